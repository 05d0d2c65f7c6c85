"""Renderers of `tpaudit size`: a table and per-rank bars (terminal), the `tpaudit/size/v1` JSON, and a
self-contained HTML page with one stacked bar per option against the GPU's capacity."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._fit import print_table
from ..units import format_bytes, format_int, unit_legend
from . import renderer
from ._inert import html as _esc, terminal as inert

if TYPE_CHECKING:  # annotations only: a `check` that loads every renderer need not import the sizing
    from ..sizing import SizeOption, SizeReport

_BAR = 48


# ----------------------------------------------------------------------------------------------------------------------
# What a bar is made of
# ----------------------------------------------------------------------------------------------------------------------
# (label, terminal character, rich style, HTML colour)
_SEGMENTS = {
    "weights": ("weights", "█", "blue", "#3b6fd4"),
    "kv": ("KV cache / state", "▓", "magenta", "#b04fc4"),
    "grads": ("gradients", "▓", "red", "#e0823a"),
    "master": ("master weights", "▚", "dark_orange", "#f2b33d"),
    "optimizer": ("optimizer states", "▞", "yellow", "#d9534f"),
    "activations": ("activation budget", "░", "cyan", "#4fb3bf"),
    "overhead": ("overhead", "▒", "grey50", "#9e9e9e"),
}


def _serving_parts(rank) -> list[tuple[str, int]]:
    return [("weights", rank.param_bytes), ("kv", rank.kv_cache_bytes + rank.state_bytes),
            ("overhead", rank.overhead_bytes)]


def _training_parts(rank, overhead: int) -> list[tuple[str, int]]:
    return [("weights", rank.param_bytes), ("grads", rank.grad_bytes), ("master", rank.master_weight_bytes),
            ("optimizer", rank.optimizer_bytes), ("activations", rank.activation_budget_bytes),
            ("overhead", overhead)]


def option_parts(report: SizeReport, option: SizeOption) -> list[tuple[str, int]] | None:
    """The worst rank's stacked segments of `option` (`[(segment key, bytes)]`): weights, KV cache/state and
    overhead when serving; weights, gradients, master weights, optimizer states, activation budget and overhead with
    `--training`. `None` when the option could not be simulated."""
    if report.training is not None:
        if option.training is None:
            return None
        return _training_parts(option.training.worst, option.training.overhead_bytes)
    return _serving_parts(option.worst) if option.worst is not None else None


# ----------------------------------------------------------------------------------------------------------------------
# Terminal
# ----------------------------------------------------------------------------------------------------------------------
def _bar(parts: list[tuple[str, int]], capacity: int) -> Text:
    total = sum(v for _, v in parts)
    scale = max(capacity, total) / _BAR
    text, used = Text(), 0
    for key, value in parts:
        _, char, style, _ = _SEGMENTS[key]
        n = int(round(value / scale))
        text.append(char * n, style=style)
        used += n
    cap = int(round(capacity / scale))
    if used < cap:
        text.append("·" * (cap - used), style="dim")
    elif total > capacity:
        text.append(f" over by {total / capacity - 1:.0%}", style="bold red")
    return text


def _free(capacity: int, total: int, unit: str) -> str:
    """What is left of a GPU, or by how much it is short: never a negative size."""
    left = capacity - total
    return format_bytes(left, unit) if left >= 0 else f"short by {format_bytes(-left, unit)}"


def _context_cell(option: SizeOption) -> str:
    fit = option.context_fit
    if fit is None:
        return "-"
    if fit.max_context_tokens is None:
        return "unlimited"
    mark = {"max_position_embeddings": " (cap)", "weights": " (no room)"}.get(fit.limited_by, "")
    return format_int(fit.max_context_tokens) + mark


def _legend(keys: list[str]) -> Text:
    text = Text()
    for key in keys:
        label, char, style, _ = _SEGMENTS[key]
        text.append(char, style=style)
        text.append(f" {label}  ", style="dim")
    return text + Text("· free", style="dim")


def _at_separators(segments: list[str], width: int) -> list[str]:
    """`segments` joined by " · " in lines of at most `width` columns, each break at a separator (a line ends with
    " ·"), never inside a segment; a segment wider than the line gets a line of its own."""
    lines, line = [], ""
    for segment in segments:
        joined = f"{line} · {segment}" if line else segment
        if line and len(joined) + 2 > width:
            lines.append(line + " ·")
            line = segment
        else:
            line = joined
    return lines + [line]


@renderer("size", "table", rich=True)
def render_terminal(report: SizeReport, console: Console, *, unit: str = "GiB", **_) -> None:
    """Print the serving table (with the longest context each option holds), the training table with `--training`,
    invalid reasons, one bar per option (worst rank) and one per rank of the recommended option."""
    cap = report.gpu["memory_bytes"]
    name = report.gpu.get("name") or "GPU"
    segments = ["tpaudit size", inert(report.model.get('repo_id') or report.model.get('ref')),
                f"{inert(name)} {format_bytes(cap, unit)} per GPU", f"context {report.context:,} x batch {report.batch}",
                f"KV cache {inert(report.kv_dtype)}", unit_legend(unit)]
    for line in _at_separators(segments, console.width):
        console.print(Text(line, style="bold"))
    rec = report.recommended
    training = report.training is not None
    t = Table(header_style="bold", title="Serving" if training else None)
    for col in ("tp", "ep", "valid", "weights", "total/N", "KV", "overhead", "total", "free", "fits", "max context"):
        t.add_column(col, justify="center" if col in ("valid", "fits") else "right")
    for o in report.options:
        w = o.worst
        mark = "✓" if o.fits else ("invalid" if not o.valid else "✗")
        row = [str(o.tp_size), str(o.ep_size), "yes" if o.valid else "no"]
        if w is None:
            row += ["-"] * 6 + [mark, "-"]
        else:
            row += [format_bytes(w.param_bytes, unit), format_bytes(o.naive_param_bytes, unit),
                    format_bytes(w.kv_cache_bytes + w.state_bytes, unit), format_bytes(w.overhead_bytes, unit),
                    format_bytes(w.total_bytes, unit), _free(cap, w.total_bytes, unit), mark,
                    _context_cell(o)]
        style = "bold green" if rec is o and not training else ("dim" if not o.valid else "")
        t.add_row(*row, style=style)
    print_table(console, t)
    console.print(Text("weights, KV, overhead, total: the worst rank; total/N: the naive even split of the weights; "
                       f"max context: the longest context (tokens) whose KV cache for {report.batch} sequence(s) fits "
                       "next to the weights and overhead, (cap): max_position_embeddings limits it first",
                       style="dim"))
    if training:
        _render_training_table(report, console, unit)
    for o in report.options:
        if not o.valid and o.reason:
            console.print(Text(f"tp {o.tp_size} ep {o.ep_size} invalid: ", style="bold") + Text(inert(o.reason)))
        elif o.errors:
            shown = ", ".join(o.errors[:3]) + (f" and {len(o.errors) - 3} more" if len(o.errors) > 3 else "")
            console.print(Text(f"tp {o.tp_size} ep {o.ep_size} loads, but its plan has {len(o.errors)} error "
                               f"finding(s): ", style="bold yellow") +
                          Text(f"{inert(shown)}; the bytes above are what that plan places (tpaudit check --tp {o.tp_size}"
                               f"{f' --ep {o.ep_size}' if o.ep_size > 1 else ''} explains)"))
    keys = ["weights", "grads", "master", "optimizer", "activations", "overhead"] if training else \
        ["weights", "kv", "overhead"]
    console.print(_legend(keys))
    for o in report.options:
        parts = option_parts(report, o)
        if parts is None:
            continue
        worst = o.training.worst.rank if training else o.worst.rank
        bar = _bar(parts, cap) + (Text(" invalid (see above)", style="bold") if not o.valid else Text())
        console.print(Text(f"tp {o.tp_size:>2} ep {o.ep_size:>2} worst r{worst:<3}") + bar)
    what = "training" if training else "serving"
    if rec is not None:
        console.print(Text(f"Recommended for {what}: tp_size {rec.tp_size}, ep_size {rec.ep_size} "
                           f"({inert(report.recommended_why)}). Its ranks:",
                           style="bold green" if rec.clean else "bold yellow"))
        ranks = rec.training.ranks if training else rec.ranks
        for r in ranks[:16]:
            parts = _training_parts(r, rec.training.overhead_bytes) if training else _serving_parts(r)
            total = sum(v for _, v in parts)
            console.print(Text(f"  rank {r.rank:<3}") + _bar(parts, cap) + Text(f" {format_bytes(total, unit)}"))
    else:
        console.print(Text(report.no_fit_advice, style="bold red"))
    console.print(Text(f"overhead policy: {report.overhead.describe()}", style="dim"))
    for n in report.notes:
        console.print(Text("note: " + inert(n), style="dim"))


def _render_training_table(report: SizeReport, console: Console, unit: str) -> None:
    from ..sizing.training import describe

    rec = report.recommended
    cap = report.gpu["memory_bytes"]
    dtype = report.model.get("dtype") or "bfloat16"
    t = Table(header_style="bold", title="Training (model states)")
    for col in ("tp", "ep", "valid", "params", "grads", "master", "optimizer", "activations", "overhead", "total",
                "free", "fits"):
        t.add_column(col, justify="center" if col in ("valid", "fits") else "right")
    for o in report.options:
        row = [str(o.tp_size), str(o.ep_size), "yes" if o.valid else "no"]
        tr = o.training
        if tr is None:
            row += ["-"] * 8 + ["invalid"]
        else:
            w = tr.worst
            mark = "✓" if o.training_fits else ("invalid" if not o.valid else "✗")
            need = tr.required_bytes(w)
            row += [format_bytes(v, unit) for v in (w.param_bytes, w.grad_bytes, w.master_weight_bytes,
                                                    w.optimizer_bytes, w.activation_budget_bytes, tr.overhead_bytes,
                                                    need)] + [_free(cap, need, unit), mark]
        t.add_row(*row, style="bold green" if rec is o else ("dim" if not o.valid else ""))
    print_table(console, t)
    try:
        recipe = describe(report.training, dtype)
    except KeyError:  # a quantized or integer model dtype: no per-element recipe to quote
        recipe = describe(report.training)
    console.print(Text(f"training: the worst rank; {recipe}; total = model states + activation budget + overhead",
                       style="dim"))
    for n in report.training_notes:
        console.print(Text("note: " + inert(n), style="dim"))
    if report.frozen:
        names = inert(", ".join(f["name"] for f in report.frozen[:4])) + (" ..." if len(report.frozen) > 4 else "")
        console.print(Text(f"no gradient (parameters only): {names}", style="dim"))


# ----------------------------------------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------------------------------------
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em 2em;color:#222;max-width:1250px}
h1{font-size:1.35em;margin-bottom:.2em}
p.sub{color:#555;margin-top:0}
.legend span.sw{display:inline-block;width:14px;height:14px;vertical-align:-2px;margin:0 4px 0 12px;border-radius:2px}
.chart{margin:1.2em 0}
.row{display:grid;grid-template-columns:120px 1fr 300px;align-items:center;gap:12px;margin:6px 0}
.label{font-weight:600;text-align:right;font-variant-numeric:tabular-nums}
.label small{display:block;font-weight:400;color:#666}
.track{position:relative;height:30px;background:repeating-linear-gradient(90deg,#f4f4f4 0 9px,#fafafa 9px 10px);
       border:1px solid #ddd;border-radius:3px}
.seg{position:absolute;top:0;bottom:0}
.cap{position:absolute;top:-5px;bottom:-5px;border-left:2px dashed #111}
.cut{position:absolute;right:2px;top:6px;font-size:12px;font-weight:700;color:#fff;background:#c62828;padding:1px 5px;
     border-radius:3px}
.badge{display:inline-block;padding:2px 7px;border-radius:10px;font-size:12px;font-weight:600;margin-right:6px}
.fit{background:#d7f5dc;color:#17692a}.nofit{background:#fde0e0;color:#a11}.invalid{background:#eee;color:#555}
.rec{outline:3px solid #2e7d32;outline-offset:3px;border-radius:4px}
.status{font-size:13px;font-variant-numeric:tabular-nums;white-space:nowrap}
.reason{font-size:12px;color:#666;grid-column:2 / 4}
table{border-collapse:collapse;font-size:12.5px;margin-top:1em;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#eee}
td.l,th.l{text-align:left}
.notes{font-size:12px;color:#555}
"""


def _gib(n: int, unit: str) -> str:
    return format_bytes(n, unit)


@renderer("size", "html")
def render_html(report: SizeReport, *, unit: str = "GiB", **_) -> str:
    """One self-contained page (inline CSS, no script, nothing loaded from the network): per option, the worst rank's
    memory as a stacked bar (weights, KV cache or training states, overhead) on a common scale, with the GPU's
    capacity as a dashed line; valid/invalid and fits marked; a table with the exact figures; units stated.

    Args:
        report (`SizeReport`): from `sizing.size_model`.
        unit (`str`): `GiB` (2^30 B) or `GB` (10^9 B) for printed sizes.

    Returns:
        The HTML text, ending with a newline.
    """
    cap = report.gpu["memory_bytes"]
    training = report.training is not None
    rec = report.recommended
    esc = _esc
    totals = [sum(v for _, v in parts) for o in report.options if (parts := option_parts(report, o))]
    # A common scale; an option far over capacity is cut at twice the capacity so the others stay readable.
    axis = min(max([cap, *totals]), 2 * cap)
    keys = ["weights", "grads", "master", "optimizer", "activations", "overhead"] if training else \
        ["weights", "kv", "overhead"]
    legend = "".join(f'<span class="sw" style="background:{_SEGMENTS[k][3]}"></span>{esc(_SEGMENTS[k][0])}'
                     for k in keys)
    cap_left = 100 * cap / axis
    rows = []
    for o in report.options:
        parts = option_parts(report, o)
        fits = o.training_fits if training else o.fits
        if not o.valid:
            badge = '<span class="badge invalid">invalid</span>'
        elif fits:
            badge = '<span class="badge fit">fits</span>'
        else:
            badge = '<span class="badge nofit">does not fit</span>'
        is_rec = rec is o
        label = (f'<div class="label">tp {o.tp_size} · ep {o.ep_size}'
                 f'<small>{"recommended" if is_rec else ("valid" if o.valid else "invalid")}</small></div>')
        if parts is None:
            rows.append(f'<div class="row">{label}<div class="track"></div><div class="status">{badge}</div>'
                        f'<div class="reason">{esc(o.reason or "not simulated")}</div></div>')
            continue
        total = sum(v for _, v in parts)
        segs, left = [], 0.0
        for key, value in parts:
            width = 100 * value / axis
            if left >= 100 or value <= 0:
                left += width
                continue
            shown = min(width, 100 - left)
            title = esc(f"{_SEGMENTS[key][0]}: {value:,} B ({_gib(value, unit)})")
            segs.append(f'<div class="seg" title="{title}" style="left:{left:.3f}%;width:{shown:.3f}%;'
                        f'background:{_SEGMENTS[key][3]}"></div>')
            left += width
        if total > axis:
            segs.append(f'<div class="cut">{total / cap:.1f}× capacity →</div>')
        segs.append(f'<div class="cap" style="left:{cap_left:.3f}%" title="GPU capacity {cap:,} B"></div>')
        free = cap - total
        status = (f'{badge}{esc(_gib(total, unit))} of {esc(_gib(cap, unit))}<br>'
                  f'{"free " + esc(_gib(free, unit)) if free >= 0 else "over by " + esc(_gib(-free, unit))}')
        reason = f'<div class="reason">{esc(o.why)}</div>' if o.why else ""
        rows.append(f'<div class="row{" rec" if is_rec else ""}">{label}<div class="track">{"".join(segs)}</div>'
                    f'<div class="status">{status}</div>{reason}</div>')
    table = _html_table(report, unit)
    what = "training model states" if training else f"serving: weights + KV cache for {report.context:,} tokens x " \
        f"batch {report.batch} ({esc(report.kv_dtype)})"
    recommended = (f"Recommended for {'training' if training else 'serving'}: <b>tp_size {rec.tp_size}, ep_size "
                   f"{rec.ep_size}</b> ({esc(report.recommended_why)})." if rec else
                   f"<b>{esc(report.no_fit_advice)}</b>")
    notes = [f"Overhead policy: {report.overhead.describe()}.",
             "Each bar: the worst rank of the option (the rank needing the most memory); the dashed line is the GPU's "
             "capacity; hover a segment for its exact bytes."]
    if training:
        from ..sizing.training import describe

        dtype = report.model.get("dtype") or "bfloat16"
        try:
            notes.append("Recipe: " + describe(report.training, dtype) + ".")
        except KeyError:
            notes.append("Recipe: " + describe(report.training) + ".")
        notes += ["Note: " + n + "." for n in report.training_notes]
    notes += ["Note: " + n for n in report.notes]
    model = report.model.get("repo_id") or report.model.get("ref") or ""
    gpu = f"{report.gpu.get('name') or 'GPU'} {_gib(cap, unit)} ({cap:,} B)"
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tpaudit size: {esc(model)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>tpaudit size · {esc(model)}</h1>"
        f"<p class=\"sub\">{esc(gpu)} per GPU · {what} · {esc(unit_legend(unit))}</p>"
        f"<p>{recommended}</p>"
        f"<p class=\"legend\">{legend}<span class=\"sw\" style=\"background:none;border-left:2px dashed #111;"
        f"border-radius:0\"></span>GPU capacity</p>"
        f"<div class=\"chart\">{''.join(rows)}</div>{table}"
        + "".join(f"<p class=\"notes\">{esc(n)}</p>" for n in notes)
        + f"<p class=\"notes\">{esc(versions)}</p></body></html>\n")


_LIMITS = {"max_position_embeddings": "position cap", "weights": "no room", "memory": "memory", "nothing": "-"}


def _html_table(report: SizeReport, unit: str) -> str:
    cap = report.gpu["memory_bytes"]
    training = report.training is not None
    head = ["tp", "ep", "valid", "weights", "KV / state", "total", "fits", "max context", "limited by"]
    if training:
        head += ["grads", "master", "optimizer", "activations", "total", "fits"]
    group = ""
    if training:
        group = ('<tr><th colspan="3"></th><th colspan="6" class="l">serving (weights + KV cache for '
                 f'{report.context:,} tokens x batch {report.batch})</th><th colspan="6" class="l">training (model '
                 'states)</th></tr>')
    out = ["<table><thead>" + group + "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for o in report.options:
        w = o.worst
        cells = [str(o.tp_size), str(o.ep_size), "yes" if o.valid else "no"]
        if w is None:
            cells += ["-"] * 6
        else:
            fit = o.context_fit
            cells += [_gib(w.param_bytes, unit), _gib(w.kv_cache_bytes + w.state_bytes, unit),
                      _gib(w.total_bytes, unit), "yes" if o.fits else "no",
                      "-" if fit is None else ("unlimited" if fit.max_context_tokens is None
                                               else format_int(fit.max_context_tokens)),
                      "-" if fit is None else _LIMITS.get(fit.limited_by, fit.limited_by)]
        if training:
            tr = o.training
            if tr is None:
                cells += ["-"] * 6
            else:
                t = tr.worst
                cells += [_gib(t.grad_bytes, unit), _gib(t.master_weight_bytes, unit), _gib(t.optimizer_bytes, unit),
                          _gib(t.activation_budget_bytes, unit), _gib(tr.required_bytes(t), unit),
                          "yes" if o.training_fits else "no"]
        out.append("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>")
    out.append(f"</tbody></table><p class=\"notes\">All sizes for the worst rank; capacity {cap:,} B; totals "
               f"include the overhead ({_gib(report.overhead.bytes_for(cap), unit)} per GPU). Max context: the longest "
               f"context in tokens whose KV cache for {report.batch} sequence(s) fits next to the weights; "
               "\"position cap\": the model's max_position_embeddings is reached first."
               + (" Training total = parameters + gradients + master weights + optimizer states + activation budget "
                  "+ overhead." if training else "") + "</p>")
    return "".join(out)
