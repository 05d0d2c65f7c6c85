"""Capability probes: does the installed library have the functions a release line of the seam calls, with the
parameters it passes? Probes import and inspect; they never run the functions."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capability:
    """One function, class or attribute the seam relies on.

    Attributes:
        module (`str`): the module to import (`transformers.core_model_loading`).
        path (`str`): the attribute path inside it (`rename_source_key`, `PreTrainedModel._resolve_parallel_plans`).
        params (`tuple[str, ...]`): parameter names the seam passes (empty: only presence is checked).
    """

    module: str
    path: str
    params: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.module.removeprefix('transformers.').removeprefix('torch.')}.{self.path}"

    def missing(self) -> str | None:
        """`None` when present with the expected parameters, else a few words saying what is wrong."""
        try:
            obj: Any = importlib.import_module(self.module)
        except Exception as e:  # noqa: BLE001 - a module that fails to import is a missing capability
            return f"{self.module} cannot be imported ({type(e).__name__})"
        for part in self.path.split("."):
            if not hasattr(obj, part):
                return f"{self.name} does not exist"
            obj = getattr(obj, part)
        if self.params:
            try:
                signature = inspect.signature(obj)
            except (TypeError, ValueError):
                return f"{self.name} has no inspectable signature"
            names = set(signature.parameters)
            absent = [p for p in self.params if p not in names]
            if absent:
                return f"{self.name} takes no {', '.join(absent)}"
        return None


def missing(capabilities: Iterable[Capability]) -> list[str]:
    """What is missing of `capabilities`, one entry each, in their order."""
    return [m for c in capabilities if (m := c.missing()) is not None]
