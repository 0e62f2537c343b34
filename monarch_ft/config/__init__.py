"""The job's config: one dataclass per section, each checking its own values.

``monarch_ft.config.job.JobConfig`` holds the sections; ``monarch_ft.config.job.validate``
checks them. Nothing here imports the processes' code (the controller, the ranks, the
launchers) or Hydra: only :mod:`monarch_ft.records` and :mod:`monarch_ft.common`
(import-linter contracts in pyproject.toml).
"""
