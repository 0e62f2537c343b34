"""The controller: the one process that drives a job (and the helpers it starts).

The watch loop (:mod:`.loop`) launches replica groups through a launcher, reads what their
ranks report, and applies the pure decisions kept beside it: the hang model (:mod:`.hangs`),
the committed step (:mod:`.ledger`), the restart budget and crash loops (:mod:`.budget`),
the start gate (:mod:`.gates`), the disk checkpoint to resume from (:mod:`.checkpoints`), how
the job ended (:mod:`.summary`). Around it: the warm standby and fork server pools
(:mod:`.standby_pool`, :mod:`.fork_pool`), the Lighthouse and its guard (:mod:`.lighthouse`,
:mod:`.lighthouse_guard`), attach/detach and the takeover state (:mod:`.takeover`,
:mod:`.closeout`), the narrow handle fault injectors get (:mod:`.control`), and the checks
before anything is launched (:mod:`.preflight`).

Nothing here imports the rank side (``monarch_ft.rank``), nor it this (import-linter
contracts in pyproject.toml): the two talk through files whose formats are
:mod:`monarch_ft.records`. Kept empty so that ``python -m monarch_ft.controller.lighthouse_guard``
starts in well under a second.
"""
