"""One place where failures reach the user: `error: <message>` (+ `hint: ...`) on stderr, never a traceback unless
`TPAUDIT_DEBUG=1`. stdout stays parseable. The wording lives in `errors.format_error`, shared with the guard's
worker."""

from __future__ import annotations

import os
import sys
import traceback

from ..errors import TpauditError, format_error


def report_error(error: BaseException) -> int:
    """Print `error` on stderr (one line, plus an optional hint) and return the exit code it maps to."""
    lines, code = format_error(error)
    if os.environ.get("TPAUDIT_DEBUG") and not isinstance(error, (TpauditError, KeyboardInterrupt)):
        traceback.print_exception(error)
    from ..report._inert import terminal

    for line in lines:
        try:
            print(terminal(line), file=sys.stderr)  # a path or name in the message may hold control characters
        except OSError:
            pass
    return code
