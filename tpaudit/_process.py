"""Settings for a Python process that tpaudit owns: the CLI and the scan/batch worker processes it spawns (never a
user's process that imports tpaudit as a library).

**The cyclic garbage collector.** A check allocates millions of small objects that live until the process ends: the
modules of torch and transformers, the parsed checkpoint listing (Kimi-K2.5: 208,550 names, shapes and rows), the
checkpoint mapping, the meta model. With CPython's default thresholds (700, 10, 10) a collection starts every 700 net
allocations and each older-generation collection walks everything allocated so far, so most of that work finds
nothing to free: a Kimi-K2.5 check spent about a third of its time there (20.9 s -> 14.2 s without it; Qwen3-VL-30B-A3B
10.8 s -> 8.7 s; peak RSS unchanged). tpaudit raises the first threshold to 200,000 allocations, as mypy does for the
same reason; collections still run, so cyclic garbage is still freed and memory stays bounded.

**The import phase.** Importing torch and transformers creates about two million objects that live as long as the
process (modules, functions, classes), and even at 200,000 the collector walked them a dozen times while they were
imported (a Kimi-K2.5 check: about 0.4 s of its CPU time, a Qwen3-VL-30B-A3B check 0.2 s). A process that has not
imported torch yet when it is tuned therefore starts with the collector paused; the seam's first probe, which
imports them (`compat.backend`), ends the pause (`resume_gc`): one full collection frees the cyclic garbage the
imports left (about 9,000 objects, 7 MB: without it a check's peak RSS rose by 6 MiB), what survives is moved to the
permanent generation (`gc.freeze`, as a pre-fork server does), never walked again, and the collector runs as above
for everything the check itself allocates. A process that imported torch before (a test process calling `main`)
keeps its collector running throughout.
"""

from __future__ import annotations

import gc

# mypy's `main.py` setting (`gc.set_threshold(200 * 1000, 30, 30)`), for the same kind of allocation-heavy,
# short-lived process
GC_THRESHOLDS = (200_000, 30, 30)


_paused = False


def tune_gc() -> None:
    """Set the cyclic collector's thresholds for a tpaudit-owned process, and pause it until the import phase ends
    when torch is not imported yet (see the module docstring). Idempotent."""
    import sys

    global _paused
    gc.set_threshold(*GC_THRESHOLDS)
    if "torch" not in sys.modules and gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc() -> None:
    """End the import phase of a process `tune_gc` paused: free the imports' cyclic garbage (one full collection),
    freeze what survives (torch's and transformers' modules, the permanent generation) and collect again. A no-op in
    any other process (a user's process that imports tpaudit as a library is never paused)."""
    global _paused
    if _paused:
        _paused = False
        gc.collect()
        gc.freeze()
        gc.enable()
