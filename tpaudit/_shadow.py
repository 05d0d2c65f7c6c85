"""A `tpaudit/` folder in the current directory that shadows the installed package.

`python -m tpaudit` and `torchrun ... -m tpaudit` put the current directory first on `sys.path`, so a folder named
`tpaudit` there (a clone of the repository, say) is imported as the package `tpaudit` in place of the installed one:
a folder without `__init__.py` as an empty namespace package, whose missing `__version__` then fails the import of
the command line (`ImportError: cannot import name '__version__' from 'tpaudit' (unknown location)`) on every rank.
This module imports nothing from tpaudit, so it runs before anything that would fail.
"""

from __future__ import annotations

import os
import sys


def shadowing_folder(module_file: str) -> str | None:
    """The folder imported as `tpaudit` when it is not the package holding `module_file` (a module of the installed
    package, e.g. `tpaudit/__main__.py`), else `None`."""
    package = sys.modules.get("tpaudit")
    if package is None:
        return None
    ours = os.path.dirname(os.path.abspath(module_file))
    while os.path.basename(ours) != "tpaudit" and os.path.dirname(ours) != ours:
        ours = os.path.dirname(ours)
    location = getattr(package, "__file__", None)
    if location is not None:
        folder = os.path.dirname(os.path.abspath(location))
        return None if os.path.realpath(folder) == os.path.realpath(ours) else folder
    paths = [os.path.abspath(p) for p in getattr(package, "__path__", [])]
    return next((p for p in paths if os.path.realpath(p) != os.path.realpath(ours)), paths[0] if paths else None)


def exit_if_shadowed(module_file: str) -> None:
    """Say which folder shadows the installed package, with the way out, and exit 2 (bad input) when one does."""
    folder = shadowing_folder(module_file)
    if folder is None:
        return
    print(f"error: the folder {folder} is imported as the package tpaudit in place of the installed one (python -m "
          "puts the current directory first on sys.path). Run from another directory, or rename that folder",
          file=sys.stderr)
    raise SystemExit(2)
