#!/usr/bin/env python3
"""Turn a real model's config.json + compressed tensor listing into a tpaudit snapshot fixture.

Input: a directory holding
- `config.json`: the published file (another name with `--config`, e.g. a copy that is known to be edited);
- `SOURCE.md`: where that file was found in the world: `- Hub repo id:`, `- Copy found at:` (public repository,
  commit and path), `- Cross-checks:` (a list) and `- Files (sha256):` (a list of `` `file` sha256 ``);
- `tensors.md` (optional): the `# 权重统计` section of a report written by gogongxt/python's
  `scripts/model_inspector.py`, which reads the safetensors headers of a real Hub download and compresses rows:
  `model.layers.0-47.mlp.experts.0-127.down_proj.weight (×48 layers, ×128 experts)` is one tensor per (layer,
  expert). Its leading HTML comment names the report (`of OWNER/REPO PATH @ COMMIT`).

This script expands every range (`0-2,4-6`, `3,7,...,35,39`), maps the dtype names to safetensors names and refuses to
write unless the expansion reproduces the listing's own totals: tensor count, parameter count, number of compressed
rows, and each row's own `(×N layers, ×M experts)` count. The config's sha256 must equal the one SOURCE.md records.

`source.origin` of the snapshot then says where everything came from in the world: the Hub repo, where the config
copy was found (repository@commit path), the cross-checks in brief, the report the tensor listing comes from and the
config's sha256. Hub revisions are not recorded (the copies were not taken from the Hub itself), so `revision` and
`commit` stay empty.

Shard files: rows that name one file keep it. Rows marked "Multi Files" do not say which shard holds which layer, so
those tensors are spread over the checkpoint's N shards in layer order by cumulative bytes. That reconstruction is
stated in `source.origin`; per-rank bytes never depend on it.

Usage (dev tool for maintainers):
    python scripts/import_listing.py MODEL_DIR HUB_REPO_ID OUTPUT [--config FILE]
    python scripts/import_listing.py path/to/qwen3-vl-30b-a3b-instruct Qwen/Qwen3-VL-30B-A3B-Instruct \\
        fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz

When OUTPUT already exists, its `recorded_at` is kept, so regenerating a fixture changes only what changed.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import math
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
# | `name` (×60 layers, ×384 experts) | `[7168, 256]` | `torch.int32` | 157.50 GB | Multi Files |
ROW = re.compile(r"^\| `(?P<name>[^`]+)`(?: \((?P<counts>[^)]*)\))? \| `\[(?P<shape>[^\]]*)\]` \| `(?P<dtype>[^`]+)` \| "
                 r"[^|]+ \| (?P<file>[^|]+?) \|$")
COUNT = re.compile(r"×(\d+) \w+")  # "×60 layers", "×384 experts", "×27 blocks"
SEGMENT = re.compile(r"^\d+(?:-\d+)?(?:,(?:\d+(?:-\d+)?|\.\.\.))*$")  # 0-2,4-6 or 3,7,...,39
# The report named by the listing's leading comment: "of gogongxt/python scripts/models/x.md @ <40 hex>".
REPORT = re.compile(r"of\s+(?P<repo>[\w.-]+/[\w.-]+)\s+(?P<path>\S+\.md)\s+@\s+(?P<commit>[0-9a-f]{40})")
SHARD_NAME = re.compile(r"^(.*?)(\d+)-of-(\d+)(\.safetensors)$")
# What `source.origin` must never contain: local paths of the collector, pointers to a collection directory.
FORBIDDEN_IN_ORIGIN = ("../", "/nfs/", "index id", "find_string", "read_file", "indexed text", "code index")


class ListingError(Exception):
    """The listing or SOURCE.md cannot be turned into a snapshot that reproduces it."""


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
    """Rows and totals of a `# 权重统计` listing.

    Returns:
        `(rows, totals)`: each row `{"name", "shape", "dtype" (safetensors name), "file", "count"}` where `count` is
        the product of the row's `(×N ...)` annotations (None when it has none); totals has `tensors`, `params`,
        `files` and `rows` (the compressed row count) where the listing states them.

    Raises:
        ListingError: a table row that does not parse, or a dtype with no safetensors name.
    """
    rows, totals = [], {}
    for line in text.splitlines():
        for key, pattern in (("tensors", r"权重张量数\*\*: ([\d,]+)"), ("params", r"参数总量\*\*: ([\d,]+)"),
                             ("files", r"权重文件\*\*: ([\d,]+)"), ("rows", r"压缩\*\*: [\d,]+ → ([\d,]+)")):
            m = re.search(pattern, line)
            if m:
                totals[key] = int(m.group(1).replace(",", ""))
        line = line.strip()
        if not line.startswith("| `"):
            continue
        m = ROW.match(line)
        if not m:
            raise ListingError(f"table row not understood: {line}")
        if m.group("dtype") not in TORCH_TO_SAFETENSORS:
            raise ListingError(f"dtype {m.group('dtype')} has no safetensors name: {line}")
        counts = COUNT.findall(m.group("counts") or "")
        shape = [int(x) for x in m.group("shape").split(",") if x.strip()]
        rows.append({"name": m.group("name"), "shape": shape, "dtype": TORCH_TO_SAFETENSORS[m.group("dtype")],
                     "file": m.group("file").strip(), "count": math.prod(int(c) for c in counts) if counts else None})
    return rows, totals


def build_tensors(rows: list[dict], totals: dict) -> list[CheckpointTensor]:
    """Expand the rows into one `CheckpointTensor` per tensor, in (file, name) order.

    Raises:
        ListingError: a row expands to another number of tensors than its `(×N ...)` annotation says.
    """
    fixed, multi = [], []
    for row in rows:
        names = expand_name(row["name"])
        if row["count"] is not None and len(names) != row["count"]:
            raise ListingError(f"{row['name']} expands to {len(names)} tensors, the listing says {row['count']}")
        for name, idx in names:
            entry = (name, idx, row["dtype"], tuple(row["shape"]))
            (multi if row["file"] == "Multi Files" else fixed).append((entry, row["file"]))
    files = sorted({f for _, f in fixed})
    n_files = totals.get("files", len(files) or 1)
    template = next((f for f in files), "model-00001-of-00001.safetensors")
    m = SHARD_NAME.match(template)

    # Shards are numbered 1..N of N, except where the named ones show 0..N-1 (gpt-oss: model-00000-of-00002 is the
    # first of 3 files); the "-of-" total is kept as the real names write it.
    first = 0 if m and int(m.group(3)) == n_files - 1 else 1

    def file_name(i: int) -> str:
        if not m:
            return template
        return f"{m.group(1)}{i - 1 + first:0{len(m.group(2))}d}-of-{m.group(3)}{m.group(4)}"

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


def check_totals(tensors: list[CheckpointTensor], rows: list[dict], totals: dict) -> None:
    """Raise `ListingError` unless the expansion reproduces every total the listing states."""
    n_params = sum(math.prod(t.shape) for t in tensors)
    got = {"tensors": len(tensors), "params": n_params, "rows": len(rows)}
    if "files" in totals and any(t.file for t in tensors):
        got["files"] = len({t.file for t in tensors})
    wrong = {k: (v, totals[k]) for k, v in got.items() if k in totals and totals[k] != v}
    if wrong:
        raise ListingError("expansion mismatch (got, listing): " + ", ".join(f"{k} {a:,} vs {b:,}"
                                                                             for k, (a, b) in wrong.items()))


# --- SOURCE.md ------------------------------------------------------------------------------------------------------

def parse_source_md(text: str) -> dict:
    """The facts of a SOURCE.md: `hub_id`, `hub_note`, `copy`, `cross_checks` (list) and `sha256` ({file: hex})."""
    facts: dict = {"cross_checks": [], "sha256": {}}
    section = None
    for line in text.splitlines():
        top = re.match(r"^- ([^:]+):\s*(.*)$", line)
        sub = re.match(r"^\s+- (.*)$", line)
        if top:
            key, value = top.group(1).strip(), top.group(2).strip()
            section = key
            if key == "Hub repo id":
                m = re.match(r"^`?([\w.-]+/[\w.-]+)(?: \((.*)\))?`?$", value)
                if not m:
                    raise ListingError(f"SOURCE.md: Hub repo id not understood: {value}")
                facts["hub_id"], facts["hub_note"] = m.group(1), m.group(2)
            elif key == "Copy found at":
                facts["copy"] = value
        elif sub and section == "Cross-checks":
            facts["cross_checks"].append(sub.group(1).strip())
        elif sub and section == "Files (sha256)":
            m = re.match(r"^`([^`]+)` ([0-9a-f]{64})$", sub.group(1).strip())
            if m:
                facts["sha256"][m.group(1)] = m.group(2)
    for key in ("hub_id", "copy"):
        if key not in facts:
            raise ListingError(f"SOURCE.md has no '{key}' entry")
    return facts


def world_text(text: str, siblings: dict[str, str]) -> str:
    """SOURCE.md prose as provenance in the world: no local paths of the collector, no pointers to sibling directories
    (`../NAME` becomes that model's Hub id), no search-tool ids, no markdown backticks."""
    text = re.sub(r"\s*\([^()]*(?:index ids?|find_string|/nfs/)[^()]*\)", "", text)
    text = re.sub(r"Extraction: .*?i\.e\. the raw file text\.",
                  "Taken from the report's raw config.json block (that repo's scripts/model_inspector.py, same commit, "
                  "embeds the file's text).", text)
    text = re.sub(r"\s*Transcribed from the indexed text[^.]*\.", "", text)
    text = re.sub(r"\s*(?:Copied with )?`?git show`?(?: \(byte-exact\))?\.", "", text)
    text = text.replace("in the code index", "in public code").replace("tensors.md", "the tensor listing")
    text = re.sub(r"\s*It is deliberately NOT named `?config\.json`?\.", "", text)
    text = re.sub(r"\.\./([\w.-]+)", lambda m: siblings.get(m.group(1), m.group(1)), text)
    text = text.replace("`", "")
    return re.sub(r"\s+", " ", text).strip()


def brief(item: str, limit: int = 300) -> str:
    """A cross-check in brief: whole when short, else up to its first `.` or `;` outside parentheses."""
    if len(item) > limit:
        depth = 0
        for i, ch in enumerate(item):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and ch in ".;" and i >= 40 and (i + 1 == len(item) or item[i + 1] == " "):
                item = item[:i]
                break
    return item.rstrip(".;")


def sibling_hub_ids(model_dir: Path) -> dict[str, str]:
    out = {}
    for source_md in model_dir.parent.glob("*/SOURCE.md"):
        m = re.search(r"^- Hub repo id: `?([\w.-]+/[\w.-]+)", source_md.read_text(), re.M)
        if m:
            out[source_md.parent.name] = m.group(1)
    return out


def build_origin(facts: dict, config_name: str, config_sha: str, siblings: dict[str, str],
                 listing: str | None) -> str:
    note = facts.get("hub_note")
    hub = facts["hub_id"] + (f" ({note})" if note and "NOT found" not in note else "")
    what = "config.json" if config_name == "config.json" else f"config ({config_name}, not the verbatim Hub file)"
    parts = [f"Hub repo {hub}; Hub revision not recorded.",
             f"{what}, sha256 {config_sha}: {world_text(facts['copy'], siblings)}"]
    checks = [brief(world_text(c, siblings)) for c in facts["cross_checks"]]
    if checks:
        parts.append("Cross-checks: " + "; ".join(checks) + ".")
    if listing:
        parts.append(listing)
    origin = " ".join(parts)
    bad = [w for w in FORBIDDEN_IN_ORIGIN if w in origin]
    if bad:
        raise ListingError(f"origin still names {bad}: {origin}")
    return origin


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="directory holding config.json, SOURCE.md and tensors.md")
    parser.add_argument("repo_id", help="the model's Hub repo id, e.g. Qwen/Qwen3-VL-30B-A3B-Instruct")
    parser.add_argument("output", type=Path, help="snapshot file to write (.json or .json.gz)")
    parser.add_argument("--config", default="config.json", help="config file name inside model_dir")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ListingError, OSError, json.JSONDecodeError) as e:
        print(f"error: {args.model_dir}: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    model_dir = args.model_dir
    config_bytes = (model_dir / args.config).read_bytes()
    config = json.loads(config_bytes)
    config_sha = hashlib.sha256(config_bytes).hexdigest()
    facts = parse_source_md((model_dir / "SOURCE.md").read_text())
    if facts["hub_id"] != args.repo_id:
        raise ListingError(f"SOURCE.md names Hub repo {facts['hub_id']}, not {args.repo_id}")
    recorded_sha = facts["sha256"].get(args.config)
    if recorded_sha != config_sha:
        raise ListingError(f"{args.config} has sha256 {config_sha}, SOURCE.md records {recorded_sha}")

    tensors, listing_origin = None, None
    listing = model_dir / "tensors.md"
    if listing.is_file():
        text = listing.read_text()
        report = REPORT.search(text)
        if not report:
            raise ListingError("tensors.md does not name its report ('of OWNER/REPO PATH @ COMMIT')")
        rows, totals = parse_listing(text)
        tensors = build_tensors(rows, totals)
        check_totals(tensors, rows, totals)
        n_params = sum(math.prod(t.shape) for t in tensors)
        listing_origin = (
            f"Tensor table: {len(tensors):,} tensors, {n_params:,} parameters, expanded by scripts/import_listing.py "
            f"from the compressed tensor listing in {report['repo']}@{report['commit']} {report['path']} (that repo's "
            "scripts/model_inspector.py reads the safetensors headers of a real download of the model); names, dtypes "
            "and shapes are the headers', shard files of rows marked 'Multi Files' are reconstructed by bytes, not the "
            "real assignment.")
    else:
        listing_origin = "No tensor listing: config only."
    origin = build_origin(facts, args.config, config_sha, sibling_hub_ids(model_dir), listing_origin)

    recorded_at = None
    if args.output.is_file():
        raw = args.output.read_bytes()
        recorded_at = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["source"].get("recorded_at")
    source = ModelSource(ref=args.repo_id, kind="snapshot", config=config, tensors=tuple(tensors) if tensors else None,
                         repo_id=args.repo_id, revision=None, commit=None)
    write_snapshot(source, args.output, origin=origin, recorded_by="scripts/import_listing.py",
                   recorded_at=recorded_at)
    print(f"{args.output}: {len(tensors) if tensors else 0} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
