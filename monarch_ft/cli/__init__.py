"""The command lines: ``python -m monarch_ft {status,stacks,stop,verify}`` (:mod:`.main` over
:mod:`.jobctl`) and the recipes' Hydra entry (:mod:`.hydra_entry`, :mod:`.run`).

On top of the layers (import-linter contracts in pyproject.toml): it may import any package
of monarch_ft, and none imports it.
"""
