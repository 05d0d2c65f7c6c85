"""Parallel sizes, validated once and then passed along."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

MAX_WORLD_SIZE = 1024


@dataclass(frozen=True)
class ParallelSizes:
    """The parallel degrees of one simulation, validated once (`ParallelSizes.of`).

    Attributes:
        tp_size (`int`): tensor-parallel ranks sharing each layer.
        ep_size (`int`): expert-parallel ranks sharing the experts (1 or `tp_size` in transformers 5.23/5.24 without
            FSDP; transformers itself is the judge, at plan resolution).
    """

    tp_size: int
    ep_size: int = 1

    @classmethod
    def of(cls, tp_size: Any, ep_size: Any = 1, *, names: tuple[str, str] = ("tp_size", "ep_size")) -> "ParallelSizes":
        """Validate and build.

        Args:
            tp_size, ep_size: the sizes as given.
            names (`tuple[str, str]`): how the caller calls them in messages: the API's `("tp_size", "ep_size")`, the
                CLI's `("--tp", "--ep")`.

        Raises:
            UsageError: a size that is not an `int` (`True`, `"2"`, `2.0` included), below 1, or more ranks than
                tpaudit simulates (`MAX_WORLD_SIZE`).
        """
        def given(name: str, value: object) -> str:
            return f"{name} {value}" if name.startswith("--") else f"{name}={value!r}"

        for name, field_name, value in ((names[0], "tp_size", tp_size), (names[1], "ep_size", ep_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{given(name, value)} is not a number of ranks: {field_name} must be a positive "
                                 "integer such as 2, 4 or 8")
            if value < 1:
                raise UsageError(f"{given(name, value)} is invalid: {field_name} must be a positive integer such as 2, "
                                 "4 or 8")
        if max(tp_size, ep_size) > MAX_WORLD_SIZE:
            raise UsageError(f"{given(names[0], tp_size)}, {given(names[1], ep_size)} is more ranks than tpaudit "
                             f"simulates (at most {MAX_WORLD_SIZE}): the fake process group builds a mesh of that many "
                             "ranks")
        return cls(tp_size, ep_size)

    @property
    def world_size(self) -> int:
        return max(self.tp_size, self.ep_size)

    @property
    def parallel(self) -> bool:
        """More than one rank: something may be sharded."""
        return self.world_size > 1
