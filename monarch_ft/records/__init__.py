"""Shared records: what the processes of a job write and read to understand each other.

Every process imports this package (the controller, each rank, the fork server, the
Lighthouse guard, the Slurm task wrapper, the command line), so it holds formats and pure
rules only: the run directory's paths, the event kinds, exit codes, the state decision and
a promotion, the rank report format, the lease rules, the checkpoint manifest, the fork
server's wire format. It imports nothing of monarch_ft outside itself (checked by
import-linter, see pyproject.toml), and nothing outside the standard library at import
time: the Slurm task wrapper imports it with ``python -S``.
"""
