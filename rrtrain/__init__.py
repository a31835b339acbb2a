"""rrtrain: train and compare residual-connection variants of decoder-only transformers."""

__version__ = "0.1.0"
