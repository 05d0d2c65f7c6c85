"""Renderers of `tpaudit verify`: a per-rank diff table with the first mismatches (terminal), and JSON
(`tpaudit/verify/v1`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..units import format_bytes, format_int
from . import renderer
from ._inert import terminal as inert

if TYPE_CHECKING:  # annotations only: a `check` that loads every renderer need not import verify
    from ..verify import VerifyResult


@renderer("verify", "table", rich=True)
def render_terminal(result: VerifyResult, console, *, unit: str = "GiB", limit: int = 20, **_) -> None:
    """Print the verdict, predicted against measured bytes per rank, and the first `limit` parameter mismatches."""
    from rich.table import Table
    from rich.text import Text

    verdict = Text("match" if result.match else "MISMATCH", style="bold green" if result.match else "bold red")
    console.print(Text(f"tpaudit verify · {inert(result.model.get('ref'))} · tp_size {result.tp_size}, ep_size "
                       f"{result.ep_size} · ", style="bold") + verdict)
    if result.versions.get("untested"):  # as every command says it (check, size, scan)
        console.print(Text("transformers: " + inert(result.versions["untested"]), style="yellow"))
    t = Table(header_style="bold")
    for col in ("rank", "predicted param bytes", "measured param bytes", "diff", "allocated", "load s"):
        t.add_column(col, justify="right")
    for r in result.ranks:
        diff = r["measured_param_bytes"] - r["predicted_param_bytes"]
        t.add_row(str(r["rank"]), format_int(r["predicted_param_bytes"]), format_int(r["measured_param_bytes"]),
                  Text(f"{diff:+,}", style="red" if diff else "green"), format_bytes(r["allocated_bytes"], unit),
                  str(r.get("load_seconds")))
    console.print(t)
    if result.mismatches:
        m = Table(title=f"{len(result.mismatches)} parameter mismatches (first {min(limit, len(result.mismatches))})",
                  title_justify="left", header_style="bold")
        for col in ("rank", "parameter", "predicted", "measured"):
            m.add_column(col, overflow="fold")
        for x in result.mismatches[:limit]:
            fmt = (lambda v: "absent" if v is None else f"{v['shape']} {v['dtype']} {v['bytes']:,} B")
            m.add_row(str(x["rank"]), Text(inert(x["name"])), Text(inert(fmt(x["predicted"]))),
                      Text(inert(fmt(x["measured"]))))
        console.print(m)
    for n in result.notes:
        console.print(Text("note: " + inert(n), style="dim"))
