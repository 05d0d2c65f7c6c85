"""Bad input never becomes a traceback or an internal error: one `error:` line on stderr and exit 2. Cases found by
trying to break the tool (malformed configs, headers, snapshots, options)."""

from __future__ import annotations

import gzip
import json
import struct

import pytest

from conftest import CASES, FIXTURES, run_main

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
    assert run_main("check", str(d), "--tp", "2", "--format", "json").returncode in (0, 1)


@pytest.mark.parametrize("doc, needle", [
    ({"schema": "tpaudit/snapshot/v1", "config": GRANITE, "files": [], "tensors": [["a", "BF16", [True], None]]},
     "tensors[0]"),
    ({"schema": "tpaudit/snapshot/v1", "config": GRANITE, "files": ["f"], "tensors": [["a", "BF16", [2], -1]]},
     "tensors[0]"),
    ({"schema": "tpaudit/snapshot/v1", "source": {"repo_id": 5}, "config": GRANITE, "tensors": None},
     "source.repo_id"),
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
    assert_input_error(run_main("verify", model_dir(tmp_path, raw_config="[1, 2]"), "--tp", "2"), "JSON object")


def test_size_refuses_absurd_tp():
    assert_input_error(run_main("size", LLAMA, "--gpu-memory", "80GB", "--tp", "1000000"), "between 1 and 1024")
