"""Where this code lives: the one place for the package's own location.

A module of its own (not the package's ``__init__``), so the lowest layers (records, common)
can read it without importing the package root, which exports the Python API lazily.
"""

import os

# The directory that holds this package (the repository root of a checkout, site-packages
# of an install): the ranks and helper processes get it on PYTHONPATH, so a process started
# as ``python -m monarch_ft....`` imports this very code whatever its working directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A checkout (its pyproject.toml beside the package), as opposed to an installed package:
# a checkout keeps its caches in itself, an install in the user's cache directory.
IS_CHECKOUT = os.path.isfile(os.path.join(REPO_ROOT, "pyproject.toml"))
