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


# ----------------------------------------------------------------------------------------------------------------------
# 3. Every concrete fix is re-checked before it is printed
# ----------------------------------------------------------------------------------------------------------------------
def check_json(*args):
    proc = run_main("check", *args, "--format", "json")
    return proc.returncode, json.loads(proc.stdout)


def errors_of(out) -> list[str]:
    return [f"{f['code']} {f['target']}" for f in out["findings"] if f["severity"] == "error"]


def assert_fix_offers_only_clean_alternatives(finding):
    verified = finding["verified"]
    alternatives = verified["alternatives"]
    clean = [a for a in alternatives if a["exit_code"] == 0]
    for a in alternatives:
        assert a["errors"] == len(a["remaining"]) and (a["exit_code"] == 0) == (a["errors"] == 0)
    if clean:
        assert finding["fix"].endswith("(re-checked with the whole check, load stage included: 0 errors)")
        assert (verified["exit_code"], verified["errors"]) == (0, 0)
        fix = finding["fix"].lower()
        for a in alternatives:  # each alternative's own words are in the fix exactly when it re-checked clean
            assert (a["fix"].lower() in fix) == (a in clean), (a, finding["fix"])
    else:
        assert finding["fix"].startswith("No re-checked alternative is clean: ")
        for a in alternatives:
            assert f"leaves {a['errors']} error(s)" in finding["fix"] or a["exit_code"] == 2


def test_tpa202_fix_offers_only_tp_sizes_and_ep_whose_whole_check_is_clean():
    """Qwen3-30B-A3B-FP8 (128 x 128 blocks) at tp 4: `moe_intermediate_size` 768 = 6 blocks, cut at tp 4 (192 rows).
    The sizes that keep the blocks whole (2, 3) are re-checked with the whole check: tp 3 cannot be clean (32
    attention heads, 4 KV heads and the vocabulary do not divide by 3), so it is never offered; each re-check's exit
    code and error count are what `check` itself gives for that option."""
    fp8 = str(FIXTURES / "qwen3-30b-a3b-fp8.snapshot.json.gz")
    config = read_json_any(FIXTURES / "qwen3-30b-a3b-fp8.snapshot.json.gz")["config"]
    assert config["num_attention_heads"] % 3 and config["num_key_value_heads"] % 3 and config["vocab_size"] % 3
    assert (768 // 4) % 128 and (768 // 2) % 128 == 0 and (768 // 3) % 128 == 0
    code, out = check_json(fp8, "--tp", "4")
    assert code == 1
    tpa202 = [f for f in out["findings"] if f["code"] == "TPA202"]
    for f in out["findings"]:
        if "verified" in f:
            assert_fix_offers_only_clean_alternatives(f)
    for f in tpa202:
        by_sizes = {(a["tp_size"], a["ep_size"]): a for a in f["verified"]["alternatives"]}
        assert (3, 1) in by_sizes and by_sizes[(3, 1)]["exit_code"] == 1
        assert "--tp 3" not in f["fix"] and "TPA101 num_attention_heads" in by_sizes[(3, 1)]["remaining"]
    if tpa202:  # 5.23/5.24: the experts are split by TP at tp 4 and cut their blocks
        alternatives = tpa202[0]["verified"]["alternatives"]
        for a in alternatives:
            args = ["--tp", str(a["tp_size"])] + (["--ep", str(a["ep_size"])] if a["ep_size"] > 1 else [])
            direct_code, direct = check_json(fp8, *args)
            assert (direct_code, len(errors_of(direct))) == (a["exit_code"], a["errors"]), args


def test_an_expert_fix_is_ep_rechecked_clean_and_the_release_is_named_when_it_dropped_the_rules():
    """Qwen3-VL-30B-A3B at tp 4 with the shipped plan: under 5.23/5.24 the TP load of the stored experts fails
    (TPA304), under 5.25 the experts have no TP rule and are held whole (TPA001). Either way the fix is `--ep 4`,
    re-checked clean, and `check --tp 4 --ep 4` is indeed clean. The message names the release only when its shipped
    plan has no TP rule for the experts (read from transformers' own config class)."""
    from transformers import Qwen3VLMoeTextConfig

    import transformers

    shipped = Qwen3VLMoeTextConfig.base_model_tp_plan or {}
    dropped = not any("experts" in k for k in shipped)
    code, out = check_json(QWEN3_VL, "--tp", "4")
    assert code == 1
    experts = [f for f in out["findings"] if f["severity"] == "error" and ".mlp.experts." in f["target"]]
    assert sorted(f["target"].rsplit(".", 1)[1] for f in experts) == ["down_proj", "gate_up_proj"]
    assert {f["code"] for f in experts} == ({"TPA001"} if dropped else {"TPA304"})
    for f in experts:
        assert f["fix"].startswith("Use expert parallelism, --tp 4 --ep 4")
        assert f["verified"]["exit_code"] == 0 and f["verified"]["errors"] == 0
        plain = f"transformers {transformers.__version__} splits these experts by expert parallelism only"
        assert (plain in f["message"]) == dropped
    direct_code, direct = check_json(QWEN3_VL, "--tp", "4", "--ep", "4")
    assert direct_code == 0 and errors_of(direct) == []


def test_fix_text_when_no_alternative_is_clean_names_what_remains():
    from tpaudit.model import Finding, FixOption
    from tpaudit.run.fixes import Recheck, fix_text

    f = Finding("TPA202", "quant_block_misaligned", "error", "x", "m", fix="old", fix_fallback="Re-quantize")
    a, b = FixOption("Use --tp 3, which keeps its blocks whole", 3), FixOption("Use --tp 2", 2)
    text = fix_text(f, [Recheck(a, 1, ("TPA101 num_attention_heads", "TPA101 vocab_size")),
                        Recheck(b, 1, ("TPA001 w",))])
    assert text == ("No re-checked alternative is clean: Use --tp 3, which keeps its blocks whole leaves 2 error(s) "
                    "(TPA101 num_attention_heads, TPA101 vocab_size); Use --tp 2 leaves 1 error(s) (TPA001 w). "
                    "Re-quantize")
    assert fix_text(f, [Recheck(a, 0, ()), Recheck(b, 0, ())]) == (
        "Use --tp 3, which keeps its blocks whole; or use --tp 2 (re-checked with the whole check, load stage "
        "included: 0 errors)")


def test_metadata_fixes_are_judged_by_the_plan_that_holds_them_all():
    from tpaudit.model import Finding, FixOption
    from tpaudit.run.fixes import Recheck, together_text

    def finding(target):
        o = FixOption(f"Add rule `{target}: replicate`", 4, plan_edits=((target, "replicate"),), together=True)
        return Finding("TPA201", "quant_metadata_sharded", "error", target, "m", fix="old", fix_options=(o,),
                       fix_fallback="Keep it whole another way")

    f = finding("a.weight_shape")
    group = ("TPA201 a.weight_shape", "TPA201 b.weight_shape")
    before = set(group) | {"TPA102 num_key_value_heads"}
    merged = FixOption("Add the 2 rule(s) together", 4, plan_edits=(("a.weight_shape", "replicate"),
                                                                     ("b.weight_shape", "replicate")), together=True)
    text, offered = together_text(f, Recheck(merged, 0, ()), group, before)
    assert offered and text == ("Add rule `a.weight_shape: replicate`, with the 1 other metadata rule(s) this check "
                                "proposes (re-checked together with the whole check, load stage included: 0 errors)")
    # a companion the baseline accepts is not shown: the text says where its rule comes from
    text, _ = together_text(f, Recheck(merged, 0, ()), group, before, accepted=1)
    assert text.startswith("Add rule `a.weight_shape: replicate`, with the 1 other metadata rule(s) this check "
                           "proposes, 1 of them for findings the baseline accepts (re-checked together")
    # the plan clears both and adds nothing: the report's own other error remains, named
    text, offered = together_text(f, Recheck(merged, 1, ("TPA102 num_key_value_heads",)), group, before)
    assert offered and text.endswith("clears all 2 findings and adds no error; 1 other error(s) remain: TPA102 "
                                     "num_key_value_heads)")
    # a finding of the group left, or an error the report did not have: not offered, and what is left is named
    for left in ("TPA201 b.weight_shape", "TPA304 model.layers.*.mlp.down_proj"):
        text, offered = together_text(f, Recheck(merged, 1, ("TPA102 num_key_value_heads", left)), group, before)
        assert not offered and text == (
            "No re-checked alternative is clean: Add rule `a.weight_shape: replicate`, with the 1 other metadata "
            f"rule(s) this check proposes leaves 2 error(s) ({left}). Keep it whole another way")
    # one finding alone
    alone = FixOption("Add the 1 rule(s) together", 4, plan_edits=(("a.weight_shape", "replicate"),), together=True)
    text, offered = together_text(f, Recheck(alone, 1, ("TPA102 num_key_value_heads",)), group[:1], before)
    assert offered and text.startswith("Add rule `a.weight_shape: replicate` (re-checked with the whole check, load "
                                       "stage included: clears this finding and adds no error; 1 other")


W8A16 = str(FIXTURES / "llama-3.1-70b-w8a16.snapshot.json.gz")


def test_metadata_replicate_fixes_load_when_applied_as_shown(tmp_path):
    """Llama-3.1-70B W8A16 (compressed-tensors pack-quantized, per-channel scales) at tp 4 with the shipped Llama plan:
    every quantized Linear's `weight_shape` (7 per layer: q, k, v, o, gate, up, down) is split (TPA201) and the
    `[out, 1]` scales of the two rowwise Linears (o_proj, down_proj) are split on their axis of size 1 (TPA203). Each
    fix names its own `replicate` rule and says the plan with all nine re-checks clean; applying those nine rules to
    transformers' own LlamaConfig plan as a `--plan` indeed gives exit 0."""
    from transformers import LlamaConfig

    code, report = check_json(W8A16, "--tp", "4")
    assert code == 1
    linears = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
    shapes = {f"layers.*.{block}.{name}.weight_shape" for block, names in linears.items() for name in names}
    scales = {"layers.*.self_attn.o_proj.weight_scale", "layers.*.mlp.down_proj.weight_scale"}
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert {f["target"] for f in errors} == {"model." + k for k in shapes | scales}
    for f in errors:
        key = f["target"].removeprefix("model.")
        assert f["fix"] == (f"Add rule `{key}: replicate`, with the 8 other metadata rule(s) this check proposes "
                            "(re-checked together with the whole check, load stage included: 0 errors)")
        assert f["verified"]["together"] == 9 and f["verified"]["clears"] and f["verified"]["exit_code"] == 0
        assert dict(f["verified"]["alternatives"][0]["plan_edits"]) == {k: "replicate" for k in shapes | scales}
    plan = dict(LlamaConfig.base_model_tp_plan) | {k: "replicate" for k in shapes | scales}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    fixed_code, fixed = check_json(W8A16, "--tp", "4", "--plan", str(tmp_path / "plan.json"))
    assert fixed_code == 0 and errors_of(fixed) == []
    # a baseline that accepts all but q_proj's: the one fix shown says its 8 companions belong to accepted findings
    accepted = dict(report, findings=[f for f in report["findings"] if "q_proj" not in f["target"]])
    (tmp_path / "baseline.json").write_text(json.dumps(accepted))
    _, left = check_json(W8A16, "--tp", "4", "--baseline", str(tmp_path / "baseline.json"))
    [shown] = [f for f in left["findings"] if f["severity"] == "error"]
    assert shown["target"] == "model.layers.*.self_attn.q_proj.weight_shape"
    assert ", with the 8 other metadata rule(s) this check proposes, 8 of them for findings the baseline accepts (" \
        in shown["fix"]


# ----------------------------------------------------------------------------------------------------------------------
# 4. --suggest proposes the configuration that works
# ----------------------------------------------------------------------------------------------------------------------
def test_suggest_on_case_01_proposes_expert_parallelism_and_a_clean_recheck():
    """Case 01 at tp 4: both experts families are replicated (TPA001 x 2). The model ships an expert-parallel plan
    for them, so --suggest proposes ep 4 with the plan minus its dead MLP rules, not expert TP rules voted from
    another architecture; its re-check has no error, fixes both TPA001, and its worst rank holds a quarter of the
    experts: 3/4 of 57,982,058,496 B less."""
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--plan", CASE_01_PLAN, "--suggest", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    s = json.loads(proc.stdout)["suggestion"]
    assert (s["tp_size"], s["ep_size"]) == (4, 4) and s["clean"] is True
    assert s["fixed"] == {"TPA001": 2} and s["after"]["errors"] == 0 and s["remaining_errors"] == []
    assert not any("experts" in k for k in s["rules"]) and s["snippet"]
    assert {"layers.*.mlp.experts.gate_up_proj", "layers.*.mlp.experts.down_proj"} <= set(
        s["expert_parallel"]["families"])
    assert s["before"]["worst_rank_param_bytes"] - s["after"]["worst_rank_param_bytes"] == \
        qwen3_vl_expert_bytes() * 3 // 4
    text = " ".join(run_main("check", QWEN3_VL, "--tp", "4", "--plan", CASE_01_PLAN, "--suggest").stdout.split())
    assert "Suggested configuration (re-checked, load stage included: 2 TPA001 fixed; 0 error(s);" in text
    assert "run with --tp 4 --ep 4:" in text and "DistributedConfig(tp_size=4, ep_size=4)" in text
    assert "moe_tp_experts" not in text and "packed_rowwise" not in text


def test_a_suggestion_that_leaves_errors_is_not_printed_and_says_why():
    """Qwen3-VL at tp 8: 4 KV heads cannot be split 8 ways (TPA102), which no plan rule or ep size fixes: the best
    candidate still has that error, so no plan is printed and the finding is named with its message."""
    text = read_json_any(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")["config"]["text_config"]
    assert text["num_key_value_heads"] % 8
    proc = run_main("check", QWEN3_VL, "--tp", "8", "--suggest", "--format", "json")
    s = json.loads(proc.stdout)["suggestion"]
    if s.get("after") is None:
        pytest.skip("nothing to propose at tp 8 with this release's plan")
    assert s["clean"] is False and s["snippet"] is None
    assert s["remaining_why"] and all(w.split(":")[0] in " ".join(s["remaining_why"]) for w in s["remaining_errors"])
    terminal = " ".join(run_main("check", QWEN3_VL, "--tp", "8", "--suggest").stdout.split())
    assert "No clean configuration" in terminal and "so no plan is printed" in terminal
    assert "base_model_tp_plan = {" not in terminal


def test_a_vote_for_fused_experts_counts_only_architectures_with_the_same_layout():
    """Qwen3-style experts `gate_up_proj` [E, 2I, H] (hidden size on the last axis): Llama4's rule for its
    `[E, H, 2I]` experts (`packed_rowwise`, hidden size on axis 1, read here from transformers' own Llama4 model
    built on the meta device) must not be proposed for them. Where only Llama4 votes for that name (transformers
    5.25 dropped every other expert rule, read from the config classes), the family is left unresolved and says
    why; where others vote, the proposal comes from architectures whose experts have our layout."""
    import types

    from tpaudit.model import Finding, FindingSubject
    from tpaudit.plan.suggest import sibling_plans, suggest_rules
    from transformers import Llama4TextConfig

    import torch
    from transformers import AutoModel

    small = Llama4TextConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=96, num_local_experts=2)
    with torch.device("meta"):
        llama4 = AutoModel.from_config(small)
    gate_up = dict(llama4.named_parameters())["layers.0.feed_forward.experts.gate_up_proj"]
    assert tuple(gate_up.shape) == (2, 64, 2 * 96)  # Llama4: [E, H, 2I]

    e, i, h = 128, 768, 2048
    key = "layers.*.mlp.experts.gate_up_proj"
    finding = Finding("TPA001", "replicated_weight", "error", f"model.{key}", "m",
                      subject=FindingSubject(rule_key=key, key_kind="parameter", families=(f"model.{key}",),
                                             shape=(e, 2 * i, h)))
    from tpaudit.checks.registry import suggest_actions

    suggestions, unresolved = suggest_rules(types.SimpleNamespace(findings=[finding]), {}, "model", hidden=h,
                                            actions=suggest_actions())
    proposed = {s.key: s for s in suggestions}
    voters = [mt for mt, plan in sibling_plans().items() if any(k.endswith("experts.gate_up_proj") for k in plan)]
    if key in proposed:
        assert "llama4_text" not in proposed[key].voters and proposed[key].style != "packed_rowwise"
    if voters and all(mt.startswith("llama4") for mt in voters):
        assert key not in proposed
        assert any(u.key == key and "hidden size on another axis" in u.reason for u in unresolved)


def test_kv_head_fix_offers_the_clean_size_and_ep_and_other_fixes_say_what_remains():
    """Qwen3-VL-30B-A3B at tp 8: 4 KV heads cannot be split 8 ways (TPA102). The nearest tp size that divides 4 below
    8 is 4; with the model's expert-parallel plan both tp 4 and tp 4 / ep 4 are re-checked and only the clean one is
    offered (tp 4 alone cannot TP-load the stored experts under 5.24 and holds them whole under 5.25). The experts'
    own fix (--ep 8) leaves the KV-head split, which it names."""
    text = read_json_any(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")["config"]["text_config"]
    heads = text["num_key_value_heads"]
    assert heads == 4 and max(d for d in range(2, 8) if heads % d == 0) == 4
    code, out = check_json(QWEN3_VL, "--tp", "8")
    assert code == 1
    kv = [f for f in out["findings"] if f["code"] == "TPA102"]
    assert kv
    for f in out["findings"]:
        if "verified" in f:
            assert_fix_offers_only_clean_alternatives(f)
    by_sizes = {(a["tp_size"], a["ep_size"]): a for a in kv[0]["verified"]["alternatives"]}
    assert set(by_sizes) == {(4, 1), (4, 4)}
    assert by_sizes[(4, 4)]["exit_code"] == 0 and by_sizes[(4, 1)]["exit_code"] == 1
    assert kv[0]["fix"].startswith("Use --tp 4 --ep 4")
    experts = [f for f in out["findings"] if ".mlp.experts." in f["target"] and f.get("verified")]
    assert experts and all(f["fix"].startswith("No re-checked alternative is clean: ") and
                           "TPA102 text_config.num_key_value_heads" in f["fix"] for f in experts)
