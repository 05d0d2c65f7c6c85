"""Bad input never becomes a traceback or an internal error: one `error:` line on stderr and exit 2. Cases found by
trying to break the tool (malformed configs, headers, snapshots, options)."""

from __future__ import annotations

import gzip
import json
import struct

import pytest

from conftest import CASES, FIXTURES, read_json_any, run_main

LLAMA = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
GRANITE = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())


def assert_input_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def model_dir(tmp_path, config=None, header=None, raw_config=None):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(raw_config if raw_config is not None else json.dumps(config or GRANITE))
    if header is not None:
        raw = json.dumps(header).encode()
        (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return str(d)


@pytest.mark.parametrize("change, needle", [
    ({"num_hidden_layers": "abc"}, "num_hidden_layers"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "Fix the config"),
    ({"num_hidden_layers": -2}, "num_hidden_layers = -2"),
    ({"num_hidden_layers": 10**12}, "plausible depth"),
    ({"architectures": [5]}, "architectures[0]"),
])
def test_config_values_of_the_wrong_kind(tmp_path, change, needle):
    assert_input_error(run_main("check", model_dir(tmp_path, {**GRANITE, **change}), "--tp", "2"), needle)


def test_a_config_error_keeps_its_reason_apart_from_the_advice(tmp_path):
    """`scan` reports the reason alone for transformers' own default configs, where "fix the config" does not apply;
    the CLI's line is the reason, then the advice."""
    from tpaudit.run.pipeline import Audit
    from tpaudit.errors import ConfigError
    from tpaudit.sources import open_source

    with pytest.raises(ConfigError) as e:
        Audit(open_source(model_dir(tmp_path, {**GRANITE, "num_hidden_layers": -2})))
    assert e.value.reason.endswith("num_hidden_layers = -2 must be a positive integer")
    assert e.value.fix == "Fix the config"
    assert str(e.value) == e.value.reason + ". Fix the config"


def test_transformers_validators_are_input_errors(tmp_path):
    from conftest import read_json_any

    llama = read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")["config"]
    bad = {**llama, "hidden_size": 250, "num_attention_heads": 8}  # LlamaConfig: heads must divide hidden_size
    assert_input_error(run_main("check", model_dir(tmp_path, bad), "--tp", "2"), "Fix the config")


def test_deeply_nested_json(tmp_path):
    assert_input_error(run_main("check", model_dir(tmp_path, raw_config="[" * 100000 + "]" * 100000), "--tp", "2"))
    plan = tmp_path / "plan.json"
    plan.write_text("[" * 100000 + "]" * 100000)
    assert_input_error(run_main("check", LLAMA, "--tp", "2", "--plan", str(plan)), "--plan")


@pytest.mark.parametrize("header, needle", [
    ([1, 2], "header is a JSON array, not an object of tensors"),
    ({"w": [1, 2, 3]}, "tensor 'w' in the safetensors header has a JSON array where an object"),
    ({"w": {"dtype": "F32", "shape": "100x64", "data_offsets": [0, 4]}}, "shape"),
    ({"w": {"dtype": "F32", "shape": None, "data_offsets": [0, 4]}}, "shape"),
    ({"w": {"dtype": "F32", "shape": [-100, 64], "data_offsets": [0, 4]}}, "non-negative"),
    ({"w": {"dtype": "F32", "shape": [1.5, 64], "data_offsets": [0, 4]}}, "shape"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, "data_offsets"),
])
def test_malformed_safetensors_headers(tmp_path, header, needle):
    assert_input_error(run_main("check", model_dir(tmp_path, header=header), "--tp", "2"), needle)


def test_shard_in_a_subdirectory_is_inside_the_model(tmp_path):
    d = tmp_path / "m"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(GRANITE))
    raw = json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, 4096]}}).encode()
    (d / "sub" / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4096)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight":
                                                                               "sub/x.safetensors"}}))
    proc = run_main("check", str(d), "--tp", "2", "--format", "json")
    # it builds and is judged: granite's vocab_size 49155 is odd, and its plan splits the embedding (TPA101) -> 1
    assert GRANITE["vocab_size"] % 2 == 1
    assert proc.returncode == 1, proc.stderr
    assert [f["target"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"] == ["vocab_size"]


@pytest.mark.parametrize("doc, needle", [
    ({"schema": "tpaudit/snapshot/v1", "config": GRANITE, "files": [], "tensors": [["a", "BF16", [True], None]]},
     "tensors[0]"),
    ({"schema": "tpaudit/snapshot/v1", "config": GRANITE, "files": ["f"], "tensors": [["a", "BF16", [2], -1]]},
     "tensors[0]"),
    ({"schema": "tpaudit/snapshot/v1", "source": {"repo_id": 5}, "config": GRANITE, "tensors": None},
     "source.repo_id"),
    ({"schema": "tpaudit/snapshot/v1", "source": [1], "config": GRANITE, "tensors": None}, "'source' must be an object"),
    ({"schema": "tpaudit/snapshot/v1", "source": "", "config": GRANITE, "tensors": None}, "'source' must be an object"),
    ({"schema": "tpaudit/snapshot/v1", "source": {"origin": [1]}, "config": GRANITE, "tensors": None},
     "source.origin"),
    ({"schema": 5, "config": GRANITE, "tensors": None}, "schema"),
    ({"config": GRANITE, "tensors": None}, "schema"),
])
def test_malformed_snapshots(tmp_path, doc, needle):
    path = tmp_path / "x.snapshot.json"
    path.write_text(json.dumps(doc))
    assert_input_error(run_main("check", str(path), "--tp", "2"), needle)


def test_corrupt_gzip_snapshot(tmp_path):
    path = tmp_path / "x.snapshot.json.gz"
    path.write_bytes(gzip.compress(b'{"schema": "tpaudit/snapshot/v1"')[:-6])
    assert_input_error(run_main("check", str(path), "--tp", "2"), "gzip")


@pytest.mark.parametrize("args, needle", [
    (["check", "", "--tp", "2"], "empty"),
    (["check", "/dev/null", "--tp", "2"], "neither a directory nor a regular file"),
    (["check", LLAMA, "--tp", "2147483648"], "more ranks"),
    (["check", LLAMA, "--tp", "2", "--max-replicated", "1e400B"], "--max-replicated"),
    (["check", LLAMA, "--tp", "2", "--max-replicated", "150%"], "between 0% and 100%"),
    (["check", LLAMA, "--tp", "2", "--dtype", "int8"], "--dtype int8"),
    (["check", LLAMA, "--tp", "2", "--architecture", "AutoConfig"], "not a transformers model class"),
    (["check", LLAMA, "--tp", "2", "--architecture", ""], "--architecture"),
    (["check", LLAMA, "--tp", "abc"], "--tp"),
    (["check", LLAMA], "Missing option '--tp'"),
    (["size", LLAMA, "--gpu-memory", "1e999GB"], "--gpu-memory"),
    (["size", LLAMA, "--gpu-memory", "0GB"], "more than 0"),
    (["size", LLAMA, "--gpu-memory", "80GB", "--tp", "1,,2"], "--tp"),
    (["size", LLAMA, "--gpu-memory", "80GB", "--tp", "1", "--kv-dtype", "int8"], "--kv-dtype"),
    (["size", LLAMA, "--gpu-memory", "80GB", "--overhead", "100%"], "--overhead"),
    (["verify", LLAMA, "--tp", "1", "--zero-weights", "--timeout", "nan"], "--timeout"),
    (["verify", LLAMA, "--tp", "1", "--zero-weights", "--nproc", "0"], "--nproc 0"),
])
def test_bad_options(args, needle):
    assert_input_error(run_main(*args), needle)


def test_bare_byte_counts_are_byte_sizes():
    out = run_main("check", LLAMA, "--tp", "2", "--format", "json", "--max-replicated", "1e9")
    assert out.returncode == 0, out.stderr
    assert run_main("check", LLAMA, "--tp", "2", "--format", "json", "--max-replicated", "512").returncode == 1


def test_verify_rejects_a_bad_config_before_starting_ranks(tmp_path):
    proc = run_main("verify", model_dir(tmp_path, raw_config="[1, 2]"), "--tp", "2")
    progress = [line for line in proc.stderr.splitlines() if line.startswith("tpaudit verify: ")]
    assert progress and not any(line.startswith("tpaudit verify: starting") for line in progress), proc.stderr
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if line not in progress)
    assert_input_error(proc, "JSON object")


def test_size_refuses_absurd_tp():
    assert_input_error(run_main("size", LLAMA, "--gpu-memory", "80GB", "--tp", "1000000"), "between 1 and 1024")


# ----------------------------------------------------------------------------------------------------------------------
# Plainly invalid configs, transformers' own refusals, the API's argument types
# ----------------------------------------------------------------------------------------------------------------------
LLAMA_CONFIG = read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")["config"]


@pytest.mark.parametrize("change, needle", [
    ({"hidden_size": 0}, "hidden_size = 0 must be a positive integer"),
    ({"num_key_value_heads": 64}, "num_key_value_heads = 64 exceeds num_attention_heads = 32"),
    ({"intermediate_size": -5}, "intermediate_size = -5"),
    ({"vocab_size": True}, "vocab_size"),
    ({"architectures": "LlamaForCausalLM"}, "not a list of class names"),
])
def test_plainly_invalid_configs_are_input_errors(tmp_path, change, needle):
    assert_input_error(run_main("check", model_dir(tmp_path, {**LLAMA_CONFIG, **change}), "--tp", "2"), needle)


def _gemma3n_text() -> dict:
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma3n_text").to_dict()
    assert isinstance(config["intermediate_size"], list)
    return config


@pytest.mark.slow  # builds gemma3n's 35 layers and 262,144-token per-layer embeddings
def test_a_per_layer_size_list_builds(tmp_path):
    """gemma3n gives intermediate_size per layer (transformers' own default config does): a list builds."""
    proc = run_main("check", model_dir(tmp_path, _gemma3n_text()), "--tp", "2", "--format", "json")
    # it builds and is judged: gemma3n's plan leaves its AltUp, LAuReL and per-layer-embedding projections
    # (2-D decoder weights) to no rule, so they are TPA001 errors -> exit 1
    assert proc.returncode == 1, proc.stderr
    errors = {f["target"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
    assert {"model.embed_tokens_per_layer.weight", "model.layers.*.laurel.linear_left.weight"} <= errors


def test_a_per_layer_size_must_hold_for_every_layer(tmp_path):
    """A per-layer intermediate_size list with a zero in it is the same input error as a zero."""
    config = _gemma3n_text()
    bad = {**config, "intermediate_size": [16384] * (config["num_hidden_layers"] - 1) + [0]}
    assert_input_error(run_main("check", model_dir(tmp_path, bad), "--tp", "2"),
                       "intermediate_size = 0 must be a positive integer")


def test_an_unknown_architecture_is_an_explicit_noted_fallback(tmp_path):
    """A class name the installed transformers does not have (a typo, or a repo's own spelling such as Kimi-K2.5's
    `KimiK25ForConditionalGeneration` for transformers' `Kimi_K25ForConditionalGeneration`): the model type's default
    class is built, and the report's first note says which and why."""
    proc = run_main("check", model_dir(tmp_path, {**LLAMA_CONFIG, "architectures": ["LlamaForCausalLMX"]}), "--tp", "2",
                    "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"]["architecture"] == "LlamaForCausalLM"
    assert "LlamaForCausalLMX" in out["notes"][0] and "--architecture" in out["notes"][0]


def test_negative_expert_count_is_an_input_error(tmp_path):
    config = read_json_any(FIXTURES / "qwen3-30b-a3b.snapshot.json.gz")["config"]
    assert_input_error(run_main("check", model_dir(tmp_path, {**config, "num_experts": -8}), "--tp", "2"),
                       "num_experts = -8 must not be negative")


def test_ep_without_an_ep_plan_is_refused_as_transformers_refuses():
    """llama has no base_model_ep_plan: from_pretrained raises ValueError for ep_size 2; tpaudit quotes it (exit 2),
    never a page of contradictory findings."""
    assert_input_error(run_main("check", LLAMA, "--tp", "2", "--ep", "2"),
                       "transformers refuses ep_size=2", "has no `ep_plan`")


@pytest.mark.parametrize("tp", ["2", 2.0, True, None, -1])
def test_api_sizes_of_the_wrong_type_are_usage_errors_in_api_terms(tp):
    import tpaudit
    from tpaudit.errors import UsageError

    with pytest.raises(UsageError) as e:
        tpaudit.check(LLAMA, tp_size=tp)
    assert f"tp_size={tp!r}" in str(e.value) and "--tp" not in str(e.value)


def test_api_budget_and_plan_of_the_wrong_type():
    import tpaudit
    from tpaudit.errors import PlanError, UsageError

    with pytest.raises(UsageError, match="max_replicated lots"):
        tpaudit.check(LLAMA, tp_size=2, max_replicated="lots")
    with pytest.raises(PlanError, match="dict of rule -> style"):
        tpaudit.check(LLAMA, tp_size=2, plan={"layers.*.self_attn.q_proj": 3})
    with pytest.raises(UsageError, match="not list"):
        tpaudit.check([LLAMA], tp_size=2)


def test_a_stray_checkpoint_tensor_changes_no_byte(tmp_path):
    """A `q_proj.bias` in a bias-free llama checkpoint: transformers drops unexpected keys, so the bytes per rank
    are the checkpoint's without it, and the tensor is a TPA301 warning, not a replicated parameter (TPA001)."""
    from tpaudit.model import CheckpointTensor, ModelSource
    from tpaudit.sources.sparse import write_sparse_checkpoint

    doc = read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    tensors = [CheckpointTensor(n, d, tuple(s)) for n, d, s, _ in doc["tensors"]]
    clean = tmp_path / "clean"
    write_sparse_checkpoint(ModelSource("clean", "local", doc["config"], tuple(tensors)), clean)
    stray = tmp_path / "stray"
    extra = [CheckpointTensor("model.layers.0.self_attn.q_proj.bias", "BF16", (4096,)),
             CheckpointTensor("model.layers.0.mlp.junk", "BF16", (4096, 4096))]
    write_sparse_checkpoint(ModelSource("stray", "local", doc["config"], tuple(tensors + extra)), stray)
    a = json.loads(run_main("check", str(clean), "--tp", "4", "--format", "json").stdout)
    proc = run_main("check", str(stray), "--tp", "4", "--format", "json")
    b = json.loads(proc.stdout)
    assert proc.returncode == 0 and b["ranks"] == a["ranks"] and b["total_param_bytes"] == a["total_param_bytes"]
    unmapped = {f["target"] for f in b["findings"] if f["code"] == "TPA301"}
    assert unmapped == {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.mlp.junk"}
    assert not [f for f in b["findings"] if f["code"] == "TPA001"]


def test_a_checkpoint_that_contradicts_its_config_is_an_error_finding(tmp_path):
    """The classic edited config.json: intermediate_size 14336 -> 11008 with the old checkpoint. from_pretrained
    stops with a size mismatch; check reports TPA303 (exit 1), not a clean model."""
    doc = read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    doc["config"]["intermediate_size"] = 11008
    path = tmp_path / "edited.snapshot.json"
    path.write_text(json.dumps(doc))
    proc = run_main("check", str(path), "--tp", "4", "--format", "json")
    assert proc.returncode == 1
    found = {f["target"]: f for f in json.loads(proc.stdout)["findings"] if f["code"] == "TPA303"}
    assert set(found) == {f"model.layers.*.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
    assert found["model.layers.*.mlp.gate_proj.weight"]["facts"]["checkpoint_shape"] == [14336, 4096]
    assert found["model.layers.*.mlp.gate_proj.weight"]["facts"]["model_shape"] == [11008, 4096]


@pytest.mark.slow
def test_a_plan_of_100000_rules_is_checked_and_listed(tmp_path):
    """How long it takes is `scripts/benchmark.py --section plans`; how the work grows is the next test."""
    plan = {f"layers.*.no_such_module_{i}": "colwise" for i in range(100_000)}
    plan["layers.*.self_attn.q_proj"] = "colwise"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run_main("check", LLAMA, "--tp", "2", "--plan", str(path), "--format", "json")
    assert proc.returncode == 1  # the dead rules are warnings; k/v/o and the MLP are now replicated (errors)
    assert len(json.loads(proc.stdout)["unused_rules"]) == 100_000


@pytest.mark.slow
def test_the_work_of_a_check_grows_linearly_with_its_rules():
    """The calls a check and its JSON and table renderings make for 1,000 and 10,000 dead rules: ten times the rules
    cost about ten times the extra calls (a quadratic step would cost a hundred times)."""
    import io

    from rich.console import Console

    from conftest import audit, count_calls
    from tpaudit.report import get

    def check(n: int) -> int:
        plan = {f"layers.*.no_such_module_{i}": "colwise" for i in range(n)}
        plan["layers.*.self_attn.q_proj"] = "colwise"
        calls, report = count_calls(lambda: audit(LLAMA, 2, plan=plan))
        assert len(report.unused_rules) == n
        table = get("check", "table").fn
        calls += count_calls(lambda: table(report, Console(file=io.StringIO(), width=160, no_color=True)))[0]
        return calls + count_calls(lambda: get("check", "json").fn(report))[0]

    audit(LLAMA, 2)  # imports and first-use caches out of the counts
    base, small, big = check(0), check(1_000), check(10_000)
    growth = (big - small) / (small - base)   # 9 when each rule costs the same, 99 when the cost is quadratic
    assert 6 < growth < 12, (base, small, big)


@pytest.mark.slow  # its second half is a real process whose stdout is /dev/full
def test_a_full_output_device_is_an_input_error_not_a_bug():
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    proc = run_main("check", LLAMA, "--tp", "2", "--format", "json", "-o", "/dev/full")
    assert proc.returncode == 2 and "cannot write" in proc.stderr, proc.stderr
    with open("/dev/full", "w") as full:
        import subprocess
        import sys

        from conftest import ROOT

        done = subprocess.run([sys.executable, "-m", "tpaudit", "check", LLAMA, "--tp", "2", "--format", "json"],
                              stdout=full, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), timeout=300)
    assert done.returncode == 2 and "error: cannot write the output" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_interrupt_is_130_and_an_internal_bug_is_4(monkeypatch):
    """Exit 130 on Ctrl-C and exit 4 (with the TPAUDIT_DEBUG hint) for a genuine bug, each one line."""
    import tpaudit.run.pipeline

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "report", interrupted)
    proc = run_main("check", LLAMA, "--tp", "2")
    assert proc.returncode == 130 and proc.stderr.strip() == "error: interrupted"

    def bug(*a, **k):
        raise ZeroDivisionError("division by zero\nin a place")

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "report", bug)
    proc = run_main("check", LLAMA, "--tp", "2")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 4 and len(lines) == 1
    assert lines[0].startswith("error: internal error: ZeroDivisionError: division by zero") and \
        "TPAUDIT_DEBUG=1" in lines[0]


def test_a_plan_file_that_repeats_a_rule_is_refused(tmp_path):
    """JSON keeps the last of two equal keys: a plan giving q_proj colwise then rowwise silently means rowwise."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.up_proj": "colwise", '
                    '"layers.*.self_attn.q_proj": "rowwise"}')
    assert_input_error(run_main("check", LLAMA, "--tp", "2", "--plan", str(plan)),
                       "'layers.*.self_attn.q_proj' is given more than once")
    plan.write_text('{"layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.up_proj": "colwise"}')
    # the same rules once each: accepted and judged; k/v/o_proj and gate/down_proj now have no rule (TPA001) -> 1
    assert run_main("check", LLAMA, "--tp", "2", "--plan", str(plan)).returncode == 1


def test_a_path_longer_than_the_system_allows_is_bad_input():
    from conftest import run_main

    proc = run_main("check", "/" + "a" * 5000, "--tp", "2")
    assert proc.returncode == 2 and proc.stderr.startswith("error: /aaa") and "longer than a path may be" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
