"""torch internals the seam uses (torch 2.13-2.14): the single-process `fake` process group and DTensor's own
local-shape function. Imported lazily: `tpaudit --help` must not import torch."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ._probe import Capability

CAPABILITIES = (
    Capability("torch.testing._internal.distributed.fake_pg", "FakeStore"),
    Capability("torch.distributed", "init_device_mesh", ("device_type", "mesh_shape", "mesh_dim_names")),
    Capability("torch.distributed.tensor._utils", "_compute_local_shape_and_global_offset",
               ("global_shape", "mesh_shape", "my_coordinate", "placements", "skip_offset")),
    Capability("torch.distributed.tensor", "DTensor"),
    Capability("torch.distributed.tensor.placement_types", "_StridedShard"),
    Capability("torch.distributed.tensor", "distribute_tensor", ("tensor", "device_mesh", "placements",
                                                                 "src_data_rank")),
)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[bool]:
    """Join torch's `fake` backend as rank 0 of `world_size` for the duration of the block (no communication).

    Yields `True` when this block created the group, `False` when one was already initialised (e.g. under torchrun)
    and is reused as it is.

    Source: torch 2.13 `torch.testing._internal.distributed.fake_pg` (registers the `fake` backend).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        yield False
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    excepthook = sys.excepthook  # init_process_group wraps it with a "[rank0]: " prefix
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield True
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook


def device_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A CPU `DeviceMesh` of `shape` named `names` (`torch.distributed.init_device_mesh`)."""
    from torch.distributed import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def local_shape(global_shape: Sequence[int], mesh_shape: Sequence[int], coordinate: Sequence[int],
                placements: Sequence[Any]) -> tuple[int, ...]:
    """The shape a rank at mesh `coordinate` holds of a DTensor with `placements`.

    Source: torch 2.13 `distributed.tensor._utils._compute_local_shape_and_global_offset`, the function DTensor itself
    uses for `to_local()` shapes (uneven shards follow `torch.chunk`: low ranks get `ceil(n / size)`).
    """
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape, _ = _compute_local_shape_and_global_offset(tuple(global_shape), tuple(mesh_shape), list(coordinate),
                                                     placements, skip_offset=True)
    return tuple(int(x) for x in shape)


def local_shape_and_offset(global_shape: Sequence[int], mesh_shape: Sequence[int], coordinate: Sequence[int],
                           placements: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`(local shape, global offset)` of the rank at mesh `coordinate` (see `local_shape`)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape, offset = _compute_local_shape_and_global_offset(tuple(global_shape), tuple(mesh_shape), list(coordinate),
                                                          placements, skip_offset=False)
    return tuple(int(x) for x in shape), tuple(int(x) for x in offset)


def placement(kind: str, dim: int | None, split_factor: int = 1) -> Any:
    """The torch placement `describe_placement` described: `Shard(dim)`, `_StridedShard(dim, split_factor=sf)`,
    `Replicate()` or `Partial()`."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if kind == "strided_shard":
        return _StridedShard(dim, split_factor=split_factor)
    if kind == "shard":
        return Shard(dim)
    if kind == "partial":
        return Partial()
    return Replicate()


def describe_placement(p: Any) -> tuple[str, int | None, int, str]:
    """`(kind, dim, split_factor, text)` of a torch placement: `("shard", 0, 1, "Shard(dim=0)")`,
    `("strided_shard", 1, 2, "_StridedShard(dim=1, sf=2)")`, `("replicate", None, 1, "Replicate()")`."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(p, _StridedShard):
        return "strided_shard", int(p.dim), int(p.split_factor or 1), str(p)
    if isinstance(p, Replicate):
        return "replicate", None, 1, str(p)
    if isinstance(p, Partial):
        return "partial", None, 1, str(p)
    dim = getattr(p, "dim", None)
    return ("shard" if dim is not None else type(p).__name__.lower()), dim, 1, str(p)


def is_dtensor(t: object) -> bool:
    """`isinstance(t, DTensor)`."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@contextlib.contextmanager
def distribute_once(modules: Iterable[Any]) -> Iterator[None]:
    """While the block runs, `distribute_tensor` as `modules` call it (each binds the name at import) computes each
    distinct placeholder once and hands the same `DTensor` to every later call with the same inputs.

    A TP application on meta calls `distribute_tensor(meta, mesh, [placement], src_data_rank=None)` once per
    parameter: 48 layers of Qwen3-VL-30B-A3B ask the same ~30 questions ten times each, and a `_StridedShard`
    (`packed_colwise`) answer costs torch's meta `cat` for every block of every rank (about a third of the
    application). With `src_data_rank=None` on a meta leaf tensor the function only reads the tensor's shape, stride,
    dtype and `requires_grad`, the mesh and the placements, and moves no data: the same inputs give the same
    `DTensor`. Only such calls are served from the memo (any other call goes to torch as it is); the memo lives for
    one block, so the meshes it keys on (by identity) outlive it. A caller must not change the returned object in
    place: transformers 5.23-5.24 wrap it in `nn.Parameter`, which detaches a new `DTensor` for each parameter
    (tests/test_compat_pins.py checks every call site, and the shard maps with and without the memo).

    Source: torch 2.13 `distributed.tensor._api.distribute_tensor`.
    """
    import torch
    from torch.distributed.tensor import distribute_tensor

    memo: dict[tuple[Any, ...], Any] = {}
    plain = (torch.Tensor, torch.nn.Parameter)

    def distribute(tensor: Any, device_mesh: Any = None, placements: Any = None, *, src_data_rank: int | None = 0) \
            -> Any:
        if (src_data_rank is not None or device_mesh is None or placements is None or type(tensor) not in plain
                or not tensor.is_meta or not tensor.is_leaf):
            return distribute_tensor(tensor, device_mesh, placements, src_data_rank=src_data_rank)
        key = (tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.requires_grad, id(device_mesh),
               tuple((type(p), p) for p in placements))
        try:
            found = memo.get(key)
        except TypeError:  # a placement that cannot be hashed: no memo for it
            return distribute_tensor(tensor, device_mesh, placements, src_data_rank=src_data_rank)
        if found is None:
            found = memo[key] = distribute_tensor(tensor, device_mesh, placements, src_data_rank=src_data_rank)
        return found

    saved = [(m, m.distribute_tensor) for m in modules if getattr(m, "distribute_tensor", None) is distribute_tensor]
    for m, _ in saved:
        m.distribute_tensor = distribute
    try:
        yield
    finally:
        for m, original in saved:
            m.distribute_tensor = original
