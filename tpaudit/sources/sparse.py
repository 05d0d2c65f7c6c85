"""Write a checkpoint whose safetensors files carry real headers and a sparse data region.

Each shard is `8-byte header length + JSON header + data`, exactly as safetensors lays it out, but the data region is
a hole (`truncate` past the header): the file has its true size, reads as zeros and takes almost no disk. Loaders,
`safetensors.safe_open` and `huggingface_hub.get_local_safetensors_metadata` accept it. `tpaudit verify
--zero-weights` loads such a checkpoint to confirm a full-size model's shard sizes without downloading weights, and
the tests serve such files from a loopback Hub.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from ..model import CheckpointTensor, ModelSource

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # what `save_pretrained` uses by default ("5GB")
INDEX_NAME = "model.safetensors.index.json"


def header_bytes(tensors: list[CheckpointTensor], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """The safetensors header for `tensors` laid out in order, and the length of their data region in bytes.

    Returns:
        `(8-byte little-endian length + JSON padded with spaces to a multiple of 8, data length)`.
    """
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def _shard_plan(tensors: tuple[CheckpointTensor, ...], max_shard_bytes: int) -> list[tuple[str, list[CheckpointTensor]]]:
    """Keep the recorded shard files when every tensor has one; else pack in order into shards of at most
    `max_shard_bytes` (a tensor larger than that gets a shard of its own)."""
    if tensors and all(t.file for t in tensors):
        by_file: dict[str, list[CheckpointTensor]] = {}
        for t in tensors:
            by_file.setdefault(t.file, []).append(t)
        return sorted(by_file.items())
    groups: list[list[CheckpointTensor]] = []
    current: list[CheckpointTensor] = []
    size = 0
    for t in tensors:
        if current and size + t.nbytes > max_shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current:
        groups.append(current)
    n = len(groups)
    return [(f"model-{i:05d}-of-{n:05d}.safetensors", g) for i, g in enumerate(groups, 1)]


def write_sparse_checkpoint(source: ModelSource, directory: str | os.PathLike, *,
                            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[Path]:
    """Write `config.json`, sparse safetensors shards and `model.safetensors.index.json` for `source`.

    Args:
        source (`ModelSource`): must carry a tensor table (`source.tensors` not `None`).
        directory (`str` or `Path`): created if missing.
        max_shard_bytes (`int`, *optional*, defaults to 5e9): shard size when the source records no shard files.

    Returns:
        The shard paths written.

    Raises:
        ValueError: `source` is config-only.
        OSError: the directory or files cannot be written (the disk must allow sparse files for this to be cheap).
    """
    if source.tensors is None:
        raise ValueError(f"{source.ref} has no tensor table: a sparse checkpoint needs the checkpoint's headers")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(source.config, indent=2) + "\n", encoding="utf-8")
    weight_map: dict[str, str] = {}
    total = 0
    paths = []
    for filename, tensors in _shard_plan(source.tensors, max_shard_bytes):
        head, data_len = header_bytes(tensors)
        path = out / filename
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(len(head) + data_len)  # a hole: reads as zeros, allocates no blocks
        for t in tensors:
            weight_map[t.name] = filename
        total += data_len
        paths.append(path)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return paths
