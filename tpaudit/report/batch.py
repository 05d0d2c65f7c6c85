"""Renderers of `tpaudit batch`'s summary: terminal (rich), Markdown (a pull-request comment or CI log) and a
self-contained HTML page. They draw a `BatchSummary` and compute nothing; the JSON lines of OUT
(`BatchResult.to_json()`) are the contract, these are for people."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ._fit import print_table
from . import renderer
from ._html import sortable_script
from ._inert import html as esc, markdown_code as code, markdown_text, strings_in, terminal as inert
from ..units import format_bytes, plural, unit_legend

if TYPE_CHECKING:  # annotations only: a `check` that loads every renderer need not import the batch pipeline
    from ..run.batch import BatchResult, BatchSummary, Change


def _sizes(summary: BatchSummary) -> str:
    return ", ".join(f"tp {tp}" + (f" ep {ep}" if ep != 1 else "") for tp, ep in summary.pairs)


def _rate(summary: BatchSummary) -> str:
    rate = summary.models_per_minute
    return f"{summary.seconds:.1f} s of auditing, start-up not counted" + (
        f" ({rate:,.1f} models/min)" if rate is not None else "")


def _headline(summary: BatchSummary) -> list[str]:
    m, ln, f = summary.models, summary.lines, summary.findings
    return [
        f"{plural(summary.model_count, 'model')} at {_sizes(summary)}: {plural(len(summary.results), 'line')} in "
        f"{_rate(summary)}; {summary.computed} computed, {summary.cached} from the cache" + (
            f" ({summary.cache_refused} refused by the cache check and computed again)" if summary.cache_refused
            else ""),
        f"models: {m['ok']} clean, {m['findings']} with error findings, {m['error']} with lines that could not run"
        " · lines: "
        f"{ln['ok']} audited ({ln['ok'] - summary.lines_with_errors} clean, {summary.lines_with_errors} with error "
        f"findings), {ln['error']} could not run",
        f"findings: {plural(f['error'], 'error')}, {plural(f['warning'], 'warning')}, {plural(f['note'], 'note')}",
    ]


def _share(r: BatchResult) -> str:
    return f"{r.replicated_share:.1%}" if r.replicated_share is not None else "-"


def _bytes(n: int | None, unit: str) -> str:
    return format_bytes(n, unit) if n is not None else "-"


def _change_sizes(c: Change, unit: str) -> str:
    return f"{_bytes(c.old_bytes, unit)} -> {_bytes(c.new_bytes, unit)}"


@renderer("batch", "table", rich=True)
def render_terminal(summary: BatchSummary, console, *, unit: str = "GiB", max_rows: int = 20, **_) -> None:
    """Print the summary on a rich `console`: counts, worst offenders, error lines and, with `--compare`, what
    changed (at most `max_rows` rows per table; OUT has every line)."""
    from rich.table import Table
    from rich.text import Text

    lines = _headline(summary)
    console.print(Text(f"tpaudit batch · {lines[0]}", style="bold"))
    for line in lines[1:]:
        console.print(Text(line))
    console.print(Text(unit_legend(unit), style="dim"))
    for message in summary.refused:
        console.print(Text(f"left out: {inert(message)}", style="dim"))
    for message in summary.cache_problems:
        console.print(Text(f"cache: {inert(message)}", style="yellow"))
    if summary.worst:
        t = Table(title="Worst offenders: bytes every rank holds whole", title_justify="left", header_style="bold")
        for col in ("model", "tp", "ep", "replicated", "share", "worst rank", "errors"):
            t.add_column(col, overflow="fold", justify="left" if col == "model" else "right")
        for r in summary.worst[:max_rows]:
            t.add_row(Text(inert(r.model)), str(r.tp_size), str(r.ep_size), _bytes(r.replicated_bytes, unit), _share(r),
                      _bytes(r.worst_rank_param_bytes, unit), str(r.errors), style="red" if r.errors else "")
        print_table(console, t)
    if summary.failed:
        t = Table(title="Could not be audited", title_justify="left", header_style="bold")
        for col in ("model", "tp", "ep", "exit", "reason"):
            t.add_column(col, overflow="fold")
        for r in summary.failed[:max_rows]:
            t.add_row(Text(inert(r.model)), str(r.tp_size), str(r.ep_size), str(r.exit_code), Text(inert(r.reason)),
                      style="red")
        print_table(console, t)
        if len(summary.failed) > max_rows:
            console.print(f"... and {len(summary.failed) - max_rows} more error lines (see OUT)")
    c = summary.comparison
    if c is not None:
        console.print(Text(f"Compared with {inert(c.previous)}: {plural(len(c.new_errors), 'new error')}, "
                           f"{len(c.fixed_errors)} fixed, {len(c.worse)} worse, {len(c.better)} better, "
                           f"{c.added} lines added, {c.removed} removed", style="bold"))
        for title, rows, style in (("New errors", c.new_errors, "red"), ("Fixed errors", c.fixed_errors, "green")):
            if rows:
                t = Table(title=title, title_justify="left", header_style="bold")
                for col in ("model", "tp", "ep", "error"):
                    t.add_column(col, overflow="fold")
                for ch in rows[:max_rows]:
                    t.add_row(Text(inert(ch.model)), str(ch.tp_size), str(ch.ep_size), Text(inert(ch.what)),
                              style=style)
                print_table(console, t)
        moved = list(c.worse) + list(c.better)
        if moved:
            t = Table(title="Worst-rank bytes that moved", title_justify="left", header_style="bold")
            for col in ("model", "tp", "ep", "worst rank"):
                t.add_column(col, overflow="fold")
            for ch in moved[:max_rows]:
                t.add_row(Text(inert(ch.model)), str(ch.tp_size), str(ch.ep_size), _change_sizes(ch, unit),
                          style="red" if ch in c.worse else "green")
            print_table(console, t)


@renderer("batch", "markdown")
def render_markdown(summary: BatchSummary, *, unit: str = "GiB", max_rows: int = 50, **_) -> str:
    """The summary as GitHub-flavoured Markdown (a pull-request comment or a CI job summary), ending with a newline."""
    icon = "❌" if summary.exit_code else "✅"
    # the models' references (LIST entries, what strangers wrote) may hold a backtick: quoted whole in prose
    c = summary.comparison
    prose = partial(markdown_text, names=strings_in([[r.model for r in summary.results],
                                                     [ch.model for ch in (c.new_errors + c.fixed_errors)] if c else []]))
    head = _headline(summary)
    out = [f"### {icon} tpaudit batch: {head[0]}", "", head[1], "", head[2], "", f"_{unit_legend(unit)}_", ""]
    out += [f"- left out: {prose(m)}" for m in summary.refused]
    out += [f"- cache: {prose(m)}" for m in summary.cache_problems]
    if summary.worst:
        out += ["#### Worst offenders: bytes every rank holds whole", "",
                "| model | tp | ep | replicated | share | worst rank | errors |", "|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {code(r.model)} | {r.tp_size} | {r.ep_size} | {_bytes(r.replicated_bytes, unit)} | {_share(r)} | "
                f"{_bytes(r.worst_rank_param_bytes, unit)} | {r.errors} |" for r in summary.worst[:max_rows]]
        out.append("")
    if summary.failed:
        out += ["#### Could not be audited", "", "| model | tp | ep | exit | reason |", "|---|---:|---:|---:|---|"]
        out += [f"| {code(r.model)} | {r.tp_size} | {r.ep_size} | {r.exit_code} | {prose(r.reason or '')} |"
                for r in summary.failed[:max_rows]]
        if len(summary.failed) > max_rows:
            out.append(f"\n... and {len(summary.failed) - max_rows} more error lines (see OUT)")
        out.append("")
    c = summary.comparison
    if c is not None:
        out += [f"#### Compared with {code(c.previous, table=False)}", "",
                f"{plural(len(c.new_errors), 'new error')}, {len(c.fixed_errors)} fixed, {len(c.worse)} worse, "
                f"{len(c.better)} better, {c.added} lines added, {c.removed} removed", ""]
        for title, rows in (("New errors", c.new_errors), ("Fixed errors", c.fixed_errors)):
            if rows:
                out += [f"**{title}**", "", "| model | tp | ep | error |", "|---|---:|---:|---|"]
                out += [f"| {code(ch.model)} | {ch.tp_size} | {ch.ep_size} | {prose(ch.what)} |"
                        for ch in rows[:max_rows]]
                out.append("")
        moved = [("worse", ch) for ch in c.worse] + [("better", ch) for ch in c.better]
        if moved:
            out += ["**Worst-rank bytes that moved**", "", "| model | tp | ep | worst rank | |", "|---|---:|---:|---|---|"]
            out += [f"| {code(ch.model)} | {ch.tp_size} | {ch.ep_size} | {_change_sizes(ch, unit)} | {how} |"
                    for how, ch in moved[:max_rows]]
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee;cursor:pointer;position:sticky;top:0}
td.num{text-align:right}
tr.error td{background:#fde8e8}
tr.findings td{background:#fff4e0}
"""

_SCRIPT = sortable_script("table.sortable th")


def _num(value: int | float | None, text: str) -> str:
    return f'<td class="num" data-v="{value if value is not None else -1}">{esc(text)}</td>'


@renderer("batch", "html")
def render_html(summary: BatchSummary, *, unit: str = "GiB", **_) -> str:
    """One self-contained page (inline CSS and a few lines of inline JavaScript to sort): the counts, what changed
    against `--compare`, and every line of the batch."""
    e = esc
    head = _headline(summary)
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>tpaudit batch: {e(head[0])}</title><style>{_STYLE}</style></head><body>",
             "<h1>tpaudit batch</h1>", *(f"<p>{e(line)}</p>" for line in head),
             *(f"<p>cache: {e(m)}</p>" for m in summary.cache_problems),
             f"<p><em>{e(unit_legend(unit))}. Versions: "
             f"{e(', '.join(f'{k} {v}' for k, v in summary.versions.items()))}.</em></p>"]
    parts += [f"<p>left out: {e(m)}</p>" for m in summary.refused]
    c = summary.comparison
    if c is not None:
        parts.append(f"<h2>Compared with {e(c.previous)}</h2><p>{e(plural(len(c.new_errors), 'new error'))}, "
                     f"{len(c.fixed_errors)} fixed, {len(c.worse)} worse, {len(c.better)} better, {c.added} lines "
                     f"added, {c.removed} removed</p>")
        for title, rows in (("New errors", c.new_errors), ("Fixed errors", c.fixed_errors)):
            if rows:
                parts.append(f"<h3>{title}</h3><table><thead><tr><th>model</th><th>tp</th><th>ep</th><th>error</th>"
                             "</tr></thead><tbody>" + "".join(
                                 f"<tr><td>{e(ch.model)}</td><td>{ch.tp_size}</td><td>{ch.ep_size}</td>"
                                 f"<td>{e(ch.what)}</td></tr>" for ch in rows) + "</tbody></table>")
        moved = [("worse", ch) for ch in c.worse] + [("better", ch) for ch in c.better]
        if moved:
            parts.append("<h3>Worst-rank bytes that moved</h3><table><thead><tr><th>model</th><th>tp</th><th>ep</th>"
                         "<th>before</th><th>after</th><th></th></tr></thead><tbody>" + "".join(
                             f"<tr><td>{e(ch.model)}</td><td>{ch.tp_size}</td><td>{ch.ep_size}</td>"
                             + _num(ch.old_bytes, _bytes(ch.old_bytes, unit))
                             + _num(ch.new_bytes, _bytes(ch.new_bytes, unit)) + f"<td>{how}</td></tr>"
                             for how, ch in moved) + "</tbody></table>")
    lines: list[str] = []
    for r in summary.results:
        kind = "error" if r.status == "error" else ("findings" if r.errors else "ok")
        detail = r.reason or ", ".join(r.error_targets)
        share = r.replicated_share
        lines.append(f'<tr class="{kind}"><td>{e(r.model)}</td>' + _num(r.tp_size, str(r.tp_size))
                    + _num(r.ep_size, str(r.ep_size)) + f"<td>{e(r.status)}</td>"
                    + _num(r.exit_code, str(r.exit_code))
                    + _num(r.worst_rank_param_bytes, _bytes(r.worst_rank_param_bytes, unit))
                    + _num(r.replicated_bytes, _bytes(r.replicated_bytes, unit))
                    + _num(share, f"{share:.1%}" if share is not None else "-")
                    + _num(r.errors, str(r.errors)) + _num(r.warnings, str(r.warnings))
                    + f"<td>{'cache' if r.cached else 'computed'}</td><td>{e(detail)}</td></tr>")
    parts.append("<h2>Every line</h2><p>Click a header to sort.</p><table class=\"sortable\"><thead><tr>"
                 "<th>model</th><th>tp</th><th>ep</th><th>status</th><th>exit</th><th>worst rank</th>"
                 "<th>replicated</th><th>share</th><th>errors</th><th>warnings</th><th>from</th>"
                 "<th>error findings or reason</th>"
                 "</tr></thead><tbody>" + "".join(lines) + f"</tbody></table><script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)
