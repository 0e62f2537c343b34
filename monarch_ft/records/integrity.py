"""What a state fingerprint is, as the ranks report it and the controller compares it.

Replica groups that committed the same step in one quorum hold bit-identical model and
optimizer state (every group applies the same averaged gradients to the same weights). A
rank fingerprints its shard of that state (``monarch_ft.rank.components.integrity``) and puts
it in its step record; the controller compares the groups' fingerprints of one step
(``monarch_ft.controller.integrity``). A step record's fingerprint::

    "fingerprint": {"step": K, "digest": "<16 hex>", "tensors": "<8 hex per tensor>", "vetoed": false}

- ``step``: the committed steps the state holds (what a checkpoint of it is named: ``step-K``);
- ``digest``: one 64-bit digest over every tensor's own digest, in order: equal digests, equal
  state, bit for bit;
- ``tensors``: each tensor's digest cut to 32 bits, in the order of the names the rank reported
  once (``fingerprint_names`` in its ``model_ready`` event): which tensors differ, when they do;
- ``vetoed``: taken when the step was discarded by a gradient vote (the state is then the one
  every group held before that step, compared again).

A checkpoint's manifest carries the same digest per rank (``fingerprint``), so a checkpoint is
checked against the state the replicas agreed on at its step, and a load against its manifest.

Also here, because a drill's options are checked with them before any rank runs: the bit a
``bitflip`` fault flips (:func:`bit_to_flip`).
"""

from __future__ import annotations

import random
from typing import Iterable, Optional, Sequence

# Hex digits per tensor in a fingerprint's ``tensors`` field (32 bits: which tensors differ;
# whether the states differ is the full 64-bit ``digest``'s question).
TENSOR_HEX = 8

# Exponent and mantissa widths of the floating-point formats (torch dtype names).
FLOAT_FORMATS = {"float64": (11, 52), "float32": (8, 23), "float16": (5, 10), "bfloat16": (8, 7)}
# The bit classes a bitflip names; a number names one bit itself.
BIT_CLASSES = ("mantissa", "exponent", "sign", "random")
# The reason of a ``job_rollback`` the integrity check made (two replicas disagreed, no majority):
# steps given up on purpose, and recorded, not lost.
INTEGRITY_ROLLBACK = "replicas_diverged"


def combine(digests: Iterable[int]) -> str:
    """The state's digest: xxh3-64 over the tensors' 64-bit digests, in order (16 hex digits)."""
    import xxhash

    h = xxhash.xxh3_64()
    for d in digests:
        h.update(int(d).to_bytes(8, "little"))
    return h.hexdigest()


def tensor_field(digests: Iterable[int]) -> str:
    """The ``tensors`` field: each digest's low 32 bits, 8 hex digits each, in order."""
    return "".join(f"{int(d) & 0xFFFFFFFF:0{TENSOR_HEX}x}" for d in digests)


def split_tensors(field: str) -> list[str]:
    return [field[i : i + TENSOR_HEX] for i in range(0, len(field), TENSOR_HEX)]


def differing_tensors(a: str, b: str, names: Optional[Sequence[str]]) -> list[str]:
    """The tensors whose digests differ between two ``tensors`` fields, by name (``#i`` when the
    names are not known, or the fields are of different layouts)."""
    left, right = split_tensors(a or ""), split_tensors(b or "")
    if len(left) != len(right):
        return []
    out = []
    for i, (x, y) in enumerate(zip(left, right)):
        if x != y:
            out.append(names[i] if names is not None and i < len(names) else f"#{i}")
    return out


def check_bit(bit: str) -> Optional[str]:
    """Why ``bit`` names no bit (None: it does): a class of BIT_CLASSES or a number 0-63."""
    if bit in BIT_CLASSES:
        return None
    if str(bit).isdigit() and 0 <= int(bit) < 64:
        return None
    return f"choose {', '.join(BIT_CLASSES)} or a bit number (0 is the lowest mantissa bit)"


def bit_to_flip(bit: str, dtype: str, rng: random.Random) -> int:
    """Which bit of an element of ``dtype`` (a torch dtype name, e.g. ``float32``) to flip.

    ``mantissa``: the mantissa's highest bit (the value moves by up to half of itself: wrong
    but plausible, what no range check sees); ``exponent``: the exponent's highest bit (a
    weight below 2 in magnitude becomes ~1e38 in float32, or inf: the flip that poisons
    gradients); ``sign``; ``random``: any bit, drawn from ``rng``; a number: that bit.

    Raises:
        ValueError: a class this dtype does not have (an integer tensor has no mantissa), or a
            bit number past its width.
    """
    width = 8 * {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 0)
    if dtype in FLOAT_FORMATS:
        exponent, mantissa = FLOAT_FORMATS[dtype]
        classes = {"mantissa": mantissa - 1, "exponent": mantissa + exponent - 1, "sign": mantissa + exponent}
        if bit in classes:
            return classes[bit]
    if bit == "random":
        if not width:
            raise ValueError(f"a random bit of a {dtype} tensor: only floating-point tensors are flipped")
        return rng.randrange(width)
    if str(bit).isdigit():
        n = int(bit)
        if not width or n >= width:
            raise ValueError(f"bit {n} of a {dtype} element: it has {width} bits")
        return n
    raise ValueError(f"bit {bit!r} of a {dtype} element: {check_bit(bit) or 'not a floating-point tensor'}")
