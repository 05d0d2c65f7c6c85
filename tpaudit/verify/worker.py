"""One rank of `tpaudit verify` (started by the launcher under torchrun): load, measure, write the record, shut the
process group down. Exits 1 when the load failed, so torchrun stops the other ranks instead of letting them wait."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from .._process import tune_gc

    tune_gc()
    from . import load_and_measure

    spec = json.loads(open(argv[0]).read())
    try:  # the launcher counts the ranks that started (its progress line)
        open(os.path.join(spec["out_dir"], f"rank{os.environ.get('RANK', '0')}.started"), "w").close()
    except (OSError, KeyError):
        pass
    record = load_and_measure(spec)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - shutting down; the record is already written
        pass
    return 0 if record.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
