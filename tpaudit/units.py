"""Byte quantities: parsing what users type and printing what they read.

Bytes are `int` everywhere in tpaudit; only text shows units. `GiB` is 2**30 bytes, `GB` is 10**9 bytes; every printed
size names its unit, and the report says which family it uses.
"""

from __future__ import annotations

import re

GIB = 1 << 30
GB = 10**9
MAX_BYTES = 1 << 60  # 1 EiB: anything larger is a typo, not a GPU or a model
_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, *, unit_required: bool = False) -> int:
    """`"80GB"` -> 80_000_000_000, `"24GiB"` -> 25_769_803_776, `"1e9"` -> 1_000_000_000, `"512"` -> 512.

    Units: B, KB/MB/GB/TB (powers of 10), KiB/MiB/GiB/TiB (powers of 2), case-insensitive. With `unit_required` (a
    memory size, where `80` is far likelier to mean 80 GB than 80 bytes) a bare number is refused.

    Raises:
        ValueError: not a non-negative number with an optional unit (with `unit_required`: with a unit).
    """
    m = _QUANTITY.match(str(text))
    if m and unit_required and not m.group(2):
        number = m.group(1)
        raise ValueError(f"{text!r} has no unit: write {number}GB (10^9 bytes) or {number}GiB (2^30 bytes)")
    unit = (m.group(2).lower() or "b") if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a byte size such as 80GB, 24GiB or 1e9")
    value = float(m.group(1)) * _UNITS[unit]
    if value > MAX_BYTES:
        raise ValueError(f"{text!r} is more than a byte size can sensibly be (over 1 EiB)")
    return int(round(value))


def format_bytes(n: int, unit: str = "GiB", digits: int = 2) -> str:
    """`format_bytes(16362514912)` -> `"15.24 GiB"`; `unit="GB"` -> `"16.36 GB"`. Sizes below 1 MiB/MB are shown in
    KiB/KB, below 1 KiB/KB in B, so a small number never reads as 0.00."""
    binary = unit.lower().endswith("ib")
    base = 1024 if binary else 1000
    steps = ["B", "KiB", "MiB", "GiB", "TiB"] if binary else ["B", "KB", "MB", "GB", "TB"]
    target = steps.index(unit) if unit in steps else 3
    value, i = float(n), 0
    while i < target and abs(value) >= base:
        value /= base
        i += 1
    if i == 0:
        return f"{n:,} B"
    return f"{value:,.{digits}f} {steps[i]}"


def unit_legend(unit: str = "GiB") -> str:
    """`"binary units: KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes"` (or the decimal family for `"GB"`): each printed
    size carries its unit; this says which family they belong to."""
    if unit.lower().endswith("ib"):
        return "binary units: KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes"
    return "decimal units: KB, MB, GB = 10^3, 10^6, 10^9 bytes"


def plural(n: int, word: str) -> str:
    """`plural(1, "error")` -> `"1 error"`, `plural(3, "error")` -> `"3 errors"`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_int(n: int) -> str:
    """`62141508064` -> `"62,141,508,064"`."""
    return f"{n:,}"


def shorten(text, width: int, *, words: bool = True) -> str:
    """`text` (`str()` of it) on one line, its whitespace collapsed, whole when it fits in `width` characters, else
    cut: at a word boundary and ended with " ..." (`textwrap.shorten`), so a message never stops mid-word or mid-value
    (a first word longer than `width` is cut where it must be); or, with `words=False`, after `width - 3` characters
    and ended with "..." (a library's error text, a JSON value), `width` characters in all."""
    if not words:
        line = " ".join(str(text).split())
        return line if len(line) <= width else line[: width - 3] + "..."
    import textwrap

    short = textwrap.shorten(text, width, placeholder=" ...")
    return short if short.strip(" .") else " ".join(text.split())[:width] + " ..."


def ranks_text(ranks) -> str:
    """`(0, 1, 2, 3)` -> `ranks 0-3`; `(0, 2)` -> `ranks 0, 2`; `(5,)` -> `rank 5`."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
