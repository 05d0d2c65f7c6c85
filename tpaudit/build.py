"""Build the model on the meta device exactly as `from_pretrained` would, before any weight is read.

The steps follow transformers 5.23 `PreTrainedModel.from_pretrained`:

1. `AutoConfig.from_pretrained` on the model's `config.json` (remote code only with `trust_remote_code=True`).
2. A `--plan` replaces `base_model_tp_plan` on the config that owns the base model's plan (the text config of a
   composite model), as if it were written in its `configuration_*.py`.
3. The pre-quantized quantizer (`AutoHfQuantizer.from_config`), its `update_dtype`; `validate_environment` is not
   called, because it answers for this host (on a CPU it turns FP8 into BF16), not for the deployment being checked.
4. `dtype="auto"` resolution (`modeling_utils._get_dtype`): the config's `dtype`, else the checkpoint's first floating
   dtype; config-only inputs without one fall back to the text config's `dtype`, else bfloat16 (said in the notes).
5. The model class of `config.architectures[0]`, built under `cls.get_init_context(...)` (meta device, untied),
   then `hf_quantizer.preprocess_model` (module replacement; the quantizer extends the TP/EP plans).
6. The `_keep_in_fp32_modules(_strict)` dtype plan, then the checkpoint overlay (`mapping.map_checkpoint`).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, PlanError
from .mapping import CheckpointMapping
from .model import ModelSource


@dataclass
class BuiltModel:
    """The meta-device model and what it took to build it.

    Attributes:
        model (`PreTrainedModel`): on the meta device, untied, plans merged (`model.tp_plan`, `model.ep_plan`).
        config (`PretrainedConfig`): the config it was built from (with the `--plan` override applied).
        architecture (`str`): the model class name.
        dtype (`str`): the load dtype (`"bfloat16"`).
        text_prefix (`str`): module path of the base model that owns the plan (`"model.language_model"`, `"model"`).
        plan_owner (`str`): attribute path of the config that owns the base model's plan (`"text_config"` or `""`).
        quantization (`dict`, *optional*): `{"method", "quantizer", "ran", "dequantize", "reason"}` when quantized.
        mapping (`CheckpointMapping`, *optional*): `None` for a config-only source.
        notes (`list[str]`): facts the report repeats.
    """

    model: Any
    config: Any
    architecture: str
    dtype: str
    text_prefix: str
    plan_owner: str
    quantization: dict | None = None
    mapping: CheckpointMapping | None = None
    notes: list[str] = field(default_factory=list)


def load_plan_file(path: str) -> dict[str, str]:
    """Read a `--plan` file: a JSON object of glob rule key -> style name.

    Raises:
        PlanError: not readable, not a JSON object of strings, or a style transformers does not register.
    """
    from .sources.files import PLAN_MAX_BYTES, load_json, read_capped  # regular file, size cap, no FIFO/device

    plan = load_json(read_capped(path, "--plan file", PLAN_MAX_BYTES, lambda m: PlanError(m, path=path)),
                     "--plan file", path, lambda m: PlanError(m, path=path))
    if not isinstance(plan, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in plan.items()):
        raise PlanError(f"--plan {path} must be a JSON object of rule -> style strings, e.g. "
                        '{"layers.*.self_attn.q_proj": "colwise"}', path=path)
    validate_plan(plan, origin=f"--plan {path}")
    return plan


def validate_plan(plan: dict[str, str], origin: str = "plan") -> None:
    """Raise `PlanError` for a style name the installed transformers does not register, or an empty rule key."""
    from ._compat import style_names

    known = set(style_names())
    for key, style in plan.items():
        if not key or key != key.strip() or key.startswith(".") or key.endswith("."):
            raise PlanError(f"{origin}: rule key {key!r} is not a module or parameter path such as "
                            "'layers.*.self_attn.q_proj'")
        if style not in known:
            import difflib

            close = difflib.get_close_matches(style, sorted(known), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise PlanError(f"{origin}: rule '{key}' has style '{style}', which transformers does not register.{hint} "
                            f"Known styles: {', '.join(sorted(known))}")


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
        ConfigError: transformers cannot build a config from it (unknown `model_type`, remote code needed, bad value).
    """
    import contextlib

    from transformers import AutoConfig

    model_type = source.config.get("model_type")
    if not model_type and "auto_map" not in source.config:
        raise ConfigError(f"{source.config_path or source.ref} has no model_type. A transformers config.json names "
                          "its model_type; re-save it with save_pretrained", path=source.config_path)
    with contextlib.ExitStack() as stack:
        directory = _config_dir(source, stack)
        try:
            return AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
        except ValueError as e:
            text = str(e)
            if "trust_remote_code" in text or "auto_map" in source.config and not trust_remote_code:
                raise ConfigError(
                    f"model type {model_type!r} needs the repo's own code, which tpaudit never runs unless asked. "
                    "Pass --trust-remote-code if you trust the repo", path=source.config_path) from None
            if "Unrecognized" in text or "model_type" in text or "does not recognize" in text:
                from ._compat import installed_version

                raise ConfigError(
                    f"transformers {installed_version('transformers')} does not know model type {model_type!r}. "
                    "Upgrade transformers, or pass --trust-remote-code if the repo ships its modeling code",
                    path=source.config_path) from None
            raise ConfigError(f"transformers cannot read {source.config_path or source.ref}: {_one_line(text)}. Fix "
                              "the config", path=source.config_path) from None
        except Exception as e:  # noqa: BLE001 - transformers' validators (and remote code) raise many kinds
            origin = "the repo's own configuration code" if trust_remote_code and "auto_map" in source.config \
                else "transformers"
            raise ConfigError(f"{origin} cannot read {source.config_path or source.ref}: "
                              f"{type(e).__name__}: {_one_line(str(e))}. Fix the config",
                              path=source.config_path) from None


def _one_line(text: str, limit: int = 300) -> str:
    """A multi-line library message (a validator's field name on one line, the reason on the next) as one line."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_line(text: str, limit: int = 240) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _plan_owner(config) -> tuple[Any, str]:
    """The config that owns the base model's plan and its attribute path: the (decoder) text config of a composite
    model, else the config itself. Source: transformers 5.23 `PretrainedConfig.get_text_config(decoder=True)`."""
    try:
        text = config.get_text_config(decoder=True)
    except ValueError:
        text = config
    if text is config:
        return config, ""
    for name in getattr(config, "sub_configs", {}) or {}:
        if getattr(config, name, None) is text:
            return text, name
    return text, "text_config"


def _model_class(config, architecture: str | None, trust_remote_code: bool):
    import transformers

    from transformers import PreTrainedModel

    if architecture is not None and not architecture.strip():
        raise ConfigError("--architecture is empty. Pass a model class name such as LlamaForCausalLM")
    archs = getattr(config, "architectures", None)
    name = architecture or (archs[0] if isinstance(archs, (list, tuple)) and archs else None)
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"config.json's architectures[0] is {name!r}, not a class name. Fix the config or pass "
                          "--architecture")
    if name and hasattr(transformers, name):
        cls = getattr(transformers, name)
        if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
            raise ConfigError(f"{name} is not a transformers model class (it is a {type(cls).__name__}). Pass a "
                              "class such as Qwen3VLMoeForConditionalGeneration to --architecture")
        return cls
    auto_map = getattr(config, "auto_map", None) or {}
    if name and trust_remote_code and auto_map:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        for ref in auto_map.values():
            if isinstance(ref, str) and ref.endswith("." + name):
                return get_class_from_dynamic_module(ref, config._name_or_path)
    if architecture:
        raise ConfigError(f"--architecture {architecture} is not a transformers model class. Pass a class name such "
                          "as Qwen3VLMoeForConditionalGeneration")
    from transformers.models.auto import modeling_auto as auto

    for mapping in (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                    auto.MODEL_MAPPING_NAMES):
        cls_name = mapping.get(config.model_type)
        if cls_name and hasattr(transformers, cls_name):
            return getattr(transformers, cls_name)
    raise ConfigError(f"no transformers model class for model type {config.model_type!r} "
                      f"(architectures: {config.architectures}). Pass --architecture CLASS")


def _resolve_dtype(config, source: ModelSource, notes: list[str], override: str | None = None):
    """`dtype="auto"` as `modeling_utils._get_dtype` resolves it, or `override` (`from_pretrained(dtype=...)`)."""
    import torch

    from ._compat import str_to_torch_dtype

    if override is not None:
        value = getattr(torch, override, None) if isinstance(override, str) and override else None
        if not isinstance(value, torch.dtype) or not value.is_floating_point or "float8" in override:
            from .errors import UsageError

            raise UsageError(f"--dtype {override} is not a dtype from_pretrained can build a model in. Pass "
                             "bfloat16, float16 or float32")
        return value

    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype is not None:
        return dtype
    if source.tensors:
        for t in source.tensors:  # `get_state_dict_dtype`: the first floating dtype, float8 excluded
            d = str_to_torch_dtype(t.dtype)
            if d.is_floating_point and "float8" not in str(d) and "float4" not in str(d):
                return d
        return str_to_torch_dtype(source.tensors[0].dtype)
    text = getattr(config.get_text_config(decoder=True), "dtype", None) if hasattr(config, "get_text_config") else None
    if isinstance(text, str):
        text = getattr(torch, text, None)
    if text is not None:
        notes.append(f"dtype: config.json sets no top-level dtype and there is no checkpoint; using the text "
                     f"config's {str(text).removeprefix('torch.')}")
        return text
    notes.append("dtype: neither config.json nor a checkpoint names a dtype; assuming bfloat16, the dtype of nearly "
                 "every published checkpoint (pass --dtype to change it)")
    return torch.bfloat16


def _make_quantizer(config, notes: list[str]) -> tuple[Any, dict | None]:
    qc = getattr(config, "quantization_config", None)
    if qc is None and hasattr(config, "get_text_config"):
        qc = getattr(config.get_text_config(decoder=True), "quantization_config", None)
    if qc is None:
        return None, None
    from transformers.quantizers.auto import AutoHfQuantizer

    qc_dict = qc if isinstance(qc, dict) else qc.to_dict()
    method = str(qc_dict.get("quant_method"))
    info = {"method": method, "quantizer": None, "ran": False, "dequantize": False, "reason": None}
    try:
        if not AutoHfQuantizer.supports_quant_method(qc_dict):
            info["reason"] = f"transformers does not know quant_method {method!r}"
            return None, info
        quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=True)
    except Exception as e:  # noqa: BLE001 - any failure means: fall back to the checkpoint header
        info["reason"] = f"{type(e).__name__}: {_first_line(str(e), 160)}"
        return None, info
    info["quantizer"] = type(quantizer).__name__
    return quantizer, info


def build_model(source: ModelSource, *, plan_override: dict[str, str] | None = None,
                architecture: str | None = None, trust_remote_code: bool = False,
                dtype: str | None = None, config=None, instance_plans: dict | None = None) -> BuiltModel:
    """Build `source`'s model on the meta device as `from_pretrained` does, and map its checkpoint onto it.

    Args:
        source (`ModelSource`): config and (optionally) checkpoint tensors.
        plan_override (`dict[str, str]`, *optional*): rules that replace `base_model_tp_plan` of the config owning the
            base model's plan; keys relative to that base model (`layers.*.self_attn.q_proj`).
        architecture (`str`, *optional*): model class name; default `config.architectures[0]`.
        trust_remote_code (`bool`, *optional*, defaults to `False`): allow the repo's own modeling code.
        dtype (`str`, *optional*): the `dtype` passed to `from_pretrained` (`"bfloat16"`); default `"auto"`.
        config (`PretrainedConfig`, *optional*): use this config object (a copy) instead of reading `source.config`.
        instance_plans (`dict`, *optional*): `{"tp": {...}, "ep": {...}}`: the merged plans of a model object
            (`model.tp_plan`, `model.ep_plan`), set on the built model in place of the ones it merged itself.

    Returns:
        `BuiltModel`.

    Raises:
        ConfigError: the config cannot be read or the model cannot be built from it.
        PlanError: `plan_override` names an unknown style.
    """
    import torch
    from transformers import PreTrainedModel
    from transformers.utils.generic import ContextManagers

    from ._compat import quiet_libraries
    from .mapping import map_checkpoint

    notes: list[str] = list(source.notes)
    if plan_override is not None:
        validate_plan(plan_override)
    with quiet_libraries():
        if config is not None:
            import copy

            config = copy.deepcopy(config)
        else:
            config = load_config(source, trust_remote_code=trust_remote_code)
        owner, owner_path = _plan_owner(config)
        if plan_override is not None:
            owner.base_model_tp_plan = dict(plan_override)
        cls = _model_class(config, architecture, trust_remote_code)
        quantizer, qinfo = _make_quantizer(config, notes)
        dtype = _resolve_dtype(config, source, notes, dtype)
        if quantizer is not None:
            dtype = quantizer.update_dtype(dtype)
        config.dtype = dtype
        for sub in getattr(config, "sub_configs", {}) or {}:
            if (sub_config := getattr(config, sub, None)) is not None:
                sub_config.dtype = dtype

        _check_plausible(config)
        model = _instantiate(cls, config, dtype, quantizer, qinfo, ContextManagers)
        if qinfo is not None and quantizer is not None and not qinfo["ran"]:
            quantizer = None
            model = _instantiate(cls, config, dtype, None, None, ContextManagers)
        if qinfo is not None:
            qinfo["dequantize"] = bool(quantizer is not None and getattr(quantizer.quantization_config,
                                                                          "dequantize", False))
            _quantization_notes(qinfo, source, notes)

        if instance_plans:
            model._tp_plan = dict(instance_plans.get("tp") or {})
            model._ep_plan = dict(instance_plans.get("ep") or {})
        _apply_dtype_plan(model, dtype, torch)
        mapping = None
        if source.tensors is not None:
            mapping = map_checkpoint(model, source.tensors, quantizer)
            _mapping_notes(mapping, notes)

    text_prefix = _text_prefix(model, owner, PreTrainedModel)
    return BuiltModel(model=model, config=config, architecture=cls.__name__,
                      dtype=str(dtype).removeprefix("torch."), text_prefix=text_prefix, plan_owner=owner_path,
                      quantization=qinfo, mapping=mapping, notes=notes)


MAX_LAYERS = 4096


def _check_plausible(config) -> None:
    """Refuse depths no model has before building every layer on the meta device (which would take hours)."""
    from .checks.registry import config_value

    for cfg in {id(c): c for c in (config, getattr(config, "get_text_config", lambda **_: config)(decoder=True))
                }.values():
        layers = config_value(cfg, "num_hidden_layers")
        if isinstance(layers, int) and not isinstance(layers, bool) and not 0 <= layers <= MAX_LAYERS:
            raise ConfigError(f"num_hidden_layers = {layers} is not a plausible depth (0 to {MAX_LAYERS}): tpaudit "
                              "builds every layer on the meta device. Fix the config")


def _instantiate(cls, config, dtype, quantizer, qinfo, ContextManagers):
    """`cls(config)` under the loader's init contexts, then the quantizer's `preprocess_model` (its failure is
    recorded in `qinfo`, not raised). `config` is tpaudit's own copy (from `load_config`, or deep-copied by
    `build_model`), so building from it in place is what `from_pretrained` does with its copy."""
    try:
        with ContextManagers(cls.get_init_context(dtype, quantizer is not None, False, None)):
            model = cls(config)
            if quantizer is not None:
                try:
                    quantizer.preprocess_model(model=model, dtype=dtype, device_map=None, checkpoint_files=None,
                                               use_kernels=False)
                    qinfo["ran"] = True
                except Exception as e:  # noqa: BLE001 - a quantizer that cannot run here: fall back, say so
                    qinfo["reason"] = f"{type(e).__name__}: {_first_line(str(e), 160)}"
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds on a bad config
        raise ConfigError(f"transformers cannot build {cls.__name__} from this config: {type(e).__name__}: "
                          f"{_first_line(str(e))}. Fix the config") from None
    return model


def _apply_dtype_plan(model, dtype, torch) -> None:
    """Parameters the loader keeps in float32 (`_keep_in_fp32_modules(_strict)`, `PreTrainedModel._get_dtype_plan`,
    matched as in `convert_and_load_state_dict_in_model`)."""
    from transformers.core_model_loading import build_glob_alternation

    dtype_plan = model._get_dtype_plan(dtype)
    if not dtype_plan:
        return
    pattern, by_group, _ = build_glob_alternation(list(dtype_plan))
    modules = dict(model.named_modules())
    for name, param in list(model.named_parameters()):
        match = pattern.search(name)
        if match is None or not param.is_floating_point():
            continue
        target = dtype_plan[by_group[match.lastgroup]]
        if param.dtype != target:
            module_name, _, leaf = name.rpartition(".")
            modules[module_name]._parameters[leaf] = torch.nn.Parameter(
                torch.empty(param.shape, dtype=target, device="meta"), requires_grad=param.requires_grad)


def _text_prefix(model, owner, PreTrainedModel) -> str:
    """Module path of the base model whose config owns the plan (`model.language_model` in a VLM)."""
    candidates = [(name, m) for name, m in model.named_modules()
                  if isinstance(m, PreTrainedModel) and getattr(m, "base_model", None) is m]
    for match in (lambda c: c is owner, lambda c: type(c) is type(owner),
                  lambda c: bool(getattr(c, "base_model_tp_plan", None))):
        for name, m in candidates:
            if match(m.config):
                return name
    return candidates[-1][0] if candidates else ""


def _quantization_notes(qinfo: dict, source: ModelSource, notes: list[str]) -> None:
    method = qinfo["method"]
    if qinfo["ran"] and qinfo["dequantize"]:
        notes.append(f"quantization: the {method} quantizer chose to dequantize on this host, so the model's "
                     "quantized weights count in the dequantized dtype; on the target GPUs they may be smaller")
    elif qinfo["ran"]:
        notes.append(f"quantization: {method}, modules replaced by transformers' {qinfo['quantizer']} on the meta "
                     "device (its plan extensions included)")
    else:
        where = ("taken from the checkpoint header: each follows its module's rule"
                 if not source.config_only else "NOT modelled: weights count unquantized, so bytes are overstated")
        notes.append(f"quantization: {method} quantizer could not run here ({qinfo['reason']}); quantized tensors "
                     f"{where} (tpaudit's fallback, not the loader's code)")


def _mapping_notes(mapping: CheckpointMapping, notes: list[str]) -> None:
    if mapping.companions:
        notes.append(f"checkpoint: {len(mapping.companions)} tensors the meta model lacks were added to their modules "
                     f"(e.g. {next(iter(mapping.companions))}); {len(mapping.superseded)} model parameters they "
                     "replace were dropped")
    for (stored, runtime), count in sorted(mapping.casts.items()):
        notes.append(f"checkpoint: {count} tensors stored as {stored} are cast to {runtime} on load; bytes count "
                     f"{runtime}")
    if mapping.missing:
        notes.append(f"checkpoint: {len(mapping.missing)} model parameters have no checkpoint tensor and would be "
                     f"initialised by the loader (e.g. {mapping.missing[0]})")
