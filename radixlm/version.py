"""radixlm's version (a leaf: the server reports it without importing the package's facade)."""

__version__ = "0.1.0"
