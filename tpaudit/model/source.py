"""The source stage's values: the checkpoint's tensors as their headers describe them, and the model source."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import groupby
from operator import itemgetter, mul
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from ..compat.logic import generic_name

# Bits per element of each safetensors dtype tpaudit sizes (safetensors' `Dtype::bitsize`): `F4` packs two values
# per byte. The F6 formats are refused by the header reader (no transformers quantizer stores them).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F4": 4, "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32, "U64": 64, "I64": 64,
    "F64": 64, "C64": 64,
}
SAFETENSORS_DTYPE_BYTES = SAFETENSORS_DTYPE_BITS  # the dtype names tpaudit knows (kept for readers of the table)


# ----------------------------------------------------------------------------------------------------------------------
# Source stage
# ----------------------------------------------------------------------------------------------------------------------
class CheckpointTensor(NamedTuple):
    """One tensor of a safetensors checkpoint, as its header describes it (no data). A named tuple: checkpoints hold
    hundreds of thousands of them, and a tuple is built several times faster than a frozen dataclass.

    Attributes:
        name (`str`): the on-disk name (`checkpoint_name`), e.g. `model.layers.0.block_sparse_moe.experts.3.w1.weight`.
        dtype (`str`): the safetensors dtype name, e.g. `"BF16"`, `"F8_E4M3"`, `"I32"`.
        shape (`tuple[int, ...]`): the stored shape.
        file (`str`, *optional*): the shard file holding it, `None` when the listing did not say.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data: `prod(shape) * bits / 8` (two `F4` values per byte). Raises `KeyError` for an
        unknown dtype name."""
        return math.prod(self.shape) * SAFETENSORS_DTYPE_BITS[self.dtype] // 8


def checkpoint_tensors(names: Iterable[str], dtypes: Iterable[str], shapes: Iterable[tuple[int, ...]],
                       files: Iterable[str | None]) -> tuple[CheckpointTensor, ...]:
    """`CheckpointTensor`s from four parallel sequences of equal length (names, safetensors dtype names, shapes as
    tuples of ints, shard files or `None`), built at C speed: `tuple.__new__` is what a named tuple's own constructor
    calls, minus the Python frame per tensor (a checkpoint has up to 208,550). Nothing is validated here: the readers
    check every row first."""
    return tuple(map(partial(tuple.__new__, CheckpointTensor), zip(names, dtypes, shapes, files)))


# an index part of a name: a run of digits after a dot (or at the start) up to the next dot or the end
# (`parallel_utils.replace_layer_number_by_wildcard`'s indices); the same over many names joined by newlines, where a
# name that starts with an index is found apart
_INDEX_SPLIT = re.compile(r"(?<![^.])(\d+)(?=\.|$)")
INDEX_RUNS = re.compile(r"\.(\d+)(?![^.\n])")  # findall: the digits of each index run, in order
_INDEX_AT_START = re.compile(r"\n\d")  # searched in "\n" + the joined names (a literal first: a fast search)


def name_family(name: str) -> tuple[str, tuple[str, ...]]:
    """`model.layers.3.mlp.experts.7.w1.weight` -> (`model.layers.\0.mlp.experts.\0.w1.weight`, ("3", "7")): the
    name's family key (its indices as NUL characters) and its indices."""
    parts = _INDEX_SPLIT.split(name)
    return "\0".join(parts[::2]), tuple(parts[1::2])


def group_positions(names: list[str]) -> dict[str, list[int]]:
    """Positions of `names` grouped by family (`name_family`'s key): family key -> the positions of its names in
    order; families in the order of their first name.

    All names at once (Kimi-K2.5 has 208,550): one regex pass over the names joined by newlines finds every index,
    then a stable sort groups them, with no Python step per name. Names that form cannot hold (one with a newline, or
    one that starts with an index) are grouped one by one."""
    joined = "\n".join(names)
    if joined.count("\n") != len(names) - 1 or _INDEX_AT_START.search("\n" + joined):
        families: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            families.setdefault(name_family(name)[0], []).append(i)
        return families
    keys = INDEX_RUNS.sub(".\0", joined).split("\n")
    at = keys.__getitem__
    grouped = {family: list(positions) for family, positions in groupby(sorted(range(len(names)), key=at), key=at)}
    return {family: grouped[family] for family in dict.fromkeys(keys)}


def group_families(names: list[str], positions: dict[str, list[int]] | None = None) -> dict[str, list[str]]:
    """`names` grouped by family: family key -> its names in order (`group_positions`, or `positions` when the
    caller has them)."""
    at = names.__getitem__
    return {family: list(map(at, where))
            for family, where in (positions if positions is not None else group_positions(names)).items()}


def total_bytes(tensors: Iterable[CheckpointTensor]) -> int:
    """Bytes of `tensors` together: `sum(t.nbytes for t in tensors)`, summed per dtype with C-level `map`s (no Python
    frame per tensor); dtypes that pack several values per byte (`F4`) round per tensor, as `nbytes` does.

    Args:
        tensors (`Iterable[CheckpointTensor]`): any number, any mix of dtypes (`()` gives 0).

    Returns:
        `int`: bytes.

    Raises:
        KeyError: a dtype name that `SAFETENSORS_DTYPE_BITS` does not know (the readers refuse those first).
    """
    tensors = tensors if isinstance(tensors, (list, tuple)) else list(tensors)
    dtypes = list(map(itemgetter(1), tensors))
    bits = {d: SAFETENSORS_DTYPE_BITS[d] for d in set(dtypes)}
    if any(b % 8 for b in bits.values()):
        return sum(t.nbytes for t in tensors)
    numels = map(math.prod, map(itemgetter(2), tensors))
    if len(bits) == 1:
        return sum(numels) * next(iter(bits.values())) // 8
    size = {d: b // 8 for d, b in bits.items()}
    return sum(map(mul, numels, map(size.__getitem__, dtypes)))


SourceKind = Literal["local", "snapshot", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """What a source read: the model's `config.json` and, when there is one, its checkpoint's tensor table.

    Attributes:
        ref (`str`): what the user passed as MODEL.
        kind (`"local" | "snapshot" | "hub"`): which source read it.
        config (`dict`): the parsed `config.json`, unchanged.
        tensors (`tuple[CheckpointTensor, ...]`, *optional*): every checkpoint tensor, `None` for a config-only model
            (shapes then come from the meta model and bytes from the config's dtype).
        repo_id (`str`, *optional*): the Hub repo, when known (Hub source, or recorded in a snapshot).
        revision (`str`, *optional*): the revision asked for (branch, tag or commit).
        commit (`str`, *optional*): the resolved commit sha, when known.
        config_path (`str`, *optional*): the file a user edits to change the config (a local `config.json`, the
            snapshot file), used as the location of findings in SARIF.
        config_dir (`str`, *optional*): a local directory holding `config.json` (and remote code, if any).
        notes (`tuple[str, ...]`): facts about how the input was read that the report must repeat.
    """

    ref: str
    kind: SourceKind
    config: dict[str, Any]
    tensors: tuple[CheckpointTensor, ...] | None = None
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    config_path: str | None = None
    config_dir: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def config_only(self) -> bool:
        return self.tensors is None

    @cached_property
    def generic_tensor_names(self) -> frozenset[str] | None:
        """Every checkpoint tensor name with its layer and expert indices as `*` (`generic_name`), each once; `None`
        for a config-only model. Computed once per source (91,991 DeepSeek-V3 names give 43)."""
        if self.tensors is None:
            return None
        return frozenset(generic_name(t.name) for t in self.tensors)

    @cached_property
    def name_positions(self) -> dict[str, list[int]] | None:
        """The positions of the checkpoint's tensors grouped by the family of their names (`group_positions`: names
        that differ only in their layer and expert indices), `None` for a config-only model; computed once per
        source (or handed over with it by the child that read it, `sources.beside`)."""
        if self.tensors is None:
            return None
        return group_positions(list(map(itemgetter(0), self.tensors)))

    @cached_property
    def name_families(self) -> dict[str, list[str]] | None:
        """`name_positions` as names: family key -> its tensor names in checkpoint order."""
        if self.tensors is None:
            return None
        return group_families(list(map(itemgetter(0), self.tensors)), self.name_positions)

    @cached_property
    def checkpoint_bytes(self) -> int | None:
        """Sum of every checkpoint tensor's bytes, `None` for a config-only model (computed once per source)."""
        if self.tensors is None:
            return None
        return total_bytes(self.tensors)
