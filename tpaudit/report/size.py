"""Renderers of `tpaudit size`: a table and per-rank bars (terminal), and the `tpaudit/size/v1` JSON."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..sizing import SizeReport
from ..units import format_bytes, unit_legend
from . import renderer

_BAR = 48


def _bar(rank, capacity: int) -> Text:
    scale = max(capacity, rank.total_bytes) / _BAR
    parts = [(rank.param_bytes, "█", "blue"), (rank.kv_cache_bytes + rank.state_bytes, "▓", "magenta"),
             (rank.overhead_bytes, "▒", "yellow")]
    text, used = Text(), 0
    for value, char, style in parts:
        n = int(round(value / scale))
        text.append(char * n, style=style)
        used += n
    cap = int(round(capacity / scale))
    if used < cap:
        text.append("·" * (cap - used), style="dim")
    elif used > cap:
        text.append(" over", style="bold red")
    return text


@renderer("size", "table", rich=True)
def render_terminal(report: SizeReport, console: Console, *, unit: str = "GiB", **_) -> None:
    """Print the options table, invalid reasons, one bar per option (worst rank) and one per rank of the
    recommended option."""
    cap = report.gpu["memory_bytes"]
    name = report.gpu.get("name") or "GPU"
    console.print(Text(f"tpaudit size · {report.model.get('repo_id') or report.model.get('ref')} · {name} "
                       f"{format_bytes(cap, unit)} per GPU · context {report.context:,} x batch {report.batch} · "
                       f"KV cache {report.kv_dtype} · {unit_legend(unit)}", style="bold"))
    t = Table(header_style="bold")
    for col in ("tp", "ep", "valid", "weights", "total/N", "KV", "overhead", "total", "free", "fits"):
        t.add_column(col, justify="right" if col not in ("valid", "fits") else "center")
    rec = report.recommended
    for o in report.options:
        w = o.worst
        mark = "✓" if o.fits else ("invalid" if not o.valid else "✗")
        row = [str(o.tp_size), str(o.ep_size), "yes" if o.valid else "no"]
        if w is None:
            row += ["-"] * 6 + [mark]
        else:
            row += [format_bytes(w.param_bytes, unit), format_bytes(o.naive_param_bytes, unit),
                    format_bytes(w.kv_cache_bytes + w.state_bytes, unit), format_bytes(w.overhead_bytes, unit),
                    format_bytes(w.total_bytes, unit), format_bytes(cap - w.total_bytes, unit), mark]
        style = "bold green" if rec is o else ("dim" if not o.valid else "")
        t.add_row(*row, style=style)
    console.print(t)
    console.print(Text("weights, KV, overhead, total: the worst rank; total/N: the naive even split of the weights",
                       style="dim"))
    for o in report.options:
        if not o.valid and o.reason:
            console.print(Text(f"tp {o.tp_size} ep {o.ep_size} invalid: ", style="bold") + Text(o.reason))
    console.print(Text("█ weights  ▓ KV cache/state  ▒ overhead  · free", style="dim"))
    for o in report.options:
        if o.worst is not None:
            bar = _bar(o.worst, cap) + (Text(" invalid (see above)", style="bold") if not o.valid else Text())
            console.print(Text(f"tp {o.tp_size:>2} ep {o.ep_size:>2} worst r{o.worst.rank:<3}") + bar)
    if rec is not None:
        console.print(Text(f"Recommended: tp_size {rec.tp_size}, ep_size {rec.ep_size} (the smallest valid option "
                           f"that fits). Its ranks:", style="bold green"))
        for r in rec.ranks[:16]:
            console.print(Text(f"  rank {r.rank:<3}") + _bar(r, cap) + Text(f" {format_bytes(r.total_bytes, unit)}"))
    else:
        console.print(Text("No option fits: use more or larger GPUs, a shorter context, or a smaller KV dtype.",
                           style="bold red"))
    console.print(Text(f"overhead policy: {report.overhead.describe()}", style="dim"))
    for n in report.notes:
        console.print(Text("note: " + n, style="dim"))
