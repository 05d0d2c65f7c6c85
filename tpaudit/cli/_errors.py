"""One place where failures reach the user: `error: <message>` (+ `hint: ...`) on stderr, never a traceback unless
`TPAUDIT_DEBUG=1`. stdout stays parseable."""

from __future__ import annotations

import os
import sys
import traceback

from ..errors import ExitCode, TpauditError


def report_error(error: BaseException) -> int:
    """Print `error` as one line on stderr and return the exit code it maps to."""
    if isinstance(error, TpauditError):
        _write(f"error: {error}")
        if error.hint:
            _write(f"hint: {error.hint}")
        return int(error.exit_code)
    if isinstance(error, KeyboardInterrupt):
        _write("error: interrupted")
        return int(ExitCode.INTERRUPTED)
    if os.environ.get("TPAUDIT_DEBUG"):
        traceback.print_exception(error)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    _write(f"error: internal error: {type(error).__name__}: {first[:300]}. This is a tpaudit bug: rerun with "
           "TPAUDIT_DEBUG=1 and report the traceback")
    return int(ExitCode.INTERNAL)


def _write(line: str) -> None:
    # A message from a deep layer may span lines; a user gets one line per message.
    print(" ".join(line.split("\n")), file=sys.stderr)
