"""`tpaudit scan`: every architecture of the installed transformers, or the ones named, as a CI gate."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

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
    format: Annotated[str, typer.Option("--format", "-f", help="table, json, markdown or html.")] = "table",
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Write to this file.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Full scan: exit 1 when any model type has an error "
                                                          "finding.")] = False,
) -> int:
    """Simulate every model type (or the ones named) from its default config and report plan coverage.

    Exit codes: 0 clean (a full scan is a survey unless --strict), 1 a selected model type has an error finding or
    failed to build, 2 bad input.
    """
    from ..errors import UsageError
    from ..scan import scan as run_scan
    from ._output import emit_rich, write_output

    if format not in ("table", "json", "markdown", "html"):
        raise UsageError(f"--format {format} is not supported by scan. Pass table, json, markdown or html")
    report = run_scan(tp_size=tp, selected=model_type or None, jobs=jobs)
    if format == "json":
        from ..report.scan import render_json

        write_output(render_json(report), output)
    elif format == "markdown":
        from ..report.scan import render_markdown

        write_output(render_markdown(report), output)
    elif format == "html":
        from ..report.scan import render_html

        write_output(render_html(report), output)
    else:
        from ..report.scan import render_terminal

        emit_rich(lambda console: render_terminal(report, console), output, width=200)
    gated = report.models if (model_type or strict) else []
    failing = [m for m in gated if m["status"] == "build_failed" or
               any(f["severity"] == "error" for f in m["findings"])]
    return 1 if failing else 0
