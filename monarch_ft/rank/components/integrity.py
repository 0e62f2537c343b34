"""Silent data corruption, the rank's side: fingerprints of its state, the gradient check,
and the bit flips drills inject.

A bit flipped in a weight or an optimizer moment crashes nothing. What gives it away is that
replica groups which committed the same step must hold the same bits: each rank fingerprints
its shard (:func:`fingerprint`, the format: :mod:`monarch_ft.records.integrity`) every
``ft.integrity_every`` steps and the controller compares them (``monarch_ft.controller.integrity``).

A fingerprint finds a corrupt replica one step after the fact; a flipped exponent does its
harm before that, through the gradient every group averages. So each rank also checks its
own gradient norm before the cross-group average (:class:`GradGuard`): an outlier or a
non-finite norm votes against the commit, every group discards the step, and the groups'
fingerprints of the state they still hold are compared at once.
"""

from __future__ import annotations

import fnmatch
import math
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch

from monarch_ft.records.integrity import bit_to_flip, combine, tensor_field
from monarch_ft.records.layout import read_int


class StateMismatch(ValueError):
    """A loaded checkpoint holds other state than its manifest's fingerprint vouches for."""


def named_tensors(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a state tree with its dotted name (``model.output.weight``,
    ``optim.output.weight.exp_avg``), in a fixed order: dict keys sorted, lists by index."""
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(tree, torch.Tensor):
        out.append((prefix, tree.to_local() if hasattr(tree, "to_local") else tree))
    elif isinstance(tree, dict):
        for k in sorted(tree, key=str):
            out += named_tensors(tree[k], f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out += named_tensors(v, f"{prefix}[{i}]")
    return out


def tensor_digest(t: torch.Tensor) -> int:
    """xxh3-64 of a tensor's bytes, read in place (a GPU tensor is copied to the host first)."""
    import xxhash

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if not t.numel():
        return xxhash.xxh3_64_intdigest(b"", seed=len(t.shape))
    return xxhash.xxh3_64_intdigest(t.view(-1).view(torch.uint8).numpy())


@dataclass
class Fingerprint:
    """One state's fingerprint: the tensors' names and digests, and what it took."""

    names: list[str]
    digests: list[int]
    seconds: float

    @property
    def digest(self) -> str:
        return combine(self.digests)

    def record(self, step: int, vetoed: bool = False) -> dict[str, Any]:
        """The step record's ``fingerprint`` (records.integrity)."""
        return {"step": step, "digest": self.digest, "tensors": tensor_field(self.digests), "vetoed": vetoed}


def fingerprint(tree: Any) -> Fingerprint:
    """Fingerprint every tensor of ``tree`` (a rank's shard of its state)."""
    start = time.perf_counter()
    named = named_tensors(tree)
    digests = [tensor_digest(t) for _, t in named]
    return Fingerprint([n for n, _ in named], digests, time.perf_counter() - start)


class IntegrityInterval:
    """Steps between fingerprints: ``ft.integrity_every`` when a number; with auto, 1 until the
    controller has decided and written its choice to the control file, read every 20 steps
    until then (monarch_ft.controller.integrity.choose_interval).

    Args:
        setting: the fixed number (0: off), or None for auto.
        path: the control file (RunLayout.integrity_every).
    """

    POLL_EVERY = 20

    def __init__(self, setting: Optional[int], path: str) -> None:
        self.setting, self.path = setting, path
        self._every = 1 if setting is None else setting
        self._decided = setting is not None
        self._calls = 0

    @property
    def enabled(self) -> bool:
        return self.setting != 0

    def every(self) -> int:
        if not self._decided and self._calls % self.POLL_EVERY == 0:
            chosen = read_int(self.path, 0)
            if chosen > 0:
                self._every, self._decided = chosen, True
        self._calls += 1
        return self._every

    def due(self, steps_done: int) -> bool:
        """Whether the state after ``steps_done`` committed steps is fingerprinted."""
        every = self.every() if self.enabled else 0
        return every > 0 and steps_done % every == 0


def local_grad_norm(params: list[torch.nn.Parameter]) -> float:
    """The 2-norm of this rank's own gradient shards, before any averaging."""
    grads = [(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad) for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.nn.utils.get_total_norm(grads, foreach=True))


class GradGuard:
    """Whether this rank's gradient norm is one a healthy replica produces.

    A norm is an outlier when it is not finite, or (once :data:`MIN_HISTORY` committed steps
    are known) above ``factor`` x the median of the last ``history`` committed steps' norms.
    The median, not the mean: one earlier spike must not raise the bar. Only committed
    steps' norms are remembered (:meth:`accept`), so a vetoed step never becomes the norm.

    Args:
        factor: ``ft.grad_outlier_factor``.
        history: ``ft.grad_history``.
    """

    MIN_HISTORY = 10

    def __init__(self, factor: float, history: int) -> None:
        self.factor = factor
        self.norms: deque[float] = deque(maxlen=history)

    def judge(self, norm: float) -> Optional[dict[str, Any]]:
        """Why ``norm`` is an outlier (the event's fields), or None."""
        if not math.isfinite(norm):
            return {"norm": repr(norm), "reason": "non-finite"}
        if len(self.norms) >= self.MIN_HISTORY:
            median = statistics.median(self.norms)
            if norm > self.factor * median:
                return {"norm": norm, "median": median, "factor": self.factor, "reason": "outlier"}
        return None

    def accept(self, norm: float) -> None:
        if math.isfinite(norm):
            self.norms.append(norm)


_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flip_bit(named: list[tuple[str, torch.Tensor]], pattern: str, bit: str, seed: int) -> dict[str, Any]:
    """Flip one bit of one element of one live tensor, in place; what was done, for the event.

    The tensor is drawn (``seed``) among the floating-point tensors whose name matches
    ``pattern`` (fnmatch), the element among its elements, the bit by
    :func:`monarch_ft.records.integrity.bit_to_flip`.

    Raises:
        ValueError: no floating-point tensor matches, or the bit does not exist in its dtype.
    """
    rng = random.Random(seed)
    candidates = [(n, t) for n, t in named if fnmatch.fnmatchcase(n, pattern) and t.is_floating_point() and t.numel()]
    if not candidates:
        raise ValueError(f"no floating-point tensor of this rank's state matches {pattern!r} (names are like {named[0][0]!r})")
    name, t = rng.choice(candidates)
    index = rng.randrange(t.numel())
    dtype = str(t.dtype).removeprefix("torch.")
    b = bit_to_flip(bit, dtype, rng)
    width = t.element_size() * 8
    with torch.no_grad():
        flat = t.view(-1)
        ints = flat.view(_INT_OF[t.element_size()])
        before = float(flat[index])
        value = (int(ints[index]) & ((1 << width) - 1)) ^ (1 << b)
        ints[index] = value - (1 << width) if value >= 1 << (width - 1) and ints.dtype != torch.uint8 else value
        after = float(flat[index])
    return {"tensor": name, "index": index, "bit": b, "bit_class": bit, "dtype": dtype, "before": repr(before), "after": repr(after)}
