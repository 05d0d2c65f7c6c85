"""The parity check: a small model of the real architecture loaded on threaded TP ranks, compared with the unsharded
forward.

Every expected verdict below comes from reasoning about the layout (written next to each case), not from tpaudit's
output: which rows of a fused projection a `torch.chunk` shard hands each rank, and what the modeling code then does
with them. Configs are real (fixtures/*.snapshot.json.gz, fixtures/parity/) or transformers' own class defaults
(see fixtures/parity/README.md).
"""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, audit, read_json_any, transformers_release
from releases import EXPERTS_IN_TP_PLANS, plan_524

TOL_NOISE = 1e-4   # float32 reordering noise stays far below the 1e-4 relative tolerance of the check


# ----------------------------------------------------------------------------------------------------------------------
# helpers (read configs without tpaudit)
# ----------------------------------------------------------------------------------------------------------------------
def snap_config(name: str):
    from transformers import AutoConfig

    d = dict(read_json_any(FIXTURES / f"{name}.snapshot.json.gz")["config"])
    model_type = d.pop("model_type")
    return AutoConfig.for_model(model_type, **d)


def snap_keys(name: str) -> list[str]:
    return [t[0] for t in read_json_any(FIXTURES / f"{name}.snapshot.json.gz")["tensors"]]


def phi3_medium():
    from transformers import AutoConfig

    d = json.loads((FIXTURES / "parity" / "phi-3-medium-4k-instruct.config.json").read_text())
    d.pop("model_type")
    return AutoConfig.for_model("phi3", **d)


def defaults(model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type)


def dbrx_instruct():
    from transformers import DbrxConfig

    return DbrxConfig(d_model=6144, n_heads=48, n_layers=40, max_seq_len=32768, vocab_size=100352,
                      attn_config={"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
                      ffn_config={"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4})


def shipped(config_cls_name: str, **changes) -> dict:
    import transformers

    plan = dict(getattr(transformers, config_cls_name).base_model_tp_plan)
    plan.update(changes)
    return plan


def moe_524(name: str, **changes) -> dict:
    """The plan transformers 5.24.0 shipped for a MoE model (its experts split by TP rules, which 5.25 no longer
    ships: `releases.plan_524`), with `changes`: the same plan under every release for tests about expert TP rules."""
    return {**plan_524(name), **changes}


def shipped_or_524(name: str):
    """None (the shipped plan) where the installed release still ships expert TP rules, else 5.24.0's plan."""
    return None if EXPERTS_IN_TP_PLANS else plan_524(name)


LLAMA_PLAN = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
              "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
              "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
              "layers.*.mlp.down_proj": "rowwise"}


def assert_cleared(result):
    """A valid split: every rank ran, every compared output matched, nothing is blamed; every rule of the plan is
    cleared or says why the check could not run it."""
    from tpaudit.checks.layout import parity_findings

    assert result.ran and result.passed is True, result
    assert result.error is None and result.first_divergent_module is None
    assert result.modules_compared > 0 and result.max_abs_error < TOL_NOISE
    assert parity_findings(result) == []
    assert result.verdicts and result.reruns == 0
    assert {v.status for v in result.verdicts} <= {"cleared", "not_exercised"}
    assert all(v.why for v in result.verdicts)


def status(result) -> dict:
    """rule (or module) -> (status, kind) of every verdict."""
    return {v.target: (v.status, v.kind) for v in result.verdicts}


def assert_errors(result, expected: dict[str, str]):
    """Exactly the rules `expected` (target -> code) are errors, each with one finding of that code."""
    from tpaudit.checks.layout import parity_findings

    found = {f.target: f for f in parity_findings(result)}
    assert {t: f.code for t, f in found.items()} == expected, (found, status(result))
    for f in found.values():
        assert f.severity == "error" and f.facts["evidence"] == "parity"
        assert ("exception" in f.facts) != ("max_abs_error" in f.facts)
    return found


def assert_caught(result, module, rule, style, code):
    """The first run diverged at `module` (split by `rule: style`), and that rule alone is an error, of `code`."""
    assert result.ran and result.passed is False, result
    assert (result.first_divergent_module, result.rule, result.style) == (module, rule, style), result
    finding = assert_errors(result, {rule or module: code})[rule or module]
    assert finding.facts["module"] == module and finding.facts["rule"] == rule and finding.facts["style"] == style
    return finding


# ----------------------------------------------------------------------------------------------------------------------
# the small model
# ----------------------------------------------------------------------------------------------------------------------
def test_shrink_keeps_every_residue_mod_tp_and_the_head_counts():
    """Gemma-4-26B-A4B at tp 4, by hand: m = 2 * 4 = 8. head_dim 256 -> 8 (smallest >= 8 with the same residue mod 8
    whose rotary quarter, 8 * 0.25 = 2, is even); the global layers' 512 -> 16 (the next such width: wider heads stay
    wider); hidden 2816 = 0 mod 32 (divisible by 16 heads, 8 KV heads and 2 * 16) -> 32; intermediate 2112, MoE 704 ->
    8; vocab 262144 -> 64; 128 experts with a top-8 router -> 16 (the floor: max(16, 2 * 8), 16 = 128 mod 8). Head
    and KV-head counts and the router's top-k are not scaled."""
    from tpaudit.evidence import shrink_config

    text = snap_config("gemma-4-26b-a4b").get_text_config(decoder=True)
    real = text.to_dict()
    small, shrunk = shrink_config(real, 4)
    assert small["head_dim"] == 8 and small["hidden_size"] == 32
    assert small["intermediate_size"] == 8 and small["moe_intermediate_size"] == 8 and small["vocab_size"] == 64
    assert {k: v["head_dim"] for k, v in small["per_layer_config"].items()} == dict.fromkeys(
        real["per_layer_config"], 16)
    assert {k: v["num_key_value_heads"] for k, v in small["per_layer_config"].items()} == dict.fromkeys(
        real["per_layer_config"], 2)
    assert real["num_experts"] == 128 and small["num_experts"] == 16
    for key in ("num_attention_heads", "num_key_value_heads", "top_k_experts", "layer_types"):
        assert small[key] == real[key]
    for label, (before, after) in shrunk.items():
        assert before % 4 == after % 4 and before % 2 == after % 2, label
    for tp in (3, 5, 8):   # indivisible stays indivisible, with the same remainder
        small, shrunk = shrink_config(real, tp)
        for label, (before, after) in shrunk.items():
            assert before % tp == after % tp, (tp, label)


def test_expert_count_keeps_divisibility_and_group_limited_routing():
    """By hand. DeepSeek-V3: 256 experts in n_group 8, topk_group 4, top-8. At tp 8 (m = 16) the smallest v >= 16
    with v = 256 = 0 (mod 16), 8 | v, v / 8 >= 2 and 4 * v / 8 >= 8 is 16. Qwen2-MoE's 60 experts at tp 8: 60 = 12
    (mod 16), floor max(16, 2 * 4) = 16 -> 28 (indivisible by 8 stays so, with remainder 4). A count at or under the
    floor (Mixtral's 8), or one whose top-k the config does not name, is kept; ERNIE's own spellings are known."""
    from tpaudit.evidence import shrink_config

    deepseek = {"n_routed_experts": 256, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8}
    small, shrunk = shrink_config(deepseek, 8)
    assert small["n_routed_experts"] == 16 and shrunk["n_routed_experts"] == [256, 16]
    assert (small["n_group"], small["topk_group"], small["num_experts_per_tok"]) == (8, 4, 8)
    small, _ = shrink_config({"num_experts": 60, "num_experts_per_tok": 4}, 8)
    assert small["num_experts"] == 28 and 28 % 8 == 60 % 8
    small, _ = shrink_config({"num_local_experts": 8, "num_experts_per_tok": 2}, 4)
    assert small["num_local_experts"] == 8
    small, _ = shrink_config({"num_experts": 64}, 4)
    assert small["num_experts"] == 64
    # ERNIE 4.5 MoE stores its experts and top-k as `moe_num_experts` / `moe_k` (transformers aliases them as
    # num_experts / num_experts_per_tok): at tp 4 (m = 8) the floor max(16, 2 * 6) = 16 already has 64's residue 0
    small, _ = shrink_config({"moe_num_experts": 64, "moe_k": 6}, 4)
    assert small["moe_num_experts"] == 16 and small["moe_k"] == 6
    # 4 equal groups need v = 0 (mod 4), tp 4 needs v = 10**12 + 2 = 2 (mod 8): no value fits, and none is searched for
    # long (the search stops after one period of the residues)
    huge = {"n_routed_experts": 10**12 + 2, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 8}
    assert shrink_config(huge, 4)[0]["n_routed_experts"] == 10**12 + 2


def test_longcat_expert_width_is_scaled():
    """LongCat-Flash names its experts' width `expert_ffn_hidden_size` (2048): kept at full width, 512 experts of it
    took the small model past 20 GB and the process was killed. At tp 2 (m = 4): 2048 = 0 (mod 4) -> 8."""
    from transformers import AutoConfig

    from tpaudit.evidence import shrink_config

    real = AutoConfig.for_model("longcat_flash").to_dict()
    small, shrunk = shrink_config(real, 2)
    assert real["expert_ffn_hidden_size"] == 2048 and small["expert_ffn_hidden_size"] == 8
    assert shrunk["expert_ffn_hidden_size"] == [2048, 8]


def test_one_layer_of_each_kind_in_real_order_with_per_layer_overrides():
    """Gemma 4: five sliding layers, then a global layer at index 5 with its own KV-head count (2) and head_dim
    (512 -> 16): the small model keeps layers 0 and 5, and its global layer's k_proj has 2 * 16 outputs while the
    sliding one has 8 * 8. Qwen3-Next: full attention every 4th layer -> layers 0 (linear) and 3. gpt-oss: sliding
    and full alternate -> 0 and 1."""
    from tpaudit.evidence import build_small_model

    small = build_small_model(snap_config("gemma-4-26b-a4b"), "Gemma4ForConditionalGeneration", None, 4)
    try:
        assert small.layers == (0, 5) and small.model_class.__name__ == "Gemma4ForCausalLM"
        assert "text decoder only" in small.scope
        layers = small.reference.model.layers
        assert layers[0].self_attn.k_proj.out_features == 8 * 8
        assert layers[1].self_attn.k_proj.out_features == 2 * 16
        assert small.config.layer_types == ["sliding_attention", "full_attention"]
    finally:
        small.cleanup()
    for name, cls, layers in (("qwen3-next-80b-a3b-instruct", "Qwen3NextForCausalLM", (0, 3)),
                              ("gpt-oss-20b", "GptOssForCausalLM", (0, 1))):
        small = build_small_model(snap_config(name), cls, None, 2)
        small.cleanup()
        assert small.layers == layers, name


def test_an_index_list_of_every_layer_is_not_a_kind_per_layer():
    """Llama-4-Scout (fixtures/cases/36-*, config.json as published): 48 text layers, all MoE, so `moe_layers` lists
    every index 0..47, as long as a per-layer list. Read as per-layer values it made each layer a kind of its own and
    the small model kept all 48 (7.8 s of parity at tp 8). The kinds are the NoPE pattern: `no_rope_layers` is 0 on
    every 4th layer (`layer_types` full_attention there, chunked elsewhere), so one layer of each: 0 and 3, both MoE."""
    from transformers import AutoConfig

    from tpaudit.evidence import build_small_model

    raw = json.loads((FIXTURES / "cases" / "36-llama4-scout-tp8-transposed-experts-ok" / "config.json").read_text())
    text = raw["text_config"]
    n = text["num_hidden_layers"]
    assert n == 48 and text["interleave_moe_layer_step"] == 1
    config = AutoConfig.for_model("llama4", **{k: v for k, v in raw.items() if k != "model_type"})
    assert config.text_config.moe_layers == list(range(n))
    flags = config.text_config.no_rope_layers
    first = {}
    for i, flag in enumerate(flags):
        first.setdefault(flag, i)
    assert sorted(first.values()) == [0, 3]
    small = build_small_model(config, "Llama4ForConditionalGeneration", None, 8)
    try:
        assert small.layers == (0, 3)
        assert small.config.moe_layers == [0, 1] and small.config.no_rope_layers == [flags[0], flags[3]]
    finally:
        small.cleanup()


# ----------------------------------------------------------------------------------------------------------------------
# when parity is needed: split outputs the forward cuts into parts
# ----------------------------------------------------------------------------------------------------------------------
def test_nothing_to_check_for_llama_and_qwen3_shipped_plans():
    """q/k/v_proj colwise viewed into heads, rotary halves inside a head, gate/up separate: no cut into parts."""
    from tpaudit.evidence import split_outputs

    assert split_outputs(snap_config("llama-3.1-8b-instruct"), "LlamaForCausalLM", None, 8) == []
    assert split_outputs(defaults("qwen3"), "Qwen3ForCausalLM", None, 4) == []


@pytest.mark.slow
def test_split_outputs_found_by_evidence():
    """GPT-NeoX views query_key_value per head ([head][q, k, v], rows of 3 * head_dim) and chunks it; phi3 slices
    qkv_proj into [Q | K | V] blocks and chunks gate_up_proj into halves (when both are split colwise); Qwen3-30B's
    packed experts gate_up_proj is chunked into gate and up. phi3's shipped colwise_gather_output is not a suspect."""
    from tpaudit.evidence import split_outputs

    neox = split_outputs(defaults("gpt_neox"), "GPTNeoXForCausalLM", None, 4)
    assert [(s.module, s.style) for s in neox] == [("gpt_neox.layers.*.attention.query_key_value", "colwise")]
    assert "per-head rows" in neox[0].action
    assert split_outputs(phi3_medium(), "Phi3ForCausalLM", None, 4) == []
    phi3 = split_outputs(phi3_medium(), "Phi3ForCausalLM",
                         shipped("Phi3Config", **{"layers.*.self_attn.qkv_proj": "colwise",
                                                  "layers.*.mlp.gate_up_proj": "colwise"}), 4)
    assert {s.module for s in phi3} == {"model.layers.*.self_attn.qkv_proj", "model.layers.*.mlp.gate_up_proj"}
    moe = split_outputs(snap_config("qwen3-30b-a3b"), "Qwen3MoeForCausalLM", shipped_or_524("qwen3-moe"), 4)
    assert [(s.module, s.rule, s.style) for s in moe] == [
        ("model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.gate_up_proj", "packed_colwise")]


# ----------------------------------------------------------------------------------------------------------------------
# parity: a valid split cleared, a wrong one caught (>= 8 architectures with fused or packed projections)
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_gpt_neox_per_head_query_key_value_colwise_valid_where_tp_divides_the_heads():
    """query_key_value rows are laid out [head][q, k, v]: a colwise shard of 64 heads on 4 ranks hands each rank 16
    whole heads with their q, k and v, which is exactly what the per-head view expects."""
    from tpaudit.evidence import run_parity

    result = run_parity(defaults("gpt_neox"), "GPTNeoXForCausalLM", None, 4)
    assert_cleared(result)
    assert [s.module for s in result.split] == ["gpt_neox.layers.*.attention.query_key_value"]
    # at tp 3 the 64 * 3 head-rows split into 3 chunks of 64 rows: 21 heads and a third, and the per-head view fails
    result = run_parity(defaults("gpt_neox"), "GPTNeoXForCausalLM", None, 3)
    assert_caught(result, "gpt_neox.layers.*.attention.query_key_value",
                  "gpt_neox.layers.*.attention.query_key_value", "colwise", "TPA501")
    assert "is invalid for input of size" in result.error


@pytest.mark.slow
def test_phi3_qkv_gathered_is_valid_with_10_kv_heads_at_tp4_and_plain_colwise_is_not():
    """Phi-3-medium: qkv_proj = [Q (40 * 128) | K (10 * 128) | V (10 * 128)] rows. colwise_gather_output hands every
    rank all 60 head-rows (10 KV heads stay 10, as transformers' get_kv_heads_per_rank says), so tp 4 is valid.
    Plain colwise at tp 2 gives rank 0 the first 30 head-rows (Q only) and rank 1 the last 30 (10 of Q, K, V): the
    slices qkv[..., :40 * 128] no longer find Q, K and V, and the attention fails."""
    from tpaudit.evidence import run_parity

    assert_cleared(run_parity(phi3_medium(), "Phi3ForCausalLM", None, 4))
    plan = shipped("Phi3Config", **{"layers.*.self_attn.qkv_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"})
    result = run_parity(phi3_medium(), "Phi3ForCausalLM", plan, 2)
    finding = assert_caught(result, "model.layers.*.self_attn.qkv_proj", "model.layers.*.self_attn.qkv_proj",
                            "colwise", "TPA501")
    assert result.fused and result.observed_at == "model.layers.*.self_attn" and result.error
    # the re-run that gathers qkv_proj hands o_proj the whole attention output, which `rowwise` would split again:
    # the fix that ran clean pairs it with `rowwise_split_input`; o_proj itself, the partner of the split, is no error
    assert finding.fix.startswith("Use `model.layers.*.self_attn.qkv_proj: colwise_gather_output` with "
                                  "`model.layers.*.self_attn.o_proj: rowwise_split_input`")
    o_proj = result.verdict("model.layers.*.self_attn.o_proj")
    assert o_proj.status == "not_exercised" and "partner" in o_proj.why


@pytest.mark.slow
def test_moe_gate_up_packed_colwise_valid_plain_colwise_wrong_unless_stored_per_expert():
    """Qwen3-30B-A3B experts.gate_up_proj = [gate (768) | up (768)] rows per expert. packed_colwise gives rank r its
    share of each half: valid at tp 4. Plain colwise on a checkpoint that stores the fused tensor gives rank 0 all of
    gate and rank 1 all of up, so chunk(2) pairs gate with gate: wrong numbers. On the real checkpoint, which stores
    gate_proj and up_proj per expert, the loader slices each before fusing them, and plain colwise is valid too."""
    from tpaudit.evidence import run_parity

    config = snap_config("qwen3-30b-a3b")
    assert_cleared(run_parity(config, "Qwen3MoeForCausalLM", shipped_or_524("qwen3-moe"), 4))
    wrong = moe_524("qwen3-moe", **{"layers.*.mlp.experts.gate_up_proj": "colwise"})
    result = run_parity(config, "Qwen3MoeForCausalLM", wrong, 2)
    assert_caught(result, "model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.gate_up_proj",
                  "colwise", "TPA501")
    assert result.error is None and result.max_abs_error > 0.1
    per_expert = run_parity(config, "Qwen3MoeForCausalLM", wrong, 2,
                            checkpoint_keys=snap_keys("qwen3-30b-a3b-instruct-2507"))
    assert_cleared(per_expert)
    assert "original format" in per_expert.reason


@pytest.mark.slow
def test_qwen3_5_linear_attention_in_proj_qkv_blocks_and_fused_experts():
    """Qwen3.5-35B-A3B (real checkpoint keys: fused experts.gate_up_proj, in_proj_qkv). in_proj_qkv rows are
    [Q_all | K_all | V_all]; plain colwise at tp 2 gives rank 0 all of Q and K and rank 1 only V: the split into
    [key_dim, key_dim, value_dim] pairs the wrong rows, and the gated norm sees other numbers. The shipped plan
    (gathered linear attention, packed_colwise experts, colwise q/k/v on 16/2 heads) is valid at tp 2."""
    from tpaudit.evidence import run_parity

    config, keys = snap_config("qwen3.5-35b-a3b"), snap_keys("qwen3.5-35b-a3b")
    assert_cleared(run_parity(config, "Qwen3_5MoeForConditionalGeneration", None, 2, checkpoint_keys=keys))
    plan = shipped("Qwen3_5MoeTextConfig", **{"layers.*.linear_attn.in_proj_qkv": "colwise"})
    result = run_parity(config, "Qwen3_5MoeForConditionalGeneration", plan, 2, checkpoint_keys=keys)
    assert_caught(result, "model.layers.*.linear_attn.in_proj_qkv", "model.layers.*.linear_attn.in_proj_qkv",
                  "colwise", "TPA501")
    assert result.observed_layer == 0   # layer 0 is a linear-attention layer
    # in_proj_a (gathered: each rank gets all 32 per-head decay gates) holds, and so does the gated q_proj of the
    # full-attention layer: its rows are [query | gate] per head, so a colwise shard of 16 heads on 2 ranks hands
    # each rank 8 whole heads with their gates
    verdicts = status(result)
    assert verdicts["model.layers.*.linear_attn.in_proj_a"] == ("cleared", None)
    assert verdicts["model.layers.*.self_attn.q_proj"] == ("cleared", None)
    assert result.verdict("model.layers.*.linear_attn.in_proj_qkv").fix_style == "colwise_gather_output"
    assert result.reruns == 1 and result.split and any(
        s.module == "model.layers.*.self_attn.q_proj" and s.cut == "groups" for s in result.split)
    fused = shipped("Qwen3_5MoeTextConfig", **{"layers.*.mlp.experts.gate_up_proj": "colwise"})
    result = run_parity(config, "Qwen3_5MoeForConditionalGeneration", fused, 2, checkpoint_keys=keys)
    assert_caught(result, "model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.gate_up_proj",
                  "colwise", "TPA501")


@pytest.mark.slow
def test_qwen3_next_in_proj_qkvz_interleaved_per_key_head():
    """Qwen3-Next in_proj_qkvz rows are [key head][q, k, v, z] (16 key heads). Plain colwise hands each rank 8 whole
    key-head groups, but the module reshapes with the full head counts: the forward fails. packed_colwise splits
    the rows as two contiguous halves, which cuts the groups apart: it fails too. The shipped plan gathers it, and
    runs at tp 2 (2 KV heads, 16 heads)."""
    from tpaudit.evidence import run_parity

    config = snap_config("qwen3-next-80b-a3b-instruct")
    assert_cleared(run_parity(config, "Qwen3NextForCausalLM", None, 2))
    for style in ("colwise", "packed_colwise"):
        plan = shipped("Qwen3NextConfig", **{"layers.*.linear_attn.in_proj_qkvz": style})
        result = run_parity(config, "Qwen3NextForCausalLM", plan, 2)
        assert_caught(result, "model.layers.*.linear_attn.in_proj_qkvz", "model.layers.*.linear_attn.in_proj_qkvz",
                      style, "TPA501")
        assert result.error and result.observed_at == "model.layers.*.linear_attn"


@pytest.mark.slow
def test_qwen3_next_in_proj_ba_packed_colwise_is_a_scrambled_packed_output():
    """Qwen3-Next (real config, tp 2): in_proj_ba rows are [key head][b (2), a (2)] (16 key heads, 32 value heads:
    `fix_query_key_value_ordering` views it as 16 groups of 4 and splits each into b and a). packed_colwise splits
    the rows as two contiguous halves, each chunked per rank: rank 0 gets the b/a rows of key heads 0-3 and 8-11,
    not a rank's share of b and of a, and the module's view with the full 16 key heads fails. That is a packed
    output the split scrambles: TPA501 (as vLLM found), whether it raises or computes wrong numbers.

    The rest is decided too: in_proj_qkvz, which the shipped plan gathers, holds (every rank computes all heads);
    the gated q_proj of the full-attention layers holds ([query | gate] rows per head, 16 heads on 2 ranks)."""
    from tpaudit.evidence import run_parity

    config = snap_config("qwen3-next-80b-a3b-instruct")
    plan = shipped("Qwen3NextConfig", **{"layers.*.linear_attn.in_proj_ba": "packed_colwise"})
    result = run_parity(config, "Qwen3NextForCausalLM", plan, 2)
    finding = assert_caught(result, "model.layers.*.linear_attn.in_proj_ba", "model.layers.*.linear_attn.in_proj_ba",
                            "packed_colwise", "TPA501")
    assert finding.kind == "packed_layout" and result.error
    split = result.verdict("model.layers.*.linear_attn.in_proj_ba").split
    assert split.cut == "groups" and split.groups == 16 and split.parts == (32, 32)   # 16 groups of [b, a]
    verdicts = status(result)
    assert verdicts["model.layers.*.linear_attn.in_proj_qkvz"] == ("cleared", None)
    assert verdicts["model.layers.*.self_attn.q_proj"] == ("cleared", None)
    assert "colwise_gather_output" in finding.fix


@pytest.mark.slow
def test_gpt_oss_experts_packed_colwise_splits_the_input_features_ep_is_valid():
    """gpt-oss stores experts.gate_up_proj as [E, hidden, 2 * intermediate] (input first, gate/up interleaved along
    the last dim). packed_colwise shards dim ndim - 2 = hidden, the input features: hidden_states @ W[e] multiplies
    64 features by 32 rows and fails. Not a cut of the output (the split is contracted away), hence TPA502."""
    from tpaudit.evidence import run_parity

    plan = {"layers.*.mlp.experts.gate_up_proj": "packed_colwise", "layers.*.mlp.experts.down_proj": "rowwise",
            "layers.*.mlp.experts": "moe_tp_experts"}
    result = run_parity(snap_config("gpt-oss-20b"), "GptOssForCausalLM", plan, 2)
    assert_caught(result, "model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.gate_up_proj",
                  "packed_colwise", "TPA502")
    assert "shapes cannot be multiplied" in result.error and not result.fused
    assert "unquantized" in result.reason   # the real model is mxfp4
    # its shipped plan is expert-parallel: at ep 2 each rank holds 16 of the 32 experts whole, and the sum of the
    # ranks' routed outputs is the model's
    assert_cleared(run_parity(snap_config("gpt-oss-20b"), "GptOssForCausalLM", None, 2, 2))


@pytest.mark.slow
def test_gemma4_global_layers_split_their_kv_head():
    """Gemma-4-26B-A4B: sliding layers have 8 KV heads, global layers 2 (num_global_key_value_heads, through
    per-layer configs). At tp 4 the global layers' k_proj (2 heads) gives each rank half a head and the per-head view
    fails, first at real layer 5; at tp 2 every layer splits whole heads.

    No style of q_proj, v_proj or o_proj can make half a KV head whole: the check is told (as the pipeline tells it
    from the KV heads TPA102 counts, `stage.head_limited`) that this attention block cannot split at tp 4, so it runs
    the block whole once k_proj failed, and the block's other rules are not exercised, with that reason."""
    from tpaudit.evidence import run_parity

    config = snap_config("gemma-4-26b-a4b")
    assert_cleared(run_parity(config, "Gemma4ForConditionalGeneration", None, 2))
    why = "its attention cannot split at tp_size 4: layer 5 has 2 KV heads (TPA102)"
    result = run_parity(config, "Gemma4ForConditionalGeneration", shipped_or_524("gemma4"), 4,
                        head_limited={"self_attn": why})
    assert_caught(result, "model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.k_proj", "colwise", "TPA502")
    assert result.observed_layer == 5 and "invalid" in result.error and result.reruns == 1
    verdicts = status(result)
    for rule in ("q_proj", "v_proj", "o_proj"):
        v = result.verdict(f"model.layers.*.self_attn.{rule}")
        assert v.status == "not_exercised" and why in v.why, v
    assert verdicts["model.layers.*.experts.gate_up_proj"] == ("cleared", None)   # the MoE block ran as planned
    # Gemma-4-31B-it: 16 KV heads on sliding layers, 4 on global ones (per_layer_config), tied embeddings. tp 4
    # splits every layer into whole heads; tp 8 gives each rank half of a global layer's head, first at layer 5.
    config = snap_config("gemma-4-31b-it")
    assert_cleared(run_parity(config, "Gemma4ForConditionalGeneration", None, 4))
    result = run_parity(config, "Gemma4ForConditionalGeneration", None, 8,
                        head_limited={"self_attn": "layer 5 has 4 KV heads"})
    assert_caught(result, "model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.k_proj", "colwise", "TPA502")
    assert result.observed_layer == 5


@pytest.mark.slow
@pytest.mark.parametrize("case", ["falcon", "gpt_bigcode", "dbrx", "codegen"])
def test_fused_qkv_blocks_colwise_wrong_gathered_valid(case):
    """Falcon-7B query_key_value = [Q (71 heads) | k | v] (multi-query), GPT-BigCode c_attn = [Q | k | v]
    (multi-query), DBRX Wqkv = [Q (48) | K (8) | V (8)]: a contiguous colwise half is not half of each block, and the
    split into [Q, K, V] sizes fails. CodeGen's qkv_proj is 4 groups of [q | v | k] (mp_num = 4 in the modeling code,
    whatever tp): its reshape to 4 groups fails on a shard. With the output gathered and the next projection
    splitting its input (rowwise_split_input) every rank computes whole attention: valid."""
    from tpaudit.evidence import run_parity

    cases = {
        "falcon": (defaults("falcon"), "FalconForCausalLM", "h.*.self_attention.query_key_value",
                   "h.*.self_attention.dense", "transformer."),
        "gpt_bigcode": (defaults("gpt_bigcode"), "GPTBigCodeForCausalLM", "h.*.attn.c_attn", "h.*.attn.c_proj",
                        "transformer."),
        "dbrx": (dbrx_instruct(), "DbrxForCausalLM", "blocks.*.norm_attn_norm.attn.Wqkv",
                 "blocks.*.norm_attn_norm.attn.out_proj", "transformer."),
        "codegen": (defaults("codegen"), "CodeGenForCausalLM", "h.*.attn.qkv_proj", "h.*.attn.out_proj",
                    "transformer."),
    }
    config, cls, qkv, out, prefix = cases[case]
    breaking_tp = 2
    if case == "codegen" and transformers_release() >= (5, 24):
        # 5.24 views the shard's output as `-1` groups of [q | v | k] (it was 4 whatever the shard): a colwise split
        # at tp 2 or 4 keeps whole groups, and 5.24 ships exactly that plan; tp 8 halves a group.
        from transformers import CodeGenConfig

        assert CodeGenConfig.base_model_tp_plan[qkv] == "colwise"
        assert_cleared(run_parity(config, cls, {qkv: "colwise", out: "rowwise"}, 2))
        breaking_tp = 8
    result = run_parity(config, cls, {qkv: "colwise", out: "rowwise"}, breaking_tp)
    assert_caught(result, prefix + qkv, prefix + qkv, "colwise", "TPA501")
    # out_proj is the partner of the split, not a second error; the fix that ran clean names both
    assert result.verdict(prefix + out).status == "not_exercised"
    assert result.verdict(prefix + qkv).fix_partners == ((prefix + out, "rowwise_split_input"),)
    assert_cleared(run_parity(config, cls, {qkv: "colwise_gather_output", out: "rowwise_split_input"}, 2))


def codegen_350m():
    from transformers import AutoConfig

    d = json.loads((FIXTURES / "parity" / "codegen-350m-mono.config.json").read_text())
    d.pop("model_type")
    return AutoConfig.for_model("codegen", **d)


@pytest.mark.slow
def test_codegen_advice_names_its_four_groups_not_its_heads():
    """CodeGen-350M-mono (real config): 16 heads of 64, and `qkv_proj` laid out as mp_num = 4 groups of [q | v | k]
    (a constant of the modeling code). At tp 8 the 16 heads divide, but a colwise shard of 3 * 1024 rows is half a
    group (384 of 768 rows), and the forward's view into groups fails: the advice names the 4 groups and the tp sizes
    dividing them (2 and 4), never "a tp_size that divides its heads". transformers 5.24 views a shard as `-1`
    groups, so tp 4 (one whole group per rank) re-runs clean; 5.23 always views 4 groups, so no tp size does."""
    from tpaudit.evidence import run_parity

    qkv = "transformer.h.*.attn.qkv_proj"
    result = run_parity(codegen_350m(), "CodeGenForCausalLM", {"h.*.attn.qkv_proj": "colwise",
                                                               "h.*.attn.out_proj": "rowwise"}, 8)
    finding = assert_caught(result, qkv, qkv, "colwise", "TPA501")
    split = result.verdict(qkv).split
    assert (split.cut, split.groups, len(split.parts)) == ("groups", 4, 3)
    assert "cut in 4 groups of 3 parts each, and tp_size 8 does not divide 4" in finding.fix
    assert "heads" not in finding.fix
    if transformers_release() >= (5, 24):
        assert result.verdict(qkv).tp_sizes_ok == (4,)
        assert "a tp_size dividing 4 so that every rank holds whole groups (2, 4; tp_size 4 re-run clean)" in \
            finding.fix
    else:
        assert result.verdict(qkv).tp_sizes_ok == ()



# ----------------------------------------------------------------------------------------------------------------------
# wrong styles that are not fused projections: TPA502
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_colwise_colwise_chain_and_rowwise_qkv_are_style_mismatches():
    """Two wrong rules in one plan (Llama-3.1-8B, small: hidden 256, 32 heads of 8, intermediate 8 at tp 2), two
    errors. o_proj colwise after colwise q/k/v: o_proj gets each rank's 16 of 32 heads (16 * 8 features) but keeps a
    [128, 256] weight slice that expects all 256: `mat1 and mat2 shapes cannot be multiplied (16x128 and 256x128)`;
    down_proj colwise after colwise gate/up: the same in the MLP block, which the first run never reached intact.
    Each is fixed by `rowwise` (it reduces the split input), and with both fixed the forward matches: the other
    rules are cleared.

    q/k/v rowwise: each gets the whole hidden state (256) but holds a [256, 128] input slice, so each fails alone;
    o_proj colwise then splits an output the residual needs whole: four errors. o_proj with no rule after colwise
    q/k/v: a [256, 256] weight fed 128 features, fixed by adding `o_proj: rowwise`."""
    from tpaudit.evidence import run_parity

    config = snap_config("llama-3.1-8b-instruct")
    chain = dict(LLAMA_PLAN, **{"layers.*.self_attn.o_proj": "colwise", "layers.*.mlp.down_proj": "colwise"})
    result = run_parity(config, "LlamaForCausalLM", chain, 2)
    assert result.first_divergent_module == "model.layers.*.self_attn.o_proj" and result.input_split is True
    assert "(16x128 and 256x128)" in result.error
    found = assert_errors(result, {"model.layers.*.self_attn.o_proj": "TPA502",
                                   "model.layers.*.mlp.down_proj": "TPA502"})
    for rule in ("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"):
        assert found[rule].kind == "style_mismatch" and result.verdict(rule).fix_style == "rowwise"
        assert found[rule].fix.startswith(f"Use `{rule}: rowwise`")
    for rule in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert status(result)[f"model.layers.*.{rule}"] == ("cleared", None), rule
    rows = dict(LLAMA_PLAN, **{f"layers.*.self_attn.{p}_proj": "rowwise" for p in "qkv"},
                **{"layers.*.self_attn.o_proj": "colwise"})
    result = run_parity(config, "LlamaForCausalLM", rows, 2)
    assert (result.first_divergent_module, result.input_split) == ("model.layers.*.self_attn.q_proj", False)
    assert "(16x256 and 128x256)" in result.error
    assert_errors(result, {f"model.layers.*.self_attn.{p}_proj": "TPA502" for p in "qkvo"})
    missing = {k: v for k, v in LLAMA_PLAN.items() if "o_proj" not in k}
    result = run_parity(config, "LlamaForCausalLM", missing, 2)
    finding = assert_caught(result, "model.layers.*.self_attn.o_proj", None, None, "TPA502")
    assert "(16x128 and 256x256)" in result.error and finding.fix == "Add `model.layers.*.self_attn.o_proj: " \
        "rowwise` so that it reduces the split input"
    assert_cleared(run_parity(config, "LlamaForCausalLM", None, 2))


@pytest.mark.slow
def test_ep_forward_runs_on_cpu():
    """tp 2, ep 2 on Qwen3-30B-A3B (128 experts, 64 per rank): the expert-parallel forward runs on CPU and matches."""
    from tpaudit.evidence import run_parity

    result = run_parity(snap_config("qwen3-30b-a3b"), "Qwen3MoeForCausalLM", None, 2, 2)
    assert_cleared(result)
    assert result.ep_size == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_isolated_run_in_a_subprocess_gives_the_same_verdict():
    from tpaudit.evidence import run_parity

    chain = dict(LLAMA_PLAN, **{"layers.*.self_attn.o_proj": "colwise"})
    result = run_parity(snap_config("llama-3.1-8b-instruct"), "LlamaForCausalLM", chain, 2, isolate=True)
    assert_caught(result, "model.layers.*.self_attn.o_proj", "model.layers.*.self_attn.o_proj", "colwise", "TPA502")
    assert "subprocess" in result.reason


# ----------------------------------------------------------------------------------------------------------------------
# results and findings
# ----------------------------------------------------------------------------------------------------------------------
def test_nothing_to_run_and_misuse():
    from tpaudit.errors import UsageError
    from tpaudit.evidence import run_parity

    config = snap_config("llama-3.1-8b-instruct")
    result = run_parity(config, "LlamaForCausalLM", None, 1)
    assert result.ran is False and result.passed is None and "split nothing" in result.reason
    with pytest.raises(UsageError):
        run_parity(config, "NoSuchModelClass", None, 2)
    with pytest.raises(UsageError):
        run_parity(config, "LlamaForCausalLM", None, 0)
    with pytest.raises(UsageError, match="rejected by transformers"):
        run_parity(config, "LlamaForCausalLM", None, 2, 3)
    # dense Qwen3-VL ships no text plan in 5.23: its text decoder has nothing to shard, so nothing to compare. 5.24
    # ships {"embed_tokens": "embedding_rowwise"}: the run compares that split, and it holds.
    result = run_parity(snap_config("qwen3-vl-8b-instruct"), "Qwen3VLForConditionalGeneration", None, 2)
    assert "text decoder only" in result.scope
    if transformers_release() >= (5, 24):
        assert result.ran is True and result.passed is True, result
    else:
        assert result.ran is False and "shards nothing" in result.reason


def test_findings_from_a_result():
    """Field by field: a fused split blamed is TPA501, anything else TPA502; a passed or skipped result none."""
    from tpaudit.checks.layout import parity_findings
    from tpaudit.evidence import ParityResult, SplitOutput

    name = "model.layers.*.mlp.experts.gate_up_proj"
    split = SplitOutput(module=name, rule=name, style="colwise",
                        action="chunk into parts of [8, 8] features out of 16, blocks of the whole output",
                        cut="blocks", op="chunk", parts=(8, 8), total=16, period=16)
    wrong = ParityResult(ran=True, reason="", tp_size=2, passed=False, first_divergent_module=split.module,
                         rule=split.rule, style="colwise", observed_at="model.layers.*.mlp.experts", fused=True,
                         max_abs_error=2.5, split=(split,), model_class="Qwen3MoeForCausalLM", rank=0)
    (f,) = parity_findings(wrong, text_prefix="model")
    assert (f.code, f.kind, f.target) == ("TPA501", "packed_layout", split.rule)
    assert f.facts == {"evidence": "parity", "module": split.module, "rule": split.rule, "style": "colwise",
                       "observed_at": "model.layers.*.mlp.experts", "tp_size": 2, "ep_size": 1, "rank": 0,
                       "max_abs_error": 2.5}
    assert f.fix == ("Use `layers.*.mlp.experts.gate_up_proj: packed_colwise` (two equal halves, each split across "
                     "ranks)")
    crash = ParityResult(ran=True, reason="", tp_size=2, passed=False, first_divergent_module="model.layers.*.x",
                         rule="model.layers.*.x", style="colwise", error="rank 1: RuntimeError: boom", rank=1)
    (f,) = parity_findings(crash)
    assert (f.code, f.kind) == ("TPA502", "style_mismatch") and f.facts["exception"] == "rank 1: RuntimeError: boom"
    assert "max_abs_error" not in f.facts
    assert parity_findings(ParityResult(ran=True, reason="", tp_size=2, passed=True)) == []
    assert parity_findings(ParityResult(ran=False, reason="skipped", tp_size=2)) == []
    section = wrong.to_json()
    assert {"ran", "reason", "tp_size", "ep_size", "modules_compared", "max_abs_error", "first_divergent_module",
            "rule", "style", "error", "passed", "seconds", "shrunk"} <= section.keys()
    json.dumps(section)


def test_tpa502_catalogue_entry_has_the_sections():
    from tpaudit.checks.registry import get_rule

    sections = get_rule("TPA502").sections()
    for heading in ("What it detects", "Why it matters", "Example", "Fix", "References"):
        assert sections.get(heading), heading


@pytest.mark.slow
def test_two_wrong_fused_projections_in_one_plan_give_two_errors(tmp_path):
    """Phi-3-medium with both fused projections under plain colwise at tp 2: qkv_proj = [Q | K | V] blocks and
    gate_up_proj = [gate | up] halves, each cut by a contiguous shard. The first run fails at qkv_proj, before the
    MLP sees a whole input; isolation re-runs with qkv_proj gathered and finds gate_up_proj scrambled too (chunk(2)
    pairs gate with gate): two TPA501 errors in one report, each with its own fix (gate_up_proj: two equal halves,
    `packed_colwise`). Fixing the attention as transformers' phi3 plan does leaves gate_up_proj alone; fixing
    qkv_proj alone leaves o_proj rowwise on a whole input (TPA502) with gate_up_proj."""
    model = tmp_path / "phi3"
    model.mkdir()
    (model / "config.json").write_text((FIXTURES / "parity" / "phi-3-medium-4k-instruct.config.json").read_text())
    both = {"layers.*.self_attn.qkv_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.gate_up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"}
    report = audit(str(model), tp=2, plan=both, parity="auto")
    found = {(f.code, f.severity, f.target): f for f in report.findings if f.code in ("TPA501", "TPA502")}
    assert set(found) == {("TPA501", "error", "model.layers.*.self_attn.qkv_proj"),
                          ("TPA501", "error", "model.layers.*.mlp.gate_up_proj")}
    assert found[("TPA501", "error", "model.layers.*.mlp.gate_up_proj")].fix.startswith(
        "Use `layers.*.mlp.gate_up_proj: packed_colwise`")
    assert report.parity.verdict("model.layers.*.mlp.down_proj").status != "error"
    half = {**both, "layers.*.self_attn.qkv_proj": "colwise_gather_output"}
    found = {(f.code, f.severity, f.target) for f in audit(str(model), tp=2, plan=half, parity="auto").findings
             if f.code in ("TPA501", "TPA502")}
    assert found == {("TPA502", "error", "model.layers.*.self_attn.o_proj"),
                     ("TPA501", "error", "model.layers.*.mlp.gate_up_proj")}
    fixed = {**half, "layers.*.self_attn.o_proj": "rowwise_split_input"}
    found = {(f.code, f.severity, f.target) for f in audit(str(model), tp=2, plan=fixed, parity="auto").findings
             if f.code in ("TPA501", "TPA502")}
    assert found == {("TPA501", "error", "model.layers.*.mlp.gate_up_proj")}


@pytest.mark.slow
def test_two_wrong_rules_in_a_moe_plan_give_two_errors():
    """Qwen3-30B-A3B (fused experts stored under their runtime names) at tp 2 with two wrong rules: the experts'
    gate_up_proj ([gate | up] per expert) under plain colwise, which hands rank 0 all of gate and chunk(2) then pairs
    gate with gate (TPA501, fixed by packed_colwise); and o_proj colwise after colwise q/k/v, which feeds it split
    heads without reducing them (TPA502, fixed by rowwise). The attention fails first; the experts' wrong numbers
    show only in a re-run: both are reported, and the rules that held (q/k/v, the experts' down_proj) are cleared."""
    from tpaudit.evidence import run_parity

    plan = moe_524("qwen3-moe", **{"layers.*.mlp.experts.gate_up_proj": "colwise",
                                   "layers.*.self_attn.o_proj": "colwise"})
    result = run_parity(snap_config("qwen3-30b-a3b"), "Qwen3MoeForCausalLM", plan, 2)
    assert result.first_divergent_module == "model.layers.*.self_attn.o_proj"
    found = assert_errors(result, {"model.layers.*.mlp.experts.gate_up_proj": "TPA501",
                                   "model.layers.*.self_attn.o_proj": "TPA502"})
    assert "max_abs_error" in found["model.layers.*.mlp.experts.gate_up_proj"].facts   # wrong numbers, no crash
    assert result.verdict("model.layers.*.mlp.experts.gate_up_proj").fix_style == "packed_colwise"
    assert result.verdict("model.layers.*.self_attn.o_proj").fix_style == "rowwise"
    for rule in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.experts.down_proj", "mlp.experts"):
        assert status(result)[f"model.layers.*.{rule}"] == ("cleared", None), rule


@pytest.mark.slow
def test_a_plan_that_cannot_load_is_bisected_to_its_rule():
    """`input_layernorm: colwise` on Llama: transformers' ColwiseParallel refuses a module without `out_features`
    (an RMSNorm) while loading, before any forward. Bisecting the rules (half replicated at a time) finds the one
    whose replication lets the model load; with it replicated the forward matches, so every other rule is cleared."""
    from tpaudit.evidence import run_parity

    plan = dict(LLAMA_PLAN, **{"layers.*.input_layernorm": "colwise"})
    result = run_parity(snap_config("llama-3.1-8b-instruct"), "LlamaForCausalLM", plan, 2)
    assert result.observed_at == "from_pretrained" and "out_features" in result.error
    assert_errors(result, {"model.layers.*.input_layernorm": "TPA502"})
    assert all(v.status == "cleared" for v in result.verdicts if v.status != "error")


@pytest.mark.slow
def test_the_parts_of_a_gated_query_decide_it_when_its_attention_cannot_run():
    """Qwen3.5-35B-A3B at tp 8 (case 14's model): 2 KV heads cannot split across 8 ranks, so the attention block
    cannot run sharded at all (TPA102), and the first run fails at k_proj. q_proj's output is still cut before that:
    [query | gate] per head, 16 heads on 8 ranks, so each rank's query and gate must be its 2 heads' share of the
    unsharded ones. They are (compared at the cut, on every rank): its layout is cleared, although its block ran
    whole afterwards; v_proj and o_proj, which the block never ran sharded, are not exercised, and say why."""
    from tpaudit.evidence import run_parity

    why = "its attention cannot split at tp_size 8: layer 3 has 2 KV heads (TPA102)"
    result = run_parity(snap_config("qwen3.5-35b-a3b"), "Qwen3_5MoeForConditionalGeneration",
                        shipped_or_524("qwen3-5-moe"), 8, head_limited={"self_attn": why})
    assert_caught(result, "model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.k_proj", "colwise", "TPA502")
    q_proj = result.verdict("model.layers.*.self_attn.q_proj")
    assert q_proj.status == "cleared" and "share of the unsharded parts" in q_proj.why
    for rule in ("v_proj", "o_proj"):
        v = result.verdict(f"model.layers.*.self_attn.{rule}")
        assert v.status == "not_exercised" and why in v.why
    assert status(result)["model.layers.*.mlp.experts.gate_up_proj"] == ("cleared", None)


@pytest.mark.slow
def test_a_run_that_compares_nothing_clears_nothing(monkeypatch):
    """A run whose ranks all finish but whose outputs can never be paired with the unsharded ones (here: every
    comparison made impossible) is no evidence: `passed` is None, no rule is cleared, and a fused-projection
    suspicion stays a warning."""
    import tpaudit.evidence.blame as blame
    import tpaudit.evidence.ranks as ranks

    monkeypatch.setattr(blame, "compare", lambda *a, **k: (False, None, 0.0))
    monkeypatch.setattr(ranks, "compare", lambda *a, **k: (False, None, 0.0))
    from tpaudit.checks.layout import parity_findings
    from tpaudit.evidence import run_parity

    config = snap_config("llama-3.1-8b-instruct")
    result = run_parity(config, "LlamaForCausalLM", None, 2)
    assert result.ran and result.passed is None and result.modules_compared == 0
    assert {v.status for v in result.verdicts} == {"not_exercised"}
    assert all("compared no module output" in v.why for v in result.verdicts)
    assert parity_findings(result) == []
    # through the pipeline: Qwen3-30B-A3B's experts gate_up_proj ([gate | up] per expert) under plain colwise
    # computes wrong numbers without raising; compared nowhere, the fused-name suspicion stays a warning
    plan = moe_524("qwen3-moe", **{"layers.*.mlp.experts.gate_up_proj": "colwise"})
    report = audit(str(FIXTURES / "qwen3-30b-a3b.snapshot.json.gz"), tp=2, plan=plan, parity="on")
    assert report.parity.ran and report.parity.passed is None and report.parity.reruns == 0
    layout = [(f.code, f.severity, f.target) for f in report.findings if f.code in ("TPA501", "TPA502")]
    assert layout == [("TPA501", "warning", "model.layers.*.mlp.experts.gate_up_proj")]
    assert "compared no module output" in report.findings[[f.code for f in report.findings].index("TPA501")].message


# ----------------------------------------------------------------------------------------------------------------------
# bundled models and cases: no suspicion left undecided where parity ran
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,tp", [("qwen3-30b-a3b-fp8", 8), ("gemma-4-26b-a4b", 4), ("deepseek-v3", 8),
                                     ("case:14-fp8-block-shards-smaller-than-block", 8),
                                     ("case:36-llama4-scout-tp8-transposed-experts-ok", 8),
                                     ("case:45-deepseek-v2-lite-tp4-mla-kv-a-proj-ok", 4)])
def test_where_parity_runs_every_rule_has_a_verdict_and_no_suspicion_is_left(name, tp, tmp_path):
    """The bundled models and cases whose check runs the parity check by itself (a packed or gated projection the
    forward cuts into parts). Every rule of the resolved plans that matches something has a verdict (an error, cleared,
    or not exercised with a reason: the FP8 scale rules of the quantizer, which the unquantized small model lacks,
    say "quantized kernel"), rules carry the real model's names (a composite model's `model.language_model.`), and no
    report keeps a TPA501/TPA502 warning. Case 14 (Qwen3.5 FP8 at tp 8): its 2 KV heads cannot split, the k_proj
    failure is TPA102's (one problem, one finding), and its gated q_proj, once a warning, is decided by its parts.
    Cases 36 and 45 are plans that look wrong and are right (Llama 4's experts stored transposed, so `packed_rowwise`
    halves the 2 x intermediate output of `gate_up_proj`; DeepSeek-V2's `kv_b_proj` split by heads): the sharded
    forward matches, so every rule it exercised is cleared and no TPA5xx is left at all. Qwen3-30B-A3B-FP8 and
    Gemma-4-26B-A4B run it for their packed experts' gate_up_proj, which transformers 5.25 no longer splits by TP:
    from that release on they are checked with the plan 5.24.0 shipped."""
    if name.startswith("case:"):
        from test_cases import materialise

        model, plan = materialise(name[5:], tmp_path)
        report = audit(str(model), tp=tp, plan=plan, parity="auto")
    else:   # the two MoE models' packed experts are split by TP rules only in 5.24.0's plan (5.25 splits them by EP)
        moe = {"qwen3-30b-a3b-fp8": "qwen3-moe", "gemma-4-26b-a4b": "gemma4"}
        report = audit(str(FIXTURES / f"{name}.snapshot.json.gz"), tp=tp,
                       plan=shipped_or_524(moe[name]) if name in moe else None, parity="auto")
    parity = report.parity
    assert parity.ran and parity.verdicts, parity.reason
    assert not [f for f in report.findings if f.code in ("TPA501", "TPA502") and f.severity != "error"]
    targets = {v.rule for v in parity.verdicts if v.rule}
    rules = {**report.plan["tp_rules"], **(report.plan["ep_rules"] if tp > 1 and report.ep_size > 1 else {})}
    assert set(rules) - set(report.unused_rules) <= targets
    for v in parity.verdicts:
        assert v.why and v.status in ("error", "cleared", "not_exercised")
        if v.rule and v.rule.endswith("_scale_inv"):
            assert v.status == "not_exercised" and "quantized kernel" in v.why
    prefix = report.plan["text_prefix"]
    assert all(v.rule.startswith(prefix + ".") or v.rule == "lm_head" or "outside the text decoder" in v.why
               for v in parity.verdicts if v.rule)
    if name.endswith("-ok"):
        assert parity.passed and parity.modules_compared > 0
        assert not [f for f in report.findings if f.code.startswith("TPA5")]
        assert {v.status for v in parity.verdicts} <= {"cleared", "not_exercised"}
    if name.startswith("case:14"):
        q_proj = parity.verdict(f"{prefix}.layers.*.self_attn.q_proj")
        assert q_proj.status == "cleared" and "share of the unsharded parts" in q_proj.why
        assert {f.code for f in report.findings if f.target.endswith("k_proj") or "key_value" in f.target} >= \
            {"TPA102"}
        assert not [f for f in report.findings if f.code == "TPA502"]
