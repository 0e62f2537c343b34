"""Every path of a run directory, and the control channel between the controller and the ranks.

The supervisor and the ranks talk through small files in the run directory: the
ranks append reports, the controller writes control files the ranks poll (a hold,
start gates, a stop step, the commit floor, collective-fault requests). Both sides
(and chaos, and the tests) ask this one module where each file lives, so a path is
spelled once; and every control file is written whole (:func:`atomic_write`),
because a rank may read it at any instant.

Layout of ``<run>/``::

    events.jsonl metrics.jsonl summary.json   the controller's record of the job
    controller.json controller.journal        what a takeover needs: a base and what changed since (records.journal)
    controller.lock                           the live controller's lock
    ranks/g<G>r<R>.a<A>.{jsonl,spec.json}     each rank attempt's reports and spec
    logs/g<G>r<R>.a<A>.log, lighthouse.log    process output
    control/                                  controller -> ranks (see the properties)
    stacks/                                   Python stacks captured on hangs and stalls
    tensorboard/group_<G>/                    TensorBoard event files (metrics.tensorboard=true)
    scratch/group_<G>/rank_<R>/               host-local files (a node fault deletes them)
    <checkpoint.folder>/group_<G>/step-N/     TorchTitan DCP checkpoints, each sealed by its manifest.json
    <checkpoint.folder>/group_<G>/quarantine/ copies that failed verification or a load, and why
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from monarch_ft.records.errors import ConfigError
from monarch_ft.records.journal import read_state
from monarch_ft.records.reports import read_records


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one.

    A write the file system refuses (a full or read-only disk) leaves no temporary file behind
    (on a full disk it would hold space), and its error names ``path``, the file meant."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        e.filename = path
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write(path, json.dumps(obj))


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` when it is missing or empty (a marker file)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return default
    return json.loads(text) if text.strip() else default


def read_int(path: str, default: int = 0) -> int:
    """The one integer a control file holds (a step, an epoch), or ``default`` while it is
    missing or empty. Control files are written whole (:func:`atomic_write`), so a reader
    never sees half a number; anything else in one is a bug, raised as ValueError."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return default
    return int(text) if text else default


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path`` (a torn last line of a writer that died is skipped;
    [] when it does not exist): :func:`~monarch_ft.records.reports.read_records`, whole."""
    return list(read_records(str(path)))


class RunLayout:
    """Paths of one run directory. Cheap to build; both the controller and the ranks make one.

    Args:
        run_dir: the job's run directory (Hydra's output dir).
        checkpoint_folder: ``checkpoint.folder``, relative to ``run_dir``.
    """

    def __init__(self, run_dir: str, checkpoint_folder: str = "checkpoint") -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.checkpoint_folder = checkpoint_folder

    def _p(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    # ------------------------------------------------------------ the controller's record
    @property
    def events(self) -> str:
        return self._p("events.jsonl")

    @property
    def metrics(self) -> str:
        return self._p("metrics.jsonl")

    @property
    def summary(self) -> str:
        return self._p("summary.json")

    @property
    def controller_state(self) -> str:
        """Everything a new controller needs to take the job over (monarch_ft.controller), as of
        its last compaction: read it with :meth:`read_controller_state` (the journal applied)."""
        return self._p("controller.json")

    def read_controller_state(self) -> Optional[dict]:
        """The takeover state as one record (None: no job was started here): the base with its
        journal applied (monarch_ft.records.journal.read_state). A state that cannot be read
        (damaged, not this format) is a :class:`ConfigError`: one line, naming the files."""
        try:
            return read_state(self.controller_state, self.controller_journal)
        except ValueError as e:
            raise ConfigError(
                f"the takeover state of {self.run_dir} cannot be read ({e}): {self.controller_state} and {self.controller_journal} "
                "are not a state this version wrote whole; nothing can take this job over"
            ) from None

    @property
    def controller_journal(self) -> str:
        """What changed since ``controller.json`` was written (monarch_ft.records.journal)."""
        return self._p("controller.journal")

    @property
    def controller_lock(self) -> str:
        """Held (fcntl) by the live controller: a second one on this run directory is refused."""
        return self._p("controller.lock")

    @property
    def chaos_state(self) -> str:
        """A drill's injector state (faults done, the one in progress), for the next controller."""
        return self._p("chaos_injector.json")

    # ------------------------------------------------------------ per rank attempt
    @property
    def ranks_dir(self) -> str:
        return self._p("ranks")

    @property
    def logs_dir(self) -> str:
        return self._p("logs")

    @staticmethod
    def tag(group: int, rank: int, attempt: int) -> str:
        return f"g{group}r{rank}.a{attempt}"

    def report(self, group: int, rank: int, attempt: int) -> str:
        """Where a rank appends its step and event records (one file per rank and attempt)."""
        return self._p("ranks", f"{self.tag(group, rank, attempt)}.jsonl")

    def spec(self, group: int, rank: int, attempt: int) -> str:
        return self._p("ranks", f"{self.tag(group, rank, attempt)}.spec.json")

    @staticmethod
    def standby_tag(standby: int, rank: int) -> str:
        """A warm standby's files are named by its number (one per standby ever launched)."""
        return f"sb{standby}r{rank}"

    def standby_report(self, standby: int, rank: int) -> str:
        """Where a standby rank reports until its promotion (then it writes the group's report)."""
        return self._p("ranks", f"{self.standby_tag(standby, rank)}.jsonl")

    def next_standby_number(self) -> int:
        """The first standby number no earlier controller of this run used: a controller that
        attaches must not reuse a number, whose promotion file or report may already exist
        (a new standby would take an old promotion's identity at once)."""
        import re

        used = [int(m.group(1)) for name in os.listdir(self._p("ranks")) if (m := re.match(r"sb(\d+)r\d+\.", name))] if os.path.isdir(self._p("ranks")) else []
        return max(used, default=-1) + 1

    def standby_spec(self, standby: int, rank: int) -> str:
        return self._p("ranks", f"{self.standby_tag(standby, rank)}.spec.json")

    def standby_log(self, standby: int, rank: int) -> str:
        return self._p("logs", f"{self.standby_tag(standby, rank)}.log")

    def log(self, group: int, rank: int, attempt: int) -> str:
        return self._p("logs", f"{self.tag(group, rank, attempt)}.log")

    @property
    def lighthouse_log(self) -> str:
        return self._p("logs", "lighthouse.log")

    def fork_server_log(self, host: str, number: int) -> str:
        """A warm fork server's own output (monarch_ft.controller.fork_pool): one per host and start."""
        return self._p("logs", f"forkserver.{host}.{number}.log")

    # ------------------------------------------------------------ control channel
    @property
    def control_dir(self) -> str:
        return self._p("control")

    @property
    def hold(self) -> str:
        """Present while finished groups must keep serving quorums (another group has work)."""
        return self._p("control", "hold")

    @property
    def stop_at_step(self) -> str:
        """The step every group finishes at, when the controller asks for one before training.steps."""
        return self._p("control", "stop_at_step")

    @property
    def commit_floor(self) -> str:
        """The lowest step a rank may commit: the job's committed step (see rank.components.ft.CommitFloor)."""
        return self._p("control", "commit_floor")

    @property
    def controller_heartbeat(self) -> str:
        """Rewritten by the live controller every controller.heartbeat_s: the ranks' lease."""
        return self._p("control", "controller")

    @property
    def lighthouse_epoch(self) -> str:
        """How many times the Lighthouse was restarted (rank.components.lighthouse_epoch)."""
        return self._p("control", "lighthouse_epoch")

    @property
    def stop_request(self) -> str:
        """``python -m monarch_ft stop``: the controller stops the job; with none attached
        the ranks end it themselves (save a checkpoint, exit 0)."""
        return self._p("control", "stop")

    @property
    def kill_controller(self) -> str:
        """A drill's request to its watchdog: SIGKILL the controller, attach a new one later."""
        return self._p("control", "kill_controller.json")

    def start_gate(self, generation: int) -> str:
        """Shared gate of a launch generation: the first launch (0) and each full restart."""
        return self._p("control", f"start.{generation}" if generation else "start")

    def launch_gate(self, group: int, attempt: int) -> str:
        """One relaunched group's gate; its content is the controller's decision on where the
        group's state comes from (see monarch_ft.controller.decide.recovery.open_launch_gates)."""
        return self._p("control", f"launch.g{group}.a{attempt}")

    def promotion(self, standby: int) -> str:
        """A warm standby's promotion: the identity its ranks take and where the group's state
        comes from (monarch_ft.records.decisions.Promotion), written once, whole, by the supervisor."""
        return self._p("control", f"promote.sb{standby}.json")

    def collective_fault(self, group: int, rank: int) -> str:
        """A one-shot collective fault request (rank.components.fault_agent)."""
        return self._p("control", f"collective_fault_g{group}r{rank}.json")

    def slow_save(self, group: int, rank: int) -> str:
        """A one-shot slow-storage request for the rank's next checkpoint save."""
        return self._p("control", f"slow_save_g{group}r{rank}.json")

    def bitflip(self, group: int, rank: int) -> str:
        """A one-shot bit flip request (chaos ``bitflip``): the rank flips it at its next step."""
        return self._p("control", f"bitflip_g{group}r{rank}.json")

    def transfer_fault(self, group: int, rank: int) -> str:
        """A one-shot request to damage the bytes this rank serves when it heals a peer (a test hook)."""
        return self._p("control", f"transfer_fault_g{group}r{rank}.json")

    @property
    def integrity_every(self) -> str:
        """Steps between state fingerprints, once the controller decided ``ft.integrity_every=auto``."""
        return self._p("control", "integrity_every")

    @property
    def transport_peers(self) -> str:
        """Where each stepping group's ranks serve their state (transport addresses): a healing
        rank fetches a chunk that failed its checksum again from another of them."""
        return self._p("control", "transport_peers.json")

    # ------------------------------------------------------------ host-local and durable state
    @property
    def stacks_dir(self) -> str:
        return self._p("stacks")

    def stacks_capture(self, tag: str, when: float) -> str:
        """One capture's folder of stacks (a file per rank, ``g<G>r<R>.txt``): ``stacks/<tag>-<ms>/``."""
        return self._p("stacks", f"{tag}-{int(when * 1000)}")

    def scratch(self, group: int, rank: Optional[int] = None) -> str:
        """A group's host-local files (scratch space); a node fault deletes them."""
        base = self._p("scratch", f"group_{group}")
        return base if rank is None else os.path.join(base, f"rank_{rank}")

    @property
    def tensorboard_dir(self) -> str:
        """``tensorboard --logdir`` this: one run per replica group."""
        return self._p("tensorboard")

    def tensorboard(self, group: int) -> str:
        """A group's TensorBoard run, written by its rank 0 (every attempt appends its own file)."""
        return self._p("tensorboard", f"group_{group}")

    @property
    def checkpoint_root(self) -> str:
        """``checkpoint.folder``: where every group's folder is (relative to the run, or absolute)."""
        return self._p(self.checkpoint_folder)

    def checkpoint(self, group: int) -> str:
        """A group's checkpoints (TorchTitan's ``step-N/``, our manifests and ``quarantine/``:
        see monarch_ft.rank.components.checkpoint)."""
        return self._p(self.checkpoint_folder, f"group_{group}")
