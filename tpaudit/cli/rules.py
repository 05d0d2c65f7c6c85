"""`tpaudit rules` lists the rule codes; `tpaudit explain CODE` prints one rule's catalogue entry."""

from __future__ import annotations

from typing import Annotated

import typer


def rules(
    format: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
) -> int:
    """List every rule code with its kind and summary."""
    import json

    from ..checks.registry import all_rules
    from ..errors import UsageError

    rows = [{"code": r.code, "kind": r.kind, "family": r.family, "severity": r.severity, "status": r.status,
             "summary": r.summary}
            for r in all_rules()]
    if format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if format != "table":
        raise UsageError(f"--format {format} is not supported here. Pass table or json")
    from rich.table import Table

    from ._output import stdout_console

    t = Table(header_style="bold")
    for col in ("code", "kind", "severity", "summary"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["code"], row["kind"], row["severity"], row["summary"])
    stdout_console().print(t)
    return 0


def explain(code: Annotated[str, typer.Argument(help="A rule code such as TPA001, or its kind (replicated_weight).")]
            ) -> int:
    """Print what a rule detects, why it matters, an example and the fix."""
    from rich.markdown import Markdown

    from ._output import stdout_console

    from ..checks.registry import all_rules, get_rule
    from ..errors import UsageError

    r = get_rule(code) or next((x for x in all_rules() if x.kind == code), None)
    if r is None:
        codes = ", ".join(x.code for x in all_rules())
        raise UsageError(f"{code} is not a tpaudit rule. Known codes: {codes} (see 'tpaudit rules')")
    sections = r.sections()
    text = f"# {r.code} {r.kind}\n\n{r.summary}\n"
    for heading in ("What it detects", "Why it matters", "Example", "Fix", "References"):
        if heading in sections:
            text += f"\n## {heading}\n\n{sections[heading]}\n"
    stdout_console().print(Markdown(text))
    return 0
