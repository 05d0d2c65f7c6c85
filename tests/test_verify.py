"""`tpaudit verify` on tiny models saved with save_pretrained, loaded on 2 gloo ranks under torchrun: the measured
shards must equal the prediction to the byte; a loader failure is exit 3 with the rank; a perturbed prediction (here,
in the test) is a mismatch."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import FIXTURES, run_cli, run_main

pytestmark = pytest.mark.distributed

TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3VLConfig,
                              Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  deepstack_visual_indexes=[0])
    models = {
        # odd intermediate and vocab sizes: rank 0 holds the larger shard; tied embeddings: one shared tensor
        "uneven": LlamaForCausalLM(LlamaConfig(**{**TEXT, "intermediate_size": 97, "vocab_size": 101},
                                               tie_word_embeddings=True, dtype="float32")),
        "moe": Qwen3MoeForCausalLM(Qwen3MoeConfig(**TEXT, moe_intermediate_size=32, num_experts=4,
                                                  num_experts_per_tok=2, dtype="float32")),
        "vlm": Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config={**TEXT, "rope_scaling": rope},
                                                             vision_config=vision, dtype="float32")),
        # transformers 5.23-5.25 fail to TP-load qwen3_vl_moe's experts (the checkpoint Transpose compares the local
        # shard with the full shape): the loader failure case, with expert TP rules (5.24's plan, given as --plan)
        "vlm_moe": Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(
            text_config={**TEXT, "rope_scaling": rope, "moe_intermediate_size": 32, "num_experts": 4,
                         "num_experts_per_tok": 2}, vision_config=vision, dtype="float32")),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
    return root


# each case is one torchrun launch (~30 s on 2 cores): a dense model with uneven shards and tied embeddings, a VLM;
# the MoE is loaded by test_zero_weights_from_a_snapshot and test_a_perturbed_prediction_is_a_mismatch
@pytest.mark.parametrize("name", ["uneven", "vlm"])
def test_measured_equals_predicted(tiny, name):
    proc = run_cli("verify", str(tiny / name), "--tp", "2", "--device", "cpu", "--format", "json")
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    out = json.loads(proc.stdout)
    assert out["schema"] == "tpaudit/verify/v1" and out["match"] is True and out["mismatches"] == []
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    for r in out["ranks"]:
        assert r["measured_param_bytes"] == r["predicted_param_bytes"] > 0
        assert r["allocated_bytes"] >= r["measured_param_bytes"]
    if name == "uneven":
        assert out["ranks"][0]["measured_param_bytes"] > out["ranks"][1]["measured_param_bytes"]
        # stderr is no terminal here: one progress line per phase, in order
        phases = [line.split(":")[1].strip() for line in proc.stderr.splitlines()
                  if line.startswith("tpaudit verify: ")]
        assert phases == ["preparing", "predicting", "starting", "loading", "comparing"], proc.stderr


def test_loader_failure_is_exit_3_and_names_the_rank(tiny):
    """The tiny qwen3_vl_moe at tp 2 with expert TP rules fails to load (its experts' Transpose): exit 3 naming the
    rank. transformers 5.25 ships no expert TP rules (its experts load whole at tp alone), so the plan 5.24.0 shipped
    is given with --plan under every release: the ranks load with it as DistributedConfig(tp_plan=...) overrides."""
    plan = FIXTURES / "plans" / "qwen3-vl-moe.transformers-5.24.json"
    proc = run_cli("verify", str(tiny / "vlm_moe"), "--tp", "2", "--plan", str(plan), "--device", "cpu")
    assert proc.returncode == 3, proc.stdout[-1500:] + proc.stderr[-1500:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the model failed to load on rank ") and "Traceback" not in proc.stderr
    assert "tpaudit check predicted it: TPA304 model.language_model.layers.*.mlp.experts." in line


def test_a_bad_plan_is_refused_before_any_rank_starts(tiny, tmp_path):
    """verify --plan reads the file as check --plan does: a style transformers does not register is exit 2 naming
    the file, and no rank is started."""
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"layers.*.mlp.experts.gate_up_proj": "packed_colwize"}))
    proc = run_main("verify", str(tiny / "moe"), "--tp", "2", "--plan", str(bad), "--device", "cpu")
    assert proc.returncode == 2 and str(bad) in proc.stderr and "packed_colwize" in proc.stderr, proc.stderr
    assert not any(line.startswith("tpaudit verify: starting") for line in proc.stderr.splitlines())


def test_plan_overrides_are_full_keys():
    """--plan's keys are relative to the base model; DistributedConfig(tp_plan=...) takes them from the top model:
    the text decoder's prefix goes in front (none for a model without one)."""
    from tpaudit.verify import plan_overrides

    rules = {"layers.*.mlp.experts.gate_up_proj": "packed_colwise", "layers.*.mlp.experts": "moe_tp_experts"}
    assert plan_overrides("model.language_model", rules) == {
        "model.language_model.layers.*.mlp.experts.gate_up_proj": "packed_colwise",
        "model.language_model.layers.*.mlp.experts": "moe_tp_experts"}
    assert plan_overrides("", rules) == rules and plan_overrides("model", None) is None


def test_a_perturbed_prediction_is_a_mismatch(tiny, monkeypatch):
    from tpaudit import verify

    real_predict = verify.predict

    def perturbed(*args, **kwargs):
        report = real_predict(*args, **kwargs)
        params = list(report.shard_map.params)
        i = next(i for i, p in enumerate(params) if p.name.endswith("mlp.experts.gate_up_proj"))
        shapes = list(params[i].local_shapes)
        shapes[1] = (shapes[1][0], shapes[1][1] - 1, shapes[1][2])   # claim rank 1 holds one row less
        params[i] = dataclasses.replace(params[i], local_shapes=tuple(shapes))
        sm = dataclasses.replace(report.shard_map, params=tuple(params))
        return dataclasses.replace(report, shard_map=sm)

    monkeypatch.setattr(verify, "predict", perturbed)
    result = verify.run_verify(str(tiny / "moe"), tp_size=2, device="cpu")
    assert not result.match
    assert [(m["rank"], m["name"]) for m in result.mismatches] == [(1, "model.layers.0.mlp.experts.gate_up_proj")]
    assert result.ranks[0]["measured_param_bytes"] == result.ranks[0]["predicted_param_bytes"]


def test_snapshot_without_zero_weights_is_input_error():
    from conftest import FIXTURES

    proc = run_main("verify", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--tp", "2")
    assert proc.returncode == 2 and "--zero-weights" in proc.stderr


def test_zero_weights_from_a_snapshot(tiny, tmp_path):
    from tpaudit.sources import open_source
    from tpaudit.sources.snapshot import write_snapshot

    snap = write_snapshot(open_source(str(tiny / "moe")), tmp_path / "moe.snapshot.json.gz")
    proc = run_cli("verify", str(snap), "--tp", "2", "--zero-weights", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-1500:]
    out = json.loads(proc.stdout)
    assert out["match"] and any("--zero-weights" in n for n in out["notes"])
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    for r in out["ranks"]:
        assert r["measured_param_bytes"] == r["predicted_param_bytes"] > 0


def _tiny_moe_rank_bytes(experts_whole: bool) -> int:
    """Bytes one of 2 ranks holds of the tiny qwen3_moe above, from its config (float32, 4 B): attention q/k/v/o,
    the embedding and lm_head split in halves; q_norm/k_norm, layer norms and the router whole; the fused experts
    gate_up [4, 2 x 32, 64] and down [4, 64, 32] split in halves (by the TP plan of 5.23/5.24, or by expert with
    --ep 2), or whole on both ranks (transformers 5.25 at tp only: its plan has no expert rules)."""
    hidden, heads, kv_heads, head_dim, vocab, layers = 64, 4, 2, 16, 128, 2
    experts, moe_inter = 4, 32
    attention = (2 * heads * head_dim * hidden + 2 * kv_heads * head_dim * hidden) // 2 + 2 * head_dim
    norms, router = 2 * hidden, experts * hidden
    expert_params = experts * (2 * moe_inter * hidden + hidden * moe_inter)
    per_layer = attention + norms + router + (expert_params if experts_whole else expert_params // 2)
    whole_model = 2 * vocab * hidden // 2 + hidden
    return 4 * (whole_model + layers * per_layer)


@pytest.mark.parametrize("ep", [1, 2])
def test_tiny_moe_at_tp_only_and_with_ep_loads_as_predicted(tiny, ep):
    """A real 2-rank gloo load of the tiny qwen3_moe, at tp 2 alone and at tp 2 with ep 2: the measured bytes are the
    prediction, and both are the figure worked out from the config. Under transformers 5.25 tp alone holds every
    expert whole on both ranks (its plan has no expert TP rules: TPA001, exit 1 for `check`); with ep 2 the experts
    are split by expert and the check is clean."""
    from releases import EXPERTS_IN_TP_PLANS

    args = ["--tp", "2"] + (["--ep", "2"] if ep > 1 else [])
    proc = run_cli("verify", str(tiny / "moe"), *args, "--device", "cpu", "--format", "json")
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    out = json.loads(proc.stdout)
    assert out["match"] is True and out["mismatches"] == []
    expected = _tiny_moe_rank_bytes(experts_whole=ep == 1 and not EXPERTS_IN_TP_PLANS)
    assert [r["measured_param_bytes"] for r in out["ranks"]] == [expected, expected]
    check = run_cli("check", str(tiny / "moe"), *args, "--format", "json")
    errors = [f["target"] for f in json.loads(check.stdout)["findings"] if f["severity"] == "error"]
    if ep == 1 and not EXPERTS_IN_TP_PLANS:
        assert check.returncode == 1 and sorted(errors) == [f"model.layers.*.mlp.experts.{p}"
                                                            for p in ("down_proj", "gate_up_proj")]
    else:
        assert check.returncode == 0 and errors == [], check.stdout[-2000:]


def test_a_plan_override_reaches_the_ranks(tiny):
    """verify --plan with the plan transformers 5.24.0 shipped for qwen3_moe (its experts split by TP rules): under
    every release the ranks load with it, so each holds half of every expert (the figure worked out from the config),
    which 5.25's own plan at tp alone would not (experts whole); the prediction agrees to the byte and says the plan
    was given to the ranks."""
    plan = FIXTURES / "plans" / "qwen3-moe.transformers-5.24.json"
    proc = run_cli("verify", str(tiny / "moe"), "--tp", "2", "--plan", str(plan), "--device", "cpu",
                   "--format", "json")
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    out = json.loads(proc.stdout)
    assert out["match"] is True and out["mismatches"] == []
    expected = _tiny_moe_rank_bytes(experts_whole=False)
    assert [r["measured_param_bytes"] for r in out["ranks"]] == [expected, expected]
    rules = len(json.loads(plan.read_text()))
    assert any(n.startswith(f"--plan {plan}: the ranks loaded with {rules} rule(s)") for n in out["notes"])


def test_a_plan_override_in_worker_mode(tiny, tmp_path):
    """`torchrun -m tpaudit verify --plan`: every rank reads the plan, predicts for its full keys and loads with them;
    rank 0 prints the report. With 5.24.0's qwen3_moe plan each of the 2 ranks holds half of every expert (the
    figure worked out from the config), under every release."""
    import os
    import socket
    import subprocess
    import sys

    from conftest import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = FIXTURES / "plans" / "qwen3-moe.transformers-5.24.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(port), "-m", "tpaudit", "verify", str(tiny / "moe"),
                           "--tp", "2", "--plan", str(plan), "--format", "json"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-2500:]
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["match"] is True and out["mismatches"] == []
    expected = _tiny_moe_rank_bytes(experts_whole=False)
    assert [r["measured_param_bytes"] for r in out["ranks"]] == [expected, expected]
