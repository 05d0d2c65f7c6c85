"""`--format table`: the report for people, drawn with rich. What decides something comes first: the summary, then the
findings (errors first), then the largest replicated families, then the parameters collapsed by module family and
sorted by bytes (`--params` draws the full per-parameter table). Sizes name their unit (GiB = 2**30 B by default, or
GB = 10**9 B with `--units GB`); exact byte counts stand beside them where a number decides something. Copyable
snippets (`--suggest`) are printed unwrapped."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._fit import print_table
from ..model import Report
from ..units import format_bytes, format_int, plural, unit_legend
from ._inert import terminal as inert
from .wording import load_verdict, parity_verdict, quantization_line, rank_spread
from . import renderer

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
_PARITY_STYLE = {"pass": "green", "fail": "bold red", "error": "bold red", "skipped": "dim", "inconclusive": "yellow"}
_SHARDING_MARK = {"sharded": "", "replicated_by_rule": "=", "unsharded": "✗"}
FAMILY_ROWS = 12
REPLICATED_ROWS = 8
FINDING_ROWS = 60
"""Findings drawn as rows (errors first); the rest are counted in one line. A plan of 300,000 dead rules is 300,000
TPA002 warnings: drawing them all took minutes and GBs, and no one reads them on a terminal (`--format json`)."""
UNUSED_RULES_SHOWN = 20


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _summary(report: Report, unit: str) -> Table:
    sm = report.shard_map
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    m = report.model
    t.add_row("model", Text(f"{inert(m['ref'])}  ({inert(m.get('model_type'))}, {inert(m.get('architecture'))}, "
                            f"{inert(m.get('dtype'))})"))
    if m.get("repo_id"):
        where = "Hub repo" if m.get("kind") == "hub" else "recorded from"
        rev = m.get("commit") or m.get("revision")
        t.add_row("source", Text(f"{where} {inert(m['repo_id'])}" + (f" @ {inert(rev)}" if rev else
                                                                      " (revision not recorded)")))
    if quant := quantization_line(m.get("quantization")):
        t.add_row("quantization", Text(inert(quant)))
    t.add_row("parallelism", f"tp_size {sm.tp_size}, ep_size {sm.ep_size}, world size {sm.world_size}")
    if m.get("bytes_caveat"):
        t.add_row("caveat", Text(inert(m["bytes_caveat"]), style="bold yellow"))
    t.add_row("model bytes", f"{format_int(sm.total_param_bytes)} B ({format_bytes(sm.total_param_bytes, unit)})")
    ranks = sm.rank_param_bytes
    worst = sm.worst_rank
    spread = rank_spread(ranks, unit)
    t.add_row(f"worst rank (rank {worst})",
              f"{format_int(ranks[worst])} B ({format_bytes(ranks[worst], unit)}); {spread}")
    if sm.world_size > 1:
        t.add_row("replicated", f"{format_int(report.replicated_bytes)} B ({format_bytes(report.replicated_bytes, unit)}"
                                f"), {report.replicated_share:.2%} of the model, held whole by every rank")
    t.add_row("findings", Text(f"{plural(report.count('error'), 'error')}, {plural(report.count('warning'), 'warning')}"
                               f", {plural(report.count('note'), 'note')}",
                               style="bold red" if report.has_errors else ""))
    if report.versions.get("untested"):
        t.add_row("transformers", Text(inert(report.versions["untested"]), style="yellow"))
    if report.loading is not None:
        kind, sentence = load_verdict(report.loading, unit)
        t.add_row("load", Text(inert(sentence), style={"fail": "bold red", "decompress": "yellow"}.get(kind, "")))
    if report.parity is not None:
        kind, sentence = parity_verdict(report.parity)
        t.add_row("parity", Text(inert(sentence), style=_PARITY_STYLE[kind]))
    return t


def _findings_table(report: Report) -> Table:
    t = Table(title="Findings", title_justify="left", header_style="bold", show_lines=True)
    t.add_column("severity", overflow="fold")
    t.add_column("code", overflow="fold")
    t.add_column("message", overflow="fold")
    for f in report.findings[:FINDING_ROWS]:
        body = Text(inert(f.message))
        if f.fix:
            body.append("\nfix: ", style="bold")
            body.append(inert(f.fix))
        t.add_row(Text(f.severity, style=_SEVERITY_STYLE[f.severity]), Text(f.code), body)
    rest = report.findings[FINDING_ROWS:]
    if rest:
        counts: dict[str, int] = {}
        for f in rest:
            counts[f"{f.severity} {f.code}"] = counts.get(f"{f.severity} {f.code}", 0) + 1
        t.add_row("", "", Text(f"and {format_int(len(rest))} more: "
                               + ", ".join(f"{n:,} {k}" for k, n in counts.items())
                               + " (--format json lists them all)", style="dim"))
    return t


def _replicated_table(report: Report, unit: str) -> Table:
    t = Table(title=f"Largest replicated families (held whole by every rank; {len(report.replicated)} in all)",
              title_justify="left", header_style="bold")
    t.add_column("bytes", justify="right")
    t.add_column("n", justify="right")
    t.add_column("name", overflow="fold")
    t.add_column("severity")
    for fam in report.replicated[:REPLICATED_ROWS]:
        style = _SEVERITY_STYLE.get(fam.severity or "", "dim")
        t.add_row(format_bytes(fam.bytes, unit), str(fam.count), Text(inert(fam.name), style=style),
                  Text(fam.severity or "-", style=style))
    if len(report.replicated) > REPLICATED_ROWS:
        rest = report.replicated[REPLICATED_ROWS:]
        t.add_row(format_bytes(sum(f.bytes for f in rest), unit), str(sum(f.count for f in rest)),
                  Text(f"and {len(rest)} more families (--format json lists them all)", style="dim"), "")
    return t


def _families_table(report: Report, unit: str, rows: int, width: int = 160) -> Table:
    """Module families by bytes on the worst rank. A family name has no blank to wrap at, so on a terminal narrower
    than 120 columns the whole-model bytes and the styles drop out (`--params all` and JSON have them) and the name
    keeps the room it needs instead of being cut mid-word."""
    sm = report.shard_map
    families = sm.module_families()
    wide = width >= 120
    t = Table(title=f"Parameters by module family, largest on rank {sm.worst_rank} first (--params all for every "
                    "parameter)", title_justify="left", header_style="bold")
    t.add_column(f"rank {sm.worst_rank}", justify="right")
    if wide:
        t.add_column("whole", justify="right")
    longest = max((len(f.name) for f in families[:rows]), default=10)
    t.add_column("family", overflow="fold", min_width=min(longest, max(10, width - 40)))
    t.add_column("params", justify="right")
    if wide:
        t.add_column("styles", overflow="fold")
    t.add_column("replicated", justify="right")
    for f in families[:rows]:
        replicated = Text(format_bytes(f.replicated_bytes, unit), style="red") if f.replicated_bytes \
            else Text("-", style="dim")
        cells: list[Any] = [format_bytes(f.worst_rank_bytes, unit), *([format_bytes(f.total_bytes, unit)] if wide else []),
                 Text(inert(f.name)), str(f.params), *([Text(inert(", ".join(f.styles)))] if wide else []), replicated]
        t.add_row(*cells)
    if len(families) > rows:
        rest = families[rows:]
        t.add_row(format_bytes(sum(f.worst_rank_bytes for f in rest), unit),
                  *([format_bytes(sum(f.total_bytes for f in rest), unit)] if wide else []),
                  Text(f"and {len(rest)} more families", style="dim"), str(sum(f.params for f in rest)),
                  *([""] if wide else []), "")
    return t


def _params_table(report: Report, unit: str, width: int) -> Table:
    """Full table on wide terminals; on narrow ones (< 140 columns) the whole shape, dtype and whole bytes drop out
    (they are in `--format json`). A row is a generic name (`model.layers.*.mlp.up_proj.weight`) standing for `n`
    parameters; its `whole` and `rank N` bytes are totals over them (shapes are one parameter's)."""
    sm = report.shard_map
    worst = sm.worst_rank
    wide = width >= 140
    errors = {name for f in report.findings if f.severity == "error" and f.subject for name in f.subject.families}
    t = Table(title="Parameters by generic name (n: how many parameters the name stands for, one per layer or "
                    "expert; bytes are totals over all n · ✗ replicated: no rule shards it · '=' kept whole on "
                    "purpose by its rule)",
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
        style = "red" if g.generic_name in errors else ""
        tied = f" (tied to {inert(g.tied_to)})" if g.tied_to else ""
        local = g.local_shape_rank0 if worst == 0 else g.first.local_shapes[worst]
        row: list[Any] = [mark, Text(inert(g.generic_name) + tied, style=style), str(g.count), Text(inert(g.style or "-"))]
        if wide:
            row += [_shape(g.global_shape), Text(inert(g.dtype))]
        row.append(_shape(local))
        if wide:
            row.append(format_bytes(g.total_bytes, unit))
        row.append(format_bytes(g.rank_bytes[worst], unit))
        t.add_row(*row)
    return t


@renderer("check", "table", rich=True)
def render(report: Report, console: Console, *, unit: str = "GiB", params: str = "families", **_) -> None:
    """Print `report` on `console`: summary, findings, largest replicated families, parameters (by module family,
    `params="all"` every parameter, `params="none"` none), unused rules, suggestion, notes."""
    title = f"tpaudit check · {unit_legend(unit)}"
    console.print(Panel(_summary(report, unit), title=title, title_align="left"))
    if report.findings:
        print_table(console, _findings_table(report))
    else:
        console.print(Text("No findings.", style="green"))
    if report.replicated and report.shard_map.world_size > 1:
        print_table(console, _replicated_table(report, unit))
    if params == "all":
        print_table(console, _params_table(report, unit, console.width))
    elif params == "families":
        print_table(console, _families_table(report, unit, FAMILY_ROWS, console.width))
    if report.unused_rules:
        shown = report.unused_rules[:UNUSED_RULES_SHOWN]
        more = len(report.unused_rules) - len(shown)
        console.print(Text("Rules that match nothing: ", style="bold") + Text(inert(", ".join(shown)))
                      + Text(f" and {format_int(more)} more" if more else "", style="dim"))
    if report.kv_cache is not None:
        console.print(_kv(report.kv_cache))
    if report.suggestion is not None:
        _suggestion(report.suggestion, unit, console)
    if report.baseline is not None:
        console.print(Text(f"baseline {inert(report.baseline.file)}: {report.baseline.suppressed} known finding(s) "
                           "not shown",
                           style="dim"))
    if report.notes:
        console.print(Group(*[Text("note: ", style="dim bold") + Text(inert(n), style="dim") for n in report.notes]))


def _kv(section) -> Text:
    per_rank = section.bytes_per_token_per_rank
    worst = max(per_rank) if per_rank else 0
    layers = inert(", ".join(f"{n} {k}" for k, n in sorted(section.layers.items())))
    text = Text("KV cache: ", style="bold")
    text.append(f"{format_int(worst)} B per token on the worst rank ({inert(section.dtype)}; KV heads: "
                f"{section.kv_heads} in all, {_heads(section.kv_heads_per_rank)} per rank; layers: {layers}")
    if section.windows:
        text.append(f"; sliding windows {section.windows} tokens")
    text.append(")")
    return text


def _heads(value) -> str:
    values = value if isinstance(value, list) else [value]
    return " / ".join(f"{v:g}" for v in values)


def _suggestion(section, unit: str, console: Console) -> None:
    if section.after is not None:
        before, after = section.before, section.after
        fixed = ", ".join(f"{n} {code}" for code, n in sorted(section.fixed.items()))
        console.print(Text("Suggested configuration " if section.clean is not False else "No clean configuration ",
                           style="bold" if section.clean is not False else "bold yellow") + Text(
            f"(re-checked, load stage included: {fixed + ' fixed; ' if fixed else 'nothing fixed; '}"
            f"{after['errors']} error(s); worst rank {format_bytes(before['worst_rank_param_bytes'], unit)} -> "
            f"{format_bytes(after['worst_rank_param_bytes'], unit)})"))
        if section.expert_parallel:
            ep = section.expert_parallel
            console.print(Text(f"run with --tp {section.tp_size} --ep {ep['ep_size']}: ", style="bold") +
                          Text(inert(f"{ep['why']} ({', '.join(ep['families'][:4])})")))
    if section.snippet:
        # Meant to be copied: never wrapped or cropped at the terminal's width.
        console.print(Text(inert(section.snippet.rstrip(), keep_newlines=True)), soft_wrap=True, highlight=False)
        if section.tp_plan_override or section.expert_parallel:
            import json

            ep = f", ep_size={section.ep_size}" if section.expert_parallel else ""
            plan = (", tp_plan=" + json.dumps(section.tp_plan_override, indent=4)) if section.tp_plan_override else ""
            console.print(Text("or, leaving the config as it is, at load time:", style="dim"))
            console.print(Text(inert(f"DistributedConfig(tp_size={section.tp_size or 'N'}{ep}{plan})",
                                     keep_newlines=True)), soft_wrap=True, highlight=False)
    elif section.after is None:
        console.print(Text("No rule to suggest: no sibling architecture shards the replicated families.",
                           style="bold"))
    if section.remaining_why:
        console.print(Text(f"the best candidate still has {len(section.remaining_why)} error finding(s), so no plan is "
                           "printed: ", style="bold yellow"))
        for why in section.remaining_why[:6]:
            console.print(Text("  " + inert(why)))
        if len(section.remaining_why) > 6:
            console.print(Text(f"  ... and {len(section.remaining_why) - 6} more"))
    for item in section.unresolved:
        console.print(Text("not proposed: ", style="dim bold") + Text(inert(item), style="dim"))
