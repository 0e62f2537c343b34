"""monarch_ft: fault-tolerant TorchTitan training on TorchFT, driven by one controller."""

import os

__version__ = "0.1.0"

# The directory that holds this package (the repository root of a checkout, site-packages
# of an install): the ranks and helper processes get it on PYTHONPATH, so a process started
# as ``python -m monarch_ft....`` imports this very code whatever its working directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A checkout (its pyproject.toml beside the package), as opposed to an installed package:
# a checkout keeps its caches in itself, an install in the user's cache directory.
IS_CHECKOUT = os.path.isfile(os.path.join(REPO_ROOT, "pyproject.toml"))
