"""Every terminal renderer draws what its result holds: the check table (findings, replicated families, parameters by
family or all), and the scan and verify tables, on results built here by hand or from a real fixture, with the
numbers worked out independently."""

from __future__ import annotations

import io
import json

from conftest import CASES, FIXTURES, audit, nbytes, run_main, snapshot_tensors

QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
PRE_FIX_PLAN = json.loads((CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json").read_text())


def draw(renderer, result, width: int = 200, **options) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    renderer(result, Console(file=buffer, width=width, no_color=True), **options)
    return buffer.getvalue()


def test_check_table_puts_findings_first_and_families_by_bytes():
    from tpaudit.report.terminal import render

    report = audit(QWEN3_VL, tp=4, plan=PRE_FIX_PLAN)
    text = draw(render, report)
    lines = text.splitlines()
    first_error = next(i for i, line in enumerate(lines) if "TPA001" in line and "error" in line)
    params_title = next(i for i, line in enumerate(lines) if line.startswith("Parameters by module family"))
    assert first_error < params_title < 80                    # what decides something comes before the table
    # the experts family is the largest on rank 0: 48 layers x (gate_up + down) of 128 experts, whole on every rank
    tensors = snapshot_tensors("qwen3-vl-30b-a3b-instruct")
    experts = sum(nbytes(d, s) for n, d, s in tensors if ".mlp.experts." in n)
    router = sum(nbytes(d, s) for n, d, s in tensors if n.endswith("mlp.gate.weight"))
    mlp_row = next(line for line in lines[params_title:] if "model.language_model.layers.*.mlp " in line + " ")
    assert f"{(experts + router) / 2**30:.2f} GiB" in mlp_row
    assert "Largest replicated families" in text and "and " in text and "more families" in text
    assert "Rules that match nothing" in text


def test_check_table_every_parameter_and_none():
    from tpaudit.report.terminal import render

    report = audit(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp=2)
    every = draw(render, report, params="all")
    assert "Parameters by generic name" in every and "model.layers.*.self_attn.q_proj.weight" in every
    assert "[2048, 4096]" in every                             # rank 0's shard of the 4096 x 4096 q_proj
    none = draw(render, report, params="none")
    assert "Parameters by" not in none and "No findings." in none


def test_cli_params_option():
    proc = run_main("check", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--tp", "2", "--params", "x")
    assert proc.returncode == 2 and "--params x" in proc.stderr


def test_scan_table():
    from tpaudit.report.scan import render_terminal
    from tpaudit.scan import ScanReport, ScanResult

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
