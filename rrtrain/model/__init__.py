"""The transformer and what describes it: the block (which knows no residual rule), shapes, parameter and FLOP counts."""
