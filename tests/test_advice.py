"""Advice that loads: the recommendation of `size`, the expert layouts it searches, the re-checked fixes and
`--suggest`. Expected values come from the configs (shapes x dtype sizes) and from transformers' own validation,
never from tpaudit's output."""

from __future__ import annotations

import json

import pytest

from conftest import CASES, FIXTURES, read_json_any, run_main

QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
CASE_01_PLAN = str(CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json")
BF16 = 2


def qwen3_vl_expert_bytes() -> int:
    """All routed experts of Qwen3-VL-30B-A3B: per layer `gate_up_proj [E, H, 2I]` + `down_proj [E, I, H]`, bf16."""
    text = read_json_any(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")["config"]["text_config"]
    e, h, i, layers = (text["num_experts"], text["hidden_size"], text["moe_intermediate_size"],
                       text["num_hidden_layers"])
    return layers * e * (h * 2 * i + i * h) * BF16


def accepted_by_transformers(tp: int, ep: int) -> bool:
    """Whether transformers' own `DistributedConfig` accepts the pair (its validation, asked directly)."""
    from transformers.distributed import DistributedConfig

    try:
        DistributedConfig(tp_size=tp, ep_size=ep)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------------------------
# 1. A recommendation is a clean option
# ----------------------------------------------------------------------------------------------------------------------
def test_size_recommends_the_clean_option_over_a_tie_with_errors():
    """Case 01's plan has no expert rules: at tp 4 ep 1 every rank holds all 54 GiB of experts (TPA001 x 2), at tp 4
    ep 4 a quarter of them. Both use 4 GPUs and both fit on an H100-80GB: the clean one is recommended, and the
    row with errors says which."""
    experts = qwen3_vl_expert_bytes()
    assert experts == 57_982_058_496  # 48 x 128 x (2048 x 1536 + 768 x 2048) x 2 B
    proc = run_main("size", QWEN3_VL, "--plan", CASE_01_PLAN, "--gpu", "H100-80GB", "--tp", "4", "--ep", "1,4",
                    "--context", "32768", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    opts = {(o["tp_size"], o["ep_size"]): o for o in out["options"]}
    assert set(opts) == {(4, 1), (4, 4)}
    assert opts[(4, 1)]["fits"] and opts[(4, 4)]["fits"]
    # ep 4 splits the experts 4 ways and changes nothing else: the worst ranks differ by 3/4 of the experts
    assert opts[(4, 1)]["worst_rank_param_bytes"] - opts[(4, 4)]["worst_rank_param_bytes"] == experts * 3 // 4
    assert sorted(e.split()[0] for e in opts[(4, 1)]["errors"]) == ["TPA001", "TPA001"]
    assert opts[(4, 1)]["why"].startswith("loads, but its plan has 2 error finding(s): TPA001")
    assert opts[(4, 4)]["errors"] == [] and opts[(4, 4)]["why"] is None
    assert out["recommended"] == {"tp_size": 4, "ep_size": 4}
    assert "without error findings" in out["recommended_why"]
    table = run_main("size", QWEN3_VL, "--plan", CASE_01_PLAN, "--gpu", "H100-80GB", "--tp", "4", "--ep", "1,4",
                     "--context", "32768")
    assert "Recommended for serving: tp_size 4, ep_size 4" in " ".join(table.stdout.split())


def _option(tp, ep, total, errors=(), valid=True):
    from tpaudit.sizing import RankMemory, SizeOption

    return SizeOption(tp, ep, valid, None if valid else "refused", (RankMemory(0, total, 0, 0, 0),), 0, 100, total,
                      list(errors))


def _report(*options):
    from tpaudit.sizing import OverheadPolicy, SizeReport

    return SizeReport(model={}, gpu={"name": None, "memory_bytes": 100}, context=1, batch=1, kv_dtype="bfloat16",
                      overhead=OverheadPolicy(), options=tuple(options), versions={})


def test_recommendation_order_clean_then_fewest_gpus_then_smallest_worst_rank():
    errors_small = _option(2, 1, 10, errors=["TPA001 x"])
    clean_big = _option(8, 8, 90)
    assert _report(errors_small, clean_big).recommended is clean_big   # clean wins even on more GPUs
    few, many = _option(4, 4, 80), _option(8, 8, 20)
    assert _report(many, few).recommended is few                       # then the fewest GPUs
    tp_only, ep = _option(4, 1, 60), _option(4, 4, 30)
    assert _report(tp_only, ep).recommended is ep                      # then the smaller worst rank
    rep = _report(errors_small, _option(1, 1, 200))                    # nothing clean fits: the error option, said so
    assert rep.recommended is errors_small and "1 error finding(s): TPA001 x" in rep.recommended_why
    assert _report(_option(1, 1, 200), _option(2, 1, 10, valid=False)).recommended is None


# ----------------------------------------------------------------------------------------------------------------------
# 2. Sizing searches the expert layouts transformers accepts
# ----------------------------------------------------------------------------------------------------------------------
def test_size_without_ep_searches_the_layouts_transformers_accepts():
    """No `--ep` on a model with an expert-parallel plan: each tp size is also tried with the ep sizes transformers'
    `DistributedConfig` accepts on its ranks, and on 24 GB GPUs tp 4 with ep 4 fits (experts / 4 + the rest)."""
    proc = run_main("size", QWEN3_VL, "--gpu-memory", "24GB", "--tp", "1,2,4,8", "--context", "32768",
                    "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = sorted([tp, ep] for tp in (1, 2, 4, 8) for ep in range(2, tp + 1) if accepted_by_transformers(tp, ep))
    assert out["ep_searched"] == expected and [4, 4] in expected
    assert not accepted_by_transformers(4, 2)  # a layout transformers refuses is not searched
    pairs = {(o["tp_size"], o["ep_size"]) for o in out["options"]}
    assert pairs == {(tp, 1) for tp in (1, 2, 4, 8)} | {tuple(p) for p in expected}
    assert out["recommended"] == {"tp_size": 4, "ep_size": 4}
    assert any(n.startswith("expert layouts:") and "tp 4 ep 4" in n for n in out["notes"])
    # --ep given: only what was asked
    proc = run_main("size", QWEN3_VL, "--gpu-memory", "24GB", "--tp", "4", "--ep", "1", "--format", "json")
    out = json.loads(proc.stdout)
    assert out["ep_searched"] == [] and {o["ep_size"] for o in out["options"]} == {1}


def test_a_dense_model_gets_no_expert_layouts():
    proc = run_main("size", str(FIXTURES / "llama-3.1-8b.snapshot.json.gz"), "--gpu-memory", "80GB", "--tp", "1,2",
                    "--format", "json")
    out = json.loads(proc.stdout)
    assert out["ep_searched"] == [] and {o["ep_size"] for o in out["options"]} == {1}
