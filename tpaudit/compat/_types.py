"""The typed values the seam hands to the rest of tpaudit. No torch or transformers types cross the seam in these;
the built model object itself is the one exception (it only travels back into the seam)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

# Objects of transformers and torch that cross the seam only to travel back into it: typed as `Any` (the libraries
# are read as untyped), named for what they are.
Model: TypeAlias = Any         # a `transformers.PreTrainedModel` (built on the meta device, or a user's)
ModelClass: TypeAlias = Any    # a `PreTrainedModel` subclass
Config: TypeAlias = Any        # a `transformers.PretrainedConfig`
Quantizer: TypeAlias = Any     # a `transformers.quantizers.HfQuantizer`
DistConfig: TypeAlias = Any    # a `transformers.distributed.DistributedConfig`
TorchDtype: TypeAlias = Any    # a `torch.dtype`
ResolvedPlans: TypeAlias = tuple[Any, ...]  # what `_resolve_parallel_plans` returned, handed back to `shard`


@dataclass(frozen=True)
class Placement:
    """One mesh dimension's placement of a sharded parameter.

    Attributes:
        kind (`str`): `"shard"`, `"strided_shard"` (packed styles: every block split across the ranks),
            `"replicate"` or `"partial"`.
        dim (`int`, *optional*): the tensor dimension split (non-negative), `None` for replicate/partial.
        split_factor (`int`): packed blocks of a strided shard (`packed_colwise`: 2), 1 otherwise.
        text (`str`): as torch prints it, e.g. `"Shard(dim=0)"`.
    """

    kind: str
    dim: int | None
    split_factor: int
    text: str

    @property
    def is_replicate(self) -> bool:
        """Every rank holds the whole tensor along this mesh dimension (`Replicate()`)."""
        return self.kind == "replicate"


@dataclass(frozen=True)
class ShardedParam:
    """What the loader's own TP/EP code makes of one parameter, on every rank.

    Attributes:
        name (`str`): concrete runtime name (`model.layers.3.self_attn.q_proj.weight`).
        global_shape (`tuple[int, ...]`): the whole parameter.
        dtype (`str`): torch dtype name without `torch.` (`"bfloat16"`).
        itemsize (`int`): bytes per element.
        placements (`tuple[Placement, ...]`, *optional*): `None` when the parameter stays a plain tensor (every rank
            holds it whole).
        local_shapes (`tuple[tuple[int, ...], ...]`): the shape each rank of the world holds, by rank.
        module_type (`str`): class name of the module that owns it.
    """

    name: str
    global_shape: tuple[int, ...]
    dtype: str
    itemsize: int
    placements: tuple[Placement, ...] | None
    local_shapes: tuple[tuple[int, ...], ...]
    module_type: str


@dataclass(frozen=True)
class QuantizationInfo:
    """What the pre-quantized checkpoint's quantizer did on the meta model.

    Attributes:
        method (`str`): `quant_method` (`fp8`, `compressed-tensors`, `awq`, `mxfp4`, ...).
        quantizer (`str`, *optional*): the transformers quantizer class, when one could be created.
        ran (`bool`): its `preprocess_model` replaced modules on the meta model.
        dequantize (`bool`): the quantizer chose to dequantize (weights count in the dequantized dtype).
        reason (`str`, *optional*): why it could not run here.
        gpu_view (`bool`): the build was told to size the model as a GPU holds it, although this host would
            dequantize (see `BuildOptions`).
        known (`bool`): transformers registers `method` (`False`: `from_pretrained` skips quantization altogether;
            TPA205 says so).
        refused (`bool`): `from_pretrained` raises on this config on every host with the installed releases
            (`reason` is the library's message, whole; TPA206 says so).
        refused_by (`str`, *optional*): those releases (`"transformers 5.25.0 with compressed-tensors 0.20.1"`).
        accepted_by (`str`, *optional*): the releases that accept it, where a release removed what it uses.
    """

    method: str
    quantizer: str | None = None
    ran: bool = False
    dequantize: bool = False
    reason: str | None = None
    gpu_view: bool = False
    known: bool = True
    refused: bool = False
    refused_by: str | None = None
    accepted_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "quantizer": self.quantizer, "ran": self.ran,
                               "dequantize": self.dequantize, "reason": self.reason, "gpu_view": self.gpu_view}
        if self.refused:  # only then: reports of configs that load keep their shape
            out.update(refused=True, refused_by=self.refused_by, accepted_by=self.accepted_by)
        return out


@dataclass(frozen=True)
class ModuleFacts:
    """What the checks need to know about one module of the meta model, read before any sharding.

    Attributes:
        type (`str`): class name.
        in_features (`int`, *optional*), out_features (`int`, *optional*): logical sizes of a linear layer, also when
            a quantizer stores its weight packed or transposed.
        head_dim (`int`, *optional*): for attention modules.
        is_transposed (`bool`, *optional*), is_concatenated (`bool`, *optional*): for fused experts modules, the
            layout flags transformers' experts integration reads (`[E, in, out]` storage; `[gate; up]` concatenated
            rather than interleaved).
    """

    type: str
    in_features: int | None = None
    out_features: int | None = None
    head_dim: int | None = None
    is_transposed: bool | None = None
    is_concatenated: bool | None = None


@dataclass(frozen=True)
class Renamer:
    """Checkpoint key -> runtime parameter name, with the loader's own renaming and conversion mapping.

    Attributes:
        rename (`Callable[[str], tuple[str, str | None]]`): `(runtime name, converter source pattern or None)`.
        converters (`dict[str, object]`): converter source pattern -> the converter (opaque; given back to the seam
            to convert shapes).
        siblings (`Callable[[str, str], list[str]]`): `(runtime name, source pattern)` -> the other runtime names the
            same converter fills from that tensor (a `Chunk` of `wqkv` into q/k/v: the loader renames the key to the
            first target and fills every target).
        dequantizing (`frozenset[str]`): source patterns whose converter runs the quantizer's own dequantize
            operation (`HfQuantizer.get_load_operations()["dequantize"]`, e.g. compressed-tensors'
            `CompressedTensorsDequantize`): the parameter is filled with decompressed values in its own dtype.
        quantizer_ops (`frozenset[str]`): source patterns whose converter runs any of the quantizer's own load
            operations (deserialize or dequantize).
    """

    rename: Callable[[str], tuple[str, str | None]]
    converters: dict[str, Any] = field(default_factory=dict)
    siblings: Callable[[str, str], list[str]] | None = None
    dequantizing: frozenset[str] = frozenset()
    quantizer_ops: frozenset[str] = frozenset()


class SeamError(Exception):
    """Base of the seam's own exceptions: what transformers said, classified, so callers never match its text."""


class ConfigReadError(SeamError):
    """`AutoConfig` cannot read a config. `kind`: `"remote_code"`, `"unknown_model_type"` or `"invalid"`."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class EmptyPlanError(SeamError):
    """transformers refuses a size whose plan is empty: `from_pretrained` raises `ValueError` (`plan`: `"tp"`,
    `"ep"` or `"fsdp"`)."""

    def __init__(self, plan: str, detail: str):
        super().__init__(detail)
        self.plan = plan
        self.detail = detail


class PlanRejectedError(SeamError):
    """transformers rejects the plan or the sizes for another reason (a removed style, experts `ep_size` does not
    divide); `detail` is its own message."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class LoadStepError(SeamError):
    """A step of a simulated load raised: `stage` is `"read"` (transformers' shard-on-read) or `"convert"` (a converter
    operation), `op` the operation's class name, `error` its exception type and first line."""

    def __init__(self, stage: str, op: str, error: str):
        super().__init__(f"{stage}: {op}: {error}")
        self.stage = stage
        self.op = op
        self.error = error


@dataclass(frozen=True)
class SourceSpec:
    """One checkpoint tensor as the loader collects it for a converter.

    Attributes:
        shape (`tuple[int, ...]`): stored shape.
        dtype (`str`): safetensors dtype name.
        tensor_idx (`int`): its position among the tensors of its source pattern for this parameter, in the
            loader's order (`dot_natural_key` of the checkpoint names): what `DtensorShardOperation` calls
            `tensor_idx`.
        values (`tuple[int, ...]`, *optional*): the values of a small integer tensor an operation reads (a
            compressed-tensors `weight_shape`); `None` for data the simulation may leave as zeros.
    """

    shape: tuple[int, ...]
    dtype: str
    tensor_idx: int
    values: tuple[int, ...] | None = None
