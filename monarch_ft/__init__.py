"""monarch_ft: fault-tolerant TorchTitan training on TorchFT, driven by one controller."""

import os

__version__ = "0.1.0"

# The directory that holds this package (the repository root of a checkout): the ranks and
# helper processes get it on PYTHONPATH, and the recipes' configs/ sit there.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
