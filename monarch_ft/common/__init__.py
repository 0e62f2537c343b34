"""Process-agnostic utilities: processes and their titles, the network, devices, the
training data, the model catalog, stack captures.

Used by the controller and by the ranks alike; nothing here knows which process it runs
in. It imports nothing of monarch_ft but :mod:`monarch_ft.records` (checked by
import-linter, see pyproject.toml).
"""
