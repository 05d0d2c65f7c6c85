"""Build the model on the meta device exactly as `from_pretrained` would, before any weight is read (stage 2).

    ModelSource -> BuiltModel (the meta model + the facts later stages read)

The steps follow transformers 5.23 `PreTrainedModel.from_pretrained`, each through the seam (`compat`):

1. `AutoConfig.from_pretrained` on the model's `config.json` (remote code only with `trust_remote_code=True`).
2. A `--plan` replaces `base_model_tp_plan` on the config that owns the base model's plan (the text config of a
   composite model), as if it were written in its `configuration_*.py`.
3. The pre-quantized quantizer (`AutoHfQuantizer.from_config`), its `update_dtype`; `validate_environment` is not
   called, because it answers for this host (on a CPU it turns FP8 into BF16), not for the deployment being checked.
   A quantizer that would dequantize because this host has no GPU (MXFP4) lays the model out as a GPU holds it.
4. `dtype="auto"` resolution (`modeling_utils._get_dtype`): the config's `dtype`, else the checkpoint's first floating
   dtype; config-only inputs without one fall back to the text config's `dtype`, else bfloat16 (said in the notes).
5. The model class of `config.architectures[0]`, built under `cls.get_init_context(...)` (meta device, untied),
   then `hf_quantizer.preprocess_model` (module replacement; the quantizer extends the TP/EP plans).
6. The `_keep_in_fp32_modules(_strict)` dtype plan, then the checkpoint mapping (`mapping.map_checkpoint`).

The model is built once per run: every (tp_size, ep_size) option, every suggested plan (a value handed to
`plan.resolve_plan`) and the guard reuse it, because neither the resolution nor the simulation changes it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..compat import ConfigReadError, ModuleFacts, QuantizationInfo, backend
from ..compat.styles import EXAMPLE_PLAN_JSON
from ..errors import ConfigError, PlanError, UsageError
from .facts import ModelFacts, read_facts
from .mapping import CheckpointMapping
from ..model import ModelSource

# the advice of a config error (`ConfigError.fix`), apart from its reason so that `scan` can drop it for transformers'
# own default configs
FIX_CONFIG = "Fix the config"
FIX_CONFIG_OR_CLASS = "Fix the config or pass --architecture"


@dataclass(frozen=True)
class BuildOptions:
    """How to build the model, as `from_pretrained` arguments would say it.

    Attributes:
        plan_override (`dict[str, str]`, *optional*): rules that replace `base_model_tp_plan` of the config owning
            the base model's plan; keys relative to that base model (`layers.*.self_attn.q_proj`).
        architecture (`str`, *optional*): model class name; default `config.architectures[0]`.
        trust_remote_code (`bool`): allow the repo's own modeling code.
        dtype (`str`, *optional*): the `dtype` passed to `from_pretrained` (`"bfloat16"`); default `"auto"`.
        config (`PretrainedConfig`, *optional*): use (a copy of) this config object instead of reading the source's.
        instance_plans (`dict`, *optional*): `{"tp": {...}, "ep": {...}}`: the merged plans of a model object
            (`model.tp_plan`, `model.ep_plan`), set on the built model in place of the ones it merged itself.
        gpu_view (`bool`): size quantized weights as the target GPUs hold them, also when this host would
            dequantize them (MXFP4 on a CPU host). Default `True`.
    """

    plan_override: dict[str, str] | None = None
    architecture: str | None = None
    trust_remote_code: bool = False
    dtype: str | None = None
    config: Any = None
    instance_plans: dict | None = None
    gpu_view: bool = True


@dataclass(frozen=True)
class BuiltModel:
    """The meta-device model and what it took to build it: the facts every later stage reads. Frozen: nothing changes
    it after `build_model` (a candidate plan is a value handed to `plan.resolve_plan`; the meta model itself is only
    changed for the duration of a resolution or a sharding, and put back).

    Attributes:
        source (`ModelSource`): what was read.
        model (`PreTrainedModel`): on the meta device, untied, plans merged. Never sharded in place: the simulation
            restores it.
        config (`PretrainedConfig`): the config it was built from (tpaudit's own copy).
        architecture (`str`): the model class name.
        dtype (`str`): the load dtype (`"bfloat16"`).
        text_prefix (`str`): module path of the base model that owns the plan (`"model.language_model"`, `"model"`).
        plan_owner (`str`): attribute path of the config that owns the base model's plan (`"text_config"` or `""`).
        owner_config (`PretrainedConfig`): that config.
        quantizer (`HfQuantizer`, *optional*): the quantizer that ran on the meta model (opaque; seam only).
        quantization (`QuantizationInfo`, *optional*): what it did.
        mapping (`CheckpointMapping`, *optional*): `None` for a config-only source.
        modules (`dict[str, ModuleFacts]`): concrete module name -> facts, read before any sharding.
        facts (`ModelFacts`): what later stages read instead of the config (`facts.read_facts`): config values by
            the vocabulary's roles, per-layer attention geometry, `modules`, the quantization layout.
        lm_head_names (`tuple[str, ...]`): parameters of the output embedding.
        original_plan (`dict[str, str]`): the base plan the model was built with.
        build_override (`dict[str, str]`, *optional*): that plan, when it is a `--plan` rather than the shipped one.
        instance_plans (`tuple[dict, dict]`, *optional*): a model object's own merged TP and EP plans.
        notes (`tuple[str, ...]`): facts the report repeats.
    """

    source: ModelSource
    model: Any
    config: Any
    architecture: str
    dtype: str
    text_prefix: str
    plan_owner: str
    owner_config: Any
    quantizer: Any = None
    quantization: QuantizationInfo | None = None
    mapping: CheckpointMapping | None = None
    modules: dict[str, ModuleFacts] = field(default_factory=dict)
    facts: ModelFacts | None = None
    lm_head_names: tuple[str, ...] = ()
    original_plan: dict[str, str] = field(default_factory=dict)
    build_override: dict[str, str] | None = None
    instance_plans: tuple[dict, dict] | None = None
    notes: tuple[str, ...] = ()

    def config_target(self, attr: str) -> str:
        """A config attribute as a finding target, dotted from the top-level config (`text_config.vocab_size`)."""
        return f"{self.plan_owner}.{attr}" if self.plan_owner else attr

    def relative_key(self, generic: str) -> str:
        """A full generic name as a key of `base_model_tp_plan` (`model.language_model.layers.*.x` -> `layers.*.x`)."""
        prefix = self.text_prefix + "." if self.text_prefix else ""
        return generic[len(prefix):] if prefix and generic.startswith(prefix) else generic

    @property
    def owner_class(self) -> str:
        """The config class whose `base_model_tp_plan` a fix edits (`Qwen3VLMoeTextConfig`)."""
        return type(self.owner_config).__name__


def load_plan_file(path: str) -> dict[str, str]:
    """Read a `--plan` file: a JSON object of glob rule key -> style name.

    Raises:
        PlanError: not readable, not a JSON object of strings, or a style transformers does not register.
    """
    from ..sources.files import PLAN_MAX_BYTES, load_json, read_capped  # regular file, size cap, no FIFO/device

    raw = read_capped(path, "--plan file", PLAN_MAX_BYTES, lambda m: PlanError(m, path=path))
    plan = load_json(raw, "--plan file", path, lambda m: PlanError(m, path=path))
    if not isinstance(plan, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in plan.items()):
        raise PlanError(f"--plan {path} must be a JSON object of rule -> style strings, e.g. {EXAMPLE_PLAN_JSON}",
                        path=path)
    if len(plan) < raw.count(b":"):  # cheap pre-check; a colon inside a key or style is rare, so confirm it
        import json
        from collections import Counter

        counts = Counter(k for k, _ in json.loads(raw, object_pairs_hook=list))
        repeated = sorted(k for k, n in counts.items() if n > 1)
        if repeated:
            raise PlanError(f"--plan {path}: rule {repeated[0][:80]!r} is given more than once; JSON keeps only the "
                            "last, so the file does not say what it seems to. Keep one", path=path)
    validate_plan(plan, origin=f"--plan {path}")
    return plan


def validate_plan(plan, origin: str = "plan") -> None:
    """Raise `PlanError` for a plan that is not a dict of str -> str, a malformed rule key, or a style the installed
    transformers does not register."""
    if not isinstance(plan, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in plan.items()):
        raise PlanError(f"{origin} must be a dict of rule -> style strings, e.g. {EXAMPLE_PLAN_JSON}")
    known = set(backend().style_names())
    for key, style in plan.items():
        if not key or key != key.strip() or key.startswith(".") or key.endswith(".") or ".." in key:
            raise PlanError(f"{origin}: rule key {key[:80]!r} is not a module or parameter path such as "
                            "'layers.*.self_attn.q_proj'")
        if style not in known:
            removed = backend().removed_styles().get(style)
            if removed:
                raise PlanError(f"{origin}: rule '{key[:80]}' has style '{style}', which the installed transformers "
                                f"({backend().versions['transformers']}) refuses: {removed}")
            import difflib

            close = difflib.get_close_matches(style, sorted(known), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise PlanError(f"{origin}: rule '{key[:80]}' has style '{style[:40]}', which transformers does not "
                            f"register.{hint} Known styles: {', '.join(sorted(known))}")


def _config_dir(source: ModelSource, stack) -> str:
    if source.config_dir and os.path.isfile(os.path.join(source.config_dir, "config.json")):
        return source.config_dir
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tpaudit-config-"))
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(source.config, f)
    return tmp


def load_config(source: ModelSource, *, trust_remote_code: bool = False):
    """`AutoConfig.from_pretrained` on the source's `config.json`.

    Raises:
        ConfigError: transformers cannot build a config from it (no or unknown `model_type`, remote code needed, a
            value its validators refuse).
    """
    from ..compat import installed_version

    where = source.config_path or source.ref
    model_type = source.config.get("model_type")
    if not model_type and "auto_map" not in source.config:
        raise ConfigError(f"{where} has no model_type. A transformers config.json names its model_type; re-save it "
                          "with save_pretrained", path=source.config_path)
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"{where}: model_type is {str(model_type)[:40]}, not a string",
                          fix=FIX_CONFIG, path=source.config_path)
    with contextlib.ExitStack() as stack:
        directory = _config_dir(source, stack)
        try:
            return backend().load_config(directory, trust_remote_code=trust_remote_code,
                                         has_auto_map="auto_map" in source.config)
        except ConfigReadError as e:
            if e.kind == "remote_code":
                raise ConfigError(
                    f"model type {model_type!r} needs the repo's own code, which tpaudit never runs unless asked. "
                    "Pass --trust-remote-code if you trust the repo", path=source.config_path) from None
            if e.kind == "unknown_model_type":
                raise ConfigError(
                    f"transformers {installed_version('transformers')} does not know model type {model_type!r}. "
                    "Upgrade transformers, or pass --trust-remote-code if the repo ships its modeling code",
                    path=source.config_path) from None
            origin = "the repo's own configuration code" if trust_remote_code and "auto_map" in source.config \
                else "transformers"
            raise ConfigError(f"{origin} cannot read {where}: {e.detail}", fix=FIX_CONFIG,
                              path=source.config_path) from None


def model_class(config, architecture: str | None = None, trust_remote_code: bool = False):
    """The model class `from_pretrained` would build: `architecture`, else `config.architectures[0]`, else (only
    when the config names none) the model type's causal-LM / image-text-to-text / base class, said in a note.

    Returns:
        `(cls, note or None)`.

    Raises:
        ConfigError: an empty or unknown class name, `architectures` that is not a list of class names, or no model
            class for the model type.
    """
    if architecture is not None and (not isinstance(architecture, str) or not architecture.strip()):
        raise ConfigError("--architecture is empty. Pass a model class name such as LlamaForCausalLM")
    archs = getattr(config, "architectures", None)
    if architecture is None and archs is not None:
        if not isinstance(archs, (list, tuple)):
            raise ConfigError(f"config.json's architectures is {str(archs)[:60]!r}, not a list of class names such as "
                              '["LlamaForCausalLM"]', fix=FIX_CONFIG_OR_CLASS)
        if archs and not isinstance(archs[0], str):
            raise ConfigError(f"config.json's architectures[0] is {str(archs[0])[:40]}, not a class name",
                              fix=FIX_CONFIG_OR_CLASS)
    tf = backend()
    try:
        cls, how = tf.model_class(config, architecture, trust_remote_code=trust_remote_code)
    except ConfigReadError as e:
        defaults = ", ".join(tf.model_class_names(config.model_type, type(config))[:3]) or "none"
        if e.kind == "not_a_model_class":
            raise ConfigError(f"{e.detail}, not a transformers model class. Pass a class such as "
                              f"{defaults.split(', ')[0]} to --architecture") from None
        if e.kind == "unknown_architecture" and architecture:
            raise ConfigError(f"--architecture {e.detail} is not a model class of the installed transformers "
                              f"(model type {config.model_type!r} has {defaults}, among others). Pass one of its "
                              "classes, or --trust-remote-code if the repo ships its modeling code") from None
        if e.kind == "unknown_architecture":
            # config.json names a class this transformers does not have (a repo's own spelling, a typo): build the
            # model type's default class, and say so first in every report.
            fallback = [n for n in tf.model_class_names(config.model_type, type(config)) if tf.model_class_by_name(n)]
            if not fallback:
                raise ConfigError(f"config.json's architectures[0] {e.detail} is not a model class of the installed "
                                  f"transformers, and model type {config.model_type!r} has no default class. Pass "
                                  "--architecture, or --trust-remote-code if the repo ships its modeling code") \
                    from None
            cls = tf.model_class_by_name(fallback[0])
            return cls, (f"model class: config.json names {e.detail}, which transformers "
                         f"{tf.versions['transformers']} does not have; built {cls.__name__}, the default class of "
                         f"model type {config.model_type!r} (pass --architecture to choose another)")
        if e.kind == "invalid_architecture":
            raise ConfigError(f"config.json's {e.detail}", fix=FIX_CONFIG_OR_CLASS) from None
        raise ConfigError(f"no transformers model class for model type {config.model_type!r}. Pass --architecture "
                          "CLASS") from None
    note = None
    if how == "model type default":
        note = (f"model class: config.json names no architectures, so {cls.__name__} (the model type's default "
                "class) was built; pass --architecture to choose another")
    return cls, note


def _resolve_dtype(config, source: ModelSource, notes: list[str], override: str | None = None):
    """`dtype="auto"` as `modeling_utils._get_dtype` resolves it, or `override` (`from_pretrained(dtype=...)`)."""
    import torch

    tf = backend()
    if override is not None:
        value = getattr(torch, override, None) if isinstance(override, str) and override else None
        if not isinstance(value, torch.dtype) or not value.is_floating_point or "float8" in override:
            raise UsageError(f"dtype {override!r} (--dtype {override}) is not a dtype from_pretrained can build a model "
                             "in. Pass bfloat16, float16 or float32")
        return value
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    if source.tensors:
        for t in source.tensors:  # `get_state_dict_dtype`: the first floating dtype, float8 excluded
            d = tf.torch_dtype(t.dtype)
            if d.is_floating_point and "float8" not in str(d) and "float4" not in str(d):
                return d
        return tf.torch_dtype(source.tensors[0].dtype)
    text = getattr(config.get_text_config(decoder=True), "dtype", None) if hasattr(config, "get_text_config") else None
    if isinstance(text, str):
        text = getattr(torch, text, None)
    if isinstance(text, torch.dtype):
        notes.append(f"dtype: config.json sets no top-level dtype and there is no checkpoint; using the text "
                     f"config's {str(text).removeprefix('torch.')}")
        return text
    notes.append("dtype: neither config.json nor a checkpoint names a dtype; assuming bfloat16, the dtype of nearly "
                 "every published checkpoint (pass --dtype to change it)")
    return torch.bfloat16


def build_model(source: ModelSource, options: BuildOptions | None = None) -> BuiltModel:
    """Build `source`'s model on the meta device as `from_pretrained` does, and map its checkpoint onto it.

    Args:
        source (`ModelSource`): config and (optionally) checkpoint tensors.
        options (`BuildOptions`, *optional*): plan override, class, dtype, config object, instance plans.

    Returns:
        `BuiltModel`.

    Raises:
        ConfigError: the config cannot be read, holds impossible values, or the model cannot be built from it.
        PlanError: `options.plan_override` names an unknown style.
        UsageError: `options.dtype` is not a float dtype.
        UnsupportedVersionError: the installed transformers lacks what the seam calls.
    """
    from .mapping import map_checkpoint

    options = options or BuildOptions()
    tf = backend()
    notes: list[str] = list(source.notes)
    if options.plan_override is not None:
        validate_plan(options.plan_override)
    where = source.config_path or source.ref
    config = copy.deepcopy(options.config) if options.config is not None else \
        load_config(source, trust_remote_code=options.trust_remote_code)
    owner, owner_path = tf.text_config(config)
    from .plausible import check_plausible, check_plausible_total

    check_plausible(config, owner, owner_path, where, source.config_path)
    original_plan = dict(options.plan_override) if options.plan_override is not None else tf.base_plan(owner)
    if options.plan_override is not None:
        owner.base_model_tp_plan = dict(options.plan_override)
    cls, class_note = model_class(config, options.architecture, options.trust_remote_code)
    if class_note:
        notes.insert(0, class_note)
    quantizer, qinfo = tf.quantizer(config, gpu_view=options.gpu_view)
    dtype = _resolve_dtype(config, source, notes, options.dtype)
    if quantizer is not None:
        dtype = tf.update_dtype(quantizer, dtype)
    config.dtype = dtype
    for sub in getattr(config, "sub_configs", {}) or {}:
        if (sub_config := getattr(config, sub, None)) is not None:
            sub_config.dtype = dtype

    model, quantizer_error = _instantiate(cls, config, dtype, quantizer)
    if quantizer is not None and quantizer_error is not None:  # a quantizer that cannot run here: unquantized build
        qinfo = QuantizationInfo(qinfo.method, qinfo.quantizer, ran=False, reason=quantizer_error)
        quantizer = None
        model, _ = _instantiate(cls, config, dtype, None)
    elif quantizer is not None:
        dequantize = tf.quantizer_dequantizes(quantizer)
        gpu_view = bool(getattr(quantizer, "_tpaudit_gpu_view", False)) and not dequantize and \
            tf.host_dequantizes(quantizer)
        qinfo = QuantizationInfo(qinfo.method, qinfo.quantizer, ran=True, dequantize=dequantize, gpu_view=gpu_view)
    tied = tf.tied_keys(model)  # tied copies counted once, as the report's total counts them
    check_plausible_total((shape for name, shape, _, _ in tf.parameter_table(model) if name not in tied), where,
                          source.config_path)
    if qinfo is not None:
        notes.append(_quantization_note(qinfo, source))
    if options.instance_plans:
        tf.set_merged_plans(model, options.instance_plans.get("tp"), options.instance_plans.get("ep"))
    with tf.quiet():
        tf.apply_dtype_plan(model, dtype)
    modules = tf.module_facts(model)
    lm_head = tf.output_embedding_params(model)
    mapping = None
    if source.tensors is not None:
        mapping = map_checkpoint(model, source.tensors, quantizer, quantized=qinfo is not None,
                                 positions=source.name_positions)
        notes.extend(_mapping_notes(mapping))
    text_prefix = tf.text_prefix(model, owner)
    facts = read_facts(tf, config, owner, modules, text_prefix)
    notes.extend(facts.notes)
    built = BuiltModel(source=source, model=model, config=config, architecture=cls.__name__,
                       dtype=str(dtype).removeprefix("torch."), text_prefix=text_prefix,
                       plan_owner=owner_path, owner_config=owner, quantizer=quantizer, quantization=qinfo,
                       mapping=mapping, modules=modules, facts=facts, lm_head_names=lm_head,
                       original_plan=original_plan,
                       build_override=dict(options.plan_override) if options.plan_override is not None else None,
                       instance_plans=tf.merged_plans(model) if options.instance_plans else None, notes=tuple(notes))
    return built


def _instantiate(cls, config, dtype, quantizer):
    try:
        return backend().instantiate(cls, config, dtype, quantizer)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a model's __init__ raises many kinds on a bad config
        first = " ".join(str(e).split())[:240]
        raise ConfigError(f"transformers cannot build {cls.__name__} from this config: {type(e).__name__}: {first}",
                          fix=FIX_CONFIG) from None


def _quantization_note(qinfo: QuantizationInfo, source: ModelSource) -> str:
    method = qinfo.method
    if qinfo.ran and qinfo.dequantize:
        return (f"quantization: the {method} quantizer chose to dequantize, so the model's quantized weights count "
                "in the dequantized dtype")
    if qinfo.ran and qinfo.gpu_view:
        return (f"quantization: {method}, sized as the target GPUs hold it (transformers' {qinfo.quantizer} would "
                "dequantize on this CPU host; tpaudit lays the model out as on a GPU)")
    if qinfo.ran:
        return (f"quantization: {method}, modules replaced by transformers' {qinfo.quantizer} on the meta device (its "
                "plan extensions included)")
    where = ("taken from the checkpoint header: each follows its module's rule"
             if not source.config_only else "NOT modelled: weights count unquantized, so bytes are overstated")
    if qinfo.refused:
        return (f"quantization: from_pretrained refuses this {method} quantization_config (TPA206 gives the "
                f"reason); quantized tensors {where} (tpaudit's fallback, not the loader's code)")
    return (f"quantization: {method} quantizer could not run here ({qinfo.reason}); quantized tensors {where} "
            "(tpaudit's fallback, not the loader's code)")


def _mapping_notes(mapping: CheckpointMapping) -> list[str]:
    notes = []
    if mapping.companions:
        notes.append(f"checkpoint: {len(mapping.companions)} quantization tensors the meta model lacks were added to "
                     f"their modules (e.g. {next(iter(mapping.companions))}); {len(mapping.superseded)} model "
                     "parameters they replace were dropped")
    for (stored, runtime), count in sorted(mapping.casts.items()):
        notes.append(f"checkpoint: {count} tensors stored as {stored} are cast to {runtime} on load; bytes count "
                     f"{runtime}")
    if mapping.missing:
        notes.append(f"checkpoint: {len(mapping.missing)} model parameters have no checkpoint tensor and would be "
                     f"initialised by the loader (e.g. {mapping.missing[0]})")
    if mapping.outside_parameters_bytes:
        notes.append(f"checkpoint: {mapping.outside_parameters_bytes:,} B of quantization scales load into state "
                     "that is not a parameter (e.g. MXFP4 block scales); they are not in the per-rank parameter bytes")
    return notes
