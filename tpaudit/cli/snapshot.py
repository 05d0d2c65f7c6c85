"""`tpaudit snapshot`: record a model's metadata (config, tensor table, repo, resolved commit) into one file."""

from __future__ import annotations

from typing import Annotated

import typer

from ._options import ModelArg, RevisionOpt, TokenOpt

SNAPSHOT_EXAMPLES = [
    "tpaudit snapshot Qwen/Qwen3-VL-30B-A3B-Instruct -o qwen3-vl.snapshot.json.gz",
    "tpaudit check qwen3-vl.snapshot.json.gz --tp 4          # offline, reproducible",
]


def snapshot(
    model: ModelArg,
    output: Annotated[str, typer.Option("--output", "-o", help="File to write (.json, or .json.gz to compress).")],
    revision: RevisionOpt = None,
    token: TokenOpt = None,
) -> int:
    """Record config.json and the safetensors headers (never weights) into a snapshot file for offline checks."""
    import sys

    from .. import __version__
    from ..sources import open_source
    from ..sources.snapshot import write_snapshot
    from ..units import format_bytes

    source = open_source(model, revision=revision, token=token, progress=sys.stderr.isatty())
    where = f"{source.repo_id}@{source.commit}" if source.repo_id and source.commit else source.ref
    path = write_snapshot(source, output, origin=f"recorded by tpaudit {__version__} from {where} ({source.kind})",
                          recorded_by=f"tpaudit {__version__}")
    tensors = "config only" if source.tensors is None else \
        f"{len(source.tensors)} tensors ({format_bytes(source.checkpoint_bytes)} of weights, headers only)"
    print(f"wrote {path}: {where}, {tensors}")
    return 0
