"""THE config-attribute names the evidence stage reads, in one place.

Every list of transformers config attribute names the parity check uses (to shrink a config into a small model, to
filter the projections that may need evidence) lives here and nowhere else in `tpaudit.evidence`: a new spelling of
a width, a head count or an expert count is one entry here. (The whole tool's vocabulary is to move into one table
later; this module is the evidence stage's part of it.)
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------------------------------------------
# Shrinking a config (`small_model.shrink_config`)
# ----------------------------------------------------------------------------------------------------------------------
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "n_embed")
"""The residual width."""

INTERMEDIATE_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "ffn_hidden_size", "n_inner", "ffn_dim", "expert_intermediate_size", "dense_intermediate_size",
                     "expert_ffn_hidden_size")
"""MLP and expert widths (top level and in nested sub-config dicts such as DBRX's `ffn_config`)."""

RANK_KEYS = ("q_lora_rank", "kv_lora_rank")
"""MLA's low-rank widths."""

VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")
"""Embedding rows."""

HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
"""Attention head counts (kept as they are)."""

KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "num_global_key_value_heads")
"""Key/value head counts (kept as they are)."""

LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers")
"""The decoder layer count (one layer of each kind is kept)."""

ROTARY_FRACTION_KEYS = ("partial_rotary_factor", "rotary_pct")
"""Fractions of a head that rotary embeddings cover (a small head keeps an even rotary width)."""

ROTARY_DIM_KEY = "rotary_dim"
"""An absolute rotary width (scaled with the head)."""

HEAD_DIM_SUFFIX = "head_dim"
"""Every attribute ending in it is a per-head width (`head_dim`, `global_head_dim`, `linear_key_head_dim`, MLA's
`qk_rope_head_dim`, ...), scaled distinct-to-distinct in order."""

DERIVED_HEAD_DIM_KEY = "qk_head_dim"
"""MLA's `qk_nope_head_dim + qk_rope_head_dim`: recomputed, not scaled on its own."""

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Routed-expert counts."""

TOP_K_KEYS = ("num_experts_per_tok", "top_k_experts")
"""The router's top-k (an expert count is scaled only when the config names it)."""

GROUP_KEYS = ("n_group", "topk_group")
"""Group-limited routing (DeepSeek-V3): groups of experts, and how many groups the router picks from."""

FIRST_DENSE_KEY = "first_k_dense_replace"
"""Layers before the first MoE layer (recounted over the layers kept)."""

PER_LAYER_KEY = "per_layer_config"
"""transformers' heterogeneous per-layer overrides (Gemma 4's global layers), keyed by layer index."""

UNSCALED_SUBCONFIGS = ("quantization_config", "id2label", "label2id")
"""Nested dicts that hold no widths."""

SPECIAL_TOKEN_SUFFIXES = ("_token_id", "_token_index", "_token_ids")
"""Token ids the config names (remapped into the small vocabulary)."""

DROPPED_KEYS = ("torch_dtype", "_name_or_path", "architectures", "transformers_version")
"""Config entries the small model does not carry over."""

# ----------------------------------------------------------------------------------------------------------------------
# Which projections may need evidence (`stage.candidates`)
# ----------------------------------------------------------------------------------------------------------------------
SINGLE_WIDTH_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "vocab_size", "q_lora_rank", "kv_lora_rank", "ffn_hidden_size", "n_inner", "d_ff")
"""Config attributes whose value is the output width of a single (unfused) projection."""

SINGLE_HEAD_KEYS = ("num_attention_heads", "num_key_value_heads", "num_global_key_value_heads",
                    "linear_num_key_heads", "linear_num_value_heads")
"""Head counts whose product with a head dim is a single projection's width."""

SINGLE_HEAD_DIM_KEYS = ("head_dim", "linear_key_head_dim", "linear_value_head_dim", "qk_head_dim", "v_head_dim",
                        "qk_nope_head_dim", "global_head_dim")
"""Head dims for the same products."""

MLA_QK_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim")
"""MLA's query/key head parts, whose sum is one head."""

ROPE_MARK = "rope"
"""A config entry whose name holds it is a RoPE parameter dict (per-dimension lists keep the real head dim)."""

LAYER_LIST_MARK = "layer"
"""A list of ints whose name holds it lists layer indices (`mlp_only_layers`, ...), renumbered over the kept
layers."""

QUANTIZATION_KEY = "quantization_config"
"""Dropped: the small model runs unquantized."""

VOCAB_KEY = "vocab_size"
"""The vocabulary special token ids are remapped into."""
