"""loomfs: one namespace for AI data, wherever it lives."""

__version__ = "0.1.0"
