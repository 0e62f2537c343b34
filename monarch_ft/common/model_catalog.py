"""Which TorchTitan models and flavors exist, known on the controller before anything starts.

A rank finds its model as ``torchtitan.models.<model.name>.<model.name>_args[model.flavor]``
(:func:`monarch_ft.rank.components.model.model_args`). Importing ``torchtitan.models.<name>``
to check the names would import torch and TorchTitan into the controller, tens of seconds
on a loaded machine, only to reject a typo; so the controller reads the same table from
TorchTitan's source instead (the ``<name>_args = {...}`` literal in the model package's
``__init__.py``) and a wrong name or flavor fails in one line before any rank is launched.
The rank's own lookup stays the authority: a flavor this reading accepts but the import
lacks still fails there.

The same reading gives the flavor's shape (the literal keyword values of its
``TransformerModelArgs(...)`` and the dataclass's defaults), from which
:func:`param_count` counts the parameters of TorchTitan's llama3 for the controller's
memory estimate, again without building the model.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from typing import Any, Optional


@functools.lru_cache(maxsize=None)
def _models_dir() -> Optional[str]:
    """``torchtitan/models`` of the installed TorchTitan (found without importing it)."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "models")


def _parse(path: str) -> Optional[ast.Module]:
    try:
        with open(path) as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError):
        return None


@functools.lru_cache(maxsize=None)
def _flavor_table(name: str) -> Optional[ast.Dict]:
    """The ``<name>_args = {...}`` literal of TorchTitan model ``name``'s package."""
    root = _models_dir()
    if root is None or not name.isidentifier():
        return None
    tree = _parse(os.path.join(root, name, "__init__.py"))
    for node in tree.body if tree is not None else []:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == f"{name}_args" for t in targets) and isinstance(node.value, ast.Dict):
            return node.value
    return None


@functools.lru_cache(maxsize=None)
def flavors(name: str) -> tuple[str, ...]:
    """The flavors of TorchTitan model ``name`` (its ``<name>_args`` keys); () if it has none."""
    table = _flavor_table(name)
    if table is None:
        return ()
    return tuple(sorted(k.value for k in table.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)))


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


@functools.lru_cache(maxsize=None)
def _llama3_defaults() -> dict[str, Any]:
    """``TransformerModelArgs``'s literal defaults (torchtitan/models/llama3/model/args.py)."""
    root = _models_dir()
    tree = _parse(os.path.join(root, "llama3", "model", "args.py")) if root else None
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ClassDef) and node.name == "TransformerModelArgs":
            return {
                s.target.id: _literal(s.value) for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None
            }
    return {}


def flavor_args(name: str, flavor: str) -> dict[str, Any]:
    """The literal keyword values of flavor ``flavor``'s constructor call ({} if unknown)."""
    table = _flavor_table(name)
    for key, value in zip(table.keys, table.values) if table is not None else []:
        if isinstance(key, ast.Constant) and key.value == flavor and isinstance(value, ast.Call):
            return {kw.arg: _literal(kw.value) for kw in value.keywords if kw.arg}
    return {}


def llama3_shape(name: str, flavor: str, overrides: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The TransformerModelArgs of TorchTitan's llama3 flavor ``flavor`` with ``overrides``
    (None values keep the flavor's), as literal values; None for another model or flavor."""
    if name != "llama3" or flavor not in flavors(name):
        return None
    args = {**_llama3_defaults(), **flavor_args(name, flavor)}
    args.update({k: v for k, v in overrides.items() if v is not None})
    return args


def shape_problem(name: str, flavor: str, overrides: dict[str, Any]) -> Optional[str]:
    """One line naming the fix for overrides TorchTitan's llama3 cannot build, else None."""
    args = llama3_shape(name, flavor, overrides)
    if args is None:
        return None
    for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of", "vocab_size"):
        if args.get(key) is not None and not args[key] >= 1:
            return f"model.{key}={args[key]}: must be >= 1"
    if args.get("ffn_dim_multiplier") is not None and not args["ffn_dim_multiplier"] > 0:
        return f"model.ffn_dim_multiplier={args['ffn_dim_multiplier']}: must be > 0"
    if args["dim"] % args["n_heads"]:
        return f"model.n_heads={args['n_heads']} does not divide model.dim={args['dim']}: each head takes dim / n_heads"
    kv = args.get("n_kv_heads") or args["n_heads"]
    if args["n_heads"] % kv:
        return f"model.n_kv_heads={kv} does not divide model.n_heads={args['n_heads']}: each key/value head serves n_heads / n_kv_heads heads"
    return None


def param_count(name: str, flavor: str, overrides: dict[str, Any]) -> Optional[int]:
    """Parameters of TorchTitan's llama3 ``Transformer`` of this flavor with ``overrides``
    (``vocab_size`` and the model section's overrides; None values keep the flavor's), counted
    as its modules create them: the embedding, per block the attention's four projections
    (grouped-query: ``n_kv_heads`` for the key and value), the SwiGLU feed-forward's three and
    two norms, the final norm and the output projection (not tied to the embedding).
    None for a model of another architecture (not counted here).
    """
    args = llama3_shape(name, flavor, overrides)
    if args is None:
        return None
    dim, layers, heads, vocab = args["dim"], args["n_layers"], args["n_heads"], args["vocab_size"]
    kv_heads = args.get("n_kv_heads") or heads
    head_dim = dim // heads
    hidden = int(2 * (4 * dim) / 3)
    if args.get("ffn_dim_multiplier") is not None:
        hidden = int(args["ffn_dim_multiplier"] * hidden)
    multiple = args["multiple_of"]
    hidden = multiple * ((hidden + multiple - 1) // multiple)
    attention = dim * heads * head_dim * 2 + dim * kv_heads * head_dim * 2
    block = attention + 3 * dim * hidden + 2 * dim
    return vocab * dim + layers * block + dim + dim * vocab


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
