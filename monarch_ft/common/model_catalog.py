"""Which TorchTitan models and flavors exist, known on the controller before anything starts.

A rank finds its model as ``torchtitan.models.<model.name>.<model.name>_args[model.flavor]``
(:func:`monarch_ft.rank.components.model.model_args`). Importing ``torchtitan.models.<name>``
to check the names would import torch and TorchTitan into the controller, tens of seconds
on a loaded machine, only to reject a typo; so the controller reads the same table from
TorchTitan's source instead (the ``<name>_args = {...}`` literal in the model package's
``__init__.py``) and a wrong name or flavor fails in one line before any rank is launched.
The rank's own lookup stays the authority: a flavor this reading accepts but the import
lacks still fails there.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from typing import Optional


@functools.lru_cache(maxsize=None)
def _models_dir() -> Optional[str]:
    """``torchtitan/models`` of the installed TorchTitan (found without importing it)."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "models")


@functools.lru_cache(maxsize=None)
def flavors(name: str) -> tuple[str, ...]:
    """The flavors of TorchTitan model ``name`` (its ``<name>_args`` keys); () if it has none."""
    root = _models_dir()
    if root is None or not name.isidentifier():
        return ()
    try:
        with open(os.path.join(root, name, "__init__.py")) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == f"{name}_args" for t in targets) and isinstance(node.value, ast.Dict):
            return tuple(sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)))
    return ()


def models() -> list[str]:
    """TorchTitan models a rank can build: those with a ``<name>_args`` flavor table."""
    root = _models_dir()
    if root is None or not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if flavors(d))


def model_problem(name: str, flavor: str) -> Optional[str]:
    """One line naming what to choose when ``model.name``/``model.flavor`` do not exist, else None."""
    if _models_dir() is None:
        return "torchtitan is not installed: run scripts/install.sh"
    known = flavors(name)
    if not known:
        return f"model.name={name!r} is not a TorchTitan model with flavors: choose one of {', '.join(models())}"
    if flavor not in known:
        return f"model.flavor={flavor!r} is not a {name} flavor: choose one of {', '.join(known)}"
    return None
