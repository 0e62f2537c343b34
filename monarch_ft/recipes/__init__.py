"""The recipes: the Hydra apps behind ``monarch-ft pretrain``, ``drill``, ``mttr-bench`` and
``goodput-bench`` (and the checkout's ``recipes/*.py``, thin wrappers over these).

The top layer of the import contracts (pyproject.toml): a recipe may import any package of
monarch_ft and chaos; none imports a recipe.
"""
