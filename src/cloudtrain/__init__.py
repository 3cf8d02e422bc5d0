"""cloudtrain: fast, cheap and safe deep-learning training on rented GPU servers."""

__version__ = "0.1.0"
