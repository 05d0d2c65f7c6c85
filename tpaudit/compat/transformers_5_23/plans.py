"""The 5.23 line's seam, second half: checkpoint names, the per-rank load, plan resolution and sharding on a fake
process group (the plan, shard and load stages' contacts with transformers)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from .. import _torch, loading
from .._types import (Config, DistConfig, EmptyPlanError, Model, Placement, PlanRejectedError, Quantizer, Renamer,
                      ResolvedPlans, ShardedParam, TorchDtype)
from ..logic import generic_name
from ...units import shorten
from ._common import _quiet_quantizer_packages


class PlanSeam:
    """Names, plans, shards and the load: methods of `Transformers523` (see the package's docstring)."""

    def quiet(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the release line's own (`Transformers523.quiet`)

    def torch_dtype(self, safetensors_name: str) -> TorchDtype:
        raise NotImplementedError  # the release line's own (`MetaModelSeam.torch_dtype`)

    # ------------------------------------------------------------------------------------------------------------------
    # Checkpoint names
    # ------------------------------------------------------------------------------------------------------------------
    def renamer(self, model: Model, quantizer: Quantizer | None) -> Renamer:
        """The loader's mapping of checkpoint keys to runtime names.

        Source: transformers 5.23 `core_model_loading.convert_and_load_state_dict_in_model`: `rename_source_key`
        with the transforms of `conversion_mapping.get_model_conversion_mapping` (the quantizer's included), and the
        retry without renamings when the key is already a runtime name (base-model prefix added or stripped).
        """
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        meta_state_dict = model.state_dict()
        with self.quiet(), _regexes_compiled_on_first_use():
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
                        model: Model) -> tuple[int, ...] | None:
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
        collected: dict[str, Any] = {p: [torch.empty(s, dtype=self.torch_dtype(d), device="meta") for s, d in items]
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

    def load_convert(self, renamer: Renamer, pattern: str, target: str, collected: dict[str, list[Any]], model: Model) \
            -> dict[str, tuple[int, ...]]:
        """Run the operations of the converter that owns source `pattern` on one rank's pieces (see
        `loading.convert`). Raises `LoadStepError` when one of them raises."""
        with self.quiet():
            return loading.convert(renamer.converters[pattern], target, collected, model)

    def packed_width_fallback(self, renamer: Renamer, pattern: str, packed_cols: int) -> int | None:
        """The input size the converter of `pattern` rebuilds from `packed_cols` words when a rank's `weight_shape` is
        empty (compressed-tensors MoE decompression); `None` for another converter (see `loading`)."""
        return loading.packed_width_fallback(renamer.converters.get(pattern), packed_cols)

    def decompressed_on_first_forward(self, model: Model) -> dict[str, Any] | None:
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

    def merged_plans(self, model: Model) -> tuple[dict[str, str], dict[str, str]]:
        """The model's merged, prefixed TP and EP plans (`model.tp_plan`, `model.ep_plan`), as copies."""
        return dict(model.tp_plan or {}), dict(model.ep_plan or {})

    def set_merged_plans(self, model: Model, tp_plan: dict[str, str], ep_plan: dict[str, str]) -> None:
        """Put the merged plans of another model object (e.g. a user's model the guard saw) on `model`."""
        model._tp_plan = dict(tp_plan or {})
        model._ep_plan = dict(ep_plan or {})

    def replan(self, model: Model, owner_config: Config, base_plan: dict[str, str] | None,
               quantizer: Quantizer | None) -> None:
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
    def plan_in_force(self, model: Model, owner_config: Config, base_plan: dict[str, str] | None,
                      quantizer: Quantizer | None) -> Iterator[None]:
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

    def base_plan(self, owner_config: Config) -> dict[str, str]:
        """`base_model_tp_plan` of the config that owns the base model's plan (a copy; `{}` when it has none)."""
        return dict(getattr(owner_config, "base_model_tp_plan", None) or {})

    def distributed_config(self, tp_size: int, ep_size: int, overrides: dict[str, Any] | None = None) -> DistConfig:
        """`DistributedConfig(tp_size, ep_size, **overrides)`.

        Raises:
            PlanRejectedError: transformers' own validation refuses the sizes (its message).
        """
        from transformers.distributed import DistributedConfig

        try:
            return DistributedConfig(tp_size=tp_size, ep_size=ep_size, **(overrides or {}))
        except (ValueError, TypeError) as e:
            raise PlanRejectedError(shorten(str(e), 400, words=False)) from None

    def accepted_ep_sizes(self, tp_size: int, candidates: Iterable[int]) -> list[int]:
        """The expert-parallel sizes among `candidates` (each > 1) that transformers accepts next to `tp_size` on
        `tp_size` ranks with no other parallelism: those its own `DistributedConfig` validation does not refuse
        (5.23-5.25: `ep_size` a multiple of `tp_size` that divides `fsdp_size x tp_size`, so `ep_size = tp_size`).
        Asked of transformers for each candidate, not copied, so a release that decouples the sizes answers more.

        Args:
            tp_size (`int`): tensor-parallel ranks.
            candidates (iterable of `int`): ep sizes to ask about.

        Returns:
            The accepted sizes, ascending.

        Source: transformers `DistributedConfig.__post_init__` (distributed/configuration_utils.py).
        """
        accepted: list[int] = []
        for ep in sorted(set(candidates)):
            try:
                self.distributed_config(tp_size, ep)
            except PlanRejectedError:
                continue
            accepted.append(ep)
        return accepted

    def resolve_plans(self, model: Model, dc: DistConfig) \
            -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str], ResolvedPlans]:
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
        memo_key = _resolution_key(model, dc)
        memo = model.__dict__.setdefault("_tpaudit_resolutions", {})
        try:
            if memo_key is not None and memo_key in memo:
                for k, v in memo[memo_key][1].items():  # the plans as transformers merged them with the overrides
                    model.__dict__[k] = v
                raw = tuple(dict(p) for p in memo[memo_key][0])
            else:
                with self.quiet():
                    raw = model._resolve_parallel_plans(dc)
                if memo_key is not None:
                    memo[memo_key] = (tuple(dict(p) for p in raw),
                                      {k: dict(model.__dict__[k]) for k in keys if k in model.__dict__})
            tp, ep, _ = raw
            merged_tp, merged_ep = self.merged_plans(model)
        except ValueError as e:
            text = str(e)
            if "was requested, but" in text:
                kind = text.split("_size=", 1)[0].rsplit("`", 1)[-1] or "tp"
                raise EmptyPlanError(kind, text.split(" Pass ")[0]) from None
            raise PlanRejectedError(shorten(text, 400, words=False)) from None
        finally:
            for k in keys:
                if k in saved:
                    model.__dict__[k] = saved[k]
                else:
                    model.__dict__.pop(k, None)
        return dict(tp), dict(ep), merged_tp, merged_ep, raw

    def model_names(self, model: Model) -> set[str]:
        """Generic names (layer numbers as `*`) of every module and parameter: what a rule key must name.

        Source: transformers 5.23 `DistributedMixin._resolve_parallel_plans` / `_validate_parallel_plan`. Read once
        per set of names (every option of a `size` run asks again of the same model)."""
        from itertools import chain

        names = tuple(n for n, _ in chain(model.named_modules(), model.named_parameters()))
        cached = model.__dict__.get("_tpaudit_model_names")
        if cached is not None and cached[0] == names:
            return set(cached[1])
        generic = frozenset(map(generic_name, names))
        model.__dict__["_tpaudit_model_names"] = (names, generic)
        return set(generic)

    # ------------------------------------------------------------------------------------------------------------------
    # Sharding on a fake process group
    # ------------------------------------------------------------------------------------------------------------------
    def shard(self, model: Model, dc: DistConfig, tp_size: int, ep_size: int, resolved: ResolvedPlans | None = None) \
            -> list[ShardedParam]:
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
                    with _torch.distribute_once(_distributing_modules()):
                        sharded = type(model).maybe_distribute_model(model, dc, TransformersDeviceMesh(dense, expert))
                except ValueError as e:
                    raise PlanRejectedError(shorten(str(e), 400, words=False)) from None
                return self._read(sharded, world)
        finally:
            _restore(saved)

    def unsharded(self, model: Model, world: int) -> list[ShardedParam]:
        """Every parameter held whole by every rank (one rank, or a plan the loader refuses)."""
        return self._read(model, world)

    def _read(self, model: Model, world: int) -> list[ShardedParam]:
        modules = dict(model.named_modules())
        out = []
        cache: dict[Any, Any] = {}  # (global shape, mesh shape, placements) -> local shapes and placements: few distinct keys
        for name, param in model.named_parameters(remove_duplicate=False):
            module = modules.get(name.rpartition(".")[0])
            global_shape = tuple(int(x) for x in param.shape)
            placements = None
            if _torch.is_dtensor(param):
                mesh, raw = param.device_mesh, tuple(param.placements)
                key = (global_shape, tuple(mesh.shape), raw)
                if key not in cache:
                    cache[key] = (
                        tuple(_torch.local_shape(global_shape, mesh.shape, _coordinate(r, tuple(mesh.shape)), raw)
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


class _LazyPattern:
    """A compiled regular expression that compiles on first use: `re.compile`'s stand-in while transformers builds its
    table of checkpoint conversions (see `_regexes_compiled_on_first_use`). Every attribute is the compiled pattern's;
    a copy is the same object (as a `re.Pattern`'s copy is), so the table's per-model deep copies share one compile;
    pickled, it is the compiled pattern."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._compiled: re.Pattern[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(*self._args)
        return getattr(compiled, name)

    def __copy__(self) -> _LazyPattern:
        return self

    def __deepcopy__(self, memo: object) -> _LazyPattern:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return re.compile, self._args

    def __repr__(self) -> str:
        self.__getattr__("pattern")  # compiled now
        return repr(self._compiled)


@contextlib.contextmanager
def _regexes_compiled_on_first_use() -> Iterator[None]:
    """While the block runs, `transformers.core_model_loading` compiles its regular expressions on first use.

    The first `get_model_conversion_mapping` of a process builds transformers' table of checkpoint conversions for
    every model type it knows (`conversion_mapping._build_checkpoint_conversion_mapping`, cached), a few hundred
    `WeightRenaming`s that each compile their source patterns at construction: about 0.15 s of a check, for one model
    type's few. Deferred, only the patterns a load matches keys against are compiled; each behaves as the compiled
    one (`search`, `groupindex`, ...). The module's `re` is put back when the block ends.

    Source: transformers 5.23 `core_model_loading.WeightTransform.__init__` (`self.compiled_sources =
    re.compile(...)`), `conversion_mapping.get_checkpoint_conversion_mapping`.
    """
    import types

    from transformers import core_model_loading

    original = core_model_loading.re
    shim = types.SimpleNamespace(**{k: getattr(re, k) for k in dir(re) if not k.startswith("__")})
    shim.compile = _LazyPattern
    core_model_loading.re = shim
    try:
        yield
    finally:
        core_model_loading.re = original


def _coordinate(rank: int, mesh_shape: tuple[int, ...]) -> list[int]:
    """Rank `rank`'s coordinate on a mesh of `mesh_shape` over ranks `0 .. size - 1` in row-major order (the 1-D TP
    and EP meshes, and transformers 5.25's 2-D `(units, replicas)` view of the TP mesh, `get_unit_mesh`); ranks past
    the mesh's size wrap around (a TP mesh smaller than the EP world)."""
    index = rank
    size = 1
    for n in mesh_shape:
        size *= n
    index %= size
    coordinate = []
    for n in reversed(mesh_shape):
        index, c = divmod(index, n)
        coordinate.append(c)
    return coordinate[::-1]


def _normalised(described: tuple[str, int | None, int, str], ndim: int) -> tuple[str, int | None, int, str]:
    kind, dim, sf, text = described
    if dim is not None and ndim:
        dim = dim % ndim
    return kind, dim, sf, text


def _distributing_modules() -> tuple[Any, ...]:
    """The transformers modules whose styles call `distribute_tensor` (each imports the name): the parameter styles
    of `tensor_parallel.py` and the expert styles of `expert_parallel.py` (transformers 5.23-5.24)."""
    from transformers.distributed import expert_parallel, tensor_parallel

    return tensor_parallel, expert_parallel


# the `DistributedConfig` sizes `_resolve_parallel_plans` reads only as "more than one rank or not"
_SIZE_FIELDS = ("tp_size", "ep_size", "fsdp_size", "dp_replicate_size", "pp_size")


def _resolution_key(model: Model, dc: DistConfig) -> tuple[Any, ...] | None:
    """What transformers 5.23's `_resolve_parallel_plans` depends on besides the model's modules: the model's plans as
    they are now, whether each size is above 1 (`tp_size > 1`, `ep_size > 1`, ...; no size enters otherwise), and every
    other `DistributedConfig` field (the overrides, `ep_implementation`, ...). Two options of one run with the same key
    (tp_size 2, 4 and 8 at ep_size 1) get the same plans: `size` and `--suggest` resolve each such set once.
    `None` (resolve every time) with FSDP or pipeline sizes, whose resolution also reads the model's dtype plan.
    tests/test_compat_pins.py pins the memo to fresh resolutions of many sizes, with and without overrides."""
    import dataclasses

    if (dc.dp_replicate_size or 1) * (dc.fsdp_size or 1) > 1 or (dc.pp_size or 1) > 1:
        return None
    fields = tuple((f.name, (getattr(dc, f.name) or 1) > 1 if f.name in _SIZE_FIELDS else repr(getattr(dc, f.name)))
                   for f in dataclasses.fields(dc))
    plans = tuple(tuple((model.__dict__.get(k) or {}).items()) for k in ("_tp_plan", "_ep_plan", "_fsdp_plan"))
    try:
        hash((fields, plans))
    except TypeError:  # a plan value that is not a style name: resolve it every time
        return None
    return fields, plans


def _snapshot(model: Model) -> list[tuple[Any, dict[str, Any], list[Any]]]:
    """What `maybe_distribute_model` may change in place: every module's `__dict__` (shallow), a copy of each of its
    non-empty dict-valued entries (parameters, buffers, submodules, hooks), the empty ones to clear again; and the
    configs' attributes. Empty hook dicts are the common case, so they are not copied."""
    saved: list[tuple[Any, dict[str, Any], list[Any]]] = []
    configs: dict[int, tuple[Any, dict[str, Any], list[Any]]] = {}
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


def _restore(saved: list[tuple[Any, dict[str, Any], list[Any]]]) -> None:
    for obj, state, empty in saved:
        obj.__dict__.clear()
        obj.__dict__.update(state)
        for d in empty:
            d.clear()
