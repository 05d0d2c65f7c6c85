"""Sentences more than one renderer prints the same way (the renderers differ in markup, not in what they say)."""

from __future__ import annotations

from collections.abc import Sequence


def parity_verdict(parity) -> tuple[str, str]:
    """The parity section as `(kind, sentence)`, kind one of `"pass"`, `"fail"`, `"error"`, `"skipped"`,
    `"inconclusive"`.

    `parity` is a `tpaudit.model.ParityResult` (or the report's section of that shape): `ran` False is a check that
    did not run (its `reason` says why: not needed, `--no-parity`, ...), never a divergence; `error` set is a rank
    that raised (the exception is the verdict, with the module it was running); `passed` None after a run is a run
    that compared nothing.
    """
    kind, sentence = _parity_sentence(parity)
    source = cache_phrase(parity)
    return kind, f"{sentence}; {source}" if source else sentence


def cache_phrase(parity) -> str:
    """Where the parity verdict came from, when the cache had a say: `"read from the parity cache, authenticated by
    this user's cache key (--no-cache recomputes)"` for a verdict read from it; `"computed now: <why the cache did
    not answer>"` when an entry was refused or the cache could not be used; `""` otherwise (computed now, nothing to
    say)."""
    if getattr(parity, "cached", False):
        return "read from the parity cache, authenticated by this user's cache key (--no-cache recomputes)"
    problem = getattr(parity, "cache_problem", None)
    return f"computed now: {problem}" if problem else ""


def _parity_sentence(parity) -> tuple[str, str]:
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


def rank_spread(ranks: Sequence[int], unit: str = "GiB") -> str:
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


def load_verdict(load, unit: str = "GiB") -> tuple[str, str]:
    """The load section (`LoadSection`) as `(kind, sentence)`, kind `"fail"` (transformers' own load raises or gives a
    wrong shard on some rank: TPA304), `"decompress"` (the quantizer decompresses while loading) or `"ok"` (every rank
    reads its shards as stored); the sentence gives what the worst rank reads of the checkpoint and holds."""
    from ..units import format_bytes, format_int, ranks_text

    held, stored = load.rank_resident_bytes, load.rank_stored_bytes
    worst = max(range(len(held)), key=lambda r: (held[r], -r))
    after = load.rank_first_forward_bytes
    later = (f"; {format_int(after[worst])} B ({format_bytes(after[worst], unit)}) once compressed-tensors "
             "decompresses on the first forward") if after is not None else ""
    if stored is None:
        return "ok", (f"rank {worst} holds {format_int(held[worst])} B ({format_bytes(held[worst], unit)}) after the "
                      f"load (no checkpoint to read){later}")
    failing = sorted({r for i in load.issues if i.kind in ("raises", "shape") for r in i.ranks})
    figures = f"{format_int(stored[worst])} B ({format_bytes(stored[worst], unit)}) of the checkpoint"
    held_text = f"{format_int(held[worst])} B ({format_bytes(held[worst], unit)})"
    decompressed = len(load.decompressed)
    what = (f"the quantizer decompresses {decompressed} parameter famil{'y' if decompressed == 1 else 'ies'} while "
            "loading" if decompressed else "kept as stored")
    if failing:
        families = len({i.name for i in load.issues if i.kind in ("raises", "shape")})
        return "fail", (f"FAILS on {ranks_text(failing)}: transformers' own shard-on-read and conversion break "
                        f"{families} parameter famil{'y' if families == 1 else 'ies'} (TPA304); if it loaded, rank "
                        f"{worst} would read {figures} and hold {held_text} ({what})")
    if decompressed:
        return "decompress", f"rank {worst} reads {figures} and holds {held_text}: {what}{later}"
    return "ok", f"rank {worst} reads {figures}, {what}{later}"


def quantization_line(quant: dict | None) -> str | None:
    """The report's `model.quantization` section as one sentence, `None` for an unquantized checkpoint.

    `quant` is `QuantizationInfo.to_json()`: the `quant_method` of the checkpoint's `quantization_config`, the
    transformers quantizer that laid out the meta model (`ran`), whether it chose to dequantize, and why it could not
    run where it did not.
    """
    if not quant:
        return None
    method = quant.get("method")
    if quant.get("ran"):
        kept = "dequantized at load" if quant.get("dequantize") else "weights kept quantized"
        return f"{method}: laid out by transformers' {quant.get('quantizer')} ({kept})"
    if quant.get("refused"):
        return f"{method}: refused by from_pretrained (TPA206), not laid out by a quantizer"
    return f"{method}: not laid out by a quantizer" + (f" ({quant['reason']})" if quant.get("reason") else "")
