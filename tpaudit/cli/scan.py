"""`tpaudit scan`: every architecture of the installed transformers, or the ones named, as a CI gate."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ._options import WidthOpt, format_option

SCAN_EXAMPLES = [
    "tpaudit scan --tp 4 --format html -o coverage.html",
    "tpaudit scan --model-type my_new_model --tp 4      # CI gate in a transformers checkout",
]


def scan(
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size to simulate.")] = 4,
    model_type: Annotated[Optional[list[str]], typer.Option(
        "--model-type", help="Model types to scan (repeat the option); default: all. Exit 1 when one of them has "
                             "an error finding.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Worker processes (default: CPU count).")]
    = None,
    format: format_option("scan") = "table",  # type: ignore[valid-type]  # an `Annotated` built per command
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Write to this file.")] = None,
    width: WidthOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Full scan: exit 1 when any model type has an error "
                                                          "finding.")] = False,
    parity: Annotated[bool, typer.Option(
        "--parity/--no-parity", help="Also run the sharded-forward parity check where a model type's plan splits a "
                                     "fused or packed projection (threaded ranks per such model type: seconds "
                                     "each). Where it cannot run, the type keeps its static audit and its row says "
                                     "why.")] = False,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="With --parity: neither read nor write the parity verdict cache.")] = False,
) -> int:
    """Simulate every model type (or the ones named) from its default config and report plan coverage.

    Exit codes: 0 clean (a full scan is a survey unless --strict), 1 a selected model type has an error finding or
    failed to build, 2 bad input, 4 a tpaudit bug while scanning some model type (its row says internal_error).
    """
    from ..report import get
    from ..run.scan import scan as run_scan
    from ._output import emit

    from ..model import ParallelSizes

    import sys

    from ..errors import UsageError

    get("scan", format)
    ParallelSizes.of(tp, names=("--tp", "--ep"))  # the size in the flag's own words before any work
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs} is invalid: pass 1 or more worker processes (default: the CPU count)")
    from ..evidence.cache import bypassed

    with bypassed(no_cache):
        report = run_scan(tp_size=tp, selected=model_type or None, jobs=jobs, parity="auto" if parity else "off")
    emit("scan", format, report, output, columns=width)
    if output is not None:
        from ..units import plural

        print(f"tpaudit: wrote the scan of {plural(len(report.models), 'model type')} ({format}) to {output}",
              file=sys.stderr)
    bugs = [m for m in report.models if m.status == "internal_error"]
    for m in bugs:
        print(f"error: {m.model_type}: {m.reason}", file=sys.stderr)
    if bugs:
        return 4  # a tpaudit bug while scanning some type: never a pass (tpaudit.run.executor's policy)
    gated = report.models if (model_type or strict) else []
    return 1 if any(m.failing for m in gated) else 0
