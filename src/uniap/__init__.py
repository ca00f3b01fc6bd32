"""uniap: find the fastest way to train a transformer on a cluster (UniAP's MIQP), then train it that way."""

__version__ = "0.1.0"
