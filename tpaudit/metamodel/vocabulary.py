"""THE vocabulary of model facts: every config attribute name and module leaf name tpaudit knows a role for, once.

transformers answers most questions about a model itself (its text config, per-layer configs, `get_head_shapes`, the
modules' in/out features, the quantizer's config: `tpaudit.metamodel.facts` reads those through the seam). Where it has
no answer, tpaudit must know how architectures spell a fact: that GPT-J calls the residual width `n_embd`, that LongCat
calls its experts' width `expert_ffn_hidden_size`, that DeepSeek-V4's key projection is `kv_proj`. Those spellings
live here and nowhere else: a new spelling of a width, a head count or a projection name is one line in one entry.

- `ConfigRole`: a role a config attribute plays (the residual width, the KV-head count, ...) -> every spelling of it,
  the canonical one (what a finding names when the config has none of them) first.
- `ModuleRole`: a role a module plays in a decoder layer (the key projection, a fused gate/up projection, ...) ->
  every leaf name (the last component of the module's path) that plays it.
- the rest: values and marks of the same kind (layer types, the names of text sub-configs, the marks the small
  model's config shrinking follows).

Who reads it: `metamodel/facts.py` (at build time), the checks (`checks/*.py`), the KV-cache section
(`shard/kvcache.py`), sizing (`sizing/`) and the evidence stage (`evidence/`: which projections need evidence, and the
small model's config shrinking, which edits a config dict by these names).

What "every attribute transformers uses for a role" means is mechanical (`tests/test_vocabulary.py`): every int
attribute of the text config of a model type whose text config declares a `base_model_tp_plan`, whose name matches
one of `ROLE_FAMILIES`, is either a spelling of some role here or listed in `NOT_A_ROLE` with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..compat.styles import PACKED_COLWISE


@dataclass(frozen=True)
class ConfigRole:
    """A role a config attribute plays, and every spelling transformers' configs use for it.

    Attributes:
        name (`str`): the role (`"kv_heads"`).
        attrs (`tuple[str, ...]`): the spellings, the canonical one first (the name a finding gives when the config
            has none of them); earlier spellings win when a config has several.
        doc (`str`): what the value is, and who reads it.
    """

    name: str
    attrs: tuple[str, ...]
    doc: str

    def __contains__(self, attr: str) -> bool:
        return attr in self.attrs

    @property
    def canonical(self) -> str:
        """The first spelling (`num_key_value_heads`)."""
        return self.attrs[0]


@dataclass(frozen=True)
class ModuleRole:
    """A role a module plays, and every leaf name (the last component of its path) transformers' models use for it.

    Attributes:
        name (`str`): the role (`"key"`).
        leaves (`tuple[str, ...]`): the leaf names (`k_proj`, `key`, `wk`).
        doc (`str`): what the module computes, and who reads it.
    """

    name: str
    leaves: tuple[str, ...]
    doc: str

    def __contains__(self, leaf: str) -> bool:
        return leaf in self.leaves


# ======================================================================================================================
# Config attributes: widths
# ======================================================================================================================
HIDDEN = ConfigRole("hidden", ("hidden_size", "n_embd", "d_model", "n_embed"),
                    "The residual width: every projection's input or output (`o_proj`, `down_proj`).")
INTERMEDIATE = ConfigRole(
    "intermediate",
    ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "d_ff", "dense_intermediate_size",
     "intermediate_size_mlp", "prefix_dense_intermediate_size", "mlp_only_intermediate_size"),
    "A dense MLP's hidden width (`gate_proj`/`up_proj` output). Llama 4 gives its dense layers' width as "
    "`intermediate_size_mlp` (its `intermediate_size` is the experts'), MiniMax-M3 and Cohere2-MoE their dense prefix "
    "layers' as `dense_intermediate_size` / `prefix_dense_intermediate_size`, Kolibri 1.1 (transformers 5.25) its "
    "`mlp_only_layers`' as `mlp_only_intermediate_size`.")
EXPERT_INTERMEDIATE = ConfigRole(
    "expert_intermediate", ("moe_intermediate_size", "expert_intermediate_size", "expert_ffn_hidden_size"),
    "A routed expert's hidden width (LongCat-Flash: `expert_ffn_hidden_size`).")
SHARED_EXPERT_INTERMEDIATE = ConfigRole(
    "shared_expert_intermediate",
    ("shared_expert_intermediate_size", "shared_experts_intermediate_size", "shared_intermediate_size",
     "moe_shared_expert_intermediate_size", "share_expert_dim"),
    "The always-active shared expert's hidden width (Granite-MoE-shared: `shared_intermediate_size`, Step-3.5: "
    "`share_expert_dim`).")
VOCAB = ConfigRole("vocab", ("vocab_size",), "Rows of the token embedding and the `lm_head`.")
PER_LAYER_VOCAB = ConfigRole("per_layer_vocab", ("vocab_size_per_layer_input",),
                             "Rows of Gemma 3n/4's per-layer input embeddings (`embed_tokens_per_layer`).")
HEAD_ROWS = ConfigRole(
    "head_rows", ("unpadded_vocab_size", "output_vocab_size", "vision_vocab_size"),
    "Rows an output head holds when they are not `vocab_size`: an unpadded (Inkling) or pruned (Apertus 1.5) "
    "`lm_head`, GLM-Image's image-token head. Not scaled by the small model's shrinking, which keeps the relation to "
    "`vocab_size` unknown.")
Q_LORA_RANK = ConfigRole("q_lora_rank", ("q_lora_rank",),
                         "MLA's query down-projection width (`q_a_proj` output; kept whole by design, TPA001).")
KV_LORA_RANK = ConfigRole("kv_lora_rank", ("kv_lora_rank",),
                          "MLA's latent KV width (`kv_a_proj_with_mqa` output less the rope part; what MLA caches).")
O_LORA_RANK = ConfigRole("o_lora_rank", ("o_lora_rank",),
                         "DeepSeek-V4's grouped low-rank output projection width (`o_a_proj` output per group).")

# ======================================================================================================================
# Config attributes: head counts and head widths
# ======================================================================================================================
ATTENTION_HEADS = ConfigRole(
    "attention_heads",
    ("num_attention_heads", "n_head", "n_heads", "num_heads", "swa_num_attention_heads",
     "num_sliding_attention_heads", "num_attention_heads_per_layer"),
    "Query heads of the attention layers; then sliding-window layers' own count where it differs (Inkling 2, "
    "Step-3.5/3.7) and Laguna's per-layer list. Checks read the first spelling a config has (TPA101).")
KV_HEADS = ConfigRole(
    "kv_heads",
    ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "num_global_key_value_heads", "swa_num_key_value_heads"),
    "Key/value heads of the attention layers (what a rank's KV cache holds, TPA102); the last two are the count of "
    "Gemma 4's global layers and of Inkling 2's sliding layers where it differs. Per-layer values come from "
    "transformers' `get_head_shapes`; these names say which attribute set a value (a finding's target).")
LINEAR_KEY_HEADS = ConfigRole("linear_key_heads", ("linear_num_key_heads",),
                              "Gated DeltaNet linear attention's key heads (Qwen3-Next, Qwen3.5).")
LINEAR_VALUE_HEADS = ConfigRole("linear_value_heads", ("linear_num_value_heads",),
                                "Gated DeltaNet linear attention's value heads (its recurrent state's rows).")
LINEAR_HEADS = ConfigRole("linear_heads", ("linear_num_heads",),
                          "Kimi Delta Attention's heads, one count for keys and values (Kimi Linear, GLM-5 Next).")
MAMBA_HEADS = ConfigRole("mamba_heads", ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads"),
                         "State-space (Mamba-2) heads: a fixed-size state, no per-token cache; no rule of the shipped "
                         "plans splits them.")
INDEXER_HEADS = ConfigRole("indexer_heads", ("index_n_heads", "indexer_n_heads", "indexer_kv_heads"),
                           "Heads of a sparse-attention indexer (DeepSeek-V3.2's lightning indexer, Qwen4-Exp's).")
HEAD_DIM = ConfigRole(
    "head_dim", ("head_dim", "global_head_dim", "swa_head_dim"),
    "Width of one attention head; Gemma 4's global layers and Inkling 2's sliding layers have their own.")
LINEAR_KEY_HEAD_DIM = ConfigRole("linear_key_head_dim", ("linear_key_head_dim",),
                                 "Width of one Gated DeltaNet key head.")
LINEAR_VALUE_HEAD_DIM = ConfigRole("linear_value_head_dim", ("linear_value_head_dim",),
                                   "Width of one Gated DeltaNet value head.")
LINEAR_HEAD_DIM = ConfigRole("linear_head_dim", ("linear_head_dim",),
                             "Width of one Kimi Delta Attention head (keys and values alike).")
MLA_NOPE_HEAD_DIM = ConfigRole("mla_nope_head_dim", ("qk_nope_head_dim",),
                               "MLA's query/key head part without rotary embedding.")
MLA_ROPE_HEAD_DIM = ConfigRole("mla_rope_head_dim", ("qk_rope_head_dim",),
                               "MLA's query/key head part with rotary embedding (shared by every head in the latent "
                               "cache).")
MLA_QK_HEAD_DIM = ConfigRole("mla_qk_head_dim", ("qk_head_dim",),
                             "MLA's whole query/key head, `qk_nope_head_dim + qk_rope_head_dim` (derived by the "
                             "config).")
MLA_V_HEAD_DIM = ConfigRole("mla_v_head_dim", ("v_head_dim",),
                            "MLA's value head. The cache of transformers' MLA layers stores every head's expanded key "
                            "(`qk_nope_head_dim + qk_rope_head_dim`) and value (`v_head_dim`).")
MAMBA_HEAD_DIM = ConfigRole("mamba_head_dim", ("mamba_head_dim",), "Width of one state-space head.")
INDEXER_HEAD_DIM = ConfigRole("indexer_head_dim", ("index_head_dim", "indexer_head_dim"),
                              "Width of one sparse-attention indexer head.")

# ======================================================================================================================
# Config attributes: counts and layout
# ======================================================================================================================
LAYERS = ConfigRole("layers", ("num_hidden_layers", "n_layer", "n_layers"),
                    "Decoder layers (one `LayerFacts` each; the small model keeps one of each kind).")
EXPERTS = ConfigRole("experts", ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
                     "Routed experts per MoE layer (a router's output width, TPA001; an `ep_size` must divide it).")
SHARED_EXPERTS = ConfigRole("shared_experts", ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"),
                            "Always-active shared experts per MoE layer.")
EXPERTS_TOP_K = ConfigRole(
    "experts_top_k",
    ("num_experts_per_tok", "top_k_experts", "num_experts_per_token", "moe_k", "moe_topk", "moe_top_k"),
    "Experts the router picks per token (not an expert count).")
EXPERT_GROUPS = ConfigRole("expert_groups", ("n_group",),
                           "Groups of experts of group-limited routing (DeepSeek-V3).")
EXPERT_GROUPS_PICKED = ConfigRole("expert_groups_picked", ("topk_group",),
                                  "Groups the group-limited router picks its experts from.")
FIRST_DENSE_LAYERS = ConfigRole("first_dense_layers", ("first_k_dense_replace",),
                                "Dense layers before the first MoE layer (DeepSeek-V3).")
KV_SHARED_LAYERS = ConfigRole("kv_shared_layers", ("num_kv_shared_layers",),
                              "Trailing layers that reuse earlier layers' KV states (all of them: an assistant model "
                              "that reads its target model's).")
ROTARY_FRACTION = ConfigRole("rotary_fraction", ("partial_rotary_factor", "rotary_pct"),
                             "The fraction of a head rotary embeddings cover.")
ROTARY_DIM = ConfigRole("rotary_dim", ("rotary_dim",), "An absolute rotary width.")
LAYER_TYPES = ConfigRole("layer_types", ("layer_types",),
                         "Each layer's attention kind (`full_attention`, `sliding_attention`, `linear_attention`).")
PER_LAYER_CONFIG = ConfigRole("per_layer_config", ("per_layer_config",),
                              "transformers' heterogeneous per-layer overrides (Gemma 4's global layers), by layer.")
SLIDING_WINDOW = ConfigRole("sliding_window", ("sliding_window",), "Tokens a sliding-window layer keeps.")
ATTENTION_CHUNK = ConfigRole("attention_chunk", ("attention_chunk_size",), "Tokens a chunked-attention layer keeps.")
LINEAR_CONV_KERNEL = ConfigRole("linear_conv_kernel", ("linear_conv_kernel_dim",),
                                "Gated DeltaNet's short convolution width (its conv state per sequence).")
MAX_POSITIONS = ConfigRole("max_positions", ("max_position_embeddings",),
                           "The longest context the model is configured for (`tpaudit size`'s cap).")
QUANTIZATION = ConfigRole("quantization", ("quantization_config",), "The pre-quantized checkpoint's scheme.")

CONFIG_ROLES: tuple[ConfigRole, ...] = (
    HIDDEN, INTERMEDIATE, EXPERT_INTERMEDIATE, SHARED_EXPERT_INTERMEDIATE, VOCAB, PER_LAYER_VOCAB, HEAD_ROWS,
    Q_LORA_RANK, KV_LORA_RANK, O_LORA_RANK,
    ATTENTION_HEADS, KV_HEADS, LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS, LINEAR_HEADS, MAMBA_HEADS, INDEXER_HEADS,
    HEAD_DIM, LINEAR_KEY_HEAD_DIM, LINEAR_VALUE_HEAD_DIM, LINEAR_HEAD_DIM, MLA_NOPE_HEAD_DIM, MLA_ROPE_HEAD_DIM,
    MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM, MAMBA_HEAD_DIM, INDEXER_HEAD_DIM,
    LAYERS, EXPERTS, SHARED_EXPERTS, EXPERTS_TOP_K, EXPERT_GROUPS, EXPERT_GROUPS_PICKED, FIRST_DENSE_LAYERS,
    KV_SHARED_LAYERS, ROTARY_FRACTION, ROTARY_DIM, LAYER_TYPES, PER_LAYER_CONFIG, SLIDING_WINDOW, ATTENTION_CHUNK, LINEAR_CONV_KERNEL,
    MAX_POSITIONS, QUANTIZATION,
)
"""Every config role, each once."""

# What the consumers ask for, as unions of roles (in the order a name is preferred when several hold a value)
SPLIT_SIZES: tuple[ConfigRole, ...] = (EXPERT_INTERMEDIATE, SHARED_EXPERT_INTERMEDIATE, INTERMEDIATE, VOCAB,
                                       HIDDEN, EXPERTS, LINEAR_VALUE_HEADS, LINEAR_KEY_HEADS)
"""Roles whose value sizes a dimension a rule splits, in the order TPA101 prefers a name for a size."""
MLP_WIDTHS: tuple[ConfigRole, ...] = (INTERMEDIATE, EXPERT_INTERMEDIATE, SHARED_EXPERT_INTERMEDIATE)
"""Every MLP hidden width (dense, routed expert, shared expert)."""
SCALED_WIDTHS: tuple[ConfigRole, ...] = (INTERMEDIATE, EXPERT_INTERMEDIATE, SHARED_EXPERT_INTERMEDIATE, Q_LORA_RANK,
                                         KV_LORA_RANK)
"""Widths the small model of the parity check scales each on its own (top level and in nested sub-config dicts such
as DBRX's `ffn_config`)."""
EMBEDDING_ROWS: tuple[ConfigRole, ...] = (VOCAB, PER_LAYER_VOCAB)
"""Embedding rows the small model scales (each to at least 64)."""
SINGLE_OUTPUTS: tuple[ConfigRole, ...] = (HIDDEN, INTERMEDIATE, EXPERT_INTERMEDIATE, SHARED_EXPERT_INTERMEDIATE,
                                          VOCAB, HEAD_ROWS, Q_LORA_RANK, KV_LORA_RANK)
"""Roles whose value is the output width of one single (unfused) projection."""
SINGLE_HEADS: tuple[ConfigRole, ...] = (ATTENTION_HEADS, KV_HEADS, LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS,
                                        LINEAR_HEADS, INDEXER_HEADS)
"""Head counts whose product with a head width is one single projection's output width."""
SINGLE_HEAD_DIMS: tuple[ConfigRole, ...] = (HEAD_DIM, LINEAR_KEY_HEAD_DIM, LINEAR_VALUE_HEAD_DIM, LINEAR_HEAD_DIM,
                                            MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM, MLA_NOPE_HEAD_DIM, INDEXER_HEAD_DIM)
"""Head widths for the same products."""

# ======================================================================================================================
# Config values and marks
# ======================================================================================================================
NO_CACHE_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv", "recurrent", "rwkv", "moe", "mlp"})
"""`layer_types` entries whose layers keep a fixed-size state or no state at all, no per-token KV cache: linear
attention and state-space layers, and NemotronH's `moe` / `mlp` layers, which hold no attention."""
WINDOW_LAYER_TYPES: dict[str, ConfigRole] = {"sliding_attention": SLIDING_WINDOW,
                                             "chunked_attention": ATTENTION_CHUNK}
"""`layer_types` entries whose layers keep at most a window of tokens, and the attribute that sets the window."""
DEFAULT_LAYER_TYPE = "full_attention"
"""A layer's type when the config has no `layer_types`."""
TEXT_SUBCONFIGS = ("text_config", "decoder", "generator", "llm_config", "language_config")
"""Sub-configs of a composite `config.json` that hold the text model, as `PretrainedConfig.get_text_config` looks
for them (read from the `config.json` dict where no config object is at hand: `tpaudit size`'s context cap)."""
HEAD_DIM_SUFFIX = "head_dim"
"""Every attribute ending in it is a per-head width (the small model scales them distinct-to-distinct in order)."""
UNSCALED_SUBCONFIGS = ("quantization_config", "id2label", "label2id")
"""Nested dicts of a config that hold no widths."""
SPECIAL_TOKEN_SUFFIXES = ("_token_id", "_token_index", "_token_ids")
"""Token ids a config names (the small model remaps them into its small vocabulary)."""
DROPPED_KEYS = ("torch_dtype", "_name_or_path", "architectures", "transformers_version")
"""Config entries the small model does not carry over."""
ROPE_MARK = "rope"
"""A config entry whose name holds it is a RoPE parameter dict (per-dimension lists keep the real head dim)."""
LAYER_LIST_MARK = "layer"
"""A list of ints whose name holds it lists layer indices (`mlp_only_layers`, ...)."""

# ======================================================================================================================
# Module leaf names
# ======================================================================================================================
QUERY = ModuleRole("query", ("q_proj", "q_b_proj", "query", "wq"),
                   "Query projection: its output is split per attention head (TPA101).")
KEY = ModuleRole("key", ("k_proj", "key", "wk"),
                 "Key projection: its output rows are the layer's KV heads (TPA102, the KV-cache section); a layer's "
                 "separate key projection wins over a fused one.")
VALUE = ModuleRole("value", ("v_proj", "value", "wv"), "Value projection: split per KV head like the key.")
FUSED_KV = ModuleRole(
    "fused_kv", ("kv_proj",),
    "Key and value in one output, by KV head: DeepSeek-V4's shared-KV `kv_proj` (one head read as key and value), "
    "JetMoE's `[k; v]`. Carries the layer's keys (TPA102).")
MLA_KV_UP = ModuleRole(
    "mla_kv_up", ("kv_b_proj",),
    "MLA's key/value up-projection: per attention head (split like the query), and the module that carries the "
    "layer's expanded keys.")
FUSED_QKV = ModuleRole("fused_qkv", ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv"),
                       "Query, key and value in one output (a fused projection: its split needs evidence, TPA501).")
OUTPUT = ModuleRole("output", ("o_proj", "wo"), "Attention output projection: its input is split per head.")
GENERIC_OUTPUT = ModuleRole("generic_output", ("dense", "out_proj"),
                            "Leaf names that are the attention output projection only below an attention module "
                            "(`ATTENTION_BLOCK`).")
ATTENTION_BLOCK = ModuleRole("attention_block", ("self_attn", "attn", "attention", "cross_attn"),
                             "The attention module of a decoder layer, parent of its projections.")
FUSED_GATE_UP = ModuleRole("fused_gate_up", ("gate_up_proj", "w13", "gate_up", "fc1_gate_up"),
                           f"Gate and up projections in one output (`{PACKED_COLWISE}` keeps both halves; TPA501).")
EMBEDDING = ModuleRole("embedding", ("embed_tokens", "lm_head", "wte", "word_embeddings"),
                       "Token embedding and output head: their rows are the vocabulary (TPA101 names `vocab_size`).")
DECODER_LAYERS = ModuleRole("decoder_layers", ("layers", "h"),
                            "The module list of decoder layers below the text model (`model.layers.N`, GPT-2-style "
                            "`transformer.h.N`): where a layer's key projection is looked for (TPA102, the KV-cache "
                            "section) and what TPA003 calls the decoder layers.")

MODULE_ROLES: tuple[ModuleRole, ...] = (QUERY, KEY, VALUE, FUSED_KV, MLA_KV_UP, FUSED_QKV, OUTPUT, GENERIC_OUTPUT,
                                        ATTENTION_BLOCK, FUSED_GATE_UP, EMBEDDING, DECODER_LAYERS)
"""Every module role, each once."""

KEY_CARRIERS: tuple[ModuleRole, ...] = (KEY, FUSED_KV, MLA_KV_UP, FUSED_QKV)
"""Modules whose output holds a layer's keys, the separate key projection first."""

ROUTER_LEAF = re.compile(r"(^|_)(gate|router)$")
"""A MoE router or gate by its leaf name (`gate`, `router`, `shared_expert_gate`): a fallback for routers whose
expert count the config names in no `EXPERTS` spelling."""
ROUTER_TYPE = re.compile(r"Router|TopK|Topk|MoeGate|MoEGate")
"""A MoE router by its module class name."""
SHARED_EXPERT_PATH = ".shared_expert"
"""A parameter path holding it belongs to a shared expert (its split dimension: `SHARED_EXPERT_INTERMEDIATE`)."""
EXPERTS_PATH = ".experts."
"""A parameter path holding it belongs to routed experts (`EXPERT_INTERMEDIATE`)."""
MLP_PATHS = (".mlp.", ".feed_forward.")
"""A parameter path holding one belongs to an MLP (`INTERMEDIATE`)."""

# ======================================================================================================================
# The boundary of the table (what `tests/test_vocabulary.py` holds it to)
# ======================================================================================================================
ROLE_FAMILIES: dict[str, re.Pattern] = {
    "heads": re.compile(r"heads|^n_head$"),
    "head widths": re.compile(r"head_dim"),
    "residual widths": re.compile(r"hidden_size|^n_embd$|^n_embed$|^d_model$"),
    "MLP widths": re.compile(r"intermediate_size|ffn_dim|ffn_hidden_size|^n_inner$|^d_ff$"),
    "experts": re.compile(r"experts|top_?k"),
    "low ranks": re.compile(r"lora_rank"),
    "vocabularies": re.compile(r"vocab_size"),
    "layers": re.compile(r"^num_hidden_layers$|^n_layers?$"),
}
"""Name patterns of the attributes a config uses for the roles above: every int attribute whose name matches one is
a spelling of a role or listed in `NOT_A_ROLE`."""

NOT_A_ROLE: dict[str, str] = {
    # heads
    "heads_per_ngram": "Qwen4-Exp's n-gram hash embedding heads (an embedding lookup, no attention head)",
    # residual widths
    "cross_attention_hidden_size": "T5Gemma: the encoder states' width its decoder cross-attends to (no decoder-only "
                                   "role)",
    "hidden_size_per_layer_input": "Gemma 3n/4's per-layer-embedding signal width: its projections are kept whole by "
                                   "transformers' plans and the small model keeps it",
    "out_hidden_size": "Muse Glimmer's vision-to-language projector output width (a tower's, not the decoder's)",
    "projector_hidden_size": "Muse Glimmer's / Cosmos3-Edge's vision projector MLP width (a tower's, not the "
                             "decoder's)",
    "moe_hidden_size": "Muse Spark's pooled width its experts run at (their input/output width, not an MLP hidden "
                       "width; the experts' hidden width is `moe_intermediate_size`)",
    # MLP widths
    "block_ffn_dim_multiplier": "LFM2's multiplier of its MLP width (a ratio, not a width)",
    # experts
    "index_topk": "tokens DeepSeek-V3.2's sparse-attention indexer keeps (top-k tokens, not experts)",
    "index_topk_blocks": "blocks MiniMax-M3's sparse-attention indexer keeps (not experts)",
    # heads
    "index_num_heads": "Kolibri 1.1's indexer scores keys with this many of the attention's own leading query heads "
                       "(a count of existing heads: no projection or cache of its own)",
    # vocabularies
    "ngram_vocab_size_base": "Qwen4-Exp's n-gram hash table base size (not token rows of an embedding or a head)",
    "make_ngram_vocab_size_divisible_by": "Qwen4-Exp's n-gram table padding multiple",
}
"""Attributes that match a `ROLE_FAMILIES` pattern but play none of the roles, each with the reason."""


def config_role(attr: str) -> ConfigRole | None:
    """The role an attribute name is a spelling of (the first, for a name in two roles), or `None`."""
    return next((r for r in CONFIG_ROLES if attr in r.attrs), None)


def attrs_of(*roles: ConfigRole) -> tuple[str, ...]:
    """Every spelling of `roles`, in order, each once."""
    return tuple(dict.fromkeys(a for r in roles for a in r.attrs))


def leaves_of(*roles: ModuleRole) -> frozenset[str]:
    """Every leaf name of `roles`."""
    return frozenset(leaf for r in roles for leaf in r.leaves)
