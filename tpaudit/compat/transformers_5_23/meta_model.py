"""The 5.23 line's seam, first half: configs, model classes, dtypes, quantizers and the meta model built with
them (the build stage's contacts with transformers)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .._types import (Config, ConfigReadError, Model, ModelClass, ModuleFacts, QuantizationInfo, Quantizer,
                      TorchDtype)
from ...units import shorten
from ..quant_patterns import check_patterns, probe_matching
from ..quant_refusals import format_refusal, full_reason, refusal
from ._common import _quiet_quantizer_packages


class MetaModelSeam:
    """Building the meta model: methods of `Transformers523` (see the package's docstring)."""

    def quiet(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the release line's own (`Transformers523.quiet`)

    # ------------------------------------------------------------------------------------------------------------------
    # Configs and model classes
    # ------------------------------------------------------------------------------------------------------------------
    def load_config(self, directory: str, *, trust_remote_code: bool, has_auto_map: bool) -> Config:
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
                raise ConfigReadError("remote_code", shorten(text, 240, words=False)) from None
            if "Unrecognized" in text or "model_type" in text or "does not recognize" in text:
                raise ConfigReadError("unknown_model_type", shorten(text, 240, words=False)) from None
            raise ConfigReadError("invalid", shorten(text, 300, words=False)) from None
        except Exception as e:  # noqa: BLE001 - transformers' validators (and remote code) raise many kinds
            raise ConfigReadError("invalid", f"{type(e).__name__}: {shorten(str(e), 300, words=False)}") from None

    def config_from_class(self, model_type: str) -> Config:
        """The default config of `model_type` (`CONFIG_MAPPING[model_type]()`)."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        with self.quiet():
            return CONFIG_MAPPING[model_type]()

    def config_classes(self) -> Mapping[str, Any]:
        """model_type -> config class, for every model type the installed transformers registers (lazily imported
        on access)."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        mapping: Mapping[str, Any] = CONFIG_MAPPING
        return mapping

    def text_config(self, config: Config) -> tuple[Config, str]:
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

    def config_value(self, config: Config, name: str) -> Any:
        """`getattr(config, name, None)` that survives configs whose attributes raise on access (transformers'
        heterogeneous per-layer configs raise `AmbiguousGlobalPerLayerAttributeError` for per-layer attributes)."""
        try:
            return getattr(config, name, None)
        except Exception:  # noqa: BLE001 - the attribute has no single global value
            return None

    def layer_configs(self, config: Config) -> list[Config]:
        """One config per decoder layer: `config.per_layer_config` of a heterogeneous config (per-layer overrides
        such as Gemma 4's global layers), else an empty list."""
        try:
            return list(config.per_layer_config or [])
        except Exception:  # noqa: BLE001 - not a heterogeneous config
            return []

    def head_shapes(self, config: Config) -> tuple[Any, Any]:
        """`(num_kv_heads, head_dim)`, each an int for all layers or a list per layer.

        Source: transformers 5.23 `configuration_utils.get_head_shapes` (what `generate()` sizes a static cache with).
        """
        from transformers.configuration_utils import get_head_shapes

        heads, dims = get_head_shapes(config)
        return heads, dims

    def kv_heads_per_rank(self, tp_plan: dict[str, str], num_heads: Any, tp_size: int) -> Any:
        """KV heads each rank holds under `tp_plan`, or `None` when they cannot be split evenly.

        Source: transformers 5.23 `distributed.tensor_parallel.get_kv_heads_per_rank`: a gathered key projection
        (`colwise_gather_output`) or an unsharded one keeps every head on every rank.
        """
        from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

        return get_kv_heads_per_rank(tp_plan, num_heads, tp_size)

    def model_class(self, config: Config, name: str | None, *, trust_remote_code: bool) -> tuple[ModelClass, str]:
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

    def model_class_names(self, model_type: str, config_cls: type) -> list[str]:
        """Candidate model classes of a model type, most useful first: causal LM, image-text-to-text, base model. A
        composite config (one with a `text_config`) tries its image-text-to-text class first: its causal-LM class
        often expects the text config alone."""
        from transformers.models.auto import modeling_auto as auto

        mappings = [auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                    auto.MODEL_MAPPING_NAMES]
        if "text_config" in (getattr(config_cls, "sub_configs", None) or {}):
            mappings[0], mappings[1] = mappings[1], mappings[0]
        names: list[str] = []
        for mapping in mappings:
            name = mapping.get(model_type)
            if isinstance(name, (list, tuple)):
                name = name[0]
            if name and name not in names:
                names.append(name)
        return names

    def model_class_by_name(self, name: str) -> ModelClass | None:
        """`transformers.<name>` when it is a model class, else `None`."""
        import transformers
        from transformers import PreTrainedModel

        cls = getattr(transformers, name, None)
        return cls if isinstance(cls, type) and issubclass(cls, PreTrainedModel) else None

    def declares_plan(self, config_cls: type, model_cls: ModelClass) -> bool:
        """Whether the config class, one of its sub-config classes, or the model class declares a TP/EP plan."""
        classes = [config_cls] + [c for c in (getattr(config_cls, "sub_configs", None) or {}).values() if c]
        for c in classes:
            if getattr(c, "base_model_tp_plan", None) or getattr(c, "base_model_ep_plan", None):
                return True
        return bool(getattr(model_cls, "_tp_plan", None))

    # ------------------------------------------------------------------------------------------------------------------
    # dtypes and quantizers
    # ------------------------------------------------------------------------------------------------------------------
    def torch_dtype(self, safetensors_name: str) -> TorchDtype:
        """safetensors dtype name -> torch dtype. Source: transformers 5.23 `modeling_utils.str_to_torch_dtype`, with
        the float8 variants `safetensors.torch` also knows (unknown names -> `torch.uint8`)."""
        known: dict[str, Any] = self.__dict__.setdefault("_dtypes", {})
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

    def quantizer(self, config: Config, *, gpu_view: bool = True) -> tuple[Quantizer | None, QuantizationInfo | None]:
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
        except Exception as e:  # noqa: BLE001 - from_pretrained raises the same: the loader refuses the config
            return None, refusal(method, full_reason(e))
        if not known:
            return None, QuantizationInfo(method, reason=f"transformers does not know quant_method {method!r}",
                                          known=False)
        check_patterns(qc_dict)  # before the quantizer parses or matches them: bounded, or exit 2
        try:
            with self.quiet():
                quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=True)
        except Exception as e:  # noqa: BLE001 - from_pretrained raises the same: the loader refuses the config
            return None, refusal(method, full_reason(e))
        if (why := format_refusal(qc_dict)) is not None:  # parsed, but the format's code cannot load it
            return None, refusal(method, why)
        quantizer._tpaudit_config = qc_dict
        if gpu_view:
            quantizer._tpaudit_gpu_view = True
        else:  # this host's load: the quantizer's own decision for it (FP8 and MXFP4 dequantize without a GPU)
            try:
                with self.quiet():
                    quantizer.validate_environment(device_map=None, weights_only=True)
            except Exception as e:  # noqa: BLE001 - a quantizer that refuses this host cannot run here
                return None, QuantizationInfo(method, reason=f"on this host: {type(e).__name__}: "
                                                             f"{shorten(str(e), 160, words=False)}")
        if type(quantizer).__name__ == "CompressedTensorsHfQuantizer" and not hasattr(quantizer, "use_fp8_kernel"):
            # Set by `validate_environment` (not called: it answers for this host); without an FP8 kernel the
            # compressed modules keep the checkpoint's own layout, which is what the checkpoint's tensors load into.
            quantizer.use_fp8_kernel = False
        return quantizer, QuantizationInfo(method, quantizer=type(quantizer).__name__)

    def host_dequantizes(self, quantizer: Quantizer) -> bool:
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

    def update_dtype(self, quantizer: Quantizer, dtype: TorchDtype) -> TorchDtype:
        """`quantizer.update_dtype(dtype)` (the quantizer's own choice of load dtype)."""
        with self.quiet():
            return quantizer.update_dtype(dtype)

    # ------------------------------------------------------------------------------------------------------------------
    # The meta model
    # ------------------------------------------------------------------------------------------------------------------
    def init_contexts(self, cls: ModelClass, dtype: TorchDtype, is_quantized: bool, config: Config) -> list[Any]:
        """The context managers `from_pretrained` builds a model under (meta device, untied weights, the dtype).

        Source: transformers 5.23 `PreTrainedModel.get_init_context(dtype, is_quantized, _is_ds_init_called,
        allow_all_kernels)`; it takes no config (5.25 adds one, for its fusion patches)."""
        return list(cls.get_init_context(dtype, is_quantized, False, None))

    def instantiate(self, cls: ModelClass, config: Config, dtype: TorchDtype, quantizer: Quantizer | None) \
            -> tuple[Model, str | None]:
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
        contexts = self.init_contexts(cls, dtype, quantizer is not None, config) + [initialization.no_init_weights()]
        with self.quiet(), ContextManagers(contexts):
            model = cls(config)
            if quantizer is not None:
                # the quantizer's `re.match` of its config's patterns against every module name, run first under
                # a time budget (`ConfigError`, exit 2, past it)
                probe_matching(getattr(quantizer, "_tpaudit_config", {}), [n for n, _ in model.named_modules()])
                try:
                    view = _as_on_gpu() if getattr(quantizer, "_tpaudit_gpu_view", False) else \
                        contextlib.nullcontext()
                    with view, _quiet_quantizer_packages():
                        quantizer.preprocess_model(model=model, dtype=dtype, device_map=None, checkpoint_files=None,
                                                   use_kernels=False)
                except Exception as e:  # noqa: BLE001 - a quantizer that cannot run here: fall back, say so
                    error = f"{type(e).__name__}: {shorten(str(e), 160, words=False)}"
        return model, error

    def quantizer_dequantizes(self, quantizer: Quantizer | None) -> bool:
        """The quantizer decided to dequantize (weights count in the dequantized dtype)."""
        return bool(quantizer is not None and getattr(quantizer.quantization_config, "dequantize", False))

    def apply_dtype_plan(self, model: Model, dtype: TorchDtype) -> None:
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

    def text_prefix(self, model: Model, owner_config: Config) -> str:
        """Module path of the base model whose config owns the plan (`model.language_model` in a VLM, `model` in a
        causal LM, `""` for a bare base model)."""
        from transformers import PreTrainedModel

        candidates: list[tuple[str, Any]] = [(name, m) for name, m in model.named_modules()
                                             if isinstance(m, PreTrainedModel) and getattr(m, "base_model", None) is m]
        matches: tuple[Callable[[Config], bool], ...] = (
            lambda c: c is owner_config, lambda c: type(c) is type(owner_config),
            lambda c: bool(getattr(c, "base_model_tp_plan", None)))
        for match in matches:
            for name, m in candidates:
                if match(m.config):
                    return name
        return candidates[-1][0] if candidates else ""

    def tied_keys(self, model: Model) -> dict[str, str]:
        """`{tied copy: source}` of the model's tied parameters (`all_tied_weights_keys`)."""
        return dict(getattr(model, "all_tied_weights_keys", {}) or {})

    def output_embedding_params(self, model: Model) -> tuple[str, ...]:
        """Parameter names of the output embedding (`lm_head.weight`), from `get_output_embeddings()`."""
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is None:
            return ()
        for name, module in model.named_modules():
            if module is out:
                return tuple(f"{name}.{leaf}" if name else leaf for leaf in module._parameters)
        return ()

    def module_facts(self, model: Model) -> dict[str, ModuleFacts]:
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

    def add_parameter(self, model: Model, name: str, shape: tuple[int, ...], safetensors_dtype: str) -> None:
        """Register a meta parameter `name` (a checkpoint tensor the meta model lacks, e.g. a quantization scale) on
        its module, as the quantizer would have created it."""
        import torch

        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        dtype = self.torch_dtype(safetensors_dtype)
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False))

    def remove_parameter(self, model: Model, name: str) -> None:
        """Drop parameter `name` from its module (a weight stored in another, quantized form)."""
        module_name, _, leaf = name.rpartition(".")
        del model.get_submodule(module_name)._parameters[leaf]

    def module_buffers(self, model: Model, module_name: str) -> set[str]:
        """Buffer names of a module (a checkpoint tensor that names one is not a parameter)."""
        try:
            return set(model.get_submodule(module_name)._buffers)
        except AttributeError:
            return set()

    def state_dict_keys(self, model: Model) -> set[str]:
        """Every name `from_pretrained` loads into: parameters and persistent buffers (`model.state_dict()`)."""
        return set(model.state_dict().keys())

    def parameter_table(self, model: Model) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """`(name, shape, dtype name, floating point)` of every parameter, tied copies once."""
        return [(n, tuple(int(x) for x in p.shape), str(p.dtype).removeprefix("torch."), p.is_floating_point())
                for n, p in model.named_parameters()]


@contextlib.contextmanager
def _as_on_gpu() -> Iterator[None]:
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

    patched: list[tuple[Any, str, Any]] = []
    module: Any
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.quantizers.") and hasattr(module, "get_current_accelerator"):
            patched.append((module, "get_current_accelerator", module.get_current_accelerator))
            module.get_current_accelerator = lambda: torch.device("cuda")
    try:
        kernels: Any = importlib.import_module("transformers.integrations.hub_kernels")
        patched.append((kernels, "get_kernel", kernels.get_kernel))
        kernels.get_kernel = lambda *args, **kwargs: types.SimpleNamespace()
    except ImportError:
        pass
    try:
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)
