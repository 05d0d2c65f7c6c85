#!/usr/bin/env python3
"""Turn a real model's config.json + compressed tensor listing into a tpaudit snapshot fixture.

The listings (`tensors.md`) come from gogongxt/python's `scripts/model_inspector.py`, which reads the safetensors
headers of a real Hub download and compresses rows: `model.layers.0-47.mlp.experts.0-127.down_proj.weight (x48 layers,
x128 experts)` is one tensor per (layer, expert). This script expands every range (comma lists too), maps the dtype
names to safetensors names, and checks the expansion against the listing's own totals (tensor count and parameter
count) before writing.

Shard files: rows that name one file keep it. Rows marked "Multi Files" do not say which shard holds which layer, so
those tensors are spread over the checkpoint's N shards in layer order by cumulative bytes. That reconstruction is
stated in the snapshot's `source.origin`; per-rank bytes never depend on it.

Usage (dev tool, needs ../shared/models):
    python scripts/import_listing.py ../shared/models/qwen3-vl-30b-a3b-instruct \\
        Qwen/Qwen3-VL-30B-A3B-Instruct fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpaudit.model import CheckpointTensor, ModelSource  # noqa: E402
from tpaudit.sources.snapshot import write_snapshot  # noqa: E402

TORCH_TO_SAFETENSORS = {
    "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32", "torch.float64": "F64",
    "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2", "torch.int8": "I8", "torch.uint8": "U8",
    "torch.int16": "I16", "torch.int32": "I32", "torch.int64": "I64", "torch.bool": "BOOL",
}
ROW = re.compile(r"^\| `(?P<name>[^`]+)`(?: \([^)]*\))? \| `\[(?P<shape>[^\]]*)\]` \| `(?P<dtype>[^`]+)` \| [^|]+ \| "
                 r"(?P<file>[^|]+?) \|$")
SEGMENT = re.compile(r"^\d+(?:-\d+)?(?:,(?:\d+(?:-\d+)?|\.\.\.))*$")  # 0-2,4-6 or 3,7,...,39


def expand_segment(seg: str) -> list[str]:
    """`0-2,4-6` -> 0,1,2,4,5,6; `3,7,...,35,39` -> the arithmetic progression 3, 7, ..., 39."""
    if ",...," in seg:
        head, tail = seg.split(",...,")
        first = [int(x) for x in head.split(",")]
        last = int(tail.split(",")[-1])
        step = first[1] - first[0]
        return [str(i) for i in range(first[0], last + 1, step)]
    out = []
    for part in seg.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(str(i) for i in range(int(a), int(b) + 1))
        else:
            out.append(part)
    return out


def expand_name(name: str) -> list[tuple[str, tuple[int, ...]]]:
    """`a.0-2.b.0-1.c` -> [("a.0.b.0.c", (0, 0)), ...] with the indices kept for ordering."""
    parts = [p.replace("\0", ",...,") for p in name.replace(",...,", "\0").split(".")]
    choices = [expand_segment(p) if SEGMENT.match(p) else [p] for p in parts]
    out = []
    for combo in itertools.product(*choices):
        idx = tuple(int(p) for p, c in zip(combo, choices) if len(c) > 1 or c[0].isdigit())
        out.append((".".join(combo), idx))
    return out


def parse_listing(text: str) -> tuple[list[dict], dict]:
    rows, totals = [], {}
    for line in text.splitlines():
        m = re.search(r"权重张量数\*\*: ([\d,]+)", line)
        if m:
            totals["tensors"] = int(m.group(1).replace(",", ""))
        m = re.search(r"参数总量\*\*: ([\d,]+)", line)
        if m:
            totals["params"] = int(m.group(1).replace(",", ""))
        m = re.search(r"权重文件\*\*: (\d+)", line)
        if m:
            totals["files"] = int(m.group(1))
        m = ROW.match(line.strip())
        if m:
            shape = [int(x) for x in m.group("shape").split(",") if x.strip()]
            rows.append({"name": m.group("name"), "shape": shape, "dtype": TORCH_TO_SAFETENSORS[m.group("dtype")],
                         "file": m.group("file").strip()})
    return rows, totals


def build_tensors(rows: list[dict], totals: dict) -> list[CheckpointTensor]:
    fixed, multi = [], []
    for row in rows:
        for name, idx in expand_name(row["name"]):
            entry = (name, idx, row["dtype"], tuple(row["shape"]))
            (multi if row["file"] == "Multi Files" else fixed).append((entry, row["file"]))
    files = sorted({f for _, f in fixed})
    n_files = totals.get("files", len(files) or 1)
    template = next((f for f in files), "model-00001-of-00001.safetensors")
    m = re.match(r"^(.*?)(\d+)-of-(\d+)(\.safetensors)$", template)

    def file_name(i: int) -> str:
        if not m:
            return template
        width, total_width = len(m.group(2)), len(m.group(3))
        return f"{m.group(1)}{i:0{width}d}-of-{n_files:0{total_width}d}{m.group(4)}"

    multi.sort(key=lambda e: (e[0][1], e[0][0]))
    sizes = [CheckpointTensor(n, d, s).nbytes for (n, _, d, s), _ in multi]
    total = sum(sizes) or 1
    out: list[CheckpointTensor] = []
    cumulative = 0
    for ((name, _, dtype, shape), _), size in zip(multi, sizes):
        i = min(n_files, 1 + (cumulative * n_files) // total)
        cumulative += size
        out.append(CheckpointTensor(name, dtype, shape, file_name(i)))
    for (name, _, dtype, shape), f in fixed:
        out.append(CheckpointTensor(name, dtype, shape, f))
    out.sort(key=lambda t: (t.file or "", t.name))
    return out


def main(argv: list[str]) -> int:
    model_dir, repo_id, output = Path(argv[0]), argv[1], argv[2]
    config_text = (model_dir / "config.json").read_text()
    config = json.loads(config_text)
    config_sha = hashlib.sha256(config_text.encode()).hexdigest()
    listing = model_dir / "tensors.md"
    tensors = None
    origin = (f"config.json copied verbatim from ../shared/models/{model_dir.name} (sha256 {config_sha}; see that "
              "SOURCE.md for where it was found). ")
    if listing.is_file():
        rows, totals = parse_listing(listing.read_text())
        tensors = build_tensors(rows, totals)
        n_params = sum(int(__import__("math").prod(t.shape)) for t in tensors)
        if totals.get("tensors") not in (None, len(tensors)) or totals.get("params") not in (None, n_params):
            print(f"expansion mismatch: {len(tensors)} tensors / {n_params} params vs listing {totals}",
                  file=sys.stderr)
            return 1
        origin += (f"Tensor table: {len(tensors)} tensors, {n_params:,} parameters, expanded from the compressed "
                   "listing gogongxt/python@ec9962697819add8f24ce1b180cf98ca6a53c40f (model_inspector.py over the "
                   "real safetensors headers) by scripts/import_listing.py; shard files of rows marked 'Multi "
                   "Files' are reconstructed by bytes, not the real assignment.")
    else:
        origin += "No tensor listing: config only."
    source = ModelSource(ref=repo_id, kind="snapshot", config=config, tensors=tuple(tensors) if tensors else None,
                         repo_id=repo_id, revision=None, commit=None)
    write_snapshot(source, output, origin=origin, recorded_by="scripts/import_listing.py")
    print(f"{output}: {len(tensors) if tensors else 0} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
