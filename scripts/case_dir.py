#!/usr/bin/env python3
"""Turn a case of `fixtures/cases/` into a model directory `tpaudit check` reads as a checkpoint.

A case that needs tensors the meta model does not have (quantization scales, per-expert tensors) lists its
checkpoint in `tensors.json.gz` (on-disk names, dtypes, shapes). This writes `config.json` and sparse safetensors
shards whose headers list those tensors (the data region is a hole: no disk used), as `tests/test_cases.py` does
before it judges a case. Then check it with the sizes its `expected.json` names, and its `tp_plan.json` if any:

    python scripts/case_dir.py fixtures/cases/10-fp8-qwen3-vl-moe-expert-scales-ep /tmp/case10
    tpaudit check /tmp/case10 --tp 4 --ep 4

Usage: case_dir.py CASE_DIR OUT_DIR (OUT_DIR must not exist yet)
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def write_case(case: Path, out: Path) -> None:
    """Write the model directory of `case` (a folder with `config.json` and, optionally, `tensors.json.gz`: `{"tensors":
    {name: [dtype, shape] or shape}, "dtype_default": "BF16"}`) to `out`, which must not exist."""
    from tpaudit.model import CheckpointTensor, ModelSource
    from tpaudit.sources.sparse import write_sparse_checkpoint

    config = json.loads((case / "config.json").read_text())
    listing = case / "tensors.json.gz"
    if not listing.is_file():
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        return
    spec = json.loads(gzip.decompress(listing.read_bytes()))
    default = spec.get("dtype_default", "BF16")
    tensors = []
    for name, value in spec["tensors"].items():
        dtype, shape = (value if isinstance(value[0], str) else (default, value))
        tensors.append(CheckpointTensor(name, dtype, tuple(shape)))
    write_sparse_checkpoint(ModelSource(ref=case.name, kind="local", config=config, tensors=tuple(tensors)), out)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    case, out = Path(argv[0]), Path(argv[1])
    if not (case / "config.json").is_file():
        print(f"error: {case} is not a case directory (no config.json)", file=sys.stderr)
        return 2
    if out.exists():
        print(f"error: {out} exists. Pass a new directory", file=sys.stderr)
        return 2
    write_case(case, out)
    expected = json.loads((case / "expected.json").read_text()) if (case / "expected.json").is_file() else {}
    sizes = f"--tp {expected.get('tp_size', 2)}" + (f" --ep {expected['ep_size']}" if expected.get("ep_size", 1) > 1
                                                    else "")
    plan = f" --plan {case / 'tp_plan.json'}" if (case / "tp_plan.json").is_file() else ""
    print(f"wrote {out}: tpaudit check {out} {sizes}{plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
