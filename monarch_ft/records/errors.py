"""The error every process raises for a setting that cannot run."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot run; the message says what to change.

    Raised by config validation, the controller's pre-flight checks, the launchers' option
    checks and the command line; each entry point prints it as one ``monarch_ft: error:``
    line and exits 2.
    """


def require(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` (one line naming the fix) unless ``ok``."""
    if not ok:
        raise ConfigError(message)
