"""Where command output goes: stdout (parseable; errors go to stderr) or `--output FILE`."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Callable


def write_output(text: str, output: str | None) -> None:
    """Write `text` to stdout, or to the file `output`.

    Raises:
        UsageError: the file cannot be written.
    """
    from ..errors import UsageError

    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"cannot write --output {output}: {e.strerror or e}. Check the directory") from None


def stdout_console(**options):
    """A rich console on stdout whose closed pipe (`tpaudit check ... | head`) raises `BrokenPipeError` for `main` to
    end quietly with 141, as a process killed by SIGPIPE does (rich's own handling exits 1, which reads as "error
    findings")."""
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    return _StdoutConsole(**{"markup": False, **options})


def emit_rich(draw: Callable, output: str | None, *, width: int = 120, columns: int | None = None) -> None:
    """Run `draw(console)` on a rich console for the terminal, or render it without colour into `output`.

    Not on a terminal (a pipe, a CI log, `-o FILE`) the console is `width` columns wide (the renderer's, 120 unless
    it needs more), which a CI log page shows whole; the `COLUMNS` environment variable sets another width, and
    `columns` (`--width`) sets it everywhere, a terminal included.

    The console never reads rich markup (`markup=False`): renderers style with `Text` objects, so a name such as
    `x[/]y` prints as written instead of being parsed (`tpaudit/report/_inert.py`)."""
    from rich.console import Console

    if output is None:
        # A pipe or a CI log is no 80-column terminal: draw `width` wide unless COLUMNS says otherwise.
        wide = columns or (None if sys.stdout.isatty() or os.environ.get("COLUMNS") else width)
        draw(stdout_console(width=wide))
        return
    buffer = io.StringIO()
    draw(Console(file=buffer, width=columns or _columns() or width, no_color=True, markup=False))
    write_output(buffer.getvalue(), output)


def _columns() -> int | None:
    """`COLUMNS` when it is a sensible width (20 to 4,000 columns), else `None`."""
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and 20 <= int(value) <= 4000 else None


def emit(command: str, fmt: str, result, output: str | None, *, columns: int | None = None, **options) -> None:
    """Draw `result` with the renderer registered for `command --format fmt`, to stdout or `output`; a terminal
    format `columns` wide when given (`--width`, see `emit_rich`).

    Raises:
        UsageError: no such format for `command`, or `output` cannot be written.
    """
    from ..report import get

    r = get(command, fmt)
    if r.rich:
        emit_rich(lambda console: r.fn(result, console, **options), output, width=r.width, columns=columns)
    else:
        write_output(r.fn(result, **options), output)
