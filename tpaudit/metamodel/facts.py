"""The model's facts, read once when the model is built (stage 2), for every later stage to read instead of a config.

    config (the plan owner's, and the top-level one) + the meta model -> ModelFacts (carried by `BuiltModel.facts`)

transformers answers where it can, through the seam: the text config's global values (`compat.config_value`, which
survives heterogeneous configs), the per-layer configs (`layer_configs`), each layer's KV heads and head width
(`head_shapes`, transformers' `get_head_shapes`), the modules' in/out features (`module_facts`), the quantization
config. Where it has no answer (which attribute is the residual width, which module a layer's keys come from) the
vocabulary table (`tpaudit.metamodel.vocabulary`) says how architectures spell it. A role the table cannot fill for this
model is a note in every report (`ModelFacts.notes`), never a silent skip: a layer with a per-token cache but no module
the table names a key projection is one TPA102 cannot judge.

Checks, the KV-cache section, the evidence stage and sizing read `ModelFacts`; none of them reads a live transformers
config.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from . import vocabulary as V
from ..compat import ModuleFacts

_PLAIN = (int, float, str, bool)


@dataclass(frozen=True)
class QuantScheme:
    """How a pre-quantized checkpoint lays out its weights (from `quantization_config`).

    Attributes:
        method (`str`): `fp8`, `awq`, `gptq`, `compressed-tensors`, ...
        bits (`int`, *optional*): weight bits for integer formats.
        group_size (`int`, *optional*): scales per `group_size` input features.
        block (`tuple[int, int]`, *optional*): `(out, in)` block of a block-scaled format (FP8 128 x 128).
        packed_axis (`"in" | "out"`, *optional*): the logical axis whose values are packed into int32 words.
        pack_factor (`int`, *optional*): values per int32 word (`32 // bits`).
    """

    method: str
    bits: int | None = None
    group_size: int | None = None
    block: tuple[int, int] | None = None
    packed_axis: str | None = None
    pack_factor: int | None = None

    @property
    def bits_divide_word(self) -> bool:
        return self.bits is None or 32 % self.bits == 0


@dataclass(frozen=True)
class LayerFacts:
    """One decoder layer's attention geometry, as transformers sizes its cache.

    Attributes:
        index (`int`): layer number.
        layer_type (`str`): the config's `layer_types` entry (`full_attention` when the config has none).
        kv_heads (`int`, *optional*): KV heads of the layer (transformers' `get_head_shapes`, per-layer overrides
            included).
        head_dim (`int`, *optional*): width of one of its heads (the same source).
    """

    index: int
    layer_type: str
    kv_heads: int | None
    head_dim: int | None


@dataclass(frozen=True)
class ModelFacts:
    """What later stages know about the model, read once at build time (see the module docstring).

    Attributes:
        model_type (`str`, *optional*): the top-level config's `model_type`.
        config_class (`str`): class name of the config that owns the base model's plan (`Qwen3VLMoeTextConfig`).
        attributes (`dict[str, Any]`): that config's global value of every attribute the vocabulary table names
            (ints, floats, strings, and lists of them as tuples); an attribute the config lacks, or whose value
            differs by layer, is absent. Read-only by convention.
        layer_attributes (`tuple[dict[str, Any], ...]`): the same, per layer, for a heterogeneous config (transformers'
            `per_layer_config`: Gemma 4's global layers); empty otherwise.
        layers (`tuple[LayerFacts, ...]`): every decoder layer's attention geometry; empty when the config describes
            no attention heads the table knows.
        modules (`dict[str, ModuleFacts]`): concrete module name -> type, logical in/out features, head_dim, fused
            experts' layout flags (the meta model, before any sharding).
        quant (`QuantScheme`, *optional*): the checkpoint's quantization layout; `None` when not quantized.
        notes (`tuple[str, ...]`): roles the table could not fill for this model, and what cannot be judged because
            of it (every report repeats them).
    """

    model_type: str | None
    config_class: str
    attributes: dict[str, Any] = field(default_factory=dict)
    layer_attributes: tuple[dict[str, Any], ...] = ()
    layers: tuple[LayerFacts, ...] = ()
    modules: dict[str, ModuleFacts] = field(default_factory=dict)
    quant: QuantScheme | None = None
    notes: tuple[str, ...] = ()

    def value(self, attr: str) -> Any:
        """The global value of config attribute `attr`, `None` when the config has none (or one per layer)."""
        return self.attributes.get(attr)

    def values(self, attr: str) -> list:
        """Every distinct value of `attr` across the layers (per-layer configs), else its single global value; empty
        when absent."""
        out = []
        for attrs in self.layer_attributes or (self.attributes,):
            v = attrs.get(attr)
            if v is not None and v not in out:
                out.append(v)
        return out

    def spelling(self, role: V.ConfigRole) -> str | None:
        """The first spelling of `role` the config gives a value (`n_embd` for GPT-J's residual width), else
        `None`."""
        return next((a for a in role.attrs if self.attributes.get(a) is not None), None)

    def get(self, role: V.ConfigRole) -> Any:
        """The value of the first spelling of `role` the config gives, else `None`."""
        attr = self.spelling(role)
        return self.attributes[attr] if attr is not None else None

    def role_values(self, role: V.ConfigRole) -> tuple[str, list]:
        """`(spelling, values)`: the first spelling of `role` that the config or any of its layers gives a value, and
        its `values`; `(role.canonical, [])` when none does."""
        for a in role.attrs:
            found = self.values(a)
            if found:
                return a, found
        return role.canonical, []

    def attribute_for(self, role: V.ConfigRole, wanted: int, raw: dict | None = None,
                      *also: V.ConfigRole) -> tuple[str, Any]:
        """The config attribute that sets a per-layer value of `role` (then of the roles `also`, e.g. the attention
        heads a config without KV heads uses for both): the first spelling whose value is `wanted` in `raw` (the
        `config.json` section the config was read from: the file a user edits, which still names an attribute
        transformers folds into its per-layer configs, such as Gemma 4's `num_global_key_value_heads`), else in the
        config (`num_global_key_value_heads` = 4 for Gemma 4's global layers, while `num_key_value_heads` = 16).

        Returns:
            `(attribute name, its value)`; `("per_layer_config.<canonical>", wanted)` when no attribute holds `wanted`
            globally (only the per-layer configs do).
        """
        for r in (role, *also):
            if isinstance(raw, dict):
                for a in r.attrs:
                    v = raw.get(a)
                    if v == wanted and not isinstance(v, bool):
                        return a, wanted
            for a in r.attrs:
                if self.attributes.get(a) == wanted:
                    return a, wanted
        return f"{V.PER_LAYER_CONFIG.canonical}.{role.canonical}", wanted


def read_facts(tf, config, owner, modules: dict[str, ModuleFacts], text_prefix: str) -> ModelFacts:
    """Read the facts of a built model (see the module docstring).

    Args:
        tf: the seam (`compat.backend()`).
        config (`PretrainedConfig`): the top-level config.
        owner (`PretrainedConfig`): the config that owns the base model's plan (the text config of a composite model).
        modules (`dict[str, ModuleFacts]`): `tf.module_facts(model)`.
        text_prefix (`str`): module path of the base model that owns the plan (`model.language_model`).

    Returns:
        `ModelFacts`.
    """
    names = [a for role in V.CONFIG_ROLES for a in role.attrs]
    attributes = _plain_values(tf, owner, names)
    layer_attributes = tuple(_plain_values(tf, c, names) for c in tf.layer_configs(owner))
    facts = ModelFacts(model_type=getattr(config, "model_type", None), config_class=type(owner).__name__,
                       attributes=attributes, layer_attributes=layer_attributes, modules=modules,
                       quant=_quant_scheme(config, owner))
    notes: list[str] = []
    layers = _layers(tf, owner, facts, notes)
    notes += _unknown_roles(facts, layers, text_prefix)
    return dataclasses.replace(facts, layers=layers, notes=tuple(notes))


def _plain_values(tf, config, names) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        v = tf.config_value(config, name)
        if isinstance(v, (list, tuple)) and all(isinstance(x, _PLAIN) or x is None for x in v):
            out[name] = tuple(v)
        elif isinstance(v, _PLAIN):
            out[name] = v
    return out


def has_attention_geometry(facts: ModelFacts) -> bool:
    """Whether the config describes decoder attention heads (encoders-only or state-space configs may not): an
    attention-head count, a layer count and a residual or head width the table knows."""
    return isinstance(facts.get(V.ATTENTION_HEADS), int) and isinstance(facts.get(V.LAYERS), int) and (
        isinstance(facts.get(V.HIDDEN), int) or isinstance(facts.get(V.HEAD_DIM), int))


def _layers(tf, owner, facts: ModelFacts, notes: list[str]) -> tuple[LayerFacts, ...]:
    """Every layer's type, KV heads and head width. Source: transformers `configuration_utils.get_head_shapes`."""
    if not has_attention_geometry(facts):
        return ()
    n_layers = int(facts.get(V.LAYERS) or 0)
    layer_types = list(facts.get(V.LAYER_TYPES) or [V.DEFAULT_LAYER_TYPE] * n_layers)
    try:
        heads, dims = tf.head_shapes(owner)
    except Exception as e:  # noqa: BLE001 - a config transformers itself cannot size a cache for
        notes.append(f"KV heads unknown: transformers' get_head_shapes cannot size this config's cache "
                     f"({type(e).__name__}); TPA102 cannot judge KV heads and the report has no kv_cache section")
        return ()
    heads = list(heads) if isinstance(heads, (list, tuple)) else [heads] * n_layers
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims] * n_layers
    return tuple(LayerFacts(i, layer_types[i] if i < len(layer_types) else V.DEFAULT_LAYER_TYPE,
                            heads[i] if i < len(heads) else None, dims[i] if i < len(dims) else None)
                 for i in range(n_layers))


def layer_index(name: str, text_prefix: str) -> int | None:
    """The decoder layer a module or parameter of the text model belongs to (`model.layers.3.self_attn.k_proj` ->
    3), `None` outside the decoder layers (`V.DECODER_LAYERS`)."""
    prefix = text_prefix + "." if text_prefix else ""
    if not name.startswith(prefix):
        return None
    m = _LAYER.search(name[len(prefix) - 1:] if prefix else "." + name)
    return int(m.group(1)) if m else None


_LAYER = re.compile(r"\.(?:" + "|".join(map(re.escape, V.DECODER_LAYERS.leaves)) + r")\.(\d+)\.")


def _unknown_roles(facts: ModelFacts, layers: tuple[LayerFacts, ...], text_prefix: str) -> list[str]:
    """Notes for the roles the table cannot fill: layers with a per-token KV cache and no key projection the table
    names, and decoder attention modules whose geometry (heads, layers, width) the table cannot read."""
    notes = []
    prefix = text_prefix + "." if text_prefix else ""
    carriers = V.leaves_of(*V.KEY_CARRIERS)
    if layers:
        have = {layer_index(name, text_prefix) for name in facts.modules if name.rpartition(".")[2] in carriers}
        missing: dict[str, list[int]] = {}
        for layer in layers:
            if layer.layer_type not in V.NO_CACHE_LAYER_TYPES and layer.index not in have:
                missing.setdefault(layer.layer_type, []).append(layer.index)
        for layer_type, indices in missing.items():
            where = ", ".join(map(str, indices[:6])) + (", ..." if len(indices) > 6 else "")
            below = " or ".join(f"`{prefix}{leaf}.N`" for leaf in V.DECODER_LAYERS.leaves)
            notes.append(
                f"key projection unknown: {len(indices)} {layer_type} layer(s) ({where}) have no module tpaudit's "
                f"vocabulary names a key projection ({', '.join(sorted(carriers))}, below {below}): TPA102 cannot "
                f"judge the KV heads of layer type {layer_type}, and the kv_cache section counts them whole on every "
                "rank")
    elif not has_attention_geometry(facts):
        attention = V.leaves_of(V.QUERY, V.KEY, V.FUSED_QKV)
        if any(layer_index(n, text_prefix) is not None and n.rpartition(".")[2] in attention for n in facts.modules):
            notes.append(f"attention geometry unknown: {_missing_geometry(facts)}: TPA102 cannot judge KV heads, and "
                         "the report has no kv_cache section")
    return notes


def _missing_geometry(facts: ModelFacts) -> str:
    """Why `has_attention_geometry` is false, in words."""
    attr, per_layer = facts.role_values(V.ATTENTION_HEADS)
    if facts.get(V.ATTENTION_HEADS) is None and per_layer:
        return f"the {facts.config_class}'s `{attr}` differs by layer ({', '.join(map(str, per_layer[:4]))})"
    missing = [r for r in (V.ATTENTION_HEADS, V.LAYERS) if not isinstance(facts.get(r), int)]
    if isinstance(facts.get(V.ATTENTION_HEADS), int) and isinstance(facts.get(V.LAYERS), int):
        missing = [V.HIDDEN, V.HEAD_DIM]
    return f"the {facts.config_class} gives no " + " and no ".join(
        f"{r.name.replace('_', ' ')} ({', '.join(f'`{a}`' for a in r.attrs[:4])})" for r in missing)


def _quant_scheme(config, owner) -> QuantScheme | None:
    """The quantization layout from `quantization_config` (the top-level config's, else the text config's)."""
    qc = getattr(config, V.QUANTIZATION.canonical, None)
    if qc is None:
        qc = getattr(owner, V.QUANTIZATION.canonical, None)
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = str(qc.get("quant_method", ""))
    if method == "fp8":
        block = qc.get("weight_block_size")
        return QuantScheme(method, bits=8, block=tuple(block) if block else None)
    if method == "awq":
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = qc.get("group_size") or qc.get("q_group_size")
        return QuantScheme(method, bits=bits, group_size=int(group) if group and int(group) > 0 else None,
                           packed_axis="out", pack_factor=32 // bits if 32 % bits == 0 else None)
    if method == "gptq":
        bits = int(qc.get("bits") or 4)
        group = qc.get("group_size")
        return QuantScheme(method, bits=bits, group_size=int(group) if group and int(group) > 0 else None,
                           packed_axis="in", pack_factor=32 // bits if 32 % bits == 0 else None)
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
        if not weights:
            return QuantScheme(method)
        bits = int(weights.get("num_bits") or 8)
        strategy = weights.get("strategy")
        group = weights.get("group_size") if strategy == "group" else None
        block = weights.get("block_structure") if strategy == "block" else None
        packed = qc.get("format") == "pack-quantized" and weights.get("type", "int") == "int"
        return QuantScheme(method, bits=bits, group_size=int(group) if group else None,
                           block=tuple(block) if block else None, packed_axis="in" if packed else None,
                           pack_factor=(32 // bits if 32 % bits == 0 else None) if packed else None)
    return QuantScheme(method)
