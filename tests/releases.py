"""What the installed transformers release changes in the tests' expectations, read from transformers' own data
(its config classes' plans), never from tpaudit.

transformers 5.25 took the routed experts out of the `base_model_tp_plan` of 69 MoE config classes (only Llama4 keeps
expert TP rules): they are split by the EP plan alone, so a TP-only load holds them whole on every rank. Tests whose
expectation depends on that read `EXPERTS_IN_TP_PLANS` and compute both answers from shapes.
"""

from __future__ import annotations

from importlib import metadata

RELEASE = tuple(int(x) for x in metadata.version("transformers").split("+")[0].split(".")[:2])


def _experts_in_tp_plans() -> bool:
    from transformers import Qwen3MoeConfig, Qwen3VLMoeTextConfig

    return all(any(".experts." in key for key in cls.base_model_tp_plan)
               for cls in (Qwen3MoeConfig, Qwen3VLMoeTextConfig))


EXPERTS_IN_TP_PLANS = _experts_in_tp_plans()

# Qwen3-VL-30B-A3B-Instruct (fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz): 48 layers of 128 experts, hidden
# 2048, moe_intermediate 768, bfloat16: gate_up [128, 2 x 768, 2048] and down [128, 2048, 768] per layer.
QWEN_VL_EXPERT_BYTES = 48 * 128 * (2 * 768 * 2048 + 2048 * 768) * 2          # 57,982,058,496 B (54.00 GiB)
# tp 4 with every expert split 4 ways (by the TP plan under 5.23/5.24, by `--ep 4` under any release)
QWEN_VL_TP4_SPLIT = 16_362_514_912
# tp 4 as the shipped plan does it: the experts split (5.23/5.24) or whole on every rank (5.25)
QWEN_VL_TP4 = QWEN_VL_TP4_SPLIT if EXPERTS_IN_TP_PLANS else \
    QWEN_VL_TP4_SPLIT + QWEN_VL_EXPERT_BYTES - QWEN_VL_EXPERT_BYTES // 4


def plan_524(name: str) -> dict[str, str]:
    """The `base_model_tp_plan` transformers 5.24.0 shipped for a MoE model (`fixtures/plans/NAME.transformers-5.24
    .json`, copied from its config class), for tests about expert TP rules that 5.25 no longer ships."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "fixtures" / "plans" / f"{name}.transformers-5.24.json"
    return json.loads(path.read_text())
