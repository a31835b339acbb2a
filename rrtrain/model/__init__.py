"""The transformer and what describes it: the block (which knows no residual rule), norms, shapes and parameter counts."""
