"""The loader's own read-and-convert step for one parameter on one rank, without weights (transformers 5.23/5.24).

Under TP/EP, `from_pretrained` reads every checkpoint tensor *sharded on read*: `core_model_loading.
convert_and_load_state_dict_in_model` hands each tensor to `distributed.sharding_utils.DtensorShardOperation(param)
.shard_tensor(source, tensor_idx)`, which slices it by the placements of the parameter it loads into (also a
per-expert tensor, or a quantizer companion that a converter merges into a fused parameter), and drops the pieces a
rank does not own. The converter's operations (`MergeModulelist`, `Concatenate`, `Transpose`, a quantizer's dequantize
op such as compressed-tensors' `CompressedTensorsDequantize`) then turn the rank's pieces into its local shard. Any
exception in either step fails the load (`log_conversion_errors` turns op errors into a `RuntimeError` at the end).

This module runs those two steps for any rank of a simulated world:

- `RankShardOperation` is transformers' `DtensorShardOperation` for rank `r` of a 1-D mesh of `mesh_size` ranks (the
  meshes transformers builds for a TP-only or EP-only load are 1-D). The fake process group tpaudit shards on is
  rank 0 of its world, so instead of a live DTensor it takes the parameter's global shape and placements and the
  rank: `__init__` and `_get_sub_mesh` are replaced, everything that slices (`shard_tensor`,
  `_compute_contiguous_slice`, `_compute_strided_slice`, `_normalize_param_dim`) is transformers' own.
  `tests/test_compat_pins.py` holds the replacement to the original on real DTensors of a fake process group at
  several ranks.
- `convert` runs the converter's own operations on the rank's pieces (meta tensors, or small CPU tensors where an
  operation reads values, e.g. compressed-tensors' `weight_shape`).

Source: transformers 5.23/5.24 `core_model_loading.py` (`convert_and_load_state_dict_in_model`, `spawn_materialize`,
`WeightConverter.convert`, `dot_natural_key`), `distributed/sharding_utils.py` (`DtensorShardOperation`).
"""

from __future__ import annotations

from typing import Any

from ._probe import Capability
from ._types import LoadStepError, SourceSpec, TorchDtype
from ..units import shorten

__all__ = ["CAPABILITIES", "LoadStepError", "RankReader", "SourceSpec", "convert", "decompressed_on_first_forward",
           "natural_key", "packed_width_fallback", "rank_shard_operation"]

CAPABILITIES = (
    Capability("transformers.distributed.sharding_utils", "DtensorShardOperation.shard_tensor",
               ("source", "tensor_idx", "device", "dtype")),
    Capability("transformers.distributed.sharding_utils", "DtensorShardOperation._get_sub_mesh", ("mesh_dim",)),
    Capability("transformers.core_model_loading", "dot_natural_key", ("s",)),
)


def _one_line(e: BaseException, limit: int = 200) -> str:
    """`e` as `"Type: message"`, the message on one line and at most `limit` characters; `"Type"` without one."""
    text = shorten(e, limit, words=False)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Rank:
    """What `DtensorShardOperation` asks a (sub-)mesh: this rank's index on it and its size."""

    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def get_local_rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def rank_shard_operation(global_shape: tuple[int, ...], placements: tuple[Any, ...], mesh_size: int, rank: int) -> Any:
    """transformers' `DtensorShardOperation` for a parameter of `global_shape` with torch `placements` on a 1-D mesh
    of `mesh_size` ranks, as rank `rank` holds it.

    Raises:
        LoadStepError: transformers' own offset computation refuses the shape or placements.
    """
    from transformers.distributed.sharding_utils import DtensorShardOperation

    from ._torch import local_shape_and_offset

    class RankShardOperation(DtensorShardOperation):  # type: ignore[misc]  # transformers is read as untyped
        def __init__(self) -> None:  # noqa: D401 - the replaced constructor: the same attributes, from the rank's coordinate
            self.device_mesh = None
            self.placements = tuple(placements)
            self.param_ndim = len(global_shape)
            local, offsets = local_shape_and_offset(global_shape, (mesh_size,), [rank], self.placements)
            self._axis0_offset = offsets[0]
            self._axis0_local_size = local[0]
            self._axis0_size = global_shape[0]
            self._rank = _Rank(rank, mesh_size)

        def _get_sub_mesh(self, mesh_dim: int) -> _Rank:
            return self._rank

    try:
        return RankShardOperation()
    except Exception as e:  # noqa: BLE001 - torch's own refusal of the placements is the loader's
        raise LoadStepError("read", "DtensorShardOperation", _one_line(e)) from None


def natural_key(name: str) -> Any:
    """The loader's sort key for checkpoint names (`core_model_loading.dot_natural_key`)."""
    from transformers.core_model_loading import dot_natural_key

    return dot_natural_key(name)


class RankReader:
    """Shard-on-read of one parameter's checkpoint tensors for one rank, memoized per distinct stored shape.

    Args:
        global_shape (`tuple[int, ...]`): the parameter's global shape.
        placements (`tuple`): its torch placements (`Shard`, `_StridedShard`, `Replicate`), one per mesh dimension.
        mesh_size (`int`): ranks of the 1-D mesh it is sharded on (tp_size, or ep_size for EP rules).
        rank (`int`): the rank.
    """

    def __init__(self, global_shape: tuple[int, ...], placements: tuple[Any, ...], mesh_size: int, rank: int):
        self.op = rank_shard_operation(tuple(global_shape), tuple(placements), mesh_size, rank)
        self._shapes: dict[tuple[tuple[int, ...], bool], tuple[int, ...] | None] = {}

    def owned_flags(self, tensor_indices: list[int]) -> list[bool]:
        """For each checkpoint piece index, whether this rank's shard-on-read keeps the piece whole (an expert in its
        range); pieces with the same stored shape and the same flag read alike (`local_shape`)."""
        op = self.op
        size, start = max(op._axis0_size, 1), op._axis0_offset
        end = start + op._axis0_local_size
        return [start <= i % size < end for i in tensor_indices]

    def local_shape(self, spec: SourceSpec, torch_dtype: TorchDtype) -> tuple[int, ...] | None:
        """The shape this rank reads of `spec` (`None`: a per-expert piece it does not own, dropped).

        Raises:
            LoadStepError: `shard_tensor` raises for this tensor (the load fails on this rank).
        """
        key = (spec.shape, self.owned_flags([spec.tensor_idx])[0])
        if key not in self._shapes:
            import torch

            source = torch.empty(spec.shape, dtype=torch_dtype, device="meta")
            try:
                out = self.op.shard_tensor(source, tensor_idx=spec.tensor_idx)
            except Exception as e:  # noqa: BLE001 - whatever transformers raises fails this rank's load
                raise LoadStepError("read", "DtensorShardOperation.shard_tensor", _one_line(e)) from None
            self._shapes[key] = None if out is None else tuple(int(x) for x in out.shape)
        return self._shapes[key]

    def materialize(self, spec: SourceSpec, torch_dtype: TorchDtype, data: bool) -> Any:
        """This rank's piece of `spec` as a tensor: on the meta device, or (`data`) a CPU tensor of zeros, with the
        real values sliced by `shard_tensor` where `spec.values` holds them. `None` when the rank drops it."""
        import torch

        if spec.values is not None and data:
            source = torch.tensor(spec.values, dtype=torch_dtype).reshape(spec.shape)
            try:
                return self.op.shard_tensor(source, tensor_idx=spec.tensor_idx)
            except Exception as e:  # noqa: BLE001 - as in local_shape: whatever transformers raises fails the read
                raise LoadStepError("read", "DtensorShardOperation.shard_tensor", _one_line(e)) from None
        shape = self.local_shape(spec, torch_dtype)
        if shape is None:
            return None
        return torch.zeros(shape, dtype=torch_dtype) if data else torch.empty(shape, dtype=torch_dtype, device="meta")


def convert(converter: Any, target: str, collected: dict[str, list[Any]], model: Any) -> dict[str, tuple[int, ...]]:
    """Run `converter`'s operations, as `WeightConverter.convert` does, on the collected pieces of one rank.

    Args:
        converter: the loader's `WeightConverter` (opaque: from the seam's `Renamer`).
        target (`str`): the runtime parameter name the pieces load into.
        collected (`dict[str, list[Tensor]]`): source pattern -> the rank's pieces, in the loader's order.
        model: the meta model (operations read the target parameter's dtype from it).

    Returns:
        `{key: shape}` of every tensor the operations produce (keys as the operations name them: target patterns).

    Raises:
        LoadStepError: an operation raises (the loader records a conversion error and fails the load).
    """
    import torch

    values: dict[str, Any] = dict(collected)
    for op in converter.operations:
        try:
            values = op.convert(values, source_patterns=converter.source_patterns,
                                target_patterns=converter.target_patterns, full_layer_name=target, model=model,
                                config=model.config, missing_keys=None)
        except Exception as e:  # noqa: BLE001 - any failure of the loader's own operation fails the load
            raise LoadStepError("convert", type(op).__name__, _one_line(e)) from None
    out = {}
    for key, value in values.items():
        value = value[0] if isinstance(value, list) and len(value) == 1 else value
        if isinstance(value, torch.Tensor):
            out[key] = tuple(int(x) for x in value.shape)
    return out


def packed_width_fallback(converter: Any, packed_cols: int) -> int | None:
    """The input size compressed-tensors' MoE decompression rebuilds when a rank's `weight_shape` arrives empty:
    `packed_cols * (32 // num_bits)` (exact only when `num_bits` divides 32). `None` when the converter has no
    `CompressedTensorsDequantize`.

    A copy of the fallback in transformers 5.23/5.24 `integrations/compressed_tensors.CompressedTensorsDequantize
    .convert` (`shape = torch.tensor([quant.shape[0], quant.shape[1] * pack_factor])`), pinned to it by
    tests/test_compat_pins.py, which runs the operation itself with an empty `weight_shape`.
    """
    from transformers.integrations.compressed_tensors import CompressedTensorsDequantize, get_experts_scheme

    op = next((op for op in getattr(converter, "operations", ()) if isinstance(op, CompressedTensorsDequantize)),
              None)
    if op is None:
        return None
    scheme = op.scheme or get_experts_scheme(op.hf_quantizer.compressor.quantization_config)
    return packed_cols * (32 // int(scheme.weights.num_bits))


def decompressed_on_first_forward(model: Any) -> dict[str, dict[str, tuple[tuple[int, ...], str]]] | None:
    """What compressed-tensors' decompression hook leaves in each compressed module after the first forward pass:
    `{module name: {parameter leaf: (global shape, torch dtype name)}}`; `None` when the model carries no such hook.

    transformers' compressed-tensors path without `dequantize` (the default) compresses the meta model's targeted
    modules (`ModelCompressor.compress_model`), which registers `ct_decompress_hook`: the first forward decompresses
    every compressed module in place (`decompress_model`). compressed-tensors' own `decompress_module` is run here on a
    meta copy of one module per distinct layout (its meta path: exact input size for group strategies and for bit
    widths that divide 32, an upper bound within 32 / bits values otherwise).

    Source: compressed-tensors 0.20 `compressors/model_compressors/model_compressor.py` (`add_decompress_hook`),
    `compressors/base.py` (`decompress_module`).
    """
    if getattr(model, "ct_decompress_hook", None) is None:
        return None
    import copy

    from compressed_tensors.compressors.base import decompress_module

    out: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
    done: dict[tuple[Any, ...], dict[str, tuple[tuple[int, ...], str]]] = {}
    for name, module in model.named_modules():
        if str(getattr(module, "quantization_status", "")).lower().rsplit(".", 1)[-1] != "compressed":
            continue
        params = tuple((leaf, tuple(p.shape), str(p.dtype)) for leaf, p in module.named_parameters(recurse=False))
        key = (type(module).__name__, params, repr(getattr(module, "quantization_scheme", None)))
        if key not in done:
            clone = copy.deepcopy(module)
            decompress_module(clone)
            done[key] = {leaf: (tuple(int(x) for x in p.shape), str(p.dtype).removeprefix("torch."))
                         for leaf, p in clone.named_parameters(recurse=False)}
        out[name] = done[key]
    return out
