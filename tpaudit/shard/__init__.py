"""Apply the resolved plan with transformers' own code on a single-process fake process group, and read every rank's
shard shapes (stage 4).

    BuiltModel + ResolvedPlan -> ShardMap

The seam (`compat.backend().shard`) joins torch's `fake` backend as rank 0 of `world_size` ranks (no communication
happens), builds the dense and expert device meshes the way `distributed.utils.initialize_distributed_mesh` does,
and calls the model's own `maybe_distribute_model` (`apply_tensor_parallelism`, `apply_expert_parallelism`).
Parameters become DTensors whose placements are what every rank gets; each rank's local shape comes from torch's
DTensor shape function for that rank's mesh coordinate. A parameter left a plain tensor is held whole by every rank.
The model is restored afterwards, so one built model serves every option.
"""

from __future__ import annotations

from ..compat import PlanRejectedError, backend
from ..compat.logic import generic_name
from ..compat.styles import is_explicit_replicate
from ..errors import UsageError
from ..model import ParamOrigin, ParamShard, Sharding, ShardMap
from ..plan import ResolvedPlan


def simulate(built, plan: ResolvedPlan) -> ShardMap:
    """Shard `built.model` by `plan` and return what every rank holds of every parameter.

    Args:
        built (`BuiltModel`): the meta model (not consumed: the seam restores it).
        plan (`ResolvedPlan`): from `plan.resolve_plan` for the same model and plan.

    Returns:
        `ShardMap` with one `ParamShard` per parameter, tied copies included (marked `tied_to`, counted once).

    Raises:
        UsageError: transformers refuses to apply the plan (e.g. experts that `ep_size` does not divide).
    """
    tf = backend()
    sizes = plan.sizes
    if sizes.parallel and not plan.loader_errors:
        dc = tf.distributed_config(sizes.tp_size, sizes.ep_size, plan.dist_overrides)
        try:
            sharded = tf.shard(built.model, dc, sizes.tp_size, sizes.ep_size, plan.resolution)
        except PlanRejectedError as e:
            raise UsageError(f"transformers refuses to shard this model at tp_size {sizes.tp_size}, ep_size "
                             f"{sizes.ep_size}: {e.detail}") from None
    else:  # one rank, or a plan the loader itself refuses: every parameter stays whole
        sharded = tf.unsharded(built.model, sizes.world_size)
    tied = tf.tied_keys(built.model)
    applied = {**plan.applied_tp, **plan.applied_ep}
    mapping = built.mapping
    params = []
    rules: dict[str, tuple] = {}  # a parameter's rule depends on its generic name only (`compat.logic.parameter_rule`)
    for s in sharded:
        module_name = s.name.rpartition(".")[0]
        generic = generic_name(s.name)
        found = rules.get(generic)
        if found is None:
            found = rules[generic] = plan.rule_for(s.name)
        rule, style, kind = found
        sharding: Sharding
        if s.placements is not None:
            placement = ", ".join(p.text for p in s.placements)
            split = next((p for p in s.placements if p.dim is not None), None)
            shard_dim, split_factor = (split.dim, split.split_factor) if split else (None, 1)
            sharding = "replicated_by_rule" if all(p.is_replicate for p in s.placements) else "sharded"
        else:
            placement, shard_dim, split_factor = "whole", None, 1
            rule_applied = s.name in applied or module_name in applied
            sharding = "replicated_by_rule" if rule_applied and is_explicit_replicate(style) else "unsharded"
        origin, ckpt = _origin(s.name, mapping)
        params.append(ParamShard(
            name=s.name, generic_name=generic, global_shape=s.global_shape, dtype=s.dtype,
            itemsize=s.itemsize, local_shapes=s.local_shapes, style=style, rule=rule, plan=kind,
            placement=placement, sharding=sharding, origin=origin, checkpoint_names=ckpt, tied_to=tied.get(s.name),
            module_type=s.module_type, shard_dim=shard_dim, split_factor=split_factor,
            floating=s.dtype.startswith(("float", "bfloat", "complex")), placements=s.placements))
    return ShardMap(tp_size=sizes.tp_size, ep_size=sizes.ep_size, params=tuple(params))


def _origin(name: str, mapping) -> tuple[ParamOrigin, tuple[str, ...]]:
    """Where a parameter's shape and dtype come from, and the checkpoint tensors that load into it."""
    if mapping is not None and name in mapping.companions:
        return "companion", (mapping.companions[name].name,)
    if mapping is not None and name in mapping.by_param:
        return "checkpoint", tuple(mapping.by_param[name])
    return "model", ()
