"""``monarch-ft {status,stacks,stop,verify} RUN_DIR`` (``python -m monarch_ft ...`` alike): a running (or finished) job from any shell.

    python -m monarch_ft status RUN_DIR [--json]  each group's state, step, loss, restarts; faults and MTTR; the controller
    python -m monarch_ft stacks RUN_DIR [--group G]   every rank's Python stacks now (py-spy), to RUN_DIR/stacks/ and here
    python -m monarch_ft stop RUN_DIR             stop the job cleanly, with or without a controller attached
    python -m monarch_ft verify RUN_DIR           every checkpoint step on disk against its manifest (exit 1 if any is damaged)

Thin entries over monarch_ft.cli.jobctl; bad input is one ``monarch_ft: error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from monarch_ft.records.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"monarch_ft: error: {message}: see monarch-ft --help", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str]) -> int:
    parser = _Parser(prog="monarch-ft", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    status = sub.add_parser("status", help="the job at a glance")
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true", help="the same fields as one JSON object, for scripts")
    stacks = sub.add_parser("stacks", help="every rank's Python stacks now (py-spy)")
    stacks.add_argument("run_dir")
    stacks.add_argument("--group", type=int, default=None)
    stop = sub.add_parser("stop", help="stop the job cleanly")
    stop.add_argument("run_dir")
    stop.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the job to stop")
    sub.add_parser("verify", help="check every checkpoint step on disk against its manifest").add_argument("run_dir")
    args = parser.parse_args(argv)
    from monarch_ft.cli import jobctl

    try:
        if args.command == "status":
            from monarch_ft.cli import api

            print(api.status_json(args.run_dir) if args.json else jobctl.format_status(jobctl.job_status(args.run_dir)))
            return 0
        if args.command == "stacks":
            for label, path in sorted(jobctl.job_stacks(args.run_dir, args.group).items()):
                with open(path, errors="replace") as f:
                    print(f"==== {label} ({path})\n{f.read().rstrip()}")
            return 0
        if args.command == "verify":
            lines, damaged = jobctl.verify_checkpoints(args.run_dir)
            print("\n".join(lines))
            return 1 if damaged else 0
        return 0 if jobctl.job_stop(args.run_dir, args.timeout) == 0 else 1
    except ConfigError as e:
        print(f"monarch_ft: error: {e}", file=sys.stderr)
        return 2
