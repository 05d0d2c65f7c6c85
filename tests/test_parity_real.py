"""Every parity error the zoo scan reports, proven by a real load: a tiny model of that architecture saved with
`save_pretrained`, loaded on 2 gloo ranks under torchrun with the plan transformers ships
(`tests/scripts/parity_load.py`, which imports nothing of tpaudit), and compared with its unsharded forward. The
parity check's error stands only where the real load diverges too; `fixtures/parity/*.json` records each confirmed
one with the plan fix that makes the real load match, and the test reruns the load with that fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIRMED = sorted(p for p in (ROOT / "fixtures" / "parity").glob("*.json") if not p.name.endswith(".config.json"))

pytestmark = pytest.mark.distributed


def _save(case: dict, path: Path) -> None:
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.for_model(case["model_type"], **case["config"], dtype="float32")
    torch.manual_seed(0)
    model = getattr(transformers, case["model_class"])(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.normal_(0, 0.2)
    model.save_pretrained(path)


def _real_load(path: Path, case: dict, out: Path, plan: dict | None = None, port: int = 29631) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(case["tp_size"]), "--master-addr",
           "127.0.0.1", "--master-port", str(port), str(ROOT / "tests" / "scripts" / "parity_load.py"), str(path),
           case["model_class"], str(out)]
    if plan is not None:
        plan_file = out.with_suffix(".plan.json")
        plan_file.write_text(json.dumps(plan))
        cmd.append(str(plan_file))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.is_file(), proc.stdout[-1500:] + proc.stderr[-1500:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("fixture", CONFIRMED, ids=lambda p: p.stem)
def test_a_confirmed_parity_error_diverges_in_a_real_load_and_its_fix_matches(fixture, tmp_path):
    from tpaudit.checks.layout import parity_findings
    from tpaudit.evidence import run_parity
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    case = json.loads(fixture.read_text())
    if case["model_type"] not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"{case['model_type']} is not in the installed transformers")
    rule, style = case["finding"]["rule"], case["finding"]["style"]
    config = AutoConfig.for_model(case["model_type"], **case["config"])
    shipped = dict(type(config).base_model_tp_plan or {})
    assert shipped.get(rule) == style  # the plan transformers ships still has the rule
    # the parity check's verdict on the shipped plan
    result = run_parity(config, case["model_class"], None, case["tp_size"])
    codes = {(f.code, f.target) for f in parity_findings(result)}
    assert (case["finding"]["code"], rule) in codes, (codes, result.reason)
    # the real load with the shipped plan raises or diverges too
    _save(case, tmp_path / "model")
    shipped_run = _real_load(tmp_path / "model", case, tmp_path / "shipped.json")
    assert shipped_run["error"] is not None or shipped_run["max_abs_error"] > 1e-4 * shipped_run["scale"], shipped_run
    # ... and with the fix it matches the unsharded forward
    fixed = _real_load(tmp_path / "model", case, tmp_path / "fixed.json", plan=case["plan_fix"], port=29632)
    assert fixed["error"] is None, fixed
    assert fixed["max_abs_error"] <= 1e-4 * fixed["scale"], fixed
    # the parity check agrees with the fix
    result = run_parity(config, case["model_class"], {**shipped, **case["plan_fix"]}, case["tp_size"])
    assert result.passed is True, result


LONGCAT = {"vocab_size": 64, "hidden_size": 64, "num_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
           "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "head_dim": 8,
           "v_head_dim": 8, "ffn_hidden_size": 32, "moe_topk": 2, "n_routed_experts": 4, "zero_expert_num": 2,
           "expert_ffn_hidden_size": 16}


def test_longcat_flash_shipped_plan_loads_and_matches_so_parity_reports_no_error(tmp_path):
    """transformers 5.24 splits LongCat-Flash's experts with `packed_colwise` / `rowwise` under `moe_tp_experts` and
    divides the identity ("zero") experts' input by tp_size (`moe_identity_expert`): each rank's expert outputs are
    partial sums the experts module all-reduces. A real load matches the unsharded forward, so the parity check must
    not call the experts' rules errors (it once compared the identity expert's partial output). 5.25 moves the
    experts to an EP plan: the tp-only load keeps them whole and matches as well."""
    from tpaudit.checks.layout import parity_findings
    from tpaudit.evidence import run_parity
    from transformers import AutoConfig

    case = {"model_type": "longcat_flash", "model_class": "LongcatFlashForCausalLM", "config": LONGCAT, "tp_size": 2}
    _save(case, tmp_path / "model")
    real = _real_load(tmp_path / "model", case, tmp_path / "shipped.json", port=29633)
    assert real["error"] is None and real["max_abs_error"] <= 1e-4 * real["scale"], real
    result = run_parity(AutoConfig.for_model("longcat_flash", **LONGCAT), "LongcatFlashForCausalLM", None, 2)
    assert result.passed is True, result
    assert not [f for f in parity_findings(result) if f.severity == "error"]
