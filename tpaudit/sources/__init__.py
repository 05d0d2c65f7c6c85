"""Sources: turn the MODEL argument into a `ModelSource` (config + checkpoint tensor table, never weights).

A reference is recognised without guessing:

- an existing directory, or an existing `config.json` file         -> local   (`sources/local.py`)
- an existing file whose JSON has `"schema": "tpaudit/snapshot/v1"` -> snapshot (`sources/snapshot.py`)
- `org/name` that is not an existing path                          -> Hub      (`sources/hub.py`)
- anything else                                                    -> `ModelReferenceError` (exit 2)

Every source returns the same `ModelSource`, so the later stages never know where the metadata came from.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelReferenceError
from ..model import ModelSource

# Hub repo ids: `org/name`, each part letters, digits, `-`, `_`, `.` (huggingface_hub's validate_repo_id rules).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")


def classify_reference(ref: str) -> str:
    """Return `"local"`, `"snapshot"` or `"hub"` for a MODEL argument.

    Raises:
        ModelReferenceError: `ref` is none of these (a path that does not exist and is not `org/name`).
    """
    import errno
    import os
    import stat

    from .snapshot import looks_like_snapshot

    if not ref or not ref.strip():
        raise ModelReferenceError("the model reference is empty. Pass a model directory, a snapshot file or a Hub id",
                                  ref=ref)
    path = Path(ref)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        mode = None
        if e.errno == errno.ENAMETOOLONG:
            raise ModelReferenceError(f"{ref[:120]}... is longer than a path may be here ({e.strerror}). Pass a "
                                      "shorter path (a relative one, or a symlink to the model)", ref=ref) from None
        if os.path.lexists(path):  # a dangling symlink, a loop, or a path we may not read
            raise ModelReferenceError(f"{ref} cannot be opened: {e.strerror or e}. Pass a readable model directory "
                                      "or file", ref=ref) from None
    if mode is not None and not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise ModelReferenceError(f"{ref} is neither a directory nor a regular file. Pass a model directory, a "
                                  "snapshot file or a Hub id", ref=ref)
    if path.is_dir():
        return "local"
    if path.is_file():
        if looks_like_snapshot(path):
            return "snapshot"
        if path.suffix == ".json" and not path.name.endswith(".safetensors.index.json"):
            return "local"
        raise ModelReferenceError(
            f"{ref} is a file but neither a tpaudit snapshot nor a config.json. Pass the model directory, a "
            "snapshot recorded with 'tpaudit snapshot', or a Hub id such as Qwen/Qwen3-VL-30B-A3B-Instruct",
            ref=ref,
        )
    if _HUB_ID.match(ref) and ".." not in ref and not ref.endswith(".json") and not ref.endswith(".gz"):
        org = ref.split("/", 1)[0]
        if os.path.isdir(org):  # `fixtures/nope`: a mistyped local path, not a Hub id
            raise ModelReferenceError(
                f"{ref} does not exist: {org}/ is a local directory here, so {ref} names a local path, not a Hub "
                f"repo. Check the path (to read the Hub repo {ref}, run tpaudit from a directory without {org}/)",
                ref=ref)
        return "hub"
    raise ModelReferenceError(
        f"{ref} does not exist and is not a Hub id (org/name). Pass an existing model directory, a snapshot file, "
        "or a Hub id such as Qwen/Qwen3-VL-30B-A3B-Instruct",
        ref=ref,
    )


def open_source(ref: str, *, revision: str | None = None, token: str | None = None,
                progress: bool = False) -> ModelSource:
    """Read MODEL's config and checkpoint metadata from wherever `ref` points.

    Args:
        ref (`str`): a local directory or `config.json`, a snapshot file, or a Hub id.
        revision (`str`, *optional*): Hub only: branch, tag or commit (default: the repo's default branch).
        token (`str`, *optional*): Hub only: an access token (default: `HF_TOKEN` or the stored login).
        progress (`bool`, *optional*, defaults to `False`): Hub only: show a progress bar on header fetches.

    Returns:
        `ModelSource`.

    Raises:
        ModelReferenceError: `ref` is not recognised.
        UsageError: `revision` given for a local path or snapshot.
        ConfigError, CheckpointError, SnapshotError, HubError: see each source.
    """
    kind = classify_reference(ref)
    if kind != "hub" and revision is not None:
        from ..errors import UsageError

        raise UsageError(f"--revision {revision} applies to Hub ids only, and {ref} is a local {kind}. Drop "
                         "--revision or pass the Hub id")
    if kind == "local":
        from .local import load_local

        return load_local(ref)
    if kind == "snapshot":
        from .snapshot import load_snapshot

        return load_snapshot(ref)
    from .hub import load_hub

    return load_hub(ref, revision=revision, token=token, progress=progress)
