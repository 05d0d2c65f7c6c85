"""Model states of a training run on every rank: parameters, gradients, master weights and optimizer states.

Pure functions of a `ShardMap` (the exact per-rank layout `check` simulates) and a `TrainingSetup`; nothing here
imports torch or transformers. Every figure is a count of the rank's **local elements** (the product of the shard
shape it holds) times bytes per element, so replicated weights (whole on every rank), uneven `torch.chunk` shards
(larger on the low ranks) and expert-parallel splits count exactly where they live.

Per trainable parameter, on rank `r` holding `n` local elements of local shape `s`:

    parameter      n x the parameter's itemsize (every parameter, trainable or not)
    gradient       n x itemsize of `grad_dtype` (default: the parameter's dtype); a gradient has the sharding of
                   its parameter, so a replicated weight has a whole gradient on every rank
    master weight  n x 4 (float32) when the parameter is 16-bit (float16/bfloat16) and master weights are on
    optimizer      adamw:     2 x n (first and second moment, `torch.optim.AdamW`'s `exp_avg`/`exp_avg_sq`)
                   sgd:       1 x n (the momentum buffer of `torch.optim.SGD` with momentum > 0; plain SGD
                              without momentum keeps none)
                   adafactor: factored second moment (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates
                              with Sublinear Memory Cost", and `transformers.optimization.Adafactor`): for a tensor
                              of >= 2 dims, a row statistic of shape `s[:-1]` and a column statistic of shape
                              `s[:-2] + s[-1:]`, i.e. `prod(s[:-2]) x (s[-2] + s[-1])` elements; a 1-D tensor keeps a
                              full `exp_avg_sq` of `n`. No first moment (`beta1=None`, transformers' default).
                   none:      0
                   times the itemsize of `optimizer_dtype` (default float32)

Default (the common mixed-precision recipe): AdamW, fp32 moments, fp32 master weights for 16-bit parameters,
gradients in the parameter dtype: a bf16 parameter costs 2 + 2 + 4 + 8 = 16 bytes per local element.

Not trainable (parameter bytes only; no gradient, master weight or optimizer state): integer, boolean and 8-bit or
smaller floating tensors (quantized weights, packed values, `g_idx`, `weight_shape`), and the floating parameters
other than `bias` of a module that holds such a tensor (its quantization scales and zero points), and companion
tensors (checkpoint tensors a quantizer adds to a module, see `ParamShard.origin`). Tied pairs count once (the tied
copy carries no bytes, as in `ShardMap`).

Not modelled: activations (they depend on batch, sequence length and activation checkpointing; reserve some with an
activation budget), scalar optimizer state (AdamW's step counter, Adafactor's RMS and step), and any data-parallel
sharding of states (ZeRO/FSDP): the figures are per TP/EP rank with every state of its parameters held locally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ..model import ParamShard, ShardMap

Optimizer = Literal["adamw", "sgd", "adafactor", "none"]
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd", "adafactor", "none")

# Bytes per element of the torch dtypes a gradient or optimizer state can be kept in.
STATE_DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
# Parameter dtypes that train (get a gradient and optimizer states); 16-bit ones also get a float32 master copy.
TRAINABLE_DTYPES = frozenset({"float64", "float32", "bfloat16", "float16"})
HALF_DTYPES = frozenset({"bfloat16", "float16"})
MASTER_DTYPE = "float32"
OPTIMIZER_NOTES: dict[str, str] = {
    "adamw": "adamw: two moments (exp_avg, exp_avg_sq) per trainable element; the scalar step counter is not counted",
    "sgd": "sgd: one momentum buffer per trainable element (momentum > 0; plain SGD without momentum keeps none)",
    "adafactor": "adafactor: factored second moments, rows + columns over the last two dims of each local shard "
                 "(>= 2-D), a full second moment for 1-D tensors, no first moment (beta1=None); the scalar RMS and "
                 "step are not counted; as in the Adafactor paper (Shazeer & Stern 2018) and "
                 "transformers.optimization.Adafactor",
    "none": "no optimizer states (e.g. gradients only, or an optimizer kept elsewhere)",
}
ACTIVATIONS_NOTE = ("activations are not modelled: they depend on batch, sequence length and activation checkpointing; "
                    "reserve memory for them with --activation-budget")
PER_RANK_NOTE = ("model states are per TP/EP rank with no data-parallel sharding of gradients or optimizer states "
                 "(ZeRO/FSDP would divide them further)")


@dataclass(frozen=True)
class TrainingSetup:
    """How a training run keeps its model states.

    Attributes:
        optimizer (`"adamw" | "sgd" | "adafactor" | "none"`): whose states to count; default `"adamw"`.
        master_weights (`bool`): keep a float32 copy of every 16-bit trainable parameter; default `True`.
        grad_dtype (`str`, *optional*): dtype of gradients (`"float32"`, `"bfloat16"`, ...); `None` (default): the
            parameter's own dtype.
        optimizer_dtype (`str`): dtype of optimizer states; default `"float32"`.
        activation_budget_bytes (`int`): bytes reserved per rank for activations (not modelled); default 0.
    """

    optimizer: Optimizer = "adamw"
    master_weights: bool = True
    grad_dtype: str | None = None
    optimizer_dtype: str = "float32"
    activation_budget_bytes: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        for what, name in (("grad_dtype", self.grad_dtype), ("optimizer_dtype", self.optimizer_dtype)):
            if name is not None and name not in STATE_DTYPE_BYTES:
                raise ValueError(f"{what} {name!r} is not one of {', '.join(STATE_DTYPE_BYTES)}")
        if self.activation_budget_bytes < 0:
            raise ValueError(f"activation budget {self.activation_budget_bytes} B is negative")

    def to_json(self) -> dict[str, Any]:
        """The setup as JSON (`grad_dtype` `null` means: each parameter's own dtype)."""
        return {"optimizer": self.optimizer, "master_weights": self.master_weights, "grad_dtype": self.grad_dtype,
                "optimizer_dtype": self.optimizer_dtype, "activation_budget_bytes": self.activation_budget_bytes}


@dataclass(frozen=True)
class RankTraining:
    """One rank's model states (bytes), and the element counts behind them.

    `model_state_bytes = param_bytes + grad_bytes + master_weight_bytes + optimizer_bytes`;
    `total_bytes = model_state_bytes + activation_budget_bytes` (the GPU overhead is added by the caller).

    Attributes:
        rank (`int`).
        param_bytes (`int`): every resident parameter (trainable or not), as `ShardMap.rank_param_bytes`.
        grad_bytes (`int`), master_weight_bytes (`int`), optimizer_bytes (`int`): of the trainable parameters.
        activation_budget_bytes (`int`): the reserve the user asked for.
        trainable_elements (`int`): local elements of trainable parameters.
        frozen_elements (`int`): local elements of parameters that get no gradient (quantized, integer, scales).
    """

    rank: int
    param_bytes: int
    grad_bytes: int
    master_weight_bytes: int
    optimizer_bytes: int
    activation_budget_bytes: int
    trainable_elements: int
    frozen_elements: int

    @property
    def model_state_bytes(self) -> int:
        """Parameters + gradients + master weights + optimizer states."""
        return self.param_bytes + self.grad_bytes + self.master_weight_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """Model states + the activation budget."""
        return self.model_state_bytes + self.activation_budget_bytes

    def to_json(self) -> dict[str, Any]:
        """Every field and both sums, in bytes (counts in elements)."""
        return {"rank": self.rank, "param_bytes": self.param_bytes, "grad_bytes": self.grad_bytes,
                "master_weight_bytes": self.master_weight_bytes, "optimizer_bytes": self.optimizer_bytes,
                "activation_budget_bytes": self.activation_budget_bytes,
                "model_state_bytes": self.model_state_bytes, "total_bytes": self.total_bytes,
                "trainable_elements": self.trainable_elements, "frozen_elements": self.frozen_elements}


def _module_of(name: str) -> str:
    return name.rpartition(".")[0]


def frozen_reason(p: ParamShard, quantized_modules: frozenset[str]) -> str | None:
    """Why `p` gets no gradient or optimizer state, `None` when it trains.

    Args:
        p (`ParamShard`): the parameter.
        quantized_modules (`frozenset[str]`): modules (dotted names) that hold a non-trainable-dtype tensor, from
            `quantized_modules`.

    Returns:
        `"quantized or integer tensor"`, `"quantization metadata"`, or `None`.
    """
    if p.dtype not in TRAINABLE_DTYPES:
        return "quantized or integer tensor"
    if p.origin == "companion":
        return "quantization metadata"
    if _module_of(p.name) in quantized_modules and p.name.rpartition(".")[2] != "bias":
        return "quantization metadata"
    return None


def quantized_modules(shard_map: ShardMap) -> frozenset[str]:
    """Modules holding at least one parameter whose dtype does not train (integer, bool, 8-bit or smaller float)."""
    return frozenset(_module_of(p.name) for p in shard_map.params if p.dtype not in TRAINABLE_DTYPES)


def optimizer_elements(local_shape: tuple[int, ...], optimizer: str) -> int:
    """Optimizer-state elements a rank keeps for one parameter shard of `local_shape`.

    Args:
        local_shape (`tuple[int, ...]`): the rank's shard shape (`()` for a scalar).
        optimizer (`str`): `adamw` (2 x n), `sgd` (n), `adafactor` (`prod(s[:-2]) x (s[-2] + s[-1])` for >= 2-D,
            `n` for 1-D and scalars), `none` (0).

    Returns:
        Elements (`int`); 0 for an empty shard.

    Raises:
        ValueError: unknown optimizer.
    """
    n = math.prod(local_shape)
    if optimizer == "adamw":
        return 2 * n
    if optimizer == "sgd":
        return n
    if optimizer == "none":
        return 0
    if optimizer == "adafactor":
        if n == 0:
            return 0
        if len(local_shape) >= 2:
            return math.prod(local_shape[:-2]) * (local_shape[-2] + local_shape[-1])
        return n
    raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")


def rank_training(shard_map: ShardMap, setup: TrainingSetup) -> tuple[RankTraining, ...]:
    """Every rank's model states under `setup`.

    Args:
        shard_map (`ShardMap`): the simulated layout (local shapes per rank, dtypes; tied copies carry nothing).
        setup (`TrainingSetup`): optimizer, master weights, dtypes, activation budget.

    Returns:
        One `RankTraining` per rank (`shard_map.world_size` of them), in rank order.
    """
    qmods = quantized_modules(shard_map)
    world = shard_map.world_size
    grad = [0] * world
    master = [0] * world
    optim = [0] * world
    trainable = [0] * world
    frozen = [0] * world
    opt_item = STATE_DTYPE_BYTES[setup.optimizer_dtype]
    for p in shard_map.params:
        if p.tied_to is not None:
            continue
        trains = frozen_reason(p, qmods) is None
        grad_item = STATE_DTYPE_BYTES[setup.grad_dtype] if setup.grad_dtype else p.itemsize
        master_item = STATE_DTYPE_BYTES[MASTER_DTYPE] if setup.master_weights and p.dtype in HALF_DTYPES else 0
        for r in range(world):
            shape = p.local_shapes[r]
            n = math.prod(shape)
            if not trains:
                frozen[r] += n
                continue
            trainable[r] += n
            grad[r] += n * grad_item
            master[r] += n * master_item
            optim[r] += optimizer_elements(shape, setup.optimizer) * opt_item
    return tuple(RankTraining(r, shard_map.rank_param_bytes[r], grad[r], master[r], optim[r],
                              setup.activation_budget_bytes, trainable[r], frozen[r]) for r in range(world))


def frozen_families(shard_map: ShardMap) -> list[dict[str, Any]]:
    """Parameters that get no gradient, grouped by generic name: `[{"name", "count", "reason"}]`, model order."""
    qmods = quantized_modules(shard_map)
    out: dict[str, dict[str, Any]] = {}
    for p in shard_map.params:
        if p.tied_to is not None:
            continue
        why = frozen_reason(p, qmods)
        if why is None:
            continue
        entry = out.setdefault(p.generic_name, {"name": p.generic_name, "count": 0, "dtype": p.dtype, "reason": why})
        entry["count"] += 1
    return list(out.values())


def bytes_per_element(setup: TrainingSetup, dtype: str) -> dict[str, int]:
    """Bytes one trainable element of parameter dtype `dtype` costs under `setup`, by component.

    Adafactor's factored states are not per element; its `optimizer` entry is the unfactored (1-D) figure.

    Returns:
        `{"param", "grad", "master_weight", "optimizer", "total"}` in bytes.

    Raises:
        KeyError: `dtype` is not a trainable dtype name.
    """
    item = STATE_DTYPE_BYTES[dtype]
    out = {"param": item, "grad": STATE_DTYPE_BYTES[setup.grad_dtype] if setup.grad_dtype else item,
           "master_weight": STATE_DTYPE_BYTES[MASTER_DTYPE] if setup.master_weights and dtype in HALF_DTYPES else 0,
           "optimizer": optimizer_elements((1,), setup.optimizer) * STATE_DTYPE_BYTES[setup.optimizer_dtype]}
    out["total"] = sum(out.values())
    return out


def describe(setup: TrainingSetup, dtype: str = "bfloat16") -> str:
    """The recipe in words with its bytes per element, e.g. `"adamw (float32 states), float32 master weights,
    gradients in the parameter dtype: 2 + 2 + 4 + 8 = 16 B per trainable bfloat16 element"`."""
    b = bytes_per_element(setup, dtype)
    grads = f"{setup.grad_dtype} gradients" if setup.grad_dtype else "gradients in the parameter dtype"
    master = "float32 master weights for 16-bit parameters" if setup.master_weights else "no master weights"
    states = f" ({setup.optimizer_dtype} states)" if setup.optimizer != "none" else ""
    per = "" if setup.optimizer == "adafactor" else (
        f": {b['param']} + {b['grad']} + {b['master_weight']} + {b['optimizer']} = {b['total']} B per trainable "
        f"{dtype} element")
    return f"{setup.optimizer}{states}, {master}, {grads}{per}"
