"""The shard map against the loader's own per-rank result: for chosen ranks, a separate process joins the fake
process group *as that rank* and reads `to_local().shape` of every DTensor after `maybe_distribute_model`, which is
exactly what that rank would hold. tpaudit computes all ranks in one process from the placements; both must agree."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import CASES, ROOT, audit

RANK_PROBE = r"""
import json, sys
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import AutoConfig
from transformers.distributed import DistributedConfig
from transformers.distributed.utils import TransformersDeviceMesh
import transformers
config_dir, tp, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = AutoConfig.from_pretrained(config_dir)
cls = getattr(transformers, config.architectures[0])
dtype = torch.bfloat16
with transformers.utils.generic.ContextManagers(cls.get_init_context(dtype, False, False, None)):
    model = cls(config)
dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp)
dc = DistributedConfig(tp_size=tp)
dense = init_device_mesh("cpu", (1, 1, 1, tp), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
expert = init_device_mesh("cpu", (1, 1, 1, 1), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep"))
model = cls.maybe_distribute_model(model, dc, TransformersDeviceMesh(dense, expert))
print(json.dumps({n: list(p.to_local().shape if isinstance(p, DTensor) else p.shape)
                  for n, p in model.named_parameters(remove_duplicate=False)}))
"""


@pytest.mark.slow  # one process per checked rank, each importing torch and transformers
@pytest.mark.parametrize("config_dir, tp, ranks", [
    (CASES / "09-granite-tp5-indivisible-dims", 5, [4]),           # uneven: the last rank is short
    (CASES / "01-qwen3-vl-moe-experts-replicated", 4, [3]),        # packed_colwise (_StridedShard) experts
])
def test_every_rank_matches_a_process_of_that_rank(config_dir, tp, ranks):
    report = audit(str(config_dir), tp=tp)
    predicted = {p.name: p.local_shapes for p in report.shard_map.params}
    for rank in ranks:
        out = subprocess.run([sys.executable, "-c", RANK_PROBE, str(config_dir), str(tp), str(rank)],
                             capture_output=True, text=True, cwd=str(ROOT), timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        assert set(measured) == set(predicted)
        for name, shape in measured.items():
            assert tuple(shape) == predicted[name][rank], (name, rank)
