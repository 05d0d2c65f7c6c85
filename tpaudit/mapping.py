"""Checkpoint names -> runtime names, as `from_pretrained` maps them, and the overlay of what the meta model lacks.

Plan rules match the model's runtime parameter names, not the checkpoint's. transformers renames and merges checkpoint
tensors at load (`block_sparse_moe.experts.3.w1.weight` -> `mlp.experts.gate_up_proj`; transposed fused experts), so
each checkpoint key goes through the same `core_model_loading.rename_source_key` with the same transforms
(`conversion_mapping.get_model_conversion_mapping`) the loader uses.

A checkpoint tensor that maps to no parameter but whose parent module exists (a quantizer's `weight_packed`,
`weight_scale`, `weight_shape`, `qweight`, `scales` when its quantizer cannot run here) is added to that module as a
meta parameter: transformers applies a module's rule to every parameter of the module
(`DistributedMixin._expand_parallel_plan` falls back to the parent module), whatever created it. The module's own
parameters that the checkpoint does not hold (the unquantized `weight` the packed form replaces) are then removed:
they would not exist at runtime. A tensor with no parent module (DeepSeek-V3's MTP layer 61) is unmapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import CheckpointTensor


@dataclass
class CheckpointMapping:
    """How a checkpoint's tensors land in the model.

    Attributes:
        by_param (`dict[str, list[str]]`): runtime name -> the checkpoint names that load into it.
        companions (`dict[str, CheckpointTensor]`): runtime name -> the checkpoint tensor added to its module.
        unmapped (`list[tuple[CheckpointTensor, str]]`): tensors (with their renamed key) that map to nothing.
        superseded (`list[str]`): model parameters removed because their module is stored in another form.
        missing (`list[str]`): model parameters no checkpoint tensor loads (the loader initialises them).
        casts (`dict[tuple[str, str], int]`): `(checkpoint dtype, runtime dtype)` -> count of float tensors the loader
            casts on load.
    """

    by_param: dict[str, list[str]] = field(default_factory=dict)
    companions: dict[str, CheckpointTensor] = field(default_factory=dict)
    unmapped: list[tuple[CheckpointTensor, str]] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    casts: dict[tuple[str, str], int] = field(default_factory=dict)


def map_checkpoint(model, tensors: tuple[CheckpointTensor, ...], hf_quantizer=None) -> CheckpointMapping:
    """Map every checkpoint tensor to a runtime name and add the companions to the meta model (in place).

    Args:
        model (`PreTrainedModel`): the meta-device model, after the quantizer's `preprocess_model` if one ran.
        tensors (`tuple[CheckpointTensor, ...]`): the checkpoint's tensor table.
        hf_quantizer (`HfQuantizer`, *optional*): its `update_weight_conversions` joins the transforms, as at load.

    Returns:
        `CheckpointMapping`.

    Source: transformers 5.23 `core_model_loading.convert_and_load_state_dict_in_model` (renaming and the
    base-model-prefix fallback), `conversion_mapping.get_model_conversion_mapping`.
    """
    import torch
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    from ._compat import str_to_torch_dtype

    mapping = CheckpointMapping()
    meta_state_dict = model.state_dict()
    weight_mapping = get_model_conversion_mapping(model, None, hf_quantizer)
    renamings = [t for t in weight_mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in weight_mapping if isinstance(t, WeightConverter)]
    prefix = model.base_model_prefix
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters())

    for tensor in tensors:  # the loader sorts by dot_natural_key; the mapping of each key does not depend on order
        key = tensor.name
        renamed, _ = rename_source_key(key, renamings, converters, prefix, meta_state_dict)
        if renamed not in meta_state_dict and key in meta_state_dict:
            renamed, _ = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=meta_state_dict)
        if renamed in meta_state_dict:
            mapping.by_param.setdefault(renamed, []).append(key)
            param = parameters.get(renamed)
            if param is not None and param.is_floating_point():
                runtime = str(param.dtype).removeprefix("torch.")
                stored = str(str_to_torch_dtype(tensor.dtype)).removeprefix("torch.")
                if stored != runtime and tensor.dtype.startswith(("F", "BF")):
                    mapping.casts[(tensor.dtype, runtime)] = mapping.casts.get((tensor.dtype, runtime), 0) + 1
            continue
        module_name, _, leaf = renamed.rpartition(".")
        module = modules.get(module_name)
        if module is None or not leaf or leaf in module._buffers or renamed in mapping.companions:
            mapping.unmapped.append((tensor, renamed))
            continue
        mapping.companions[renamed] = tensor

    # Add companions; remove the params they replace (their module is stored in another, quantized form).
    touched_modules = {}
    for name, tensor in mapping.companions.items():
        module_name, _, leaf = name.rpartition(".")
        module = modules[module_name]
        dtype = str_to_torch_dtype(tensor.dtype)
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.empty(tensor.shape, dtype=dtype, device="meta"), requires_grad=False))
        touched_modules[module_name] = module
    for module_name, module in touched_modules.items():
        for leaf in list(module._parameters):
            name = f"{module_name}.{leaf}"
            if name not in mapping.by_param and name not in mapping.companions:
                del module._parameters[leaf]
                mapping.superseded.append(name)

    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    mapping.missing = [name for name, _ in model.named_parameters()
                       if name not in mapping.by_param and name not in mapping.companions and name not in tied]
    return mapping
