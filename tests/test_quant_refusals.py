"""A `quantization_config` the loader refuses is an error (TPA206, exit 1) with the library's reason whole, and, where
a library release removed the value, which releases accept it; the findings read from the checkpoint header stay.

The expected reasons are computed here by calling the library's own parser on the same config (compressed-tensors'
`QuantizationConfig.model_validate`), never copied from tpaudit's output."""

from __future__ import annotations

import copy
import gzip
import json

from conftest import CASES, FIXTURES, read_json_any, run_main

W8A16 = "llama-3.1-70b-w8a16"
ACTORDER = CASES / "11-compressed-tensors-weight-shape-g-idx-sharded"  # a real Llama-3.1-8B W4A16 config


def _patched(tmp_path, weights: dict) -> tuple[str, dict]:
    doc = read_json_any(FIXTURES / f"{W8A16}.snapshot.json.gz")
    qc = copy.deepcopy(doc["config"]["quantization_config"])
    qc["config_groups"]["group_0"]["weights"].update(weights)
    doc["config"]["quantization_config"] = qc
    path = tmp_path / "patched.snapshot.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(path), qc


def _library_reason(qc: dict) -> str:
    """What compressed-tensors' parser itself says about `qc`, on one line."""
    from compressed_tensors.quantization import QuantizationConfig

    try:
        QuantizationConfig.model_validate({k: v for k, v in qc.items() if k != "quant_method"})
    except Exception as e:  # noqa: BLE001 - the message is what the test wants
        return " ".join(str(e).split())
    raise AssertionError("compressed-tensors accepted the config")


def _findings(proc, code: str) -> list[dict]:
    return [f for f in json.loads(proc.stdout)["findings"] if f["code"] == code]


def test_fractional_num_bits_is_an_error_with_the_whole_reason(tmp_path):
    ref, qc = _patched(tmp_path, {"num_bits": 4.5})
    proc = run_main("check", ref, "--tp", "4", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    [finding] = _findings(proc, "TPA206")
    assert finding["severity"] == "error" and finding["target"] == "quantization_config"
    assert _library_reason(qc) in finding["message"]  # whole: its last words included


def test_zero_bits_is_refused_not_laid_out(tmp_path):
    """compressed-tensors' parser accepts `num_bits: 0`; its pack-quantized unpacking takes 1 to 8 bits only."""
    ref, _ = _patched(tmp_path, {"num_bits": 0})
    proc = run_main("check", ref, "--tp", "4", "--format", "json")
    assert proc.returncode == 1
    [finding] = _findings(proc, "TPA206")
    assert "num_bits` is 0" in finding["message"] and "[1, 8]" in finding["message"]
    assert json.loads(proc.stdout)["model"]["quantization"]["ran"] is False


def test_removed_actorder_names_the_releases_that_accept_it(tmp_path):
    """compressed-tensors 0.19.0 removed `actorder: "group"` (0.18.0 maps it to ActivationOrdering.GROUP); the
    header's findings (the sharded `weight_shape` and `g_idx` of the case's expected report) stay."""
    from test_cases import materialise

    model_dir, _ = materialise(ACTORDER.name, tmp_path)
    proc = run_main("check", str(model_dir), "--tp", "4", "--format", "json")
    assert proc.returncode == 1
    [finding] = _findings(proc, "TPA206")
    assert "actorder='group' has been removed" in finding["message"]
    assert "compressed-tensors 0.18.0 and earlier accept it; 0.19.0 removed" in finding["message"]
    kinds = {(f["kind"], f["target"].rpartition(".")[2]) for f in json.loads(proc.stdout)["findings"]}
    assert ("quant_metadata_sharded", "weight_shape") in kinds and ("quant_metadata_sharded", "weight_g_idx") in kinds


def test_unknown_quant_method_stays_a_skip_warning(tmp_path):
    """transformers' `get_hf_quantizer` skips an unknown `quant_method` (`supports_quant_method` answers False and
    logs), so the load goes on: TPA205, no refusal."""
    doc = read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    doc["config"]["quantization_config"] = {"quant_method": "evil", "bits": 4}
    path = tmp_path / "evil.snapshot.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    proc = run_main("check", str(path), "--tp", "4", "--format", "json")
    assert not _findings(proc, "TPA206") and [f["severity"] for f in _findings(proc, "TPA205")] == ["warning"]
