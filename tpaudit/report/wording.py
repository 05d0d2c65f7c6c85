"""Sentences more than one renderer prints the same way (the renderers differ in markup, not in what they say)."""

from __future__ import annotations


def parity_verdict(parity) -> tuple[str, str]:
    """The parity section as `(kind, sentence)`, kind one of `"pass"`, `"fail"`, `"error"`, `"skipped"`,
    `"inconclusive"`.

    `parity` is a `tpaudit.model.ParityResult` (or the report's section of that shape): `ran` False is a check that
    did not run (its `reason` says why: not needed, `--no-parity`, ...), never a divergence; `error` set is a rank
    that raised (the exception is the verdict, with the module it was running); `passed` None after a run is a run
    that compared nothing.
    """
    p = parity
    size = f"tp_size {p.tp_size}" + (f", ep_size {p.ep_size}" if getattr(p, "ep_size", 1) > 1 else "")
    if not p.ran:
        reason = (p.reason or "").removeprefix("not run: ")
        return "skipped", f"not run ({reason})" if reason else "not run"
    stats = f"{p.modules_compared} modules compared, {p.seconds:.1f} s"
    if p.error:
        where = f" in `{p.observed_at}`" if p.observed_at else ""
        return "error", f"sharded forward at {size} FAILED: {p.error}{where} ({stats})"
    if p.passed is None:
        return "inconclusive", f"sharded forward at {size} ran but compared nothing ({p.reason})"
    error = f"max abs error {p.max_abs_error:.2g}, " if p.max_abs_error is not None else ""
    if p.passed:
        return "pass", f"sharded forward at {size} matches the unsharded model ({error}{stats})"
    module = f" at `{p.first_divergent_module}`" if p.first_divergent_module else ""
    return "fail", f"sharded forward at {size} DIVERGES{module} ({error}{stats})"


def rank_spread(ranks: list[int], unit: str = "GiB") -> str:
    """How the per-rank parameter bytes differ, in one phrase: `"every rank the same (8 ranks)"`, or the lightest
    rank and the spread in exact bytes (`"uneven: lightest rank 7 holds 1,536 B (1.50 KiB) less"`): rounded
    per-rank sizes would hide differences of a few KiB on a 4 GiB shard."""
    from ..units import format_bytes, format_int

    if len(set(ranks)) <= 1:
        return f"every rank the same ({len(ranks)} ranks)"
    low = min(range(len(ranks)), key=lambda r: (ranks[r], r))
    gap = max(ranks) - ranks[low]
    sizes = len(set(ranks))
    return (f"uneven ({sizes} different sizes): lightest rank {low} holds {format_int(gap)} B "
            f"({format_bytes(gap, unit)}) less")
