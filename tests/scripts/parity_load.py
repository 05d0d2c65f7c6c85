"""A real tensor-parallel load of a saved model, compared with its unsharded forward (run under torchrun, gloo).

    torchrun --nproc-per-node 2 tests/scripts/parity_load.py MODEL_DIR CLASS OUT_JSON [PLAN_JSON]

Every rank loads MODEL_DIR with `CLASS.from_pretrained(dir, distributed_config=DistributedConfig(tp_size=WORLD))`
(PLAN_JSON, when given, is a `tp_plan` override of the shipped plan, merged by transformers), eager attention and
experts, float32; rank 0 also loads it unsharded. The same token ids go through both; rank 0 writes
`{"max_abs_error", "scale", "error"}` to OUT_JSON: the largest |sharded - unsharded| of the last hidden state (or the
logits) and the largest |unsharded|, or the exception a rank raised. Nothing of tpaudit is imported: this is the
evidence its parity check is compared with.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import torch
    import torch.distributed as dist
    import transformers
    from transformers.distributed import DistributedConfig

    path, class_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    plan = json.loads(open(sys.argv[4]).read()) if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cls = getattr(transformers, class_name)
    # 5.25 loads Hub kernels by default: the CPU reference path is the point here
    kwargs = {"dtype": torch.float32, "attn_implementation": "eager", "experts_implementation": "eager",
              "use_kernels": False}
    ids = torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(0))

    def first_tensor(output):
        for key in ("logits", "last_hidden_state"):
            value = getattr(output, key, None)
            if value is not None:
                return value
        return output[0]

    result = {"max_abs_error": None, "scale": None, "error": None}
    try:
        config = {"tp_size": world}
        if plan is not None:
            config["tp_plan"] = plan
        try:
            sharded = cls.from_pretrained(path, distributed_config=DistributedConfig(**config), **kwargs).eval()
        except TypeError:  # a release without `use_kernels`
            kwargs.pop("use_kernels")
            sharded = cls.from_pretrained(path, distributed_config=DistributedConfig(**config), **kwargs).eval()
        with torch.no_grad():
            got = first_tensor(sharded(input_ids=ids))
        if hasattr(got, "full_tensor"):
            got = got.full_tensor()
    except Exception as e:  # noqa: BLE001 - the evidence: which rank raised what
        result["error"] = f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        got = None
    errors = [None] * world
    dist.all_gather_object(errors, result["error"])
    if rank == 0:
        if any(errors):
            result["error"] = next(e for e in errors if e)
        else:
            reference = cls.from_pretrained(path, **kwargs).eval()
            with torch.no_grad():
                want = first_tensor(reference(input_ids=ids))
            result["max_abs_error"] = float((got - want).abs().max())
            result["scale"] = float(want.abs().max())
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
