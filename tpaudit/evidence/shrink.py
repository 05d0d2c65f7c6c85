"""Shrinking a config: every width scaled down so that each split `tp_size` makes of the real model keeps its
structure (`shrink_config`), for the small model of the parity check (`small_model.py`). Config attribute names come
from `tpaudit.metamodel.vocabulary`, the one table of them.
"""

from __future__ import annotations

import copy
import math

from ..metamodel import vocabulary as V

MIN_VOCAB = 64
HEAD_DIM_FLOOR = 8
WIDTH_FLOOR = 8
HIDDEN_FLOOR = 16
EXPERT_FLOOR = 16


def _same_residue(x: int, modulus: int, floor: int, extra=()) -> int:
    """Smallest `v` with `floor <= v <= x`, `v % modulus == x % modulus` and, for every divisor `d` in `extra`,
    `v % d == 0` exactly when `x % d == 0`; `x` itself when no smaller value qualifies."""
    if x <= floor:
        return x
    for v in range(floor, x):
        if v % modulus == x % modulus and all((v % d == 0) == (x % d == 0) for d in extra if d > 0):
            return v
    return x


def _rotary_fractions(d: dict) -> list[float]:
    """Every rotary fraction (`partial_rotary_factor`, `rotary_pct`) in a config dict, nested RoPE dicts included."""
    out = []
    for k, v in d.items():
        if k in V.ROTARY_FRACTION.attrs and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, dict) and (V.ROPE_MARK in k or any(isinstance(x, dict) for x in v.values())):
            out.extend(_rotary_fractions(v))
    return out


def _rope_has_lists(d: dict) -> bool:
    """RoPE parameters with per-dimension lists (`mrope_section`, LongRoPE factors) are laid out for the real head
    dim: the small model keeps it."""
    for k, v in d.items():
        if (V.ROPE_MARK in k) and isinstance(v, dict):
            stack = [v]
            while stack:
                cur = stack.pop()
                for x in cur.values():
                    if isinstance(x, (list, tuple)) and len(x) > 1:
                        return True
                    if isinstance(x, dict):
                        stack.append(x)
    return False


def key_of(d: dict, names) -> str | None:
    """The first of `names` that `d` holds as an int (not a bool)."""
    return next((k for k in names if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def shrink_config(config_dict: dict, tp_size: int, *, keep_head_widths: bool = False
                  ) -> tuple[dict, dict[str, list[int]]]:
    """Scale a config dict down so that every split `tp_size` makes of the real model keeps its structure.

    The rule (`m = 2 * tp_size`): a width `x` becomes the smallest `v >= floor` with `v % m == x % m`, so `v` is
    divisible by `tp_size` (and by 2) exactly when `x` is, and leaves the same remainder when it is not. Head and
    KV-head counts, layer types and every ratio the forward reads (rotary fractions) are kept. Scaled:

    - head dims (`head_dim`, `global_head_dim`, `linear_key_head_dim`, `linear_value_head_dim`, MLA's
      `qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`, and `head_dim` overrides in `per_layer_config`): each
      distinct real width to a distinct small one in the same order (floor 8), so wider heads stay wider, and a
      rotary fraction of it stays an even integer; attention head dims stay real when the RoPE parameters carry
      per-dimension lists such as `mrope_section`;
    - `hidden_size` (`n_embd`, `d_model`): `heads * head_dim` when the real config has `hidden == heads * head_dim`
      (its head dim is derived), else scaled on its own (floor 16) keeping divisibility by the head counts;
    - intermediate sizes (`intermediate_size`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
      `ffn_hidden_size`, `n_inner`, ...; floor 8), MLA ranks (`q_lora_rank`, `kv_lora_rank`; floor 8),
      `vocab_size` (floor 64), nested sub-config dicts (DBRX's `ffn_config`) included;
    - the routed-expert count (`num_experts`, `num_local_experts`, `n_routed_experts`) when the config names its top-k
      (floor 16 and twice the top-k; see `_shrink_experts`): every expert costs a load and a loop step on each rank,
      and 256 of them cost DeepSeek-V3's check seconds for no more evidence than 16 give.

    The layer count is not changed here (`build_small_model` keeps one layer of each kind). Attribute names:
    `tpaudit.metamodel.vocabulary`.

    Args:
        config_dict (`dict`): `PretrainedConfig.to_dict()` of the (text) config.
        tp_size (`int`): the tp_size whose splits must keep their structure.
        keep_head_widths (`bool`, *optional*, defaults to `False`): keep the attention head widths real (as for
            per-dimension RoPE lists), for a model whose code lays RoPE out for its real head width without the
            config saying so (Ernie-4.5-VL-MoE's default `mrope_section` `[22, 22, 20]` lives in its RoPE code).

    Returns:
        `(small_dict, shrunk)`: the new dict and `{attribute: [real, small]}` for what changed.
    """
    d = copy.deepcopy(config_dict)
    m = 2 * tp_size
    shrunk: dict[str, list[int]] = {}

    def put(target: dict, key: str, value: int, label: str) -> None:
        if target.get(key) != value:
            shrunk[label] = [target[key], value]
            target[key] = value

    def put_new(target: dict, key: str, value: int, label: str, real: int) -> None:
        if target.get(key, real) != value:
            shrunk[label] = [real, value]
            target[key] = value

    heads_key, kv_key = key_of(d, V.ATTENTION_HEADS.attrs), key_of(d, V.KV_HEADS.attrs)
    hidden_key = key_of(d, V.HIDDEN.attrs)
    heads = d.get(heads_key) if heads_key else None
    kv_heads = d.get(kv_key) if kv_key else None
    hidden = d.get(hidden_key) if hidden_key else None
    fractions = _rotary_fractions(d)
    rotary_dim_key = V.ROTARY_DIM.canonical
    rotary_dim = d.get(rotary_dim_key) if isinstance(d.get(rotary_dim_key), int) else None
    keep_heads = keep_head_widths or _rope_has_lists(d)
    head_dim = V.HEAD_DIM_SUFFIX

    def head_ok(v: int, real: int) -> bool:
        if any(not float(v * f).is_integer() or int(v * f) % 2 for f in fractions):
            return False
        return not (rotary_dim and (rotary_dim * v) % real or rotary_dim and (rotary_dim * v // real) % 2)

    derived_head = heads and hidden and (not isinstance(d.get(head_dim), int) or d[head_dim] * heads == hidden)
    real_head = d[head_dim] if isinstance(d.get(head_dim), int) else (hidden // heads if derived_head else None)
    if keep_head_widths and derived_head and real_head and not isinstance(d.get(head_dim), int):
        # the real head width named, so that the hidden size can still shrink (transformers reads `head_dim` first)
        d[head_dim], derived_head = real_head, False

    # Every per-head width of the config (top level, and per-layer overrides such as Gemma 4's global layers), each
    # distinct real value to a distinct small one in the same order, so layers with wider heads keep wider heads.
    per_layer_key, derived_key = V.PER_LAYER_CONFIG.canonical, V.MLA_QK_HEAD_DIM.canonical
    per_layer = d.get(per_layer_key) if isinstance(d.get(per_layer_key), dict) else {}
    head_keys = [k for k in d if k.endswith(head_dim) and k != derived_key and isinstance(d[k], int)]
    nope, rope = V.MLA_NOPE_HEAD_DIM.canonical, V.MLA_ROPE_HEAD_DIM.canonical
    # per-dimension RoPE lists (`mrope_section`) are laid out for the rotary head width: MLA's rope part included
    rope_keys = {head_dim, "global_" + head_dim, rope} if keep_heads else set()

    def layer_heads(override: dict) -> list[str]:
        return [k for k, v in override.items() if k.endswith(head_dim) and k != derived_key and k not in rope_keys
                and isinstance(v, int) and not isinstance(v, bool)]

    reals = sorted({d[k] for k in head_keys if k not in rope_keys}
                   | {o[k] for o in per_layer.values() if isinstance(o, dict) for k in layer_heads(o)})
    # a width kept real for the RoPE lists is a fixed point: a wider head stays wider than it (Hunyuan-V4's indexer
    # head holds the rope part: `index_head_dim >= qk_rope_head_dim`)
    kept = {d[k] for k in head_keys if k in rope_keys}
    small_of: dict[int, int] = {}
    low = HEAD_DIM_FLOOR
    for real in reals:
        low = max([low] + [k + 1 for k in kept if k < real])
        v = next((v for v in range(low, real) if v % m == real % m and head_ok(v, real)), real)
        small_of[real] = v
        low = v + 1
    for key in head_keys:
        if key not in rope_keys:
            put(d, key, small_of[d[key]], key)
    real_top = {k: config_dict[k] for k in (head_dim, nope, rope) if isinstance(config_dict.get(k), int)}
    for layer, override in per_layer.items():
        if not isinstance(override, dict):
            continue
        real_override = (config_dict.get(per_layer_key) or {}).get(layer) or {}
        real_layer = {**real_top, **{k: real_override[k] for k in (head_dim, nope, rope)
                                     if isinstance(real_override.get(k), int)}}
        for key in layer_heads(override):
            put(override, key, small_of[override[key]], f"{per_layer_key}.{layer}.{key}")
        _keep_mla_sum(real_layer, {**d, **override}, lambda v, o=override, lay=layer: put_new(
            o, head_dim, v, f"{per_layer_key}.{lay}.{head_dim}", real_layer[head_dim]))
    _keep_mla_sum(real_top, d, lambda v: put(d, head_dim, v, head_dim))
    if isinstance(d.get(derived_key), int) and isinstance(d.get(nope), int):
        put(d, derived_key, d[nope] + d.get(rope, 0), derived_key)
    if derived_head and real_head:
        small_head = d[head_dim] if isinstance(d.get(head_dim), int) else small_of.get(real_head)
        if small_head is None and keep_head_widths:
            small_head = real_head
        if small_head is None:
            small_head = next((v for v in range(HEAD_DIM_FLOOR, real_head) if v % m == real_head % m
                               and head_ok(v, real_head)), real_head)
        put(d, hidden_key, heads * small_head, hidden_key)
    elif hidden_key:
        extra = [x for x in (heads, kv_heads, 2 * (heads or 0)) if x]
        put(d, hidden_key, _same_residue(hidden, m, HIDDEN_FLOOR, extra), hidden_key)
    if rotary_dim and real_head and derived_head:
        put(d, rotary_dim_key, rotary_dim * (d[hidden_key] // heads) // real_head, rotary_dim_key)

    def widths(target: dict, prefix: str) -> None:
        for k in V.attrs_of(*V.SCALED_WIDTHS):
            if isinstance(target.get(k), int) and not isinstance(target.get(k), bool):
                put(target, k, _same_residue(target[k], m, WIDTH_FLOOR), prefix + k)
            elif isinstance(target.get(k), list) and target[k] and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in target[k]):
                # one width per expert kind (Ernie-4.5-VL-MoE's text and vision experts): each scaled alone
                small = [_same_residue(x, m, WIDTH_FLOOR) for x in target[k]]
                for i, (x, v) in enumerate(zip(target[k], small)):
                    if x != v:
                        shrunk[f"{prefix}{k}.{i}"] = [x, v]
                target[k] = small
        for k, v in list(target.items()):
            if isinstance(v, dict) and k not in V.UNSCALED_SUBCONFIGS and V.ROPE_MARK not in k:
                widths(v, f"{prefix}{k}.")

    widths(d, "")
    _shrink_experts(d, m, put)
    for k in V.attrs_of(*V.EMBEDDING_ROWS):
        if isinstance(d.get(k), int) and d[k] > MIN_VOCAB:
            put(d, k, _same_residue(d[k], m, MIN_VOCAB), k)
    return d, shrunk


def _keep_mla_sum(real: dict, small: dict, set_head) -> None:
    """A head width the real config (or one layer of it) defines as the sum of MLA's parts (`head_dim ==
    qk_nope_head_dim + qk_rope_head_dim`, which Dots 3's validator requires of its sliding layers) stays their sum in
    the small config: `set_head` is called with the small sum. Each part keeps its residue, so the sum does too."""
    head_dim, nope, rope = V.HEAD_DIM_SUFFIX, V.MLA_NOPE_HEAD_DIM.canonical, V.MLA_ROPE_HEAD_DIM.canonical
    if all(isinstance(real.get(k), int) for k in (head_dim, nope, rope)) and real[head_dim] == real[nope] + real[rope] \
            and all(isinstance(small.get(k), int) for k in (nope, rope)):
        set_head(small[nope] + small[rope])


def _shrink_experts(d: dict, m: int, put) -> None:
    """Scale the routed-expert count of a config dict down (see `shrink_config`), in place.

    The count `E` becomes the smallest `v >= max(EXPERT_FLOOR, 2 * top_k)` with `v % m == E % m`, so `tp_size` (and
    an `ep_size` up to it) divides `v` exactly when it divides `E`, the router still picks a strict subset of `v`
    experts, and group-limited routing (`n_group`, `topk_group`: DeepSeek-V3's) still has `n_group` equal groups of
    at least 2 experts whose `topk_group` best hold `top_k` of them. Only the counts whose top-k the config names
    (`num_experts_per_tok`, `top_k_experts`) are scaled; any other layout keeps its real count.
    """
    key, top_key = key_of(d, V.EXPERTS.attrs), key_of(d, V.EXPERTS_TOP_K.attrs)
    if not key or not top_key:
        return
    real, top_k = d[key], d[top_key]
    group_key, top_group_key = V.EXPERT_GROUPS.canonical, V.EXPERT_GROUPS_PICKED.canonical
    groups = d.get(group_key) if isinstance(d.get(group_key), int) and d.get(group_key, 0) > 1 else 1
    top_groups = d.get(top_group_key) if isinstance(d.get(top_group_key), int) else groups

    def fits(v: int) -> bool:
        return (v % m == real % m and v % groups == 0 and (groups == 1 or v // groups >= 2)
                and top_groups * (v // groups) >= top_k)

    floor = max(EXPERT_FLOOR, 2 * top_k)
    # past one period of every residue the rule asks about, no new value can fit: search no further (a config with
    # contradictory groups and a count of 10^12 keeps its count instead of scanning to it)
    stop = min(real, floor + math.lcm(m, groups) * (top_k + 2))
    if real > floor:
        put(d, key, next((v for v in range(floor, stop) if fits(v)), real), key)
