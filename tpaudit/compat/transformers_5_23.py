"""The seam for the transformers 5.23 release line: 5.23.x and 5.24.x, whose private functions tpaudit calls have
the same source (checked function by function; `tests/test_compat_pins.py` holds the copies to the originals).

Every call into transformers' (and torch's) internals that tpaudit makes lives in this class. A later release line
that changes one of them is a subclass in a module of its own that overrides the methods that differ, and a line in
`compat/__init__.py`'s `LINES`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import Any

from . import _torch, loading
from . import parity as _parity
from ._probe import Capability, missing
from ._types import (ConfigReadError, EmptyPlanError, ModuleFacts, PlanRejectedError, Placement, QuantizationInfo,
                     Renamer, ShardedParam)
from .logic import generic_name


def _first_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Transformers523:
    """transformers 5.23.x / 5.24.x on torch 2.13-2.14.

    Attributes:
        versions (`dict[str, str]`): `transformers`, `torch`, `huggingface_hub` as installed.
        tested (`bool`): the installed transformers is a release this line was tested with.
    """

    LINE = "5.23"
    TESTED_RELEASES = ("5.23", "5.24")     # major.minor the test suite runs against in CI
    SUPPORTED = ">=5.23,<5.25"
    CAPABILITIES = (
        Capability("transformers", "PreTrainedModel._resolve_parallel_plans", ("distributed_config",)),
        Capability("transformers", "PreTrainedModel.maybe_distribute_model",
                   ("model", "distributed_config", "mesh_manager")),
        Capability("transformers", "PreTrainedModel.init_parallel_plans"),
        Capability("transformers", "PreTrainedModel.get_init_context",
                   ("dtype", "is_quantized", "_is_ds_init_called", "allow_all_kernels")),
        Capability("transformers", "PreTrainedModel._get_dtype_plan", ("dtype",)),
        Capability("transformers.core_model_loading", "rename_source_key",
                   ("source_key", "weight_renamings", "weight_converters", "base_model_prefix", "meta_state_dict")),
        Capability("transformers.core_model_loading", "WeightRenaming"),
        Capability("transformers.core_model_loading", "WeightConverter"),
        Capability("transformers.core_model_loading", "build_glob_alternation", ("globs",)),
        Capability("transformers.conversion_mapping", "get_model_conversion_mapping",
                   ("model", "key_mapping", "hf_quantizer")),
        Capability("transformers.distributed", "DistributedConfig"),
        Capability("transformers.distributed.utils", "TransformersDeviceMesh", ("dense_mesh", "expert_mesh")),
        Capability("transformers.distributed.parallel_utils", "ALL_PARALLEL_STYLES"),
        Capability("transformers.distributed.parallel_utils", "_get_parameter_plan", ("parameter_name", "plan")),
        Capability("transformers.distributed.parallel_utils", "replace_layer_number_by_wildcard", ("name",)),
        Capability("transformers.distributed.tensor_parallel", "get_kv_heads_per_rank",
                   ("tp_plan", "num_heads", "tp_size")),
        Capability("transformers.distributed.expert_parallel", "apply_expert_parallelism"),
        Capability("transformers.distributed.mixin", "DistributedMixin.maybe_distribute_model"),
        Capability("transformers.configuration_utils", "get_head_shapes", ("config",)),
        Capability("transformers.modeling_utils", "str_to_torch_dtype"),
        Capability("transformers.quantizers.auto", "AutoHfQuantizer.from_config", ("quantization_config",)),
        Capability("transformers.utils.generic", "ContextManagers"),
        Capability("transformers.initialization", "no_init_weights"),
        Capability("transformers.models.auto.configuration_auto", "CONFIG_MAPPING"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_MAPPING_NAMES"),
    ) + _torch.CAPABILITIES + loading.CAPABILITIES + _parity.CAPABILITIES

    def __init__(self, versions: dict[str, str], tested: bool):
        self.versions = dict(versions)
        self.tested = tested

    @classmethod
    def probe(cls) -> list[str]:
        """What the installed libraries lack of what this line calls (empty when it can run)."""
        return missing(cls.CAPABILITIES)

    # ------------------------------------------------------------------------------------------------------------------
    # Quiet libraries
    # ------------------------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self):
        """Silence transformers' and torch's own warnings and logs while tpaudit simulates (it reports those facts)."""
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        torch_logger = logging.getLogger("torch")
        torch_level = torch_logger.level
        torch_logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            torch_logger.setLevel(torch_level)

    # ------------------------------------------------------------------------------------------------------------------
    # Configs and model classes
    # ------------------------------------------------------------------------------------------------------------------
    def load_config(self, directory: str, *, trust_remote_code: bool, has_auto_map: bool):
        """`AutoConfig.from_pretrained(directory)`.

        Raises:
            ConfigReadError: `kind` `"remote_code"` (the config needs the repo's code and it may not run),
                `"unknown_model_type"` (transformers does not know the `model_type`), `"invalid"` (a validator or
                the repo's code refused a value; `detail` is its message on one line).
        """
        from transformers import AutoConfig

        try:
            with self.quiet():
                return AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
        except ValueError as e:
            text = str(e)
            if "trust_remote_code" in text or (has_auto_map and not trust_remote_code):
                raise ConfigReadError("remote_code", _first_line(text)) from None
            if "Unrecognized" in text or "model_type" in text or "does not recognize" in text:
                raise ConfigReadError("unknown_model_type", _first_line(text)) from None
            raise ConfigReadError("invalid", _first_line(text, 300)) from None
        except Exception as e:  # noqa: BLE001 - transformers' validators (and remote code) raise many kinds
            raise ConfigReadError("invalid", f"{type(e).__name__}: {_first_line(str(e), 300)}") from None

    def config_from_class(self, model_type: str):
        """The default config of `model_type` (`CONFIG_MAPPING[model_type]()`)."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        with self.quiet():
            return CONFIG_MAPPING[model_type]()

    def config_classes(self) -> dict[str, Any]:
        """model_type -> config class, for every model type the installed transformers registers (lazily imported
        on access)."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        return CONFIG_MAPPING

    def text_config(self, config) -> tuple[Any, str]:
        """The config that owns the base model's plan and its attribute path: the (decoder) text config of a composite
        model, else the config itself.

        Source: transformers 5.23 `PretrainedConfig.get_text_config(decoder=True)`.
        """
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

    def config_value(self, config, name: str):
        """`getattr(config, name, None)` that survives configs whose attributes raise on access (transformers'
        heterogeneous per-layer configs raise `AmbiguousGlobalPerLayerAttributeError` for per-layer attributes)."""
        try:
            return getattr(config, name, None)
        except Exception:  # noqa: BLE001 - the attribute has no single global value
            return None

    def layer_configs(self, config) -> list:
        """One config per decoder layer: `config.per_layer_config` of a heterogeneous config (per-layer overrides
        such as Gemma 4's global layers), else an empty list."""
        try:
            return list(config.per_layer_config or [])
        except Exception:  # noqa: BLE001 - not a heterogeneous config
            return []

    def head_shapes(self, config) -> tuple[Any, Any]:
        """`(num_kv_heads, head_dim)`, each an int for all layers or a list per layer.

        Source: transformers 5.23 `configuration_utils.get_head_shapes` (what `generate()` sizes a static cache with).
        """
        from transformers.configuration_utils import get_head_shapes

        return get_head_shapes(config)

    def kv_heads_per_rank(self, tp_plan: dict[str, str], num_heads, tp_size: int):
        """KV heads each rank holds under `tp_plan`, or `None` when they cannot be split evenly.

        Source: transformers 5.23 `distributed.tensor_parallel.get_kv_heads_per_rank`: a gathered key projection
        (`colwise_gather_output`) or an unsharded one keeps every head on every rank.
        """
        from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

        return get_kv_heads_per_rank(tp_plan, num_heads, tp_size)

    def model_class(self, config, name: str | None, *, trust_remote_code: bool):
        """The model class named `name` (default: `config.architectures[0]`), else the model type's causal-LM,
        image-text-to-text or base class.

        Returns:
            `(cls, how)`: `how` is `"architectures"`, `"--architecture"`, `"remote code"` or `"model type default"`.

        Raises:
            ConfigReadError: `kind` `"not_a_model_class"`, `"unknown_architecture"` or `"no_model_class"`.
        """
        import transformers
        from transformers import PreTrainedModel

        archs = getattr(config, "architectures", None)
        explicit = name is not None
        name = name or (archs[0] if isinstance(archs, (list, tuple)) and archs else None)
        if name is not None and not isinstance(name, str):
            raise ConfigReadError("invalid_architecture", f"architectures[0] is {name!r}, not a class name")
        if name and hasattr(transformers, name):
            cls = getattr(transformers, name)
            if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
                raise ConfigReadError("not_a_model_class", f"{name} is a {type(cls).__name__}")
            return cls, "--architecture" if explicit else "architectures"
        auto_map = getattr(config, "auto_map", None) or {}
        if name and trust_remote_code and auto_map:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            for ref in auto_map.values():
                if isinstance(ref, str) and ref.endswith("." + name):
                    return get_class_from_dynamic_module(ref, config._name_or_path), "remote code"
        if name:
            raise ConfigReadError("unknown_architecture", name)
        for cls_name in self.model_class_names(config.model_type, type(config)):
            if hasattr(transformers, cls_name):
                return getattr(transformers, cls_name), "model type default"
        raise ConfigReadError("no_model_class", str(config.model_type))

    def model_class_names(self, model_type: str, config_cls) -> list[str]:
        """Candidate model classes of a model type, most useful first: causal LM, image-text-to-text, base model. A
        composite config (one with a `text_config`) tries its image-text-to-text class first: its causal-LM class
        often expects the text config alone."""
        from transformers.models.auto import modeling_auto as auto

        mappings = [auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                    auto.MODEL_MAPPING_NAMES]
        if "text_config" in (getattr(config_cls, "sub_configs", None) or {}):
            mappings[0], mappings[1] = mappings[1], mappings[0]
        names = []
        for mapping in mappings:
            name = mapping.get(model_type)
            if isinstance(name, (list, tuple)):
                name = name[0]
            if name and name not in names:
                names.append(name)
        return names

    def model_class_by_name(self, name: str):
        """`transformers.<name>` when it is a model class, else `None`."""
        import transformers
        from transformers import PreTrainedModel

        cls = getattr(transformers, name, None)
        return cls if isinstance(cls, type) and issubclass(cls, PreTrainedModel) else None

    def declares_plan(self, config_cls, model_cls) -> bool:
        """Whether the config class, one of its sub-config classes, or the model class declares a TP/EP plan."""
        classes = [config_cls] + [c for c in (getattr(config_cls, "sub_configs", None) or {}).values() if c]
        for c in classes:
            if getattr(c, "base_model_tp_plan", None) or getattr(c, "base_model_ep_plan", None):
                return True
        return bool(getattr(model_cls, "_tp_plan", None))

    # ------------------------------------------------------------------------------------------------------------------
    # dtypes and quantizers
    # ------------------------------------------------------------------------------------------------------------------
    def torch_dtype(self, safetensors_name: str):
        """safetensors dtype name -> torch dtype. Source: transformers 5.23 `modeling_utils.str_to_torch_dtype`, with
        the float8 variants `safetensors.torch` also knows (unknown names -> `torch.uint8`)."""
        known = self.__dict__.setdefault("_dtypes", {})
        if safetensors_name not in known:
            import torch
            from transformers.modeling_utils import str_to_torch_dtype as table

            if safetensors_name in table:
                known[safetensors_name] = table[safetensors_name]
            else:
                extra = {"F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
                         "F8_E8M0": "float8_e8m0fnu", "C64": "complex64"}
                known[safetensors_name] = getattr(torch, extra.get(safetensors_name, ""), torch.uint8)
        return known[safetensors_name]

    def quantizer(self, config, *, gpu_view: bool = True):
        """The pre-quantized checkpoint's quantizer (`AutoHfQuantizer.from_config(..., pre_quantized=True)`), or
        `None` with the reason.

        With `gpu_view` (the default), `validate_environment` is not called: it answers for this host (on a CPU it
        turns FP8 into BF16), not for the GPUs being planned for, and a quantizer that would dequantize because no
        accelerator is present (MXFP4 on a CPU host) is asked to keep the quantized layout, as the target GPUs hold
        it. Without it (`tpaudit verify --device cpu`), `validate_environment` decides for this host, as the ranks'
        own load does.

        Returns:
            `(quantizer or None, QuantizationInfo or None)`; `None, None` for an unquantized config.
        """
        qc = getattr(config, "quantization_config", None)
        if qc is None and hasattr(config, "get_text_config"):
            qc = getattr(config.get_text_config(decoder=True), "quantization_config", None)
        if qc is None:
            return None, None
        from transformers.quantizers.auto import AutoHfQuantizer

        qc_dict = qc if isinstance(qc, dict) else qc.to_dict()
        method = str(qc_dict.get("quant_method"))
        try:
            with self.quiet():  # its warning ("Unknown quantization type") is TPA205's to say, once
                known = AutoHfQuantizer.supports_quant_method(qc_dict)
            if not known:
                return None, QuantizationInfo(method, reason=f"transformers does not know quant_method {method!r}",
                                              known=False)
            with self.quiet():
                quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=True)
        except Exception as e:  # noqa: BLE001 - any failure means: fall back to the checkpoint header
            return None, QuantizationInfo(method, reason=f"{type(e).__name__}: {_first_line(str(e), 160)}")
        if gpu_view:
            quantizer._tpaudit_gpu_view = True
        else:  # this host's load: the quantizer's own decision for it (FP8 and MXFP4 dequantize without a GPU)
            try:
                with self.quiet():
                    quantizer.validate_environment(device_map=None, weights_only=True)
            except Exception as e:  # noqa: BLE001 - a quantizer that refuses this host cannot run here
                return None, QuantizationInfo(method, reason=f"{type(e).__name__}: {_first_line(str(e), 160)}")
        if type(quantizer).__name__ == "CompressedTensorsHfQuantizer" and not hasattr(quantizer, "use_fp8_kernel"):
            # Set by `validate_environment` (not called: it answers for this host); without an FP8 kernel the
            # compressed modules keep the checkpoint's own layout, which is what the checkpoint's tensors load into.
            quantizer.use_fp8_kernel = False
        return quantizer, QuantizationInfo(method, quantizer=type(quantizer).__name__)

    def host_dequantizes(self, quantizer) -> bool:
        """Whether the quantizer would dequantize on THIS host: its own `validate_environment`, run on a fresh
        quantizer made from a copy of its config (FP8 and MXFP4 turn to bfloat16 without a suitable GPU; the
        quantizer tpaudit builds with is left untouched).

        Source: transformers 5.23 `FineGrainedFP8HfQuantizer.validate_environment`,
        `Mxfp4HfQuantizer.validate_environment` (both set `quantization_config.dequantize = True`).
        """
        import copy

        from transformers.quantizers.auto import AutoHfQuantizer

        try:
            with self.quiet():
                probe = AutoHfQuantizer.from_config(copy.deepcopy(quantizer.quantization_config), pre_quantized=True)
                probe.validate_environment(device_map=None, weights_only=True)
        except Exception:  # noqa: BLE001 - a quantizer that refuses this host dequantizes nothing here either
            return False
        return bool(getattr(probe.quantization_config, "dequantize", False))

    def update_dtype(self, quantizer, dtype):
        """`quantizer.update_dtype(dtype)` (the quantizer's own choice of load dtype)."""
        with self.quiet():
            return quantizer.update_dtype(dtype)

    # ------------------------------------------------------------------------------------------------------------------
    # The meta model
    # ------------------------------------------------------------------------------------------------------------------
    def instantiate(self, cls, config, dtype, quantizer):
        """`cls(config)` on the meta device under the loader's init contexts (`cls.get_init_context`: meta device,
        untied), then the quantizer's `preprocess_model` (module replacement; its plan extensions).

        Returns:
            `(model, quantizer_error)`: `quantizer_error` is the one-line reason the quantizer could not run here
            (`None` when it ran or there is none).

        Raises:
            Exception: whatever the model's `__init__` raises for this config (the caller turns it into a
                `ConfigError`).
        """
        from transformers import initialization
        from transformers.utils.generic import ContextManagers

        error = None
        # `no_init_weights`: meta tensors hold no values, so the loader's weight initialisation only costs time here
        # (shapes, dtypes, ties and plans are set in `__init__` and `post_init`, which still run).
        contexts = cls.get_init_context(dtype, quantizer is not None, False, None) + [initialization.no_init_weights()]
        with self.quiet(), ContextManagers(contexts):
            model = cls(config)
            if quantizer is not None:
                try:
                    view = _as_on_gpu() if getattr(quantizer, "_tpaudit_gpu_view", False) else \
                        contextlib.nullcontext()
                    with view, _quiet_quantizer_packages():
                        quantizer.preprocess_model(model=model, dtype=dtype, device_map=None, checkpoint_files=None,
                                                   use_kernels=False)
                except Exception as e:  # noqa: BLE001 - a quantizer that cannot run here: fall back, say so
                    error = f"{type(e).__name__}: {_first_line(str(e), 160)}"
        return model, error

    def quantizer_dequantizes(self, quantizer) -> bool:
        """The quantizer decided to dequantize (weights count in the dequantized dtype)."""
        return bool(quantizer is not None and getattr(quantizer.quantization_config, "dequantize", False))

    def apply_dtype_plan(self, model, dtype) -> None:
        """Parameters the loader keeps in float32 (`_keep_in_fp32_modules(_strict)`): re-typed in place.

        Source: transformers 5.23 `PreTrainedModel._get_dtype_plan`, matched with `build_glob_alternation` as in
        `convert_and_load_state_dict_in_model`.
        """
        import torch
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

    def text_prefix(self, model, owner_config) -> str:
        """Module path of the base model whose config owns the plan (`model.language_model` in a VLM, `model` in a
        causal LM, `""` for a bare base model)."""
        from transformers import PreTrainedModel

        candidates = [(name, m) for name, m in model.named_modules()
                      if isinstance(m, PreTrainedModel) and getattr(m, "base_model", None) is m]
        for match in (lambda c: c is owner_config, lambda c: type(c) is type(owner_config),
                      lambda c: bool(getattr(c, "base_model_tp_plan", None))):
            for name, m in candidates:
                if match(m.config):
                    return name
        return candidates[-1][0] if candidates else ""

    def tied_keys(self, model) -> dict[str, str]:
        """`{tied copy: source}` of the model's tied parameters (`all_tied_weights_keys`)."""
        return dict(getattr(model, "all_tied_weights_keys", {}) or {})

    def output_embedding_params(self, model) -> tuple[str, ...]:
        """Parameter names of the output embedding (`lm_head.weight`), from `get_output_embeddings()`."""
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is None:
            return ()
        for name, module in model.named_modules():
            if module is out:
                return tuple(f"{name}.{leaf}" if name else leaf for leaf in module._parameters)
        return ()

    def module_facts(self, model) -> dict[str, ModuleFacts]:
        """Concrete module name -> `ModuleFacts` (type, logical linear sizes, attention head_dim, fused-experts layout
        flags), read from the meta model."""
        out = {}
        for name, m in model.named_modules():
            in_f, out_f = getattr(m, "in_features", None), getattr(m, "out_features", None)
            head_dim = getattr(m, "head_dim", None)
            flags = {k: getattr(m, k) for k in ("is_transposed", "is_concatenated")
                     if isinstance(getattr(m, k, None), bool)}
            out[name] = ModuleFacts(type=type(m).__name__, in_features=in_f if isinstance(in_f, int) else None,
                                    out_features=out_f if isinstance(out_f, int) else None,
                                    head_dim=head_dim if isinstance(head_dim, int) else None, **flags)
        return out

    def add_parameter(self, model, name: str, shape: tuple[int, ...], safetensors_dtype: str) -> None:
        """Register a meta parameter `name` (a checkpoint tensor the meta model lacks, e.g. a quantization scale) on
        its module, as the quantizer would have created it."""
        import torch

        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        dtype = self.torch_dtype(safetensors_dtype)
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False))

    def remove_parameter(self, model, name: str) -> None:
        """Drop parameter `name` from its module (a weight stored in another, quantized form)."""
        module_name, _, leaf = name.rpartition(".")
        del model.get_submodule(module_name)._parameters[leaf]

    def module_buffers(self, model, module_name: str) -> set[str]:
        """Buffer names of a module (a checkpoint tensor that names one is not a parameter)."""
        try:
            return set(model.get_submodule(module_name)._buffers)
        except AttributeError:
            return set()

    def state_dict_keys(self, model) -> set[str]:
        """Every name `from_pretrained` loads into: parameters and persistent buffers (`model.state_dict()`)."""
        return set(model.state_dict().keys())

    def parameter_table(self, model) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """`(name, shape, dtype name, floating point)` of every parameter, tied copies once."""
        return [(n, tuple(int(x) for x in p.shape), str(p.dtype).removeprefix("torch."), p.is_floating_point())
                for n, p in model.named_parameters()]

    # ------------------------------------------------------------------------------------------------------------------
    # Checkpoint names
    # ------------------------------------------------------------------------------------------------------------------
    def renamer(self, model, quantizer) -> Renamer:
        """The loader's mapping of checkpoint keys to runtime names.

        Source: transformers 5.23 `core_model_loading.convert_and_load_state_dict_in_model`: `rename_source_key`
        with the transforms of `conversion_mapping.get_model_conversion_mapping` (the quantizer's included), and the
        retry without renamings when the key is already a runtime name (base-model prefix added or stripped).
        """
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        meta_state_dict = model.state_dict()
        with self.quiet():
            weight_mapping = get_model_conversion_mapping(model, None, quantizer)
        renamings = [t for t in weight_mapping if isinstance(t, WeightRenaming)]
        converters = [t for t in weight_mapping if isinstance(t, WeightConverter)]
        prefix = model.base_model_prefix
        by_pattern = {p: c for c in converters for p in c.source_patterns}

        def rename(key: str) -> tuple[str, str | None]:
            renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta_state_dict)
            if renamed not in meta_state_dict and key in meta_state_dict:
                renamed, pattern = rename_source_key(key, [], [], base_model_prefix=prefix,
                                                     meta_state_dict=meta_state_dict)
            return renamed, pattern

        def siblings(runtime: str, pattern: str) -> list[str]:
            # WeightConverter(source_patterns=["wqkv"], target_patterns=["attn.q_proj", "attn.k_proj", ...]): the key
            # is renamed with the first target; the operations fill all of them. Literal patterns only (a regex
            # target cannot be swapped in by text; such a converter is left alone).
            converter = by_pattern.get(pattern)
            targets = [t.replace("\\.", ".") for t in getattr(converter, "target_patterns", None) or []]
            if len(targets) < 2 or not all(re.fullmatch(r"[\w.]+", t) for t in targets) or targets[0] not in runtime:
                return []
            head, _, tail = runtime.rpartition(targets[0])
            return [head + t + tail for t in targets[1:]]

        load_ops = dict(quantizer.get_load_operations()) if quantizer is not None else {}
        dequantize = load_ops.get("dequantize")
        dequantizing = frozenset(p for p, c in by_pattern.items()
                                 if dequantize is not None and any(isinstance(op, dequantize) for op in c.operations))
        quantizer_ops = tuple(load_ops.values())
        quantizing = frozenset(p for p, c in by_pattern.items()
                               if quantizer_ops and any(isinstance(op, quantizer_ops) for op in c.operations))
        return Renamer(rename=rename, converters=by_pattern, siblings=siblings, dequantizing=dequantizing,
                       quantizer_ops=quantizing)

    def converted_shape(self, renamer: Renamer, target: str, sources: dict[str, list[tuple[tuple[int, ...], str]]],
                        model) -> tuple[int, ...] | None:
        """The shape the loader's conversion ops give `target` from its checkpoint tensors, run on meta tensors.

        Args:
            target (`str`): the runtime parameter name.
            sources (`dict`): converter source pattern -> `[(stored shape, safetensors dtype)]` in load order.

        Returns:
            The converted shape, or `None` when the ops cannot run on meta tensors here (the caller then does not
            judge the shape).
        """
        import torch

        converter = None
        for pattern in sources:
            converter = renamer.converters.get(pattern)
            if converter is not None:
                break
        if converter is None:
            return None
        collected = {p: [torch.empty(s, dtype=self.torch_dtype(d), device="meta") for s, d in items]
                     for p, items in sources.items()}
        try:
            with self.quiet():
                for op in converter.operations:
                    collected = op.convert(collected, source_patterns=converter.source_patterns,
                                           target_patterns=converter.target_patterns, full_layer_name=target,
                                           model=model, config=model.config, missing_keys=None)
        except Exception:  # noqa: BLE001 - an op that needs real data: the shape is not judged
            return None
        for key, value in collected.items():
            value = value[0] if isinstance(value, list) and len(value) == 1 else value
            if isinstance(value, torch.Tensor) and (key in target or len(collected) == 1):
                return tuple(int(x) for x in value.shape)
        return None

    # ------------------------------------------------------------------------------------------------------------------
    # The load itself: shard-on-read and the converters' operations, per rank (compat/loading.py)
    # ------------------------------------------------------------------------------------------------------------------
    def load_reader(self, global_shape: tuple[int, ...], placements: tuple[Placement, ...], mesh_size: int,
                    rank: int) -> "loading.RankReader":
        """transformers' shard-on-read for one parameter as rank `rank` of a 1-D mesh of `mesh_size` ranks.

        Raises:
            LoadStepError: transformers' own placement arithmetic refuses the parameter (the load fails).
        """
        torch_placements = tuple(_torch.placement(p.kind, p.dim, p.split_factor) for p in placements)
        return loading.RankReader(global_shape, torch_placements, mesh_size, rank)

    def load_convert(self, renamer: Renamer, pattern: str, target: str, collected: dict[str, list], model) \
            -> dict[str, tuple[int, ...]]:
        """Run the operations of the converter that owns source `pattern` on one rank's pieces (see
        `loading.convert`). Raises `LoadStepError` when one of them raises."""
        with self.quiet():
            return loading.convert(renamer.converters[pattern], target, collected, model)

    def packed_width_fallback(self, renamer: Renamer, pattern: str, packed_cols: int) -> int | None:
        """The input size the converter of `pattern` rebuilds from `packed_cols` words when a rank's `weight_shape` is
        empty (compressed-tensors MoE decompression); `None` for another converter (see `loading`)."""
        return loading.packed_width_fallback(renamer.converters.get(pattern), packed_cols)

    def decompressed_on_first_forward(self, model) -> dict | None:
        """compressed-tensors' in-place decompression on the first forward pass, per compressed module (see
        `loading.decompressed_on_first_forward`); `None` when the model has no decompression hook."""
        with self.quiet(), _quiet_quantizer_packages():
            return loading.decompressed_on_first_forward(model)

    def local_shape(self, global_shape: tuple[int, ...], placements: tuple[Placement, ...], mesh_size: int,
                    rank: int) -> tuple[int, ...]:
        """The shape rank `rank` of a 1-D mesh of `mesh_size` holds of a tensor of `global_shape` with `placements`
        (torch's own DTensor local-shape function)."""
        torch_placements = [_torch.placement(p.kind, p.dim, p.split_factor) for p in placements]
        return _torch.local_shape(global_shape, (mesh_size,), [rank], torch_placements)

    def converter_operations(self, renamer: Renamer, pattern: str) -> tuple[str, ...]:
        """Class names of the operations the converter of source `pattern` runs, in order."""
        converter = renamer.converters.get(pattern)
        return tuple(type(op).__name__ for op in getattr(converter, "operations", None) or ())

    # ------------------------------------------------------------------------------------------------------------------
    # Plans
    # ------------------------------------------------------------------------------------------------------------------
    def style_names(self) -> list[str]:
        """Every style name the installed transformers registers (`colwise`, `rowwise`, `packed_colwise`, ...).

        Source: transformers 5.23 `distributed.parallel_utils.ALL_PARALLEL_STYLES` (filled by `tensor_parallel.py` and
        `expert_parallel.py` at import).
        """
        import transformers.distributed.expert_parallel  # noqa: F401  registers the EP styles
        import transformers.distributed.tensor_parallel  # noqa: F401  registers the TP styles
        from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

        return sorted(ALL_PARALLEL_STYLES.keys())

    def merged_plans(self, model) -> tuple[dict[str, str], dict[str, str]]:
        """The model's merged, prefixed TP and EP plans (`model.tp_plan`, `model.ep_plan`), as copies."""
        return dict(model.tp_plan or {}), dict(model.ep_plan or {})

    def set_merged_plans(self, model, tp_plan: dict[str, str], ep_plan: dict[str, str]) -> None:
        """Put the merged plans of another model object (e.g. a user's model the guard saw) on `model`."""
        model._tp_plan = dict(tp_plan or {})
        model._ep_plan = dict(ep_plan or {})

    def replan(self, model, owner_config, base_plan: dict[str, str] | None, quantizer) -> None:
        """Give the model a new `base_model_tp_plan` and merge the plans again as the model's construction did.

        `owner_config.base_model_tp_plan` is replaced, then every `PreTrainedModel` in the model re-runs its own
        `init_parallel_plans` (children first, as `post_init` ran them), then the quantizer's
        `update_parallel_plan` extends the merged plans again. No module is rebuilt.

        Source: transformers 5.23 `DistributedMixin.init_parallel_plans`, `HfQuantizer.preprocess_model`.
        """
        from transformers import PreTrainedModel

        if base_plan is None:
            owner_config.__dict__.pop("base_model_tp_plan", None)
        else:
            owner_config.base_model_tp_plan = dict(base_plan)
        pretrained = [m for _, m in model.named_modules() if isinstance(m, PreTrainedModel)]
        for m in reversed(pretrained):
            m.init_parallel_plans()
        if quantizer is not None and getattr(model, "is_quantized", False):
            with self.quiet():
                quantizer.update_parallel_plan(model, model.tp_plan)
                quantizer.update_parallel_plan(model, model.ep_plan)

    @contextlib.contextmanager
    def plan_in_force(self, model, owner_config, base_plan: dict[str, str] | None, quantizer):
        """Make `base_plan` (relative keys) the model's `base_model_tp_plan` and merge the plans again (`replan`) for
        the duration of the block, then put back every plan attribute of every `PreTrainedModel` in the model and the
        config's own `base_model_tp_plan`: a candidate plan is a value handed to one resolution, never state left on
        the built model. `None` leaves the model's own plans in force.

        Source: transformers 5.23 `DistributedMixin.init_parallel_plans` (sets `_tp_plan`, `_ep_plan`, `_pp_plan`,
        `_fsdp_plan` on each `PreTrainedModel`).
        """
        if base_plan is None:
            yield
            return
        from transformers import PreTrainedModel

        keys = ("_tp_plan", "_ep_plan", "_pp_plan", "_fsdp_plan")
        saved = [(m, {k: m.__dict__[k] for k in keys if k in m.__dict__})
                 for _, m in model.named_modules() if isinstance(m, PreTrainedModel)]
        had, old = "base_model_tp_plan" in owner_config.__dict__, owner_config.__dict__.get("base_model_tp_plan")
        try:
            self.replan(model, owner_config, base_plan, quantizer)
            yield
        finally:
            for m, state in saved:
                for k in keys:
                    if k in state:
                        m.__dict__[k] = state[k]
                    else:
                        m.__dict__.pop(k, None)
            if had:
                owner_config.__dict__["base_model_tp_plan"] = old
            else:
                owner_config.__dict__.pop("base_model_tp_plan", None)

    def base_plan(self, owner_config) -> dict[str, str]:
        """`base_model_tp_plan` of the config that owns the base model's plan (a copy; `{}` when it has none)."""
        return dict(getattr(owner_config, "base_model_tp_plan", None) or {})

    def distributed_config(self, tp_size: int, ep_size: int, overrides: dict | None = None):
        """`DistributedConfig(tp_size, ep_size, **overrides)`.

        Raises:
            PlanRejectedError: transformers' own validation refuses the sizes (its message).
        """
        from transformers.distributed import DistributedConfig

        try:
            return DistributedConfig(tp_size=tp_size, ep_size=ep_size, **(overrides or {}))
        except (ValueError, TypeError) as e:
            raise PlanRejectedError(_first_line(str(e), 400)) from None

    def resolve_plans(self, model, dc) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str], tuple]:
        """The concrete TP and EP plans `from_pretrained` applies: overrides merged, EP rules winning over TP rules on
        the same modules, `*` expanded into layer numbers; and the merged plans with the overrides.

        The model's own plans are put back afterwards (transformers merges `DistributedConfig` overrides into them in
        place), so the same model serves the next option.

        Returns:
            `(applied_tp, applied_ep, merged_tp, merged_ep, raw)`: `raw` is transformers' own return value, handed
            back to `shard` so that `maybe_distribute_model` does not resolve the same plans a second time.

        Source: transformers 5.23 `DistributedMixin._resolve_parallel_plans`.

        Raises:
            EmptyPlanError: a size > 1 whose plan is empty (`from_pretrained` raises the same `ValueError`).
            PlanRejectedError: any other refusal (a removed EP style, an override key that matches nothing).
        """
        keys = ("_tp_plan", "_ep_plan", "_fsdp_plan")
        saved = {k: model.__dict__[k] for k in keys if k in model.__dict__}
        try:
            with self.quiet():
                raw = model._resolve_parallel_plans(dc)
            tp, ep, _ = raw
            merged_tp, merged_ep = self.merged_plans(model)
        except ValueError as e:
            text = str(e)
            if "was requested, but" in text:
                kind = text.split("_size=", 1)[0].rsplit("`", 1)[-1] or "tp"
                raise EmptyPlanError(kind, text.split(" Pass ")[0]) from None
            raise PlanRejectedError(_first_line(text, 400)) from None
        finally:
            for k in keys:
                if k in saved:
                    model.__dict__[k] = saved[k]
                else:
                    model.__dict__.pop(k, None)
        return dict(tp), dict(ep), merged_tp, merged_ep, raw

    def model_names(self, model) -> set[str]:
        """Generic names (layer numbers as `*`) of every module and parameter: what a rule key must name.

        Source: transformers 5.23 `DistributedMixin._resolve_parallel_plans` / `_validate_parallel_plan`."""
        from itertools import chain

        return {generic_name(n) for n, _ in chain(model.named_modules(), model.named_parameters())}

    # ------------------------------------------------------------------------------------------------------------------
    # Sharding on a fake process group
    # ------------------------------------------------------------------------------------------------------------------
    def shard(self, model, dc, tp_size: int, ep_size: int, resolved: tuple | None = None) -> list[ShardedParam]:
        """Shard `model` with the loader's own `maybe_distribute_model` as rank 0 of a single-process fake process
        group, read every parameter's placements and every rank's local shape, and put the model back as it was.

        The model is not consumed: every module's attributes, parameters, buffers, submodules and hooks are restored
        after the sharding, so the same meta model serves every (tp_size, ep_size) option of a run.

        Args:
            resolved (`tuple`, *optional*): what `resolve_plans` got from `_resolve_parallel_plans` for the same model
                and sizes; `maybe_distribute_model` then uses it instead of resolving again (same model, same config,
                a moment later: the same answer, half the work).

        Returns:
            One `ShardedParam` per parameter, in `named_parameters(remove_duplicate=False)` order (tied copies
            included).

        Raises:
            PlanRejectedError: transformers refuses to shard (e.g. experts that `ep_size` does not divide).

        Source: transformers 5.23 `DistributedMixin.maybe_distribute_model` (`apply_tensor_parallelism`,
        `apply_expert_parallelism`), the meshes of `distributed.utils.initialize_distributed_mesh`; torch 2.13's DTensor
        local-shape function.
        """
        world = max(tp_size, ep_size)
        saved = _snapshot(model)
        try:
            with self.quiet(), _torch.fake_process_group(world):
                from transformers.distributed.utils import TransformersDeviceMesh

                dense = _torch.device_mesh((1, 1, 1, tp_size), ("pp", "dp_replicate", "fsdp", "tp"))
                expert = _torch.device_mesh((1, 1, dc.efsdp_size, ep_size), ("pp", "dp_replicate", "efsdp", "ep"))
                if resolved is not None:  # undone by the restore below, like every other attribute
                    model.__dict__["_resolve_parallel_plans"] = lambda _config: resolved
                try:
                    sharded = type(model).maybe_distribute_model(model, dc, TransformersDeviceMesh(dense, expert))
                except ValueError as e:
                    raise PlanRejectedError(_first_line(str(e), 400)) from None
                return self._read(sharded, world)
        finally:
            _restore(saved)

    def unsharded(self, model, world: int) -> list[ShardedParam]:
        """Every parameter held whole by every rank (one rank, or a plan the loader refuses)."""
        return self._read(model, world)

    def _read(self, model, world: int) -> list[ShardedParam]:
        modules = dict(model.named_modules())
        out = []
        cache: dict = {}  # (global shape, mesh shape, placements) -> local shapes and placements: few distinct keys
        for name, param in model.named_parameters(remove_duplicate=False):
            module = modules.get(name.rpartition(".")[0])
            global_shape = tuple(int(x) for x in param.shape)
            placements = None
            if _torch.is_dtensor(param):
                mesh, raw = param.device_mesh, tuple(param.placements)
                key = (global_shape, tuple(mesh.shape), raw)
                if key not in cache:
                    cache[key] = (
                        tuple(_torch.local_shape(global_shape, mesh.shape, [r % mesh.size()], raw)
                              for r in range(world)),
                        tuple(Placement(*_normalised(_torch.describe_placement(p), len(global_shape))) for p in raw))
                shapes, placements = cache[key]
            else:
                shapes = (global_shape,) * world
            out.append(ShardedParam(name=name, global_shape=global_shape,
                                    dtype=str(param.dtype).removeprefix("torch."), itemsize=param.element_size(),
                                    placements=placements, local_shapes=shapes,
                                    module_type=type(module).__name__ if module is not None else ""))
        return out

    # ------------------------------------------------------------------------------------------------------------------
    # The load-time guard
    # ------------------------------------------------------------------------------------------------------------------
    def install_distribute_hook(self, hook) -> object:
        """Make `from_pretrained` call `hook(original, cls, model, distributed_config, mesh_manager)` at the step
        between building the model and reading weights. Returns a token for `remove_distribute_hook`.

        transformers 5.23 has no public hook there: this wraps `DistributedMixin.maybe_distribute_model`."""
        from transformers.distributed.mixin import DistributedMixin

        original = DistributedMixin.__dict__["maybe_distribute_model"]

        def wrapped(cls, model, distributed_config, mesh_manager):
            return hook(original.__func__, cls, model, distributed_config, mesh_manager)

        DistributedMixin.maybe_distribute_model = classmethod(wrapped)
        return original

    def remove_distribute_hook(self, token) -> None:
        from transformers.distributed.mixin import DistributedMixin

        DistributedMixin.maybe_distribute_model = token

    def model_payload(self, model, distributed_config=None) -> dict[str, Any]:
        """What it takes to rebuild a user's `model` on the meta device in another process: its config, class,
        dtype, merged plans and the `DistributedConfig` plan overrides (JSON-serialisable)."""
        import json

        overrides = {}
        if distributed_config is not None:
            for key in ("tp_plan", "ep_plan"):
                value = getattr(distributed_config, key, None)
                if isinstance(value, dict):
                    overrides[key] = dict(value)
        param = next(iter(model.parameters()), None)
        return {
            "config": json.loads(model.config.to_json_string(use_diff=False)),
            "architecture": type(model).__name__,
            "dtype": str(param.dtype).removeprefix("torch.") if param is not None else None,
            "tp_plan": dict(model.tp_plan or {}),
            "ep_plan": dict(model.ep_plan or {}),
            "overrides": overrides,
        }

    def is_pretrained_model(self, obj) -> bool:
        """`isinstance(obj, transformers.PreTrainedModel)`."""
        from transformers import PreTrainedModel

        return isinstance(obj, PreTrainedModel)

    def is_pretrained_config(self, obj) -> bool:
        """`isinstance(obj, transformers.PretrainedConfig)`."""
        from transformers import PretrainedConfig

        return isinstance(obj, PretrainedConfig)

    def sizes_of(self, distributed_config) -> tuple[int, int]:
        """`(tp_size, ep_size)` of a `DistributedConfig`."""
        return int(distributed_config.tp_size), int(distributed_config.ep_size)


def _normalised(described: tuple[str, int | None, int, str], ndim: int) -> tuple[str, int | None, int, str]:
    kind, dim, sf, text = described
    if dim is not None and ndim:
        dim = dim % ndim
    return kind, dim, sf, text


def _snapshot(model) -> list[tuple[Any, dict, list]]:
    """What `maybe_distribute_model` may change in place: every module's `__dict__` (shallow), a copy of each of its
    non-empty dict-valued entries (parameters, buffers, submodules, hooks), the empty ones to clear again; and the
    configs' attributes. Empty hook dicts are the common case, so they are not copied."""
    saved = []
    configs = {}
    for m in model.modules():
        state = dict(m.__dict__)
        empty = []
        for k, v in state.items():
            if isinstance(v, dict):
                if v:
                    state[k] = v.copy()
                else:
                    empty.append(v)
        saved.append((m, state, empty))
        config = state.get("config")
        if config is not None and id(config) not in configs:
            configs[id(config)] = (config, dict(config.__dict__), [])
    return saved + list(configs.values())


def _restore(saved) -> None:
    for obj, state, empty in saved:
        obj.__dict__.clear()
        obj.__dict__.update(state)
        for d in empty:
            d.clear()


@contextlib.contextmanager
def _quiet_quantizer_packages():
    """Silence a quantization package's own output while its module replacement runs on the meta device:
    compressed-tensors logs through loguru (one warning per module whose width its group size does not divide: tpaudit
    reports that as a finding) and draws tqdm progress bars ("Applying quantization config", "Compressing model") on
    stderr. Both are restored afterwards, so a library user's own compressed-tensors logging is untouched."""
    import io
    import sys

    loguru = sys.modules.get("loguru")
    if loguru is None and "compressed_tensors" in sys.modules:
        import loguru
    if loguru is not None:
        loguru.logger.disable("compressed_tensors")
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm writes to the `sys.stderr` of the moment
            yield
    finally:
        if loguru is not None:
            loguru.logger.enable("compressed_tensors")


@contextlib.contextmanager
def _as_on_gpu():
    """While a quantizer replaces modules on the meta device, answer its "which accelerator is here?" with a CUDA
    device, and its request for a GPU kernel module with an empty stand-in, so it lays the model out as the target
    GPUs hold it instead of dequantizing for this CPU host. Nothing runs: the meta device computes nothing.

    Source: transformers 5.23 `quantizers/quantizer_mxfp4.py` (`get_current_accelerator()` decides to dequantize
    on a CPU host), `integrations/mxfp4.py` (`get_kernel` before replacing the experts).
    """
    import importlib
    import sys
    import types

    import torch

    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.quantizers.") and hasattr(module, "get_current_accelerator"):
            patched.append((module, "get_current_accelerator", module.get_current_accelerator))
            module.get_current_accelerator = lambda: torch.device("cuda")
    try:
        kernels = importlib.import_module("transformers.integrations.hub_kernels")
        patched.append((kernels, "get_kernel", kernels.get_kernel))
        kernels.get_kernel = lambda *args, **kwargs: types.SimpleNamespace()
    except ImportError:
        pass
    try:
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)
