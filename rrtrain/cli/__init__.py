"""The command line: `rrtrain NAME ...` dispatches to one module per subcommand (`main.py` holds the dispatcher)."""
