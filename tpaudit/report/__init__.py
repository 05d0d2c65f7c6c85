"""Renderers: a result -> text. One module per output format (or per command's formats); renderers never compute,
they only draw what the result already holds.

Every renderer registers itself with `@renderer(command, format)`; the modules of this package are found, not
listed, so a new output format is one new module here. The CLI's `--format` of each command offers exactly the formats
registered for it (`formats(command)`).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Renderer:
    """One output format of one command.

    Attributes:
        command (`str`): `check`, `size`, `scan`, `verify`, `batch`.
        name (`str`): the `--format` value (`table`, `json`, `markdown`, `sarif`, `html`).
        fn (`Callable`): `fn(result, **options) -> str`, or with `rich=True` `fn(result, console, **options)`, which
            draws on a rich console.
        rich (`bool`): draws on a console (terminal tables).
        width (`int`): console width when the output is not a terminal.
    """

    command: str
    name: str
    fn: Callable
    rich: bool = False
    width: int = 120


_REGISTRY: dict[tuple[str, str], Renderer] = {}


def renderer(command: str, name: str, *, rich: bool = False, width: int = 120):
    """Register `fn` as the `name` format of `command`. Refuses a second renderer for the same pair."""

    def register(fn):
        key = (command, name)
        if key in _REGISTRY and _REGISTRY[key].fn is not fn:
            raise ValueError(f"two renderers for {command} --format {name}: {_REGISTRY[key].fn.__name__}, "
                             f"{fn.__name__}")
        _REGISTRY[key] = Renderer(command, name, fn, rich, width)
        return fn

    return register


@functools.lru_cache(maxsize=None)
def _load() -> None:
    """Import every renderer module of this package, once per process (each registers its formats on import)."""
    from .. import report

    for module in pkgutil.iter_modules(report.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def formats(command: str) -> list[str]:
    """The `--format` values registered for `command`, `table` first."""
    _load()
    names = [name for (cmd, name) in _REGISTRY if cmd == command]
    return sorted(names, key=lambda n: (n != "table", n))


def get(command: str, name: str) -> Renderer:
    """The renderer of `command --format name`.

    Raises:
        UsageError: no such format for this command (the message lists the ones there are).
    """
    _load()
    r = _REGISTRY.get((command, name))
    if r is None:
        from ..errors import UsageError

        raise UsageError(f"--format {name} is not a format of tpaudit {command}. Pass one of: "
                         f"{', '.join(formats(command))}")
    return r
