"""Renderers of `tpaudit scan`: terminal table, JSON (`tpaudit/scan/v1`), Markdown, and a self-contained HTML page
with a coverage heat map (no network at view time: inline CSS and a few lines of inline JavaScript for sorting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._fit import print_table
from . import renderer
from ._html import sortable_script
from ._inert import html as esc, markdown_code as code, markdown_text as prose, terminal as inert
from ..units import format_bytes, plural, shorten, unit_legend

if TYPE_CHECKING:  # annotations only: a `check` that loads every renderer need not import the scan
    from ..run.scan import ScanReport


def parity_summary(report: ScanReport) -> str | None:
    """One line: how many types the parity check gave a verdict (passed, failed), could not run, did not need."""
    c = report.parity_counts
    if c is None:
        return None
    return (f"parity: {plural(c['checked'], 'type')} checked ({c['passed']} passed, {c['failed']} failed), "
            f"{c['could_not_run']} could not run, {c['not_checked']} not needed")


def _parity_notes(report: ScanReport) -> list[tuple[str, str]]:
    """`(model_type, why)` for each row whose parity check could not run."""
    out = []
    for m in report.models:
        if m.parity_outcome != "could_not_run":
            continue
        why = m.parity_error or (m.parity or {}).get("error") or (m.parity or {}).get("reason") or ""
        out.append((m.model_type, why))
    return out


def _warning_lines(report: ScanReport) -> list[str]:
    """One line per distinct message transformers or torch gave during the scan, with its count."""
    return [f"{count}x {message}" for message, count in report.library_warnings]


@renderer("scan", "table", rich=True, width=200)
def render_terminal(report: ScanReport, console, *, show_all: bool = False, **_) -> None:
    """Print one row per model type (status, error count, replicated bytes and share, error families) on `console`."""
    from rich.table import Table
    from rich.text import Text

    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items()))
    console.print(Text(f"tpaudit scan · tp_size {report.tp_size} · {plural(len(report.models), 'model type')} "
                       f"({counts}) · {report.seconds:.0f} s · {unit_legend('GiB')}", style="bold"))
    t = Table(header_style="bold")
    for col in ("model_type", "status", "errors", "replicated", "share", "replicated families (error)", "unused rules"):
        t.add_column(col, overflow="fold")
    for m in report.models:
        if not show_all and m.status in ("no_model_class",) and not report.selected:
            continue
        share = m.replicated_share
        style = "red" if m.errors else ("dim" if m.status != "ok" else "")
        t.add_row(Text(inert(m.model_type)),
                  Text(inert(m.status + (f": {shorten(m.reason or '', 160)}" if m.status == "build_failed" else ""))),
                  str(m.errors), format_bytes(m.replicated_bytes) if m.replicated_bytes is not None else "-",
                  f"{share:.1%}" if share is not None else "-", Text(inert(m.error_families())),
                  str(len(m.unused_rules)), style=style)
    print_table(console, t)
    if (line := parity_summary(report)) is not None:
        console.print(Text(line, style="bold"))
        for model_type, why in _parity_notes(report):
            console.print(Text(inert(f"  {model_type}: parity could not run: {shorten(why, 320)}"), style="dim"))
    if lines := _warning_lines(report):
        console.print(Text(f"transformers and torch said ({plural(len(lines), 'distinct message')}):", style="bold"))
        for line in lines:
            console.print(Text(inert(f"  {shorten(line, 320)}"), style="dim"))


@renderer("scan", "markdown")
def render_markdown(report: ScanReport, **_) -> str:
    """The scan as a Markdown table for a pull-request comment (model types without a model class left out)."""
    lines = [f"### tpaudit scan: tp_size {report.tp_size}", "",
             f"{len(report.models)} model types: " + ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())),
             *(["", prose(line)] if (line := parity_summary(report)) is not None else []),
             "", "| model_type | status | errors | replicated | share | replicated families (error) |",
             "|---|---|---:|---:|---:|---|"]
    for m in report.models:
        if m.status == "no_model_class":
            continue
        share = m.replicated_share
        lines.append(f"| {code(m.model_type)} | {prose(m.status)} | {m.errors} | "
                     f"{format_bytes(m.replicated_bytes) if m.replicated_bytes is not None else '-'} | "
                     f"{f'{share:.1%}' if share is not None else '-'} | {prose(m.error_families())} |")
    notes = _parity_notes(report)
    if notes:
        lines += ["", "Parity could not run (the static audit above stands):", ""]
        lines += [f"- {code(t)}: {prose(shorten(why, 320))}" for t, why in notes]
    if said := _warning_lines(report):
        lines += ["", "transformers and torch said:", ""] + [f"- {prose(shorten(w, 320))}" for w in said]
    return "\n".join(lines) + "\n"


def _colour(share: float | None) -> str:
    if share is None:
        return "#f2f2f2"
    # green (0% replicated) -> yellow -> red (100% replicated)
    r = int(255 * min(1.0, 2 * share))
    g = int(200 * min(1.0, 2 * (1 - share)))
    return f"rgb({r},{g},70)"


# Laid out to fit 1400 px: the component cells are narrow, and the error families (long dotted names without a
# blank) wrap anywhere inside a bounded column instead of widening the table.
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{background:#eee;cursor:pointer;position:sticky;top:0}
td.cell{text-align:center;min-width:52px;color:#111}
td.num{text-align:right}
td.fams{max-width:300px;overflow-wrap:anywhere;font-size:12px}
td.type{max-width:220px;overflow-wrap:anywhere}
.legend span{display:inline-block;width:40px;height:12px;margin-right:4px}
"""

_SCRIPT = sortable_script("th")


@renderer("scan", "html")
def render_html(report: ScanReport, **_) -> str:
    """One self-contained page: architecture x component heat map coloured by the replicated share, sortable."""
    from ..run.scan import COMPONENTS

    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in COMPONENTS)
    rows = []
    for m in report.models:
        if m.status == "no_model_class":
            continue
        errors, share = m.errors, m.replicated_share
        cells = []
        for comp in COMPONENTS:
            entry = m.components.get(comp)
            if not entry or not entry["bytes"]:
                cells.append('<td class="cell" data-v="-1" style="background:#f7f7f7"></td>')
                continue
            s = entry["replicated_bytes"] / entry["bytes"]
            title = esc(f"{comp}: {format_bytes(entry['replicated_bytes'])} of {format_bytes(entry['bytes'])} "
                                "replicated on every rank")
            cells.append(f'<td class="cell" data-v="{s:.4f}" title="{title}" style="background:{_colour(s)}">'
                         f"{s:.0%}</td>")
        fams = esc(m.error_families(4))
        reason = esc(m.reason or "")
        rows.append(
            f"<tr><td class=\"type\">{esc(m.model_type)}</td><td title=\"{reason}\">{esc(m.status)}</td>"
            f'<td class="num" data-v="{errors}">{errors}</td>'
            f'<td class="num" data-v="{share if share is not None else -1:.4f}">'
            f"{'' if share is None else f'{share:.1%}'}</td>"
            f'<td class="num" data-v="{m.total_param_bytes or 0}">'
            f"{format_bytes(m.total_param_bytes) if m.total_param_bytes else ''}</td>"
            + "".join(cells) + f"<td class=\"fams\">{fams}</td></tr>")
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(report.counts.items()))
    versions = esc(", ".join(f"{k} {v}" for k, v in report.versions.items()))
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tpaudit scan: tp_size {report.tp_size}</title><style>{_STYLE}</style></head><body>"
        f"<h1>TP plan coverage at tp_size {report.tp_size}</h1>"
        f"<p>{len(report.models)} model types ({esc(counts)}). Each cell: the share of that component's "
        "weights (2-D and larger) that every rank holds whole because no rule shards it. Click a header to sort. "
        f"{versions}.</p>"
        + (f"<p>{esc(line)}.</p>" if (line := parity_summary(report)) is not None else "")
        + "".join(f"<p class=\"note\">{esc(t)}: parity could not run: {esc(shorten(why, 320))}</p>"
                  for t, why in _parity_notes(report))
        + "".join(f"<p class=\"note\">{esc(shorten(w, 320))}</p>" for w in _warning_lines(report))
        + "<p class=\"legend\"><span style=\"background:rgb(0,200,70)\"></span>0% "
        "<span style=\"background:rgb(255,200,70)\"></span>50% <span style=\"background:rgb(255,0,70)\"></span>100% "
        "replicated</p>"
        f"<table><thead><tr><th>model type</th><th>status</th><th>errors</th><th>replicated share</th>"
        f"<th>model bytes</th>{head}<th>replicated families (error)</th></tr></thead><tbody>"
        + "".join(rows) + f"</tbody></table><script>{_SCRIPT}</script></body></html>\n")

