"""The rank side: everything that runs in a rank's process (and in the fork server it may be forked from).

:mod:`.worker` is the entry (``python -m monarch_ft.rank.worker SPEC.json``), :mod:`.trainer`
the training loop, :mod:`.components` its parts (TorchTitan's model, optimizer and
checkpoints, the TorchFT Manager and sync modes, reports and metrics, the fault agent), and
:mod:`.zygote`, :mod:`.standby_wait` and :mod:`.monarch_actor` the other ways a rank comes to
life: forked from a warm fork server, promoted from a warm standby, or run by a Monarch actor.

Nothing here imports the controller side (``monarch_ft.controller``), nor it this
(import-linter contracts in pyproject.toml): the two talk through files whose formats are
:mod:`monarch_ft.records`.
"""
