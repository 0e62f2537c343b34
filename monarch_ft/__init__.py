"""monarch_ft: fault-tolerant TorchTitan training on TorchFT, driven by one controller.

From Python (a script, a notebook): ``job = monarch_ft.launch(overrides=[...])``, then
``job.status()``, ``job.inject("process_kill", target=1)``, ``job.stop()``, ``job.wait()``,
``job.report()``; ``monarch_ft.attach(run_dir)`` after a restart (monarch_ft.cli.api).
"""

from monarch_ft.paths import IS_CHECKOUT, REPO_ROOT  # noqa: F401 (kept where they were)

__version__ = "0.1.0"


def __getattr__(name: str):
    """``monarch_ft.launch``, ``attach`` and ``JobHandle`` (monarch_ft.cli.api), imported when first
    used: a rank imports this package too, and needs none of it."""
    if name in ("launch", "attach", "JobHandle"):
        from monarch_ft.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'monarch_ft' has no attribute {name!r}")
