"""Run under torchrun (2 gloo ranks): load a tiny saved model inside tpaudit.strict_tp() and print, per rank, one JSON
line: whether the guard raised, its targets, and whether the loader got as far as reading weights."""

import json
import sys

import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.distributed import DistributedConfig
from transformers.modeling_utils import PreTrainedModel

import tpaudit

model_dir, mode = sys.argv[1], sys.argv[2]
if mode == "uncovered":  # a proposed plan without any experts rule
    Qwen3MoeConfig.base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
    }

loaded = []
original = PreTrainedModel.__dict__["_load_pretrained_model"]


def spy(*args, **kwargs):
    loaded.append(True)
    return original.__func__(*args, **kwargs)


PreTrainedModel._load_pretrained_model = staticmethod(spy)
result = {"rank": None, "raised": False, "loaded": None, "targets": [], "snippet": False}
try:
    with tpaudit.strict_tp():
        # shipped-ep: the shipped plan with expert parallelism (ep_size = tp_size), as transformers 5.25 splits experts
        sizes = {"tp_size": 2, "ep_size": 2} if mode == "shipped-ep" else {"tp_size": 2}
        model = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(**sizes))
except tpaudit.ReplicatedWeightsError as e:
    result.update(raised=True, targets=sorted(f.target for f in e.findings), snippet=bool(e.plan_snippet),
                  message=str(e).splitlines()[0])
result["rank"] = dist.get_rank() if dist.is_initialized() else None
result["loaded"] = bool(loaded)
print("RESULT " + json.dumps(result), flush=True)
if dist.is_initialized():
    dist.destroy_process_group()
