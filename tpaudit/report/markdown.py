"""`--format markdown`: a pull-request comment. Draws the report; computes nothing."""

from __future__ import annotations

from functools import partial

from ..model import Report
from ..units import format_bytes, format_int, plural, unit_legend
from ._inert import markdown_code as code, markdown_fence as fenced, markdown_text, strings_in
from .wording import load_verdict, parity_verdict, quantization_line, rank_spread
from . import renderer

_ICON = {"error": "❌", "warning": "⚠️", "note": "ℹ️"}
_PARITY_ICON = {"pass": "✅", "fail": "❌", "error": "❌", "skipped": "➖", "inconclusive": "⚠️"}


@renderer("check", "markdown")
def render(report: Report, *, unit: str = "GiB", max_rows: int = 30, **_) -> str:
    """The report as GitHub-flavoured Markdown, ending with a newline."""
    sm = report.shard_map
    m = report.model
    # names strangers wrote (tensor names, rule keys, architectures[0]) that may hold a backtick: quoted whole in prose
    prose = partial(markdown_text, names=strings_in([m, report.unused_rules, [fam.name for fam in report.replicated],
                                                     [(f.target, f.facts) for f in report.findings]]))
    errors, warnings, notes = report.count("error"), report.count("warning"), report.count("note")
    status = "❌" if errors else ("⚠️" if warnings else "✅")
    name = m.get("repo_id") or m.get("ref")
    lines = [f"### {status} tpaudit: {code(name, table=False)} at tp_size {sm.tp_size}, ep_size {sm.ep_size}", "",
             f"{plural(errors, 'error')}, {plural(warnings, 'warning')}, {plural(notes, 'note')} · "
             f"{unit_legend(unit)}", "",
             *([f"> ⚠️ {prose(report.versions['untested'])}", ""] if report.versions.get("untested") else []),
             *([f"> ⚠️ {prose(m['bytes_caveat'])}", ""] if m.get("bytes_caveat") else []),
             "| | |", "|---|---|",
             f"| model | {code(m.get('architecture'))} ({prose(m.get('model_type'))}, {prose(m.get('dtype'))}) |",
             *([f"| quantization | {prose(quant)} |"] if (quant := quantization_line(m.get("quantization"))) else []),
             f"| model bytes | {format_int(sm.total_param_bytes)} B ({format_bytes(sm.total_param_bytes, unit)}) |"]
    ranks = sm.rank_param_bytes
    spread = rank_spread(ranks, unit)
    lines.append(f"| worst rank (rank {sm.worst_rank}) | {format_int(sm.worst_rank_param_bytes)} B "
                 f"({format_bytes(sm.worst_rank_param_bytes, unit)}); {spread} |")
    if sm.world_size > 1:
        lines.append(f"| replicated on every rank | {format_int(report.replicated_bytes)} B "
                     f"({format_bytes(report.replicated_bytes, unit)}, {report.replicated_share:.2%} of the model) |")
    kv = report.kv_cache
    if kv is not None:
        worst = max(kv.bytes_per_token_per_rank or [0])
        lines.append(f"| KV cache per token, worst rank | {format_int(worst)} B ({prose(kv.dtype)}; KV heads per rank: "
                     f"{kv.kv_heads_per_rank}) |")
    if report.loading is not None:
        kind, sentence = load_verdict(report.loading, unit)
        lines.append(f"| load | {'❌ ' if kind == 'fail' else ''}{prose(sentence)} |")
    if report.parity is not None:
        kind, sentence = parity_verdict(report.parity)
        lines.append(f"| parity | {_PARITY_ICON[kind]} {prose(sentence)} |")
    if report.findings:
        lines += ["", "#### Findings", "", "| | code | target | message | fix |", "|---|---|---|---|---|"]
        for f in report.findings[:max_rows]:
            lines.append(f"| {_ICON[f.severity]} {f.severity} | {f.code} | {code(f.target)} | {prose(f.message)} | "
                         f"{prose(f.fix)} |")
        if len(report.findings) > max_rows:
            lines.append(f"\n{len(report.findings) - max_rows} more findings: run `tpaudit check` locally.")
    if report.replicated:
        lines += ["", f"<details><summary>Replicated on every rank: {len(report.replicated)} parameter families, "
                      f"{format_bytes(report.replicated_bytes, unit)}</summary>", "",
                  "| name | count | bytes | reason |", "|---|---:|---:|---|"]
        for fam in report.replicated[:max_rows]:
            lines.append(f"| {code(fam.name)} | {fam.count} | {format_bytes(fam.bytes, unit)} | {prose(fam.reason)} |")
        if len(report.replicated) > max_rows:
            rest = report.replicated[max_rows:]
            lines.append(f"| and {len(rest)} more families | {sum(f.count for f in rest)} | "
                         f"{format_bytes(sum(f.bytes for f in rest), unit)} | `--format json` lists them all |")
        lines += ["", "</details>"]
    if report.unused_rules:
        lines += ["", "<details><summary>Rules that match nothing</summary>", ""]
        lines += [f"- {code(r, table=False)}" for r in report.unused_rules[:max_rows]]
        if len(report.unused_rules) > max_rows:
            lines.append(f"- and {len(report.unused_rules) - max_rows:,} more: `--format json` lists them all")
        lines += ["", "</details>"]
    if report.suggestion is not None and report.suggestion.snippet:
        lines += ["", "#### Suggested plan", "", *fenced(report.suggestion.snippet.rstrip(), "python")]
    if report.baseline is not None:
        lines += ["", f"{report.baseline.suppressed} finding(s) accepted by the baseline "
                      f"{code(report.baseline.file, table=False)} are not shown."]
    if report.notes:
        lines += ["", "<details><summary>Notes</summary>", ""] + [f"- {prose(n)}" for n in report.notes] + \
                 ["", "</details>"]
    versions = report.versions
    lines += ["", f"<sub>tpaudit {prose(versions.get('tpaudit'))} · transformers {prose(versions.get('transformers'))} "
                  f"· torch {prose(versions.get('torch'))}</sub>"]
    return "\n".join(lines) + "\n"
