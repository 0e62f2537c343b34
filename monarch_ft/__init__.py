"""monarch_ft: fault-tolerant TorchTitan training on TorchFT, driven by one controller."""

__version__ = "0.1.0"
