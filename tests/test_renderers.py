"""Every terminal renderer draws what its result holds: the check table (findings, replicated families, parameters by
family or all), and the scan and verify tables, on results built here by hand or from a real fixture, with the
numbers worked out independently."""

from __future__ import annotations

import io
import json

from conftest import CASES, FIXTURES, audit, run_main

QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
PRE_FIX_PLAN = json.loads((CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json").read_text())


def draw(renderer, result, width: int = 200, **options) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    renderer(result, Console(file=buffer, width=width, no_color=True), **options)
    return buffer.getvalue()


def test_check_table_puts_findings_first_and_families_by_bytes():
    """On the hand-built report of the golden tests (tests/test_golden.py): what decides something comes before the
    parameter table, and the module families are ordered by their bytes on the worst rank."""
    from test_golden import EXPERT_BYTES, LAYERS, NORM_BYTES, ROUTER_BYTES, full_report

    from tpaudit.report.terminal import render

    text = draw(render, full_report(), width=160)
    lines = text.splitlines()
    first_error = next(i for i, line in enumerate(lines) if "TPA001" in line and "error" in line)
    replicated_title = next(i for i, line in enumerate(lines) if line.startswith("Largest replicated families"))
    params_title = next(i for i, line in enumerate(lines) if line.startswith("Parameters by module family"))
    assert first_error < replicated_title < params_title
    # the MoE block is the largest on rank 0: both layers' fused experts and routers, whole on every rank
    mlp = LAYERS * (EXPERT_BYTES + ROUTER_BYTES)
    families = [line for line in lines[params_title:] if line.startswith("│")]
    assert "model.layers.*.mlp " in families[0] and f"{mlp / 2**20:.2f} MiB" in families[0]
    assert "model.layers.* " in families[3] and f"{LAYERS * NORM_BYTES / 2**10:.2f} KiB" in families[3]
    assert "Rules that match nothing: model.layers.*.mlp.shared_expert" in text


def test_check_table_every_parameter_and_none():
    from test_golden import HIDDEN, TP, clean_report, full_report

    from tpaudit.report.terminal import render

    every = draw(render, full_report(), params="all")
    assert "Parameters by generic name" in every and "model.layers.*.self_attn.q_proj.weight" in every
    table = every[every.index("Parameters by generic name"):]
    q_proj = next(line for line in table.splitlines() if "self_attn.q_proj.weight" in line)
    assert f"[{HIDDEN // TP}, {HIDDEN}]" in q_proj                  # rank 0's shard of the colwise q_proj
    none = draw(render, clean_report(), params="none")
    assert "Parameters by" not in none and "No findings." in none


def test_cli_params_option():
    proc = run_main("check", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--tp", "2", "--params", "x")
    assert proc.returncode == 2 and "--params x" in proc.stderr


def test_scan_table():
    from tpaudit.report.scan import render_terminal
    from tpaudit.run.scan import ScanReport, ScanResult

    rows = [ScanResult("alpha", "ok", "AlphaForCausalLM", total_param_bytes=4 * 2**30, worst_rank_param_bytes=2**30,
                       replicated_bytes=2**30, replicated=[{"name": "model.layers.*.mlp.x.weight", "bytes": 2**30,
                                                            "count": 2, "severity": "error"}],
                       findings=[{"code": "TPA001", "severity": "error"}]),
            ScanResult("beta", "build_failed", reason="ValueError: no")]
    text = draw(render_terminal, ScanReport(4, rows, {"tpaudit": "x"}, None, 12.0))
    alpha = next(line for line in text.splitlines() if "alpha" in line)
    assert "1.00 GiB" in alpha and "25.0%" in alpha and "model.layers.*.mlp.x.weight" in alpha and " 1 " in alpha
    assert "build_failed: ValueError: no" in text and "2 model types" in text


def test_verify_table():
    from tpaudit.report.verify import render_terminal
    from tpaudit.verify import VerifyResult

    result = VerifyResult(2, 1, ranks=[{"rank": 0, "predicted_param_bytes": 100, "measured_param_bytes": 100,
                                        "allocated_bytes": 2**20, "load_seconds": 1.5},
                                       {"rank": 1, "predicted_param_bytes": 100, "measured_param_bytes": 96,
                                        "allocated_bytes": 2**20, "load_seconds": 1.4}],
                          mismatches=[{"rank": 1, "name": "model.norm.weight",
                                       "predicted": {"shape": [2], "dtype": "bfloat16", "bytes": 4},
                                       "measured": None}],
                          model={"ref": "m"})
    text = draw(render_terminal, result)
    assert "MISMATCH" in text and "-4" in text and "model.norm.weight" in text and "absent" in text
    assert "1.00 MiB" in text and "(GiB)" not in text          # each size carries its own unit


def test_parity_line_says_what_happened_never_diverges_when_it_did_not_run():
    from tpaudit.evidence import ParityResult
    from tpaudit.report.wording import parity_verdict

    skipped = ParityResult(ran=False, reason="not needed: no fused split", tp_size=4)
    assert parity_verdict(skipped) == ("skipped", "not run (not needed: no fused split)")
    raised = ParityResult(ran=True, reason="", tp_size=8, passed=False, error="rank 0: RuntimeError: bad view",
                          observed_at="model.layers.*.self_attn", modules_compared=6, max_abs_error=0.5)
    kind, text = parity_verdict(raised)
    assert kind == "error" and "rank 0: RuntimeError: bad view" in text and "model.layers.*.self_attn" in text
    assert "DIVERGES" not in text
    wrong = ParityResult(ran=True, reason="", tp_size=2, passed=False, max_abs_error=4.08, modules_compared=12,
                         first_divergent_module="model.layers.*.mlp.gate_up_proj")
    assert parity_verdict(wrong)[0] == "fail" and "DIVERGES at `model.layers.*.mlp.gate_up_proj`" in \
        parity_verdict(wrong)[1] and "max abs error 4.1" in parity_verdict(wrong)[1]
    ok = ParityResult(ran=True, reason="", tp_size=2, passed=True, max_abs_error=1e-7, modules_compared=9)
    assert parity_verdict(ok)[0] == "pass" and "matches the unsharded model" in parity_verdict(ok)[1]
    # a real report with the parity check switched off: the table and the Markdown say "not run"
    from tpaudit.report import get

    report = audit(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp=8)
    assert report.parity is not None and report.parity.ran is False
    table = draw(get("check", "table").fn, report)
    markdown = get("check", "markdown").fn(report)
    for text in (table, markdown):
        assert "not run (switched off (--no-parity)" in text and "diverge" not in text.lower()


def test_uneven_ranks_are_summed_up_in_exact_bytes():
    from tpaudit.report.wording import rank_spread

    assert rank_spread([7, 7, 7]) == "every rank the same (3 ranks)"
    assert rank_spread([10, 7, 10, 9], "GiB") == "uneven (3 different sizes): lightest rank 1 holds 3 B (3 B) less"
    # Granite 3.3 8B at tp 5: vocab 49,159 rows -> rank 4 holds fewer embedding rows than ranks 0-3
    report = audit(str(FIXTURES / "granite-3.3-8b-instruct.snapshot.json.gz"), tp=5)
    ranks = report.shard_map.rank_param_bytes
    assert ranks[0] == max(ranks) and ranks[4] == min(ranks)
    assert f"lightest rank 4 holds {max(ranks) - min(ranks):,} B" in rank_spread(ranks)
