"""What a release line's backend object offers the rest of tpaudit: the `Seam` protocol, and the check that a release
line implements all of it (`require_seam`), run when the line's module is imported and again by `compat._lines()`.

Every release line (`transformers_5_23.Transformers523`, and each later line's subclass) implements `Seam`;
`compat.backend()` is typed as returning it, so a type checker holds every caller to these signatures and every
line to them too. Values of transformers and torch that only travel back into the seam (the meta model, configs,
quantizers, a `DistributedConfig`, torch dtypes) are `Any` here, named by the aliases of `_types`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from ._probe import Capability
from ._types import (Config, DistConfig, Model, ModelClass, ModuleFacts, Placement, QuantizationInfo, Quantizer,
                     Renamer, ResolvedPlans, ShardedParam, TorchDtype)
from .styles import StyleVocabulary

if TYPE_CHECKING:
    from .loading import RankReader


class Seam(Protocol):
    """The backend of one transformers release line (see `compat/__init__.py`). Documented where implemented
    (`transformers_5_23`); the groups follow its two halves, `meta_model.MetaModelSeam` and `plans.PlanSeam`."""

    LINE: ClassVar[str]
    TESTED_RELEASES: ClassVar[tuple[str, ...]]
    SUPPORTED: ClassVar[str]
    CAPABILITIES: ClassVar[tuple[Capability, ...]]
    STYLES: ClassVar[type[StyleVocabulary]]
    versions: dict[str, str]
    tested: bool

    def __init__(self, versions: dict[str, str], tested: bool) -> None: ...

    @classmethod
    def probe(cls) -> list[str]: ...

    # the libraries' own output, the load-time guard, `isinstance` questions
    def quiet(self) -> AbstractContextManager[None]: ...

    def install_distribute_hook(self, hook: Callable[..., Any]) -> object: ...

    def remove_distribute_hook(self, token: object) -> None: ...

    def model_payload(self, model: Model, distributed_config: DistConfig | None = None) -> dict[str, Any]: ...

    def deprecated_styles(self) -> dict[str, str]: ...

    def removed_styles(self) -> dict[str, str]: ...

    def is_pretrained_model(self, obj: object) -> bool: ...

    def is_pretrained_config(self, obj: object) -> bool: ...

    def sizes_of(self, distributed_config: DistConfig) -> tuple[int, int]: ...

    # configs and model classes
    def load_config(self, directory: str, *, trust_remote_code: bool, has_auto_map: bool) -> Config: ...

    def config_from_class(self, model_type: str) -> Config: ...

    def config_classes(self) -> Mapping[str, Any]: ...

    def text_config(self, config: Config) -> tuple[Config, str]: ...

    def config_value(self, config: Config, name: str) -> Any: ...

    def layer_configs(self, config: Config) -> list[Config]: ...

    def head_shapes(self, config: Config) -> tuple[Any, Any]: ...

    def kv_heads_per_rank(self, tp_plan: dict[str, str], num_heads: Any, tp_size: int) -> Any: ...

    def model_class(self, config: Config, name: str | None, *, trust_remote_code: bool) -> tuple[ModelClass, str]: ...

    def model_class_names(self, model_type: str, config_cls: type) -> list[str]: ...

    def model_class_by_name(self, name: str) -> ModelClass | None: ...

    def declares_plan(self, config_cls: type, model_cls: ModelClass) -> bool: ...

    # dtypes and quantizers
    def torch_dtype(self, safetensors_name: str) -> TorchDtype: ...

    def quantizer(self, config: Config, *, gpu_view: bool = True) \
        -> tuple[Quantizer | None, QuantizationInfo | None]: ...

    def host_dequantizes(self, quantizer: Quantizer) -> bool: ...

    def update_dtype(self, quantizer: Quantizer, dtype: TorchDtype) -> TorchDtype: ...

    # the meta model
    def init_contexts(self, cls: ModelClass, dtype: TorchDtype, is_quantized: bool, config: Config) -> list[Any]: ...

    def instantiate(self, cls: ModelClass, config: Config, dtype: TorchDtype, quantizer: Quantizer | None) \
        -> tuple[Model, str | None]: ...

    def quantizer_dequantizes(self, quantizer: Quantizer | None) -> bool: ...

    def apply_dtype_plan(self, model: Model, dtype: TorchDtype) -> None: ...

    def text_prefix(self, model: Model, owner_config: Config) -> str: ...

    def tied_keys(self, model: Model) -> dict[str, str]: ...

    def output_embedding_params(self, model: Model) -> tuple[str, ...]: ...

    def module_facts(self, model: Model) -> dict[str, ModuleFacts]: ...

    def add_parameter(self, model: Model, name: str, shape: tuple[int, ...], safetensors_dtype: str) -> None: ...

    def remove_parameter(self, model: Model, name: str) -> None: ...

    def module_buffers(self, model: Model, module_name: str) -> set[str]: ...

    def state_dict_keys(self, model: Model) -> set[str]: ...

    def parameter_table(self, model: Model) -> list[tuple[str, tuple[int, ...], str, bool]]: ...

    # checkpoint names and the per-rank load
    def renamer(self, model: Model, quantizer: Quantizer | None) -> Renamer: ...

    def converted_shape(self, renamer: Renamer, target: str, sources: dict[str, list[tuple[tuple[int, ...], str]]],
                        model: Model) -> tuple[int, ...] | None: ...

    def load_reader(self, global_shape: tuple[int, ...], placements: tuple[Placement, ...], mesh_size: int,
                    rank: int) -> RankReader: ...

    def load_convert(self, renamer: Renamer, pattern: str, target: str, collected: dict[str, list[Any]],
                     model: Model) -> dict[str, tuple[int, ...]]: ...

    def packed_width_fallback(self, renamer: Renamer, pattern: str, packed_cols: int) -> int | None: ...

    def decompressed_on_first_forward(self, model: Model) -> dict[str, Any] | None: ...

    def local_shape(self, global_shape: tuple[int, ...], placements: tuple[Placement, ...], mesh_size: int,
                    rank: int) -> tuple[int, ...]: ...

    def converter_operations(self, renamer: Renamer, pattern: str) -> tuple[str, ...]: ...

    # plans
    def style_names(self) -> list[str]: ...

    def merged_plans(self, model: Model) -> tuple[dict[str, str], dict[str, str]]: ...

    def set_merged_plans(self, model: Model, tp_plan: dict[str, str], ep_plan: dict[str, str]) -> None: ...

    def replan(self, model: Model, owner_config: Config, base_plan: dict[str, str] | None,
               quantizer: Quantizer | None) -> None: ...

    def plan_in_force(self, model: Model, owner_config: Config, base_plan: dict[str, str] | None,
                      quantizer: Quantizer | None) -> AbstractContextManager[None]: ...

    def base_plan(self, owner_config: Config) -> dict[str, str]: ...

    def distributed_config(self, tp_size: int, ep_size: int, overrides: dict[str, Any] | None = None) \
        -> DistConfig: ...

    def accepted_ep_sizes(self, tp_size: int, candidates: Iterable[int]) -> list[int]: ...

    def resolve_plans(self, model: Model, dc: DistConfig) \
        -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str], ResolvedPlans]: ...

    def model_names(self, model: Model) -> set[str]: ...

    # sharding on a fake process group
    def shard(self, model: Model, dc: DistConfig, tp_size: int, ep_size: int,
              resolved: ResolvedPlans | None = None) -> list[ShardedParam]: ...

    def unsharded(self, model: Model, world: int) -> list[ShardedParam]: ...


_Line = TypeVar("_Line", bound=type)


def seam_members() -> tuple[str, ...]:
    """The names every release line must provide: `Seam`'s methods and attributes, sorted."""
    names = {n for n, v in vars(Seam).items() if not n.startswith("_") and (callable(v) or isinstance(v, classmethod))}
    return tuple(sorted(names | {n for n in Seam.__annotations__ if not n.startswith("_")}))


def _declared(cls: type, name: str) -> bool:
    return hasattr(cls, name) or any(name in getattr(c, "__annotations__", {}) for c in cls.__mro__)


def _parameters(fn: Any) -> list[tuple[str, Any]]:
    func = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values()]


def require_seam(cls: _Line) -> _Line:
    """Check that release-line class `cls` implements every `Seam` member with `Seam`'s parameters (names and kinds);
    returns `cls`, so it also serves as a class decorator.

    Raises:
        TypeError: a member is missing or takes other parameters (names each; a tpaudit bug, exit 4).
    """
    if cls in _CHECKED:
        return cls
    problems = []
    for name in seam_members():
        if not _declared(cls, name):
            problems.append(f"{name} is missing")
            continue
        theirs = inspect.getattr_static(Seam, name, None)
        if theirs is None or not (callable(theirs) or isinstance(theirs, classmethod)):
            continue
        ours = inspect.getattr_static(cls, name)
        if not (callable(ours) or isinstance(ours, (classmethod, staticmethod))):
            problems.append(f"{name} is not a method")
        elif _parameters(ours) != _parameters(theirs):
            problems.append(f"{name}{inspect.signature(getattr(cls, name))} differs from the protocol's "
                            f"{name}{inspect.signature(getattr(Seam, name))}")
    if problems:
        raise TypeError(f"release line {cls.__module__}.{cls.__qualname__} does not implement the seam "
                        f"(compat._seam.Seam): {'; '.join(problems)}")
    _CHECKED.add(cls)
    return cls


_CHECKED: set[type] = set()  # the classes found complete (a class does not change after it is made)
