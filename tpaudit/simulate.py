"""Apply the resolved plan with transformers' own code on a single-process fake process group, and read every rank's
shard shapes.

This process joins torch's `fake` backend as rank 0 of `world_size` ranks (no communication happens), builds the
dense and expert device meshes the way `distributed.utils.initialize_distributed_mesh` does, and calls the model's
own `maybe_distribute_model` (`apply_tensor_parallelism`, `apply_expert_parallelism`). Parameters become DTensors
whose placements are what every rank gets; each rank's local shape then comes from torch's DTensor shape function
for that rank's mesh coordinate (`_compat.local_shape`). A parameter left a plain tensor is held whole by every rank.
"""

from __future__ import annotations

import contextlib

from .model import ParamShard, ShardMap, generic_name
from .plan import EXPLICIT_REPLICATE_STYLES, ResolvedPlan


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """Join torch's `fake` backend as rank 0 of `world_size` for the duration of the block.

    Source: torch 2.13 `torch.testing._internal.distributed.fake_pg` (registers the `fake` backend). Any process
    group already initialised (e.g. under torchrun) is left alone and reused.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        yield False
        return
    import sys

    from torch.testing._internal.distributed.fake_pg import FakeStore

    excepthook = sys.excepthook  # init_process_group wraps it with a "[rank0]: " prefix
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield True
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook


def _meshes(tp_size: int, ep_size: int, dc):
    """Dense `(pp, dp_replicate, fsdp, tp)` and expert `(pp, dp_replicate, efsdp, ep)` meshes on the CPU, as
    `distributed.utils.initialize_distributed_mesh` lays them out."""
    from torch.distributed import init_device_mesh
    from transformers.distributed.utils import TransformersDeviceMesh

    dense = init_device_mesh("cpu", (1, 1, 1, tp_size), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
    expert = init_device_mesh("cpu", (1, 1, dc.efsdp_size, ep_size), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep"))
    return TransformersDeviceMesh(dense, expert)


def _placement_text(placements) -> str:
    return ", ".join(str(p) for p in placements)


def simulate(built, plan: ResolvedPlan) -> ShardMap:
    """Shard `built.model` by `plan` and return what every rank holds of every parameter.

    Args:
        built (`BuiltModel`): the meta model (consumed: its parameters become DTensors).
        plan (`ResolvedPlan`): from `plan.resolve_plan` for the same model.

    Returns:
        `ShardMap` with one `ParamShard` per parameter, tied copies included (marked `tied_to`, counted once).

    Raises:
        UsageError: transformers refuses to apply the plan (e.g. experts that `ep_size` does not divide).
    """
    from ._compat import quiet_libraries
    from .errors import UsageError
    from .plan import distributed_config

    model = built.model
    tp_size, ep_size = plan.tp_size, plan.ep_size
    world_size = max(tp_size, ep_size)
    if (tp_size > 1 or ep_size > 1) and not plan.loader_errors:
        dc = distributed_config(tp_size, ep_size, plan.dist_overrides)
        with quiet_libraries(), fake_process_group(world_size):
            try:
                model = type(model).maybe_distribute_model(model, dc, _meshes(tp_size, ep_size, dc))
            except ValueError as e:
                raise UsageError(f"transformers refuses to shard this model at tp_size {tp_size}, ep_size {ep_size}: "
                                 f"{e}") from None
            params = _read_params(model, built.mapping, plan, world_size)
    else:  # one rank, or a plan the loader itself refuses: every parameter stays whole
        params = _read_params(model, built.mapping, plan, world_size)
    return ShardMap(tp_size=tp_size, ep_size=ep_size, params=tuple(params))


def _origin(name: str, mapping) -> tuple[str, tuple[str, ...]]:
    """Where a parameter's shape and dtype come from, and the checkpoint tensors that load into it."""
    if mapping is not None and name in mapping.companions:
        return "companion", (mapping.companions[name].name,)
    if mapping is not None and name in mapping.by_param:
        return "checkpoint", tuple(mapping.by_param[name])
    return "model", ()


def _read_params(model, mapping, plan: ResolvedPlan, world_size: int) -> list[ParamShard]:
    """Every parameter's placement and each rank's local shape (read inside the fake process group)."""
    from torch.distributed.tensor import DTensor, Replicate

    from ._compat import local_shape

    tied = dict(getattr(model, "all_tied_weights_keys", {}) or {})
    modules = dict(model.named_modules())
    applied = {**plan.applied_tp, **plan.applied_ep}
    out = []
    for name, param in model.named_parameters(remove_duplicate=False):
        module_name = name.rpartition(".")[0]
        module = modules.get(module_name)
        rule, style, kind = plan.rule_for(name)
        global_shape = tuple(int(x) for x in param.shape)
        if isinstance(param, DTensor):
            mesh, placements = param.device_mesh, tuple(param.placements)
            shapes = tuple(local_shape(global_shape, mesh.shape, [r % mesh.size()], placements)
                           for r in range(world_size))
            placement = _placement_text(placements)
            shard_dim, split_factor = _split_of(placements, len(global_shape))
            sharding = "replicated_by_rule" if all(isinstance(p, Replicate) for p in placements) else "sharded"
        else:
            shapes = tuple(global_shape for _ in range(world_size))
            placement, shard_dim, split_factor = "whole", None, 1
            rule_applied = name in applied or module_name in applied
            sharding = "replicated_by_rule" if rule_applied and style in EXPLICIT_REPLICATE_STYLES else "unsharded"
        origin, ckpt = _origin(name, mapping)
        out.append(ParamShard(
            name=name, generic_name=generic_name(name), global_shape=global_shape,
            dtype=str(param.dtype).removeprefix("torch."), itemsize=param.element_size(),
            local_shapes=shapes, style=style, rule=rule, plan=kind, placement=placement, sharding=sharding,
            origin=origin, checkpoint_names=ckpt, tied_to=tied.get(name),
            module_type=type(module).__name__ if module is not None else "",
            shard_dim=shard_dim, split_factor=split_factor))
    return out


def _split_of(placements, ndim: int) -> tuple[int | None, int]:
    """`(dimension split, split factor)` of a 1-D mesh placement: `Shard(d)` -> `(d, 1)`, `_StridedShard(d, sf)` ->
    `(d, sf)`, `Replicate()` -> `(None, 1)`. Negative dims are normalised."""
    for p in placements:
        dim = getattr(p, "dim", None)
        if dim is None:
            continue
        return (dim % ndim if ndim else 0), int(getattr(p, "split_factor", 1) or 1)
    return None, 1
