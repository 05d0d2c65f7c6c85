"""`--format table`: the report for people, drawn with rich. Sizes name their unit (GiB = 2**30 B by default, or
GB = 10**9 B with `--units GB`); exact byte counts stand beside them where a number decides something."""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..model import Report
from ..units import format_bytes, format_int, plural, unit_legend

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
_SHARDING_MARK = {"sharded": "", "replicated_by_rule": "=", "unsharded": "✗"}


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _summary(report: Report, unit: str) -> Table:
    sm = report.shard_map
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    m = report.model
    t.add_row("model", f"{escape(m['ref'])}  ({m.get('model_type')}, {m.get('architecture')}, {m.get('dtype')})")
    if m.get("repo_id"):
        where = "Hub repo" if m.get("kind") == "hub" else "recorded from"
        rev = m.get("commit") or m.get("revision")
        t.add_row("source", f"{where} {escape(m['repo_id'])}" + (f" @ {rev}" if rev else " (revision not recorded)"))
    t.add_row("parallelism", f"tp_size {sm.tp_size}, ep_size {sm.ep_size}, world size {sm.world_size}")
    t.add_row("model bytes", f"{format_int(sm.total_param_bytes)} B ({format_bytes(sm.total_param_bytes, unit)})")
    ranks = sm.rank_param_bytes
    worst = sm.worst_rank
    if len(set(ranks)) == 1:
        spread = f"every rank the same ({len(ranks)} ranks)"
    else:
        spread = "uneven: " + ", ".join(f"r{r} {format_bytes(b, unit)}" for r, b in enumerate(ranks[:16]))
        if len(ranks) > 16:
            spread += ", ..."
    t.add_row(f"worst rank (rank {worst})",
              f"{format_int(ranks[worst])} B ({format_bytes(ranks[worst], unit)}); {spread}")
    if sm.world_size > 1:
        t.add_row("replicated", f"{format_int(report.replicated_bytes)} B ({format_bytes(report.replicated_bytes, unit)}"
                                f"), {report.replicated_share:.2%} of the model, held whole by every rank")
    t.add_row("findings", f"{plural(report.count('error'), 'error')}, {plural(report.count('warning'), 'warning')}, "
                          f"{plural(report.count('note'), 'note')}")
    return t


def _params_table(report: Report, unit: str, width: int) -> Table:
    """Full table on wide terminals; on narrow ones (< 140 columns) the whole shape, dtype and whole bytes drop out
    (they are in `--format json`)."""
    sm = report.shard_map
    worst = sm.worst_rank
    wide = width >= 140
    t = Table(title="Parameters by generic name (✗ replicated: no rule shards it · '=' kept whole on purpose by "
                    "its rule)",
              title_justify="left", header_style="bold")
    t.add_column("", width=1)
    t.add_column("name", overflow="fold", ratio=3)
    t.add_column("n", justify="right")
    t.add_column("style", overflow="fold", ratio=1)
    if wide:
        t.add_column("shape", overflow="fold", ratio=1)
        t.add_column("dtype")
    t.add_column(f"rank {worst} shape" if sm.world_size > 1 else "shape", overflow="fold", ratio=1)
    if wide:
        t.add_column("whole", justify="right")
    t.add_column(f"rank {worst}", justify="right")
    for g in report.groups:
        mark = _SHARDING_MARK[g.sharding] if sm.world_size > 1 else ""
        style = "red" if mark == "✗" and any(f.target == g.generic_name and f.severity == "error"
                                             for f in report.findings) else ""
        tied = f" (tied to {g.tied_to})" if g.tied_to else ""
        local = g.local_shape_rank0 if worst == 0 else g.local_shape_last
        row = [mark, Text(g.generic_name + tied, style=style), str(g.count), g.style or "-"]
        if wide:
            row += [_shape(g.global_shape), g.dtype]
        row.append(_shape(local))
        if wide:
            row.append(format_bytes(g.total_bytes, unit))
        row.append(format_bytes(g.rank_bytes[worst], unit))
        t.add_row(*row)
    return t


def _findings_table(report: Report) -> Table:
    t = Table(title="Findings", title_justify="left", header_style="bold", show_lines=True)
    t.add_column("severity")
    t.add_column("code")
    t.add_column("message", overflow="fold")
    for f in report.findings:
        body = Text(f.message)
        if f.fix:
            body.append("\nfix: ", style="bold")
            body.append(f.fix)
        t.add_row(Text(f.severity, style=_SEVERITY_STYLE[f.severity]), f.code, body)
    return t


def render(report: Report, console: Console, *, unit: str = "GiB", show_params: bool = True) -> None:
    """Print `report` on `console`: summary, parameter table, unused rules, findings and notes."""
    title = f"tpaudit check · {unit_legend(unit)}"
    console.print(Panel(_summary(report, unit), title=title, title_align="left"))
    if show_params:
        console.print(_params_table(report, unit, console.width))
    if report.unused_rules:
        console.print(Text("Rules that match nothing: ", style="bold") + Text(", ".join(report.unused_rules)))
    if report.findings:
        console.print(_findings_table(report))
    else:
        console.print(Text("No findings.", style="green"))
    for key, section in report.extra.items():
        renderer = _EXTRA.get(key)
        if renderer:
            console.print(renderer(section, unit))
    if report.notes:
        console.print(Group(*[Text("note: ", style="dim bold") + Text(n, style="dim") for n in report.notes]))


def _kv(section: dict, unit: str):
    per_rank = section["bytes_per_token_per_rank"]
    worst = max(per_rank) if per_rank else 0
    layers = ", ".join(f"{n} {k}" for k, n in sorted(section["layers"].items()))
    text = Text("KV cache: ", style="bold")
    text.append(f"{format_int(worst)} B per token on the worst rank ({section['dtype']}; KV heads: "
                f"{section['kv_heads']} in all, {_heads(section['kv_heads_per_rank'])} per rank; layers: {layers}")
    if section.get("windows"):
        text.append(f"; sliding windows {section['windows']} tokens")
    text.append(")")
    return text


def _heads(value) -> str:
    values = value if isinstance(value, list) else [value]
    return " / ".join(f"{v:g}" for v in values)


def _suggestion(section: dict, unit: str):
    parts = []
    if section.get("snippet"):
        before, after = section["before"], section["after"]
        parts.append(Text("Suggested plan ", style="bold") + Text(
            f"(re-simulated: worst rank {format_bytes(before['worst_rank_param_bytes'], unit)} -> "
            f"{format_bytes(after['worst_rank_param_bytes'], unit)}, errors {before['errors']} -> {after['errors']})"))
        parts.append(Text(section["snippet"].rstrip(), no_wrap=True, overflow="ignore"))  # pasteable as is
    else:
        parts.append(Text("No rule to suggest: no sibling architecture shards the replicated families.", style="bold"))
    for item in section.get("unresolved", []):
        parts.append(Text("not proposed: ", style="dim bold") + Text(item, style="dim"))
    return Group(*parts)


def _baseline(section: dict, unit: str):
    return Text(f"baseline {section['file']}: {section['suppressed']} known finding(s) not shown", style="dim")


_EXTRA: dict = {"kv_cache": _kv, "suggestion": _suggestion, "baseline": _baseline}
