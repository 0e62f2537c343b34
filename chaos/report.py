"""Turn a fault drill's run directory into what a person reads.

A drill leaves ``drill.json``, ``metrics.jsonl`` and ``events.jsonl`` in its run
directory. :func:`write_drill_report` writes ``report.md``, ``timeline.png`` and
``mttr.png`` next to them; :func:`write_aggregate_report` does the same for a sweep
of drills (``report.md``, ``mttr.png``, ``summary.json``). :func:`phase_stats` is
the pure helper both use, and every number in a report comes from it.

Phases are seconds after a fault's ``injected_at`` (cumulative offsets); a phase
that is ``None`` for a fault does not apply to it and is left out of that phase's
statistics. The MTTR bar charts stack the *increments* between consecutive phases
(a phase that does not apply to a fault adds zero time for that fault), so a bar's
height is the mean time to the last phase reached.

Plots use the Agg canvas directly (no pyplot, no global backend switch), so this
module is safe to import anywhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from chaos.kinds import fault_label
from monarch_ft.records.events import PHASES  # one definition, shared with chaos.mttr
from monarch_ft.records.goodput import lineage
from monarch_ft.records.layout import read_jsonl
from monarch_ft.records.stats import finite, spread

__all__ = [
    "PHASES",
    "BASELINE_RECOVERY",
    "phase_stats",
    "label_faults",
    "phase_increments",
    "write_drill_report",
    "write_aggregate_report",
    "load_run",
    "main",
]

# Canonical phase order (monarch_ft.records.events.PHASES); unknown phase names are appended in
# first-seen order.
BASELINE_RECOVERY = "full_restart"

_PHASE_COLORS = ["#4c72b0", "#55a868", "#dd8452", "#8172b3", "#c44e52", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
_GROUP_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


# --------------------------------------------------------------------------- numbers


def _num(x: Any) -> float | None:
    """A finite float, or None for anything that is not one (None, NaN, strings, bools)."""
    found = finite([x])
    return found[0] if found else None


def _summary(values: Iterable[Any]) -> dict[str, Any]:
    """n, mean, p50 and p95 with their 95% bootstrap intervals, and max (monarch_ft.records.stats.spread)."""
    return spread(values).as_dict()


def _phase_order(faults: Iterable[Mapping[str, Any]]) -> list[str]:
    """Canonical phases that appear, in canonical order, then unknown ones in first-seen order."""
    seen: list[str] = []
    for f in faults:
        for name in f.get("phases") or {}:
            if name not in seen:
                seen.append(name)
    known = [p for p in PHASES if p in seen]
    return known + [p for p in seen if p not in PHASES]


def _kind_order(faults: Iterable[Mapping[str, Any]]) -> list[str]:
    kinds: list[str] = []
    for f in faults:
        k = str(f.get("kind", "unknown"))
        if k not in kinds:
            kinds.append(k)
    return kinds


def _by_kind(faults: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for f in faults:
        out.setdefault(str(f.get("kind", "unknown")), []).append(f)
    return out


def phase_stats(faults: list[dict]) -> dict:
    """Per fault kind: count, MTTR and phase spreads, survivors' stall, recovered count.

    Returns ``{kind: {"count": n, "mttr": S, "phases": {name: S}, "survivor_max_stall_s": S,
    "recovered": n, "not_recovered": n}}``, each S a spread (monarch_ft.records.stats.Spread as a
    dict: n, mean, p50, p50_ci, p95, p95_ci, max; percentiles linear, intervals 95% bootstrap).
    ``None`` values (a phase that does not apply, an unrecovered fault's MTTR) are skipped; a
    statistic with no values is ``None``. Kinds keep first-seen order; phases keep
    :data:`PHASES` order with unknown names appended.
    """
    out: dict[str, dict] = {}
    # A fault that never fired has nothing to measure (reported apart, with its reason).
    for kind, fs in _by_kind([f for f in faults if f.get("injected") is not False]).items():
        out[kind] = {
            "count": len(fs),
            "mttr": _summary(f.get("mttr_s") for f in fs),
            "phases": {name: _summary((f.get("phases") or {}).get(name) for f in fs) for name in _phase_order(fs)},
            "survivor_max_stall_s": _summary(f.get("survivor_max_stall_s") for f in fs),
            "recovered": sum(1 for f in fs if f.get("recovered") is True),
            # Injected and not back: shown beside the statistics, which cannot hold them (no MTTR).
            "not_recovered": sum(1 for f in fs if f.get("recovered") is not True),
        }
        sched = [f["scheduler"] for f in fs if f.get("scheduler")]
        if sched:
            # The scheduler's side (launcher=slurm: chaos.mttr.scheduler_times), beside ours.
            out[kind]["scheduler"] = {key: _summary(x.get(key) for x in sched) for key in SCHEDULER_TIMES}
    return out


# The scheduler's times of a fault (chaos.mttr.scheduler_times), seconds after injection.
SCHEDULER_TIMES = ("excluded_s", "not_responding_s", "down_s", "returned_s", "replacement_allocation_s")


def _fault_increments(fault: Mapping[str, Any], order: Sequence[str]) -> dict[str, float]:
    """Seconds spent in each phase (time from the previous phase reached), 0 if it does not apply.

    Offsets that go backwards (a phase reported before an earlier one) count as zero, so
    the increments always sum to the latest offset reached.
    """
    phases = fault.get("phases") or {}
    prev = 0.0
    inc: dict[str, float] = {}
    for name in order:
        v = _num(phases.get(name))
        if v is None:
            inc[name] = 0.0
            continue
        inc[name] = max(0.0, v - prev)
        prev = max(prev, v)
    return inc


def phase_increments(faults: list[dict], order: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Per fault kind: mean seconds spent in each phase (increments, not cumulative offsets).

    A phase that does not apply to a fault counts as zero seconds for it, so the
    increments of a kind sum to the mean time to the last phase reached.
    """
    order = list(order) if order is not None else _phase_order(faults)
    out: dict[str, dict[str, float]] = {}
    for kind, fs in _by_kind(faults).items():
        incs = [_fault_increments(f, order) for f in fs]
        out[kind] = {name: float(np.mean([i[name] for i in incs])) for name in order}
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _fmt(x: Any, digits: int = 2) -> str:
    v = _num(x)
    return "n/a" if v is None else f"{v:.{digits}f}"


def _cell(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


# --------------------------------------------------------------------------- pictures


def _phase_color(i: int) -> str:
    return _PHASE_COLORS[i % len(_PHASE_COLORS)]


def _save(fig: Figure, path: str) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=fig.dpi)


def _drill_start(drill: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> float:
    start = _num(drill.get("started_at"))
    if start is not None:
        return start
    times = [t for t in (_num(m.get("time")) for m in metrics) if t is not None]
    times += [t for t in (_num(f.get("injected_at")) for f in drill.get("faults") or []) if t is not None]
    return min(times) if times else 0.0


def _plot_timeline(path: str, drill: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> None:
    faults = list(drill.get("faults") or [])
    order = _phase_order(faults)
    t0 = _drill_start(drill, metrics)

    fig = Figure(figsize=(10, 7.5), dpi=120, layout="constrained")
    ax, rate_ax = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])

    # Committed step per group, from rank 0's records.
    series: dict[Any, list[tuple[float, float]]] = {}
    for m in metrics:
        if m.get("type", "step") != "step" or m.get("rank", 0) != 0 or m.get("committed") is not True:
            continue
        t, s = _num(m.get("time")), _num(m.get("step"))
        if t is None or s is None:
            continue
        series.setdefault(m.get("group", 0), []).append((t - t0, s))
    handles: list[Any] = []
    for i, group in enumerate(sorted(series, key=lambda g: (str(type(g)), g))):
        pts = sorted(series[group])
        (line,) = ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color=_GROUP_COLORS[i % len(_GROUP_COLORS)],
            lw=1.6,
            marker=".",
            ms=3,
            label=f"group {group}",
            zorder=3,
        )
        handles.append(line)
    if not series:
        ax.text(0.5, 0.5, "no committed steps recorded", transform=ax.transAxes, ha="center", va="center", color="0.4")

    # Faults: a marker at injection, then each phase as a span from the previous one.
    label_tf = blended_transform_factory(ax.transData, ax.transAxes)
    used_phases: set[str] = set()
    for f in faults:
        inj = _num(f.get("injected_at"))
        if inj is None:
            continue
        x0 = inj - t0
        phases = f.get("phases") or {}
        prev = 0.0
        for j, name in enumerate(order):
            v = _num(phases.get(name))
            if v is None:
                continue
            if v > prev:
                ax.axvspan(x0 + prev, x0 + v, color=_phase_color(j), alpha=0.22, lw=0, zorder=1)
                used_phases.add(name)
            prev = max(prev, v)
        ax.axvline(x0, color="black", ls="--", lw=1.0, zorder=2)
        target = f.get("target")
        label = f"{f.get('kind', '?')}" + (f" → g{target}" if target is not None else "")
        ax.text(
            x0,
            0.985,
            " " + label,
            transform=label_tf,
            rotation=90,
            ha="right",
            va="top",
            fontsize=8,
            color="black",
            zorder=4,
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.7),
        )
    if any(_num(f.get("injected_at")) is not None for f in faults):
        handles.append(ax.axvline(np.nan, color="black", ls="--", lw=1.0, label="fault injected"))
    for j, name in enumerate(order):
        if name in used_phases:
            handles.append(Patch(color=_phase_color(j), alpha=0.35, label=f"until {name}"))

    _plot_step_rate(rate_ax, metrics, t0, faults)
    ax.set_ylabel("committed step")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Drill timeline (recovery={drill.get('recovery', '?')}, {len(faults)} fault(s))")
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, framealpha=0.9)
    _save(fig, path)


# Useful group-steps a point of the throughput panel is averaged over.
RATE_WINDOW_STEPS = 10


def step_rate_series(metrics: Sequence[Mapping[str, Any]], window: int = RATE_WINDOW_STEPS) -> list[tuple[float, float]]:
    """(time, useful group-steps per second over the last ``window`` of them), one point per
    group-step of the final history (monarch_ft.records.goodput.lineage), at its own step's time."""
    times = sorted(lineage([dict(m) for m in metrics]).step_times.values())
    return [(times[i], window / (times[i] - times[i - window])) for i in range(window, len(times)) if times[i] > times[i - window]]


def _plot_step_rate(ax: Any, metrics: Sequence[Mapping[str, Any]], t0: float, faults: Sequence[Mapping[str, Any]]) -> None:
    """The timeline's throughput panel: useful group-steps per second, each fault marked, and
    the rate before it (a dotted line: where recovery should bring it back to)."""
    pts = step_rate_series(metrics)
    if pts:
        ax.plot([t - t0 for t, _ in pts], [r for _, r in pts], color="0.2", lw=1.4, label=f"group-steps/s (last {RATE_WINDOW_STEPS})")
    for f in faults:
        inj = _num(f.get("injected_at"))
        if inj is None:
            continue
        ax.axvline(inj - t0, color="black", ls="--", lw=1.0)
        before = _num((f.get("throughput_group_steps_per_s") or {}).get("before"))
        if before is not None:
            ax.hlines(before, inj - t0 - 5, inj - t0 + 60, colors="tab:green", linestyles=":", lw=1.2)
    ax.set_xlabel("seconds since drill start")
    ax.set_ylabel("useful group-steps/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def _plot_mttr(
    path: str,
    series: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
    title: str,
) -> None:
    """Grouped stacked bars: one group per fault kind, one bar per series (label, faults)."""
    all_faults = [f for _, fs in series for f in fs]
    kinds = _kind_order(all_faults)
    order = _phase_order(all_faults)
    incs = [phase_increments(list(fs), order) for _, fs in series]
    stats = [phase_stats(list(fs)) for _, fs in series]

    n = max(1, len(series))
    fig = Figure(figsize=(10, 5), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / n
    hatches = ["", "//", "..", "xx", "\\\\", "oo"]
    xs = np.arange(len(kinds), dtype=float)
    top = 0.0
    for si, (label, _) in enumerate(series):
        offs = xs - 0.4 + width * (si + 0.5)
        bottoms = np.zeros(len(kinds))
        for pj, name in enumerate(order):
            h = np.array([incs[si].get(k, {}).get(name, 0.0) for k in kinds])
            present = np.array([k in incs[si] for k in kinds])
            ax.bar(
                offs[present],
                h[present],
                width * 0.92,
                bottom=bottoms[present],
                color=_phase_color(pj),
                hatch=hatches[si % len(hatches)],
                edgecolor="white" if si == 0 else "0.25",
                lw=0.6,
            )
            bottoms += h
        for ki, k in enumerate(kinds):
            if k not in stats[si]:
                ax.text(offs[ki], 0, "not run", ha="center", va="bottom", fontsize=7, color="0.4", rotation=90)
                continue
            mean = stats[si][k]["mttr"]["mean"]
            y = bottoms[ki]
            top = max(top, y)
            ax.text(offs[ki], y, f"{label}\n{_fmt(mean)} s", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, kinds)
    ax.set_ylabel("seconds after injection (mean per phase)")
    ax.set_ylim(0, top * 1.18 + 1e-9 if top > 0 else 1.0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title)
    handles: list[Any] = [Patch(color=_phase_color(j), label=name) for j, name in enumerate(order)]
    if len(series) > 1:
        handles += [Patch(facecolor="white", edgecolor="0.25", hatch=hatches[si % len(hatches)], label=label) for si, (label, _) in enumerate(series)]
    if not kinds:
        ax.text(0.5, 0.5, "no faults", transform=ax.transAxes, ha="center", va="center", color="0.4")
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, framealpha=0.9)
    _save(fig, path)


# --------------------------------------------------------------------------- reports


def label_faults(faults: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The faults with ``kind`` naming the mode where it is not the kind's default (``hang:gil``),
    so reports keep a SIGSTOP hang and a GIL hang apart."""
    return [dict(f, kind=fault_label(str(f.get("kind", "unknown")), f.get("mode"))) for f in faults]


def _rel_link(run_dir: str, path: Any) -> str:
    """A markdown link to ``path`` relative to the report's folder."""
    if not isinstance(path, str):
        return _cell(path)
    rel = os.path.relpath(path, run_dir) if os.path.isabs(path) else path
    return f"[{os.path.basename(path)}]({rel})"


def _stacks_cell(run_dir: str, f: Mapping[str, Any]) -> str:
    stacks = f.get("stacks")
    if not isinstance(stacks, dict) or not stacks:
        return "n/a"
    blamed = f.get("blamed_rank")
    target = f.get("target")
    parts = []
    for label, path in sorted(stacks.items()):
        mark = " (blamed)" if blamed is not None and label == f"g{target}r{blamed}" else ""
        parts.append(f"[{label}]({os.path.relpath(path, run_dir) if os.path.isabs(path) else path}){mark}")
    return ", ".join(parts)


def _pct(st: Mapping[str, Any], key: str) -> str:
    """A percentile of a spread with its 95% interval: ``1.23 [1.10, 1.40]`` (no interval: too few values)."""
    ci = st.get(f"{key}_ci")
    return _fmt(st.get(key)) + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")


def _kind_header(order: Sequence[str]) -> list[str]:
    return (
        ["kind", "count", "recovered", "not recovered", "MTTR n", "MTTR mean (s)", "MTTR p50 [95% CI] (s)", "MTTR p95 [95% CI] (s)", "MTTR max (s)"]
        + [f"{p} mean (s)" for p in order]
        + ["survivors' longest stall p50 [95% CI] (s)", "stall p95 [95% CI] (s)", "stall max (s)"]
    )


def _kind_cells(st: Mapping[str, Any], order: Sequence[str]) -> list[str]:
    m, stall = st["mttr"], st["survivor_max_stall_s"]
    return (
        [str(st["count"]), str(st["recovered"]), str(st["not_recovered"]), str(m["n"]), _fmt(m["mean"]), _pct(m, "p50"), _pct(m, "p95"), _fmt(m["max"])]
        + [_fmt(st["phases"].get(p, {}).get("mean")) for p in order]
        + [_pct(stall, "p50"), _pct(stall, "p95"), _fmt(stall["max"])]
    )


def _consistent(drill: Mapping[str, Any]) -> bool | None:
    wc = drill.get("weights_consistent")
    if isinstance(wc, bool):
        return wc
    per = [f.get("weights_consistent") for f in drill.get("faults") or []]
    if per and all(isinstance(x, bool) for x in per):
        return all(per)
    return None


def _hosts_text(hosts) -> str:
    """The launcher's host layout: 'localhost', or each group's simulated host and address."""
    if not isinstance(hosts, dict):
        return str(hosts)
    parts = []
    for group, host in sorted(hosts.items(), key=lambda kv: str(kv[0])):
        if isinstance(host, dict):
            parts.append(f"group {group} on {host.get('netns', '?')} ({host.get('address', '?')})")
        else:
            parts.append(f"group {group} on {host}")
    return ", ".join(parts)


def _scheduler_section(faults: Sequence[Mapping[str, Any]]) -> list[str]:
    """The scheduler's view of each fault beside ours (launcher=slurm), or nothing."""
    rows = []
    for f in faults:
        sc = f.get("scheduler")
        if not sc:
            continue
        rows.append(
            [
                _cell(f.get("id")),
                _cell(f.get("kind")),
                _cell(sc.get("failed_node")),
                _fmt((f.get("phases") or {}).get("detected")),
                _fmt(sc.get("excluded_s")),
                _fmt(sc.get("not_responding_s")),
                _fmt(sc.get("down_s")),
                _fmt(sc.get("returned_s")),
                _cell(sc.get("replacement_node")),
                _fmt(sc.get("replacement_allocation_s")),
            ]
        )
    if not rows:
        return []
    header = ["id", "kind", "node down", "we detected (s)", "node excluded (s)", "Slurm: not responding (s)", "Slurm: down (s)", "node back in pool (s)"]
    header += ["replacement node", "replacement allocation (s)"]
    return (
        ["## The scheduler's view", ""]
        + _table(header, rows)
        + [
            "",
            "Seconds after injection. Slurm's own detection of a node that failed is its first `not responding` (its pings went "
            "unanswered), then `down` (silent for SlurmdTimeout: its jobs failed); we detect the ranks gone and exclude the node "
            "from new jobs (`sbatch --exclude`) at once. Replacement allocation: the relaunched group's job, from `sbatch` to its "
            "first rank running (n/a: a standby, allocated before the fault, took the group's place).",
            "",
        ]
    )


def write_drill_report(
    run_dir: str,
    drill: dict,
    metrics: list[dict],
    baseline: dict | None = None,
) -> dict[str, str]:
    """Write ``report.md``, ``timeline.png`` and ``mttr.png`` into ``run_dir``.

    ``baseline`` is the drill.json dict of the same faults run with
    ``recovery=full_restart``, or None (the report then says it was not run and the
    ratio column reads "n/a"). Returns ``{"report": ..., "timeline": ..., "mttr": ...}``.
    """
    os.makedirs(run_dir, exist_ok=True)
    paths = {
        "report": os.path.join(run_dir, "report.md"),
        "timeline": os.path.join(run_dir, "timeline.png"),
        "mttr": os.path.join(run_dir, "mttr.png"),
    }
    faults = label_faults(drill.get("faults") or [])
    base_faults = label_faults((baseline or {}).get("faults") or [])
    order = _phase_order(faults + base_faults)
    stats = phase_stats(faults)
    base_stats = phase_stats(base_faults) if baseline is not None else {}
    recovery = str(drill.get("recovery", "?"))

    _plot_timeline(paths["timeline"], drill, metrics)
    fired_only = [f for f in faults if f.get("injected") is not False]
    series: list[tuple[str, Sequence[Mapping[str, Any]]]] = [(f"ours ({recovery})", fired_only)]
    if baseline is not None:
        series.append((str(baseline.get("recovery", BASELINE_RECOVERY)), [f for f in base_faults if f.get("injected") is not False]))
    _plot_mttr(paths["mttr"], series, f"MTTR by phase and fault kind (recovery={recovery})")

    # ---- report.md
    lines: list[str] = [f"# Fault drill report: recovery={recovery}", ""]
    groups, ranks = drill.get("replica_groups"), drill.get("ranks_per_group")
    duration = None
    if _num(drill.get("started_at")) is not None and _num(drill.get("finished_at")) is not None:
        duration = _num(drill["finished_at"]) - _num(drill["started_at"])
    kinds_txt = ", ".join(f"{stats[k]['count']}× {k}" for k in stats) or "none"
    para = (
        f"A `{recovery}` recovery drill on {_cell(groups)} replica group(s) × {_cell(ranks)} rank(s) each, "
        f"{_cell(drill.get('steps'))} steps, {len(faults)} injected fault(s) ({kinds_txt}), "
        f"launcher `{_cell(drill.get('launcher'))}`, seed {_cell(drill.get('seed'))}"
    )
    if drill.get("hosts"):
        para += f", hosts: {_hosts_text(drill['hosts'])}"
    if duration is not None:
        para += f", {duration:.2f} s wall clock"
    para += "."
    fired_n = [f for f in faults if f.get("injected") is not False]
    lost = [f for f in fired_n if f.get("recovered") is not True]
    never = [f for f in faults if f.get("injected") is False]
    para += (
        f" **Faults: {len(fired_n)} injected, {len(fired_n) - len(lost)} recovered, {len(lost)} not recovered"
        + (f" (ids {', '.join(_cell(f.get('id')) for f in lost)})" if lost else "")
        + f", {len(never)} never fired.**"
    )
    para += (
        f" Goodput {_fmt(drill.get('goodput_group_steps_per_s'))} useful group-steps/s from the job's launch "
        f"({_fmt(drill.get('goodput_tokens_per_s'), 0)} tokens/s; {_fmt(drill.get('goodput_per_provisioned_replica'))} per provisioned "
        f"replica of {_cell(drill.get('provisioned_replicas'))}, standbys counted), against {_fmt(drill.get('fault_free_group_steps_per_s'))} "
        f"at steady state before the first fault: ratio {_fmt(drill.get('goodput_ratio'))}, warm-up "
        f"({_fmt(drill.get('warmup_s'))} s to the first commit) charged; ETTR {_fmt(drill.get('ettr'))} "
        f"(useful group-steps x the {_fmt(drill.get('fault_free_median_step_s'), 3)} s median step before the first fault, over groups x wall time); "
        f"{_cell(drill.get('rolled_back_group_steps'))} group-steps rolled back, {_cell(drill.get('useful_group_steps'))} useful of "
        f"{_cell(drill.get('trained_group_steps'))} trained (monarch_ft/records/goodput.py)."
    )
    if baseline is None:
        para += " The full-restart baseline was not run, so the baseline columns read n/a."
    else:
        para += (
            f" Baseline: the same faults with `recovery={_cell(baseline.get('recovery', BASELINE_RECOVERY))}` "
            f"(goodput ratio {_fmt(baseline.get('goodput_ratio'))})."
        )
    lines += [para, ""]
    lines += [
        "Phases are seconds after injection (cumulative); n/a means the phase does not apply to that kind of fault and is left out of its statistics.",
        "",
        "## By fault kind",
        "",
    ]
    header = _kind_header(order) + ["goodput ratio", "baseline MTTR mean (s)", "ratio (baseline/ours)"]
    rows = []
    for kind, st in stats.items():
        b = base_stats.get(kind)
        b_mean = b["mttr"]["mean"] if b else None
        rows.append([_cell(kind)] + _kind_cells(st, order) + [_fmt(drill.get("goodput_ratio")), _fmt(b_mean), _fmt(_ratio(b_mean, st["mttr"]["mean"]))])
    lines += _table(header, rows) + [""]

    lines += ["## Per fault", ""]
    header = (
        ["id", "kind", "target", "at_step", "mttr_s"]
        + list(order)
        + ["recovered", "weights_consistent", "job steps lost", "recovered_from_group", "recovery MB", "recovery s", "recovery path", "blamed rank", "stacks"]
        + ["detected at step (latency)"]
        + ["group-steps/s before", "during", "after", "throughput ratio"]
    )
    rows = []
    fired = [f for f in faults if f.get("injected") is not False]
    for f in fired:
        ph = f.get("phases") or {}
        rb = _num(f.get("recovery_bytes"))
        blamed = f.get("blamed_rank")
        rows.append(
            [_cell(f.get("id")), _cell(f.get("kind")), _cell(f.get("target")), _cell(f.get("at_step")), _fmt(f.get("mttr_s"))]
            + [_fmt(ph.get(p)) for p in order]
            + [
                _cell(f.get("recovered")) + (f" ({f['not_recovered']['detail']})" if f.get("not_recovered") else ""),
                _cell(f.get("weights_consistent")),
                _cell(f.get("job_steps_lost")),
                _cell(f.get("recovered_from_group")),
                _fmt(rb / 1e6 if rb is not None else None),
                _fmt(f.get("recovery_seconds")),
                _cell(f.get("recovery_path") or ("in place" if f.get("recovery_path", "") is None else None)),
                _cell(f"{blamed} ({f.get('blame')})" if blamed is not None else None),
                _stacks_cell(run_dir, f),
                _cell(f.get("detected_step")) + (f" ({f['detection_latency_steps']})" if f.get("detection_latency_steps") is not None else ""),
            ]
            + [_fmt((f.get("throughput_group_steps_per_s") or {}).get(k)) for k in ("before", "during", "after")]
            + [
                _fmt(f.get("throughput_ratio"))
                + (" (evicted)" if f.get("evicted") else "")
                + (f" ({(f.get('throughput_group_steps_per_s') or {}).get('why')})" if (f.get("throughput_group_steps_per_s") or {}).get("why") else "")
            ]
        )
    lines += _table(header, rows) + [""]
    lines += [
        "MB are 10^6 bytes. Recovery path: how the failed group came back (standby, warm fork, cold start; "
        "in place: no relaunch). Stacks: every thread of the hung rank and its group peers at the hang verdict. "
        "Detected at step: the training step the fault was caught at (latency: steps after the one it landed in).",
        "Group-steps/s: useful group-steps (those in the final history) per second over the 60 before the fault "
        "(counted from the previous fault's recovery), while it lasted, and over the 60 after its recovery (an evicted "
        "straggler's: after its standby is back); the ratio is after / before, n/a with the reason when either is missing.",
        "",
    ]
    lines += _scheduler_section(fired)
    missing = [f for f in faults if f.get("injected") is False]
    if missing:
        lines += ["## Not injected", "", f"**{len(missing)} fault(s) never fired**; nothing was measured for them.", ""]
        rows = [
            [
                _cell(f.get("id")),
                _cell(f.get("kind")),
                _cell(f.get("target")),
                _cell(f.get("at_step") if f.get("at_step") is not None else f.get("at_s")),
                _cell((f.get("not_injected") or {}).get("reason")),
                _cell((f.get("not_injected") or {}).get("detail")),
                _cell((f.get("not_injected") or {}).get("fix")),
            ]
            for f in missing
        ]
        lines += _table(["id", "kind", "target", "trigger", "reason", "what happened", "fix"], rows) + [""]

    lines += ["## Timeline", "", "![timeline](timeline.png)", "", "## MTTR by phase", "", "![mttr](mttr.png)", ""]
    lines.append(
        f"**Committed steps: never went back: {_cell(drill.get('steps_never_go_back'))}; lost to rollbacks: "
        f"{_cell(drill.get('steps_lost'))}; regressions: {_cell(len(drill.get('step_regressions') or []))}**"
    )
    lines.append("")
    wc = _consistent(drill)
    lines.append(f"**Weights consistent across replicas: {_cell(wc)}**")
    with open(paths["report"], "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return paths


def _mean_of(values: Iterable[Any]) -> float | None:
    vals = [v for v in (_num(x) for x in values) if v is not None]
    return float(np.mean(vals)) if vals else None


def _recovery_key(d: Mapping[str, Any]) -> str:
    """The recovery mode, with ``+standby`` when live recovery had warm standby groups, else
    ``+fork`` when its relaunches forked from a warm fork server (``ft.warm_fork``; plain
    ``live`` is the cold path), and the sync mode when it is not hsdp (``live+standby``,
    ``live+fork``, ``live+diloco``)."""
    recovery, mode = str(d.get("recovery", "unknown")), d.get("mode", "hsdp")
    if recovery != BASELINE_RECOVERY and d.get("standby_groups"):
        recovery += "+standby"
    elif recovery != BASELINE_RECOVERY and d.get("warm_fork"):
        recovery += "+fork"
    return recovery if mode == "hsdp" else f"{recovery}+{mode}"


def _steps_lost_table(drills: list[dict]) -> list[str]:
    """MTTR and the group-steps (tokens) each fault threw away, per ft.mode and kind: in
    localsgd/diloco the failed group's unsynced window (up to H steps) is lost."""
    pooled: dict[tuple[str, int, str], list[dict]] = {}
    tokens: dict[tuple[str, int, str], int] = {}
    for d in drills:
        for f in label_faults(f for f in d.get("faults") or [] if f.get("injected") is not False):
            key = (str(d.get("mode", "hsdp")), int(d.get("sync_every", 1)), str(f.get("kind")))
            pooled.setdefault(key, []).append(f)
            tokens[key] = int(d.get("tokens_per_group_step") or 0)
    rows = []
    for (mode, h, kind), faults in sorted(pooled.items()):
        mttr = [f["mttr_s"] for f in faults if f.get("mttr_s") is not None]
        lost = [f["group_steps_discarded"] for f in faults if f.get("group_steps_discarded") is not None]
        mean_lost = sum(lost) / len(lost) if lost else None
        rows.append(
            [
                _cell(mode),
                _cell(h),
                _cell(kind),
                _cell(len(faults)),
                _fmt(sum(mttr) / len(mttr) if mttr else None),
                _fmt(mean_lost),
                _fmt(max(lost) if lost else None),
                _fmt(mean_lost * tokens[(mode, h, kind)] if mean_lost is not None else None),
            ]
        )
    return _table(["ft.mode", "H", "kind", "faults", "MTTR mean (s)", "group-steps discarded mean", "max", "tokens discarded mean"], rows)


def _side_by_side(kinds: Sequence[str], modes: Sequence[str], stats: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One row per fault kind, per mode its MTTR p50 / p95 and the survivors' longest stall,
    then each mode's mean MTTR over full restart's (x full restart: lower is better)."""
    header = ["kind"]
    for m in modes:
        header += [
            f"{m} MTTR p50 [95% CI] (s)",
            f"{m} MTTR p95 [95% CI] (s)",
            f"{m} MTTR max (s)",
            f"{m} n (not recovered)",
            f"{m} survivors' longest stall max (s)",
        ]
    others = [m for m in modes if m != BASELINE_RECOVERY]
    has_base = BASELINE_RECOVERY in modes
    if has_base:
        header += [f"{m} / full_restart" for m in others]
    rows = []
    for k in kinds:
        row = [_cell(k)]
        for m in modes:
            st = stats.get(k, {}).get(m)
            row += (
                [
                    _pct(st["mttr"], "p50"),
                    _pct(st["mttr"], "p95"),
                    _fmt(st["mttr"]["max"]),
                    f"{st['mttr']['n']} ({st['not_recovered']})",
                    _fmt(st["survivor_max_stall_s"]["max"]),
                ]
                if st
                else ["not run"] * 5
            )
        if has_base:
            base = (stats.get(k, {}).get(BASELINE_RECOVERY) or {}).get("mttr", {}).get("mean")
            for m in others:
                st = stats.get(k, {}).get(m)
                row.append(_fmt(_ratio(st["mttr"]["mean"] if st else None, base)))
        rows.append(row)
    return _table(header, rows)


def write_aggregate_report(out_dir: str, drills: list[dict]) -> dict[str, str]:
    """Summarise a sweep of drills: ``report.md``, ``mttr.png`` and ``summary.json``.

    Faults are pooled by (kind, recovery) across drills. ``summary.json`` holds
    ``stats[kind][recovery]`` (a :func:`phase_stats` entry plus the drills' mean
    ``goodput_ratio``) and ``ratio[kind]`` = full_restart mean MTTR / ours mean MTTR,
    where "ours" is ``summary["ours"]`` ("live" if it was run, else the first non
    full-restart mode); ``ratio_by_recovery[kind][mode]`` gives it for every other mode.
    Returns ``{"report": ..., "mttr": ..., "summary": ...}``.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "report": os.path.join(out_dir, "report.md"),
        "mttr": os.path.join(out_dir, "mttr.png"),
        "summary": os.path.join(out_dir, "summary.json"),
    }
    modes: list[str] = []
    faults_by_mode: dict[str, list[dict]] = {}
    goodput_by_mode: dict[str, list[Any]] = {}
    for d in drills:
        mode = _recovery_key(d)
        if mode not in modes:
            modes.append(mode)
        # Faults that never fired are counted apart: they have nothing to measure.
        faults_by_mode.setdefault(mode, []).extend(label_faults(f for f in d.get("faults") or [] if f.get("injected") is not False))
        goodput_by_mode.setdefault(mode, []).append(d.get("goodput_ratio"))
    # Our modes first, the baseline last.
    modes = [m for m in modes if m != BASELINE_RECOVERY] + [m for m in modes if m == BASELINE_RECOVERY]
    ours_modes = [m for m in modes if m != BASELINE_RECOVERY]
    ours = "live" if "live" in ours_modes else (ours_modes[0] if ours_modes else None)

    missing = [f for d in drills for f in d.get("faults") or [] if f.get("injected") is False]
    all_faults = [f for m in modes for f in faults_by_mode[m]]
    kinds = _kind_order(all_faults)
    order = _phase_order(all_faults)
    stats_by_mode = {m: phase_stats(faults_by_mode[m]) for m in modes}

    stats: dict[str, dict[str, Any]] = {}
    for k in kinds:
        stats[k] = {}
        for m in modes:
            if k in stats_by_mode[m]:
                stats[k][m] = dict(stats_by_mode[m][k], goodput_ratio=_mean_of(goodput_by_mode[m]))

    def mean_mttr(k: str, m: str | None) -> float | None:
        st = stats.get(k, {}).get(m) if m is not None else None
        return st["mttr"]["mean"] if st else None

    ratio = {k: _ratio(mean_mttr(k, BASELINE_RECOVERY), mean_mttr(k, ours)) for k in kinds}
    ratio_by_recovery = {k: {m: _ratio(mean_mttr(k, BASELINE_RECOVERY), mean_mttr(k, m)) for m in ours_modes} for k in kinds}
    consistent = [_consistent(d) for d in drills]
    all_consistent = None if any(c is None for c in consistent) or not consistent else all(consistent)
    standby = next((m for m in ours_modes if m.startswith("live+standby")), None)
    # The target ratio: live recovery with a standby over a full restart (lower is better).
    standby_over_full = {k: _ratio(mean_mttr(k, standby), mean_mttr(k, BASELINE_RECOVERY)) for k in kinds} if standby else {}
    # Warm fork over the cold path, both live without a standby (lower is better).
    fork_over_cold = {k: _ratio(mean_mttr(k, "live+fork"), mean_mttr(k, "live")) for k in kinds} if {"live+fork", "live"} <= set(modes) else {}
    summary = {
        "drills": len(drills),
        "standby_over_full_restart": standby_over_full,
        "fork_over_cold": fork_over_cold,
        "recoveries": modes,
        "ours": ours,
        "baseline": BASELINE_RECOVERY,
        "kinds": kinds,
        "phases": order,
        "stats": stats,
        "ratio": ratio,
        "ratio_by_recovery": ratio_by_recovery,
        "weights_consistent": all_consistent,
    }
    with open(paths["summary"], "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
        fh.write("\n")

    series = [(("ours (%s)" % m) if m == ours else m, faults_by_mode[m]) for m in modes]
    _plot_mttr(paths["mttr"], series, f"MTTR by phase and fault kind across {len(drills)} drill(s)")

    lines = ["# Fault drill sweep report", ""]
    per_mode = ", ".join(f"{sum(1 for d in drills if _recovery_key(d) == m)} × `{m}`" for m in modes) or "none"
    lines += [
        (f"**{len(missing)} fault(s) were not injected** (see each drill's report). " if missing else "")
        + f"{len(drills)} drill(s) ({per_mode}) covering {len(all_faults)} injected fault(s) of "
        f"{len(kinds)} kind(s): {', '.join(kinds) or 'none'}. Faults are pooled by kind and recovery "
        f"mode; the ratio is the full-restart mean MTTR over ours" + (f" (`{ours}`)" if ours else "") + ".",
        "",
        "## By fault kind and recovery",
        "",
    ]
    header = ["kind", "recovery"] + _kind_header(order)[1:] + ["goodput ratio (mean)"]
    rows = []
    for k in kinds:
        for m in modes:
            st = stats[k].get(m)
            if st is None:
                continue
            rows.append([_cell(k), _cell(m)] + _kind_cells(st, order) + [_fmt(st["goodput_ratio"])])
    lines += _table(header, rows) + [""]
    lines += ["## Full restart vs ours", ""]
    rows = [[_cell(k), _fmt(mean_mttr(k, ours)), _fmt(mean_mttr(k, BASELINE_RECOVERY)), _fmt(ratio[k])] for k in kinds]
    lines += _table(["kind", "ours MTTR mean (s)", "full restart MTTR mean (s)", "ratio (full restart/ours)"], rows)
    lines += ["", "## Modes side by side", ""] + _side_by_side(kinds, modes, stats)
    lines += ["", "## Steps lost by ft.mode", ""] + _steps_lost_table(drills)
    lines += ["", "![mttr](mttr.png)", "", f"**Weights consistent in every drill: {_cell(all_consistent)}**"]
    with open(paths["report"], "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return paths


# --------------------------------------------------------------------------- run dirs


def load_run(run_dir: str) -> tuple[dict, list[dict], list[dict]]:
    """(drill.json, metrics.jsonl records, events.jsonl records) of a drill's run directory."""
    with open(os.path.join(run_dir, "drill.json"), encoding="utf-8") as fh:
        drill = json.load(fh)
    return drill, read_jsonl(os.path.join(run_dir, "metrics.jsonl")), read_jsonl(os.path.join(run_dir, "events.jsonl"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chaos.report RUN_DIR [--baseline BASELINE_RUN_DIR]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m chaos.report", description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--baseline", help="run directory of the same drill with recovery=full_restart")
    a = p.parse_args(argv)
    drill, metrics, _ = load_run(a.run_dir)
    baseline = load_run(a.baseline)[0] if a.baseline else None
    for name, path in write_drill_report(a.run_dir, drill, metrics, baseline).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
