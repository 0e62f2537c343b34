"""The Python half of scripts/gpu_check.sh: the environment probe and the verdict on
each check's run directory. Every command prints exactly one line, ``ok (...)`` or
``FAIL: reason``, and exits 0 / 1; the shell script counts them.

    gpu_check.py probe                                    # "<gpus> <torch> <cuda>"
    gpu_check.py env --device cuda|cpu
    gpu_check.py train RUN_DIR --device D
    gpu_check.py kill RUN_DIR --device D --xgroup nccl|gloo
    gpu_check.py collective RUN_DIR --device D --xgroup nccl|gloo
    gpu_check.py standby RUN_DIR --device D --xgroup nccl|gloo
    gpu_check.py has-standby                              # exit 0 if ft.standby_groups exists
    gpu_check.py overhead CONSOLE_LOG

Reads what a run leaves (events.jsonl, metrics.jsonl, summary.json, drill.json); never
re-derives what the drill analysis already measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


from monarch_ft.records.layout import read_jsonl as _jsonl  # noqa: E402  (a torn last line is skipped)


class Fail(Exception):
    pass


def _json(run_dir: str, name: str) -> dict:
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        raise Fail(f"no {name} in {run_dir} (see the console log next to it)")
    with open(path) as f:
        return json.load(f)


def _ranks_on(run_dir: str, device: str, xgroup: str | None) -> str:
    """Every rank built its model on the expected device with the expected cross-group
    backend (the trainer's model_ready event says which); returns a short description."""
    ready = [e for e in _jsonl(os.path.join(run_dir, "events.jsonl")) if e["event"] == "model_ready"]
    if not ready:
        raise Fail("no rank reported model_ready")
    devices = sorted({e.get("device") for e in ready})
    wrong = [d for d in devices if not str(d).startswith(device)]
    if wrong:
        raise Fail(f"ranks trained on {wrong}, expected {device}")
    backends = sorted({e.get("cross_group_backend") for e in ready})
    if xgroup and backends != [xgroup]:
        raise Fail(f"cross-group backend {backends}, expected {xgroup}")
    e = ready[0]
    parts = [",".join(devices)]
    if e.get("device_name"):
        parts.append(e["device_name"])
    parts.append(f"in-group {e.get('group_backend')}, across groups {','.join(map(str, backends))}")
    if e.get("nccl_version"):
        parts.append(f"NCCL {e['nccl_version']}")
    if any(x.get("nccl_hostid") for x in ready):
        parts.append("NCCL_HOSTID per group")
    return "; ".join(parts)


# ---------------------------------------------------------------- 1. environment
def check_env(device: str) -> str:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import AllreduceOptions, ReduceOp

    timeout = timedelta(seconds=30)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise Fail(f"torch {torch.__version__} sees no CUDA device (built with CUDA {torch.version.cuda})")
        if not dist.is_nccl_available():
            raise Fail(f"torch {torch.__version__} has no NCCL backend")
        from torchft.process_group import ProcessGroupNCCL

        torch.cuda.set_device(0)
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        desc = f"torch {torch.__version__} CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, NCCL {nccl}"
        pg = ProcessGroupNCCL(timeout=timeout)
        name = "ProcessGroupNCCL"
    else:
        if not dist.is_gloo_available():
            raise Fail(f"torch {torch.__version__} has no gloo backend")
        from torchft.process_group import ProcessGroupGloo

        desc = f"torch {torch.__version__}, gloo"
        pg = ProcessGroupGloo(timeout=timeout)
        name = "ProcessGroupGloo"
    # Beyond constructing it: configure a one-member group through a real store, run one
    # allreduce on the device, then abort it (what a collective fault does).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    pg.configure(f"127.0.0.1:{store.port}/gpu_check", "gpu_check", 0, 1)
    t = torch.full((8,), 3.0, device=device)
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    pg.allreduce([t], opts).wait()
    if device == "cuda":
        torch.cuda.synchronize()
    if not torch.equal(t.cpu(), torch.full((8,), 3.0)):
        raise Fail(f"torchft {name} allreduce of one member changed the tensor: {t.cpu().tolist()}")
    pg.abort()
    return f"{desc}; torchft {name} configured, allreduce on {t.device} and abort ok"


# ---------------------------------------------------------------- 2. one group trains
def check_train(run_dir: str, device: str, steps: int) -> str:
    summary = _json(run_dir, "summary.json")
    if summary.get("status") != "completed":
        raise Fail(f"job status {summary.get('status')!r}, expected completed")
    where = _ranks_on(run_dir, device, None)
    losses = [
        m["loss"] for m in sorted(_jsonl(os.path.join(run_dir, "metrics.jsonl")), key=lambda m: m["step"]) if m.get("committed") and m.get("loss") is not None
    ]
    if len(losses) < steps:
        raise Fail(f"{len(losses)} committed steps with a loss, expected {steps}")
    k = max(1, steps // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if not last < first:
        raise Fail(f"loss did not fall: mean of the first {k} steps {first:.3f}, of the last {k} {last:.3f}")
    return f"{len(losses)} steps on {where}; loss {first:.3f} -> {last:.3f}"


# ---------------------------------------------------------------- 3. a process kill heals
def _drill(run_dir: str) -> tuple[dict, list[dict]]:
    drill = _json(run_dir, "drill.json")
    if drill.get("exit_code") != 0:
        raise Fail(f"the job exited {drill.get('exit_code')}")
    if drill.get("weights_consistent") is not True:
        raise Fail("summary.json weights_consistent is not true: the groups ended with different weights")
    return drill, _jsonl(os.path.join(run_dir, "events.jsonl"))


def _recovered(fault: dict) -> None:
    if not fault.get("injected_at"):
        raise Fail(f"{fault['kind']} fault never injected: {fault.get('note')}")
    if not fault.get("recovered"):
        raise Fail(f"{fault['kind']} fault on group {fault['target']} not recovered: phases {fault.get('phases')}")
    if fault.get("weights_consistent") is not True:
        raise Fail(f"{fault['kind']} fault: the rejoined group's weights differ from its peers' (weights_consistent={fault.get('weights_consistent')})")


def _relaunches(events: list[dict], group: int, start: float, end: float) -> list[dict]:
    return [e for e in events if e["event"] == "group_launched" and e["group"] == group and e.get("attempt", 0) >= 1 and start <= e["time"] < end]


def check_kill(run_dir: str, device: str, xgroup: str) -> str:
    drill, events = _drill(run_dir)
    where = _ranks_on(run_dir, device, xgroup)
    (fault,) = drill["faults"]
    _recovered(fault)
    if not _relaunches(events, fault["target"], fault["injected_at"], float("inf")):
        raise Fail(f"group {fault['target']} was killed but never relaunched")
    healed = fault.get("recovered_from_group")
    if healed is None or healed == fault["target"]:
        raise Fail(f"the killed group did not heal from a live peer (recovered_from_group={healed})")
    return (
        f"{where}; killed group {fault['target']} healed from group {healed} ({fault.get('recovery_bytes')} B), "
        f"back in {fault['mttr_s']} s, weights bit-identical"
    )


# ---------------------------------------------------------------- 4. collective faults
def check_collective(run_dir: str, device: str, xgroup: str) -> str:
    drill, events = _drill(run_dir)
    where = _ranks_on(run_dir, device, xgroup)
    faults = drill["faults"]
    modes = [e.get("mode") for e in events if e["event"] == "fault_injected" and e.get("kind") == "collective"]
    if len(faults) != 2 or modes != ["abort", "hang"]:
        raise Fail(f"expected a collective abort then a collective hang, got {[f['kind'] for f in faults]} modes {modes}")
    abort, hang = faults
    for f in faults:
        _recovered(f)
    if abort["phases"].get("detected") is None:
        raise Fail("the abort discarded no step (no uncommitted step after it)")
    restarted = _relaunches(events, abort["target"], abort["injected_at"], hang["injected_at"])
    if restarted:
        raise Fail(f"the abort restarted group {abort['target']}; it must be absorbed in place")
    if not _relaunches(events, hang["target"], hang["injected_at"], float("inf")):
        raise Fail(f"the collective hang of group {hang['target']} did not get the group replaced")
    return (
        f"{where}; abort through {xgroup}: step discarded, no restart, back in {abort['mttr_s']} s; "
        f"hang: group {hang['target']} replaced, back in {hang['mttr_s']} s"
    )


# ---------------------------------------------------------------- 5. standby promotion
def has_standby() -> bool:
    import dataclasses

    from monarch_ft.config.ft import FTConfig

    return any(f.name == "standby_groups" for f in dataclasses.fields(FTConfig))


def check_standby(run_dir: str, device: str, xgroup: str) -> str:
    drill, _ = _drill(run_dir)
    where = _ranks_on(run_dir, device, xgroup)
    (fault,) = drill["faults"]
    _recovered(fault)
    if "standby" not in {str(v) for v in fault.values()}:
        raise Fail(f"the killed group was not replaced by a standby: {fault}")
    return f"{where}; group {fault['target']} replaced by a standby, back in {fault['mttr_s']} s"


# ---------------------------------------------------------------- 6. overhead benchmark
def check_overhead(console_log: str) -> str:
    with open(console_log, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    closing = [line for line in lines if line.startswith("overhead_")]
    if not closing:
        raise Fail(f"no closing overhead_... line in {console_log}")
    return closing[-1]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py")
    p.add_argument("what", choices=["probe", "env", "train", "kill", "collective", "standby", "has-standby", "overhead"])
    p.add_argument("path", nargs="?")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--xgroup", choices=["nccl", "gloo"], default="gloo")
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args(argv)
    if a.what == "probe":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(n, torch.__version__, torch.version.cuda)
        return 0
    if a.what == "has-standby":
        return 0 if has_standby() else 1
    if a.what not in ("env",) and not a.path:
        print(f"FAIL: gpu_check.py {a.what} needs a path")
        return 1
    try:
        if a.what == "env":
            line = check_env(a.device)
        elif a.what == "train":
            line = check_train(a.path, a.device, a.steps)
        elif a.what == "kill":
            line = check_kill(a.path, a.device, a.xgroup)
        elif a.what == "collective":
            line = check_collective(a.path, a.device, a.xgroup)
        elif a.what == "standby":
            line = check_standby(a.path, a.device, a.xgroup)
        else:
            line = check_overhead(a.path)
    except Fail as e:
        print(f"FAIL: {e}")
        return 1
    except Exception as e:  # a check that crashed is a failed check, in one line
        print(f"FAIL: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400])
        return 1
    print(f"ok ({line})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
