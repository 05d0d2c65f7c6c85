"""Local source: a model directory (`config.json`, with or without safetensors files), or a bare `config.json`.

Only headers are read: `safetensors_header.read_local_header` reads the 8-byte length and the JSON header of each
shard and never touches tensor data, so a 600 GB checkpoint costs a few MB of reads.

The checkpoint is the one `from_pretrained` loads (transformers 5.23 `modeling_utils._get_resolved_checkpoint_files`):
`model.safetensors` when it is there, even beside an index (a stale index is then ignored, with a note), else
`model.safetensors.index.json` and the shards its `weight_map` names. Symlinks are followed, as in the Hugging Face
cache (`models--ORG--NAME/snapshots/SHA/`, whose files link into `../../blobs/`), so a cache snapshot checks exactly
like the same files copied; an index entry whose *name* leaves the directory (`../x`, an absolute path) is refused.
Whatever stands where a file must be and is not a readable regular file (a dangling symlink left by an interrupted
download, a directory, FIFO, socket, device, symlink loop) is an input error naming it, never "config only".
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError, ConfigError
from ..model import CheckpointTensor, ModelSource, checkpoint_tensors
from .files import CONFIG_MAX_BYTES, INDEX_MAX_BYTES, JSON_MAX_DEPTH, load_json, read_capped

CONFIG_NAME = "config.json"
SAFETENSORS_SINGLE_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
_NON_SAFETENSORS_WEIGHTS = (".bin", ".pth", ".pt", ".ckpt", ".gguf")


def read_config(path: Path) -> dict:
    """Parse a `config.json`: a regular file of at most `CONFIG_MAX_BYTES`, strict UTF-8 JSON, one object.

    Raises:
        ConfigError: the file is missing, a dangling symlink, not a regular file (directory, FIFO, device), over the
            size cap, not UTF-8 JSON, nested too deeply, or not a JSON object.
    """
    path = Path(path)

    def error(message: str) -> ConfigError:
        return ConfigError(message, path=str(path))

    if not os.path.lexists(path):
        raise ConfigError(
            f"{path.parent} has no {path.name}: a model directory needs the config.json it was saved with. "
            "Pass the directory that from_pretrained would load",
            path=str(path),
        )
    raw = read_capped(path, "config.json", CONFIG_MAX_BYTES, error)
    config = load_json(raw, "config.json", str(path), error, max_depth=JSON_MAX_DEPTH)
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object. A config.json holds one object of settings", path=str(path))
    return config


def tensors_from_headers(headers: list[tuple[str, list]], advice: str = "download it again"
                         ) -> tuple[CheckpointTensor, ...]:
    """Flatten validated headers into tensors, shard by shard in file-name order, each shard's tensors in
    data-offset order (the order of the bytes on disk).

    Args:
        headers (`list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]]`): `(shard file name, entries)` as
            `safetensors_header.read_local_header` / `parse_header` return them.
        advice (`str`, *optional*): what a message tells the user to do about a corrupt checkpoint.

    Returns:
        `tuple[CheckpointTensor, ...]`.

    Raises:
        CheckpointError: two shards hold a tensor of the same name (a loader would keep one of them silently).
    """
    headers = sorted(headers, key=lambda h: h[0])
    total = sum(len(entries) for _, entries in headers)
    if len({name for _, entries in headers for name, _, _ in entries}) != total:
        seen: dict[str, str] = {}
        for filename, entries in headers:
            for name, _, _ in entries:
                if name in seen:
                    raise CheckpointError(f"tensor {name[:80]!r} is in both {seen[name]} and {filename}, and a loader "
                                          f"keeps one of them silently. The checkpoint is corrupt; {advice}",
                                          path=filename, tensor=name)
                seen[name] = filename
    rows = [(name, dtype, shape, filename) for filename, entries in headers for name, dtype, shape in entries]
    return checkpoint_tensors(*zip(*rows)) if rows else ()


def _has_other_weights(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in directory.iterdir() if p.suffix in _NON_SAFETENSORS_WEIGHTS)
    except OSError:
        return []


def _stray_shards(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in directory.iterdir() if p.name.endswith(".safetensors"))
    except OSError:
        return []


def load_local(ref: str) -> ModelSource:
    """Read a local model directory or a bare `config.json` file.

    A directory with `model.safetensors` or `model.safetensors.index.json` gives the checkpoint's tensor table (headers
    only, every one validated as safetensors would). A directory without either (config only, or `.bin`/`.pth`
    weights, which cannot be listed without unpickling them) gives a config-only source with a note saying so.

    Args:
        ref (`str`): an existing directory or `config.json` path.

    Returns:
        `ModelSource` of kind `"local"`.

    Raises:
        ConfigError: `config.json` is missing, unreadable, not a regular file, or malformed.
        CheckpointError: `model.safetensors`, the index or a shard it names is not a readable regular file (dangling
            symlink, directory, FIFO, device, loop), the index names a shard outside the directory, or a header is
            truncated or malformed (naming the file and tensor).
    """
    from .safetensors_header import read_local_header

    path = Path(ref)
    if path.is_file():
        config = read_config(path)
        return ModelSource(ref=ref, kind="local", config=config, tensors=None, config_path=str(path),
                           config_dir=str(path.parent),
                           notes=("config only: shapes come from the model built on the meta device and bytes from "
                                  "the config's dtype",))

    config_path = path / CONFIG_NAME
    if not os.path.lexists(config_path) and (path / "snapshots").is_dir():
        _refuse_cache_repo_folder(path)
    config = read_config(config_path)
    notes: list[str] = []
    tensors = None
    single = path / SAFETENSORS_SINGLE_FILE
    index = path / SAFETENSORS_INDEX_FILE
    if os.path.lexists(single):  # transformers loads model.safetensors first, whatever an index says
        tensors = tensors_from_headers([(SAFETENSORS_SINGLE_FILE, read_local_header(single))])
        if os.path.lexists(index):
            notes.append(f"{SAFETENSORS_SINGLE_FILE} is read and {SAFETENSORS_INDEX_FILE} ignored, as "
                         "from_pretrained does when both are present")
    elif os.path.lexists(index):
        shards, weight_map = _read_index(index, path)
        headers = [(shard, read_local_header(path / shard)) for shard in shards]
        tensors = tensors_from_headers(headers)  # a tensor in two shards first: the more specific fault
        check_index_entries(weight_map, headers, str(index))
    else:
        others = _has_other_weights(path)
        stray = _stray_shards(path)
        if stray:
            notes.append(f"config only: {path} holds {', '.join(stray[:3])}{' ...' if len(stray) > 3 else ''} but "
                         f"neither {SAFETENSORS_SINGLE_FILE} nor {SAFETENSORS_INDEX_FILE}, so from_pretrained would "
                         "not load them; shapes come from the meta model and bytes from the config's dtype")
        elif others:
            notes.append(f"config only: {path} holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, "
                         "which cannot be listed without unpickling; shapes come from the meta model and bytes from "
                         "the config's dtype")
        else:
            notes.append("config only: no safetensors checkpoint, so shapes come from the model built on the meta "
                         "device and bytes from the config's dtype")
    return ModelSource(ref=ref, kind="local", config=config, tensors=tensors, config_path=str(config_path),
                       config_dir=str(path), notes=tuple(notes))


def _refuse_cache_repo_folder(path: Path) -> None:
    """`models--ORG--NAME/` of the Hugging Face cache holds `snapshots/<commit>/`, not the files: say which to pass."""
    commit = None
    try:
        commit = (path / "refs" / "main").read_text(encoding="utf-8").strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        pass
    target = path / "snapshots" / commit if commit and (path / "snapshots" / commit).is_dir() else \
        path / "snapshots" / "<commit>"
    raise ConfigError(f"{path} is a Hugging Face cache folder, not a model directory: the files are in "
                      f"snapshots/<commit>/. Pass {target}", path=str(path / CONFIG_NAME))


def check_shard_name(shard: object, index: str) -> str:
    """A shard name from an index's `weight_map`, refused when it is not a relative path inside the directory.

    The test is on the name, not on where a symlink leads: the Hugging Face cache links every shard into
    `../../blobs/`, and that is fine; `../x`, `/etc/x` or `C:\\x` are not.

    Raises:
        CheckpointError: empty, absolute, with a `..` component, a backslash or a NUL byte.
    """
    if not isinstance(shard, str) or not shard:
        raise CheckpointError(f"{index} maps a tensor to shard {shard!r}, which is not a file name. Fix the index",
                              path=index)
    parts = PurePosixPath(shard).parts
    if os.path.isabs(shard) or shard.startswith("/") or ".." in parts or "\\" in shard or "\0" in shard or \
            (len(shard) > 1 and shard[1] == ":"):
        raise CheckpointError(f"{index} names shard {shard[:120]!r} outside the model directory. Fix the index: "
                              "shard names are relative to it", path=index)
    return shard


def check_index_entries(weight_map: dict[str, str], headers: list[tuple[str, list]], index: str,
                        advice: str = "the checkpoint is corrupt; download it again") -> None:
    """Every tensor an index's `weight_map` names must be in the header of the shard it names: the loader reads the
    checkpoint through the index (`from_pretrained` opens each named tensor in its shard), so an entry whose tensor
    is not there fails the load, and an index that maps only such tensors would otherwise audit an empty checkpoint.

    Args:
        weight_map (`dict[str, str]`): tensor name -> shard file, as in the index.
        headers (`list[tuple[str, list]]`): `(shard file name, entries)` of every shard the index names.
        index (`str`): the index, for the message.
        advice (`str`, *optional*): what to do about it.

    Raises:
        CheckpointError: naming the first tensor missing from its shard, and how many are.
    """
    held = {shard: {name for name, _, _ in entries} for shard, entries in headers}
    missing = [(name, shard) for name, shard in weight_map.items() if name not in held.get(shard, ())]
    if missing:
        name, shard = missing[0]
        more = f" (and {len(missing) - 1:,} more of the index's {len(weight_map):,} entries)" if len(missing) > 1 \
            else ""
        raise CheckpointError(f"{index} maps tensor {name[:120]!r} to {shard}, whose header does not hold it{more}: "
                              f"from_pretrained would fail to load it. {advice[:1].upper()}{advice[1:]}",
                              path=index, tensor=name)


def _read_index(index: Path, directory: Path) -> tuple[list[str], dict[str, str]]:
    """The shard names of `model.safetensors.index.json`, each checked to name a file inside `directory`, and its
    `weight_map`."""
    def error(message: str) -> CheckpointError:
        return CheckpointError(message, path=str(index))

    raw = read_capped(index, "safetensors index", INDEX_MAX_BYTES, error)
    data = load_json(raw, "safetensors index", str(index), error)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no weight_map of tensor name -> shard file. Download it again",
                              path=str(index))
    for value in weight_map.values():
        if not isinstance(value, str):
            check_shard_name(value, str(index))  # raises, naming the value
    shards = sorted({check_shard_name(v, str(index)) for v in set(weight_map.values())})
    for shard in shards:
        if not os.path.lexists(directory / shard):
            raise CheckpointError(
                f"{directory} is incomplete: the index lists {shard}, which is missing. Download the snapshot "
                "again or pass the Hub id",
                path=str(directory / shard),
            )
    return shards, weight_map
