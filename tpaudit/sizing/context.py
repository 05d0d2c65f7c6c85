"""The longest context an option holds: the KV cache's bytes per rank for a context, and the exact largest context
that fits a rank's budget (the arithmetic `size` uses for `kv_cache_bytes` and `max_context_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..metamodel import vocabulary as V
from ..model import KVCacheSection


@dataclass(frozen=True)
class ContextFit:
    """The longest context one option holds.

    Attributes:
        bytes_left_for_kv_cache (`int`): `capacity - weights - overhead - linear-attention state` on the rank with
            the least room (negative when the weights alone do not fit).
        max_context_tokens (`int`, *optional*): the largest integer context whose KV cache for `batch` sequences
            fits on every rank, at most `cap_tokens`; 0 when not even one token fits; `None` when nothing limits it
            (no per-token cache growing with the context, and no `max_position_embeddings`).
        cap_tokens (`int`, *optional*): the text config's `max_position_embeddings`, `None` when it has none.
        limited_by (`str`): `"memory"`, `"max_position_embeddings"` (the cap is reached before memory runs out),
            `"weights"` (no room for even one token) or `"nothing"`.
        rank (`int`, *optional*): the rank whose memory limits the context (`None` unless `limited_by` is memory or
            weights).
    """

    bytes_left_for_kv_cache: int
    max_context_tokens: int | None
    cap_tokens: int | None
    limited_by: str
    rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The option's context keys: `bytes_left_for_kv_cache`, `max_context_tokens`, `max_context_cap_tokens`,
        `max_context_limited_by`, `max_context_rank`."""
        return {"bytes_left_for_kv_cache": self.bytes_left_for_kv_cache,
                "max_context_tokens": self.max_context_tokens, "max_context_cap_tokens": self.cap_tokens,
                "max_context_limited_by": self.limited_by, "max_context_rank": self.rank}


def _kv_bytes(kv: KVCacheSection, rank: int, context: int, batch: int, scale: float) -> int:
    """KV-cache bytes of `rank` for `batch` sequences of `context` tokens: full-context layers grow with `context`,
    windowed layers stop at their window; per-token bytes are in the model dtype, `scale` converts to the cache
    dtype, and the product is rounded once, to the nearest byte."""
    full = kv.full_context_bytes_per_token_per_rank[rank] * context
    windowed = sum(per_rank[rank] * min(int(w), context) for w, per_rank in kv.window_bytes_per_token_by_window.items())
    return int(round((full + windowed) * batch * scale))


def max_context_for_rank(kv: KVCacheSection, rank: int, batch: int, scale: float, budget: int) -> int | None:
    """The largest integer context `c` with `_kv_bytes(kv, rank, c, batch, scale) <= budget`.

    `_kv_bytes` does not decrease as the context grows, so an exponential then a binary search over it finds the
    exact bound with the same arithmetic (and rounding) the option's `kv_cache_bytes` uses.

    Args:
        kv (`KVCacheSection`): the report's `kv_cache` section.
        rank (`int`): the rank.
        batch (`int`): sequences.
        scale (`float`): cache itemsize / model itemsize.
        budget (`int`): bytes the rank has for its KV cache.

    Returns:
        The context in tokens (0 when not even one token fits), or `None` when the cache stops growing (only
        windowed layers, or none) and its largest size fits: no context is too long.
    """
    def fits(c: int) -> bool:
        return _kv_bytes(kv, rank, c, batch, scale) <= budget

    if not fits(1):
        return 0
    if kv.full_context_bytes_per_token_per_rank[rank] * scale * batch == 0:
        longest = max((int(w) for w in kv.window_bytes_per_token_by_window), default=1)
        if fits(longest):
            return None
        lo, hi = 1, longest            # fits(lo), not fits(hi)
    else:
        lo, hi = 1, 2
        while fits(hi):
            lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_position_embeddings(config: dict) -> int | None:
    """The text model's `max_position_embeddings` from a `config.json` dict: the first text sub-config that has it
    (`vocabulary.TEXT_SUBCONFIGS`: `text_config`, `decoder`, `generator`, `llm_config`, `language_config`, as
    transformers' `PretrainedConfig.get_text_config` looks for them), else the top level; `None` when neither says.
    Read from the file, not the built config, whose class may default a value `config.json` does not give."""
    name = V.MAX_POSITIONS.canonical
    for key in V.TEXT_SUBCONFIGS:
        sub = config.get(key)
        if isinstance(sub, dict) and isinstance(sub.get(name), int):
            return sub[name]
    value = config.get(name)
    return value if isinstance(value, int) and value > 0 else None


def context_fit(kv: KVCacheSection | None, param_bytes: tuple[int, ...], *, capacity_bytes: int, overhead_bytes: int,
                state_bytes: int, batch: int, scale: float, cap_tokens: int | None) -> ContextFit:
    """The longest context one option holds on every rank.

    Args:
        kv (`KVCacheSection`, *optional*): the report's `kv_cache` section (`None`: the model has no KV cache tpaudit knows).
        param_bytes (`tuple[int, ...]`): each rank's weights.
        capacity_bytes (`int`), overhead_bytes (`int`): per GPU.
        state_bytes (`int`): fixed per-rank state of linear-attention layers for `batch` sequences.
        batch (`int`): sequences.
        scale (`float`): cache itemsize / model itemsize.
        cap_tokens (`int`, *optional*): `max_position_embeddings`.

    Returns:
        `ContextFit`.
    """
    budgets = [capacity_bytes - b - overhead_bytes - state_bytes for b in param_bytes]
    left_rank = min(range(len(budgets)), key=lambda r: (budgets[r], r))
    left = budgets[left_rank]
    if kv is None:
        if left < 0:
            return ContextFit(left, 0, cap_tokens, "weights", left_rank)
        return ContextFit(left, cap_tokens, cap_tokens, "max_position_embeddings" if cap_tokens else "nothing")
    best, best_rank = None, None
    for r, budget in enumerate(budgets):
        tokens = max_context_for_rank(kv, r, batch, scale, budget) if budget >= 0 else 0
        if tokens is not None and (best is None or tokens < best):
            best, best_rank = tokens, r
    if best == 0:
        return ContextFit(left, 0, cap_tokens, "weights" if budgets[best_rank] < 0 else "memory", best_rank)
    if cap_tokens is not None and (best is None or best > cap_tokens):
        return ContextFit(left, cap_tokens, cap_tokens, "max_position_embeddings")
    if best is None:
        return ContextFit(left, None, None, "nothing")
    return ContextFit(left, best, cap_tokens, "memory", best_rank)
