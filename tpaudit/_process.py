"""Settings for a Python process that tpaudit owns: the CLI and the scan/batch worker processes it spawns (never a
user's process that imports tpaudit as a library).

**The cyclic garbage collector.** A check allocates millions of small objects that live until the process ends: the
modules of torch and transformers, the parsed checkpoint listing (Kimi-K2.5: 208,550 names, shapes and rows), the
checkpoint mapping, the meta model. With CPython's default thresholds (700, 10, 10) a collection starts every 700 net
allocations and each older-generation collection walks everything allocated so far, so most of that work finds
nothing to free: a Kimi-K2.5 check spent about a third of its time there (20.9 s -> 14.2 s without it; Qwen3-VL-30B-A3B
10.8 s -> 8.7 s; peak RSS unchanged). tpaudit raises the first threshold to 200,000 allocations, as mypy does for the
same reason; collections still run, so cyclic garbage is still freed and memory stays bounded.
"""

from __future__ import annotations

import gc

# mypy's `main.py` setting (`gc.set_threshold(200 * 1000, 30, 30)`), for the same kind of allocation-heavy,
# short-lived process
GC_THRESHOLDS = (200_000, 30, 30)


def tune_gc() -> None:
    """Set the cyclic collector's thresholds for a tpaudit-owned process (see the module docstring). Idempotent."""
    gc.set_threshold(*GC_THRESHOLDS)
