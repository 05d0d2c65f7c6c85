"""Local source: a model directory (`config.json`, with or without safetensors files), or a bare `config.json`.

Only headers are read: `huggingface_hub.get_local_safetensors_metadata` reads the 8-byte length and the JSON header of
each shard and never touches tensor data, so a 600 GB checkpoint costs a few MB of reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..model import CheckpointTensor, ModelSource

CONFIG_NAME = "config.json"
SAFETENSORS_SINGLE_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
_NON_SAFETENSORS_WEIGHTS = (".bin", ".pth", ".pt", ".ckpt", ".gguf")


def read_config(path: Path) -> dict:
    """Parse a `config.json`.

    Raises:
        ConfigError: the file is missing, unreadable, not JSON, or not a JSON object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path.parent} has no {path.name}: a model directory needs the config.json it was saved with. "
            "Pass the directory that from_pretrained would load",
            path=str(path),
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}. Check the file's permissions and encoding", path=str(path)) from None
    try:
        config = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path} nests JSON too deeply to be a config.json. Fix the file", path=str(path)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. Fix the file or download it again",
            path=str(path),
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object. A config.json holds one object of settings", path=str(path))
    return config


def tensors_from_safetensors_metadata(metadata) -> tuple[CheckpointTensor, ...]:
    """Flatten a `huggingface_hub.SafetensorsRepoMetadata` into tensors, shard by shard in file-name order, each
    shard's tensors in data-offset order (the order of the bytes on disk).

    Args:
        metadata (`SafetensorsRepoMetadata`): from `get_local_safetensors_metadata` or `HfApi.get_safetensors_metadata`.

    Raises:
        CheckpointError: a header lists a dtype the safetensors format does not define.
    """
    out: list[CheckpointTensor] = []
    for filename in sorted(metadata.files_metadata):
        file_meta = metadata.files_metadata[filename]
        tensors = getattr(file_meta, "tensors", None)
        if not isinstance(tensors, dict):
            raise CheckpointError(f"{filename}: the safetensors header is not a JSON object of tensors. The shard is "
                                  "corrupt; re-download it", path=filename)
        entries = [_checked_entry(filename, name, info) for name, info in tensors.items()]
        for _, name, dtype, shape in sorted(entries, key=lambda e: e[0]):
            out.append(CheckpointTensor(name=name, dtype=dtype, shape=shape, file=filename))
    return tuple(out)


def _checked_entry(filename: str, name, info) -> tuple[int, str, str, tuple[int, ...]]:
    """`(data start, name, dtype, shape)` of one header entry, or `CheckpointError` naming what is malformed."""
    from ..model import SAFETENSORS_DTYPE_BYTES

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{filename}: tensor {str(name)[:80]!r} has {what} in its safetensors header. The shard "
                               "is corrupt or was not written by safetensors; re-download it", path=filename)

    dtype = getattr(info, "dtype", None)
    shape = getattr(info, "shape", None)
    offsets = getattr(info, "data_offsets", None)
    if not isinstance(name, str):
        raise bad("a non-string name")
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        raise bad(f"dtype {dtype!r}, which safetensors does not define")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                       for d in shape):
        raise bad(f"shape {str(shape)[:60]}, not a list of non-negative integers")
    if not (isinstance(offsets, (list, tuple)) and len(offsets) == 2 and all(isinstance(o, int) and
                                                                          not isinstance(o, bool) for o in offsets)):
        raise bad(f"data_offsets {str(offsets)[:60]}, not two integers")
    return offsets[0], name, dtype, tuple(shape)


def _has_other_weights(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix in _NON_SAFETENSORS_WEIGHTS)


def load_local(ref: str) -> ModelSource:
    """Read a local model directory or a bare `config.json` file.

    A directory with `model.safetensors` or `model.safetensors.index.json` gives the checkpoint's tensor table (headers
    only). A directory without safetensors (config only, or `.bin`/`.pth` weights, which cannot be listed without
    unpickling them) gives a config-only source with a note saying so.

    Args:
        ref (`str`): an existing directory or `config.json` path.

    Returns:
        `ModelSource` of kind `"local"`.

    Raises:
        ConfigError: `config.json` is missing or malformed.
        CheckpointError: the index lists a shard that is missing, or a header is truncated or malformed.
    """
    from huggingface_hub import get_local_safetensors_metadata
    from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError

    path = Path(ref)
    if path.is_file():
        config = read_config(path)
        return ModelSource(ref=ref, kind="local", config=config, tensors=None, config_path=str(path),
                           config_dir=str(path.parent),
                           notes=("config only: shapes come from the model built on the meta device and bytes from "
                                  "the config's dtype",))

    config_path = path / CONFIG_NAME
    config = read_config(config_path)
    notes: list[str] = []
    tensors = None
    has_safetensors = (path / SAFETENSORS_INDEX_FILE).is_file() or (path / SAFETENSORS_SINGLE_FILE).is_file()
    if has_safetensors:
        index = path / SAFETENSORS_INDEX_FILE
        if index.is_file():
            _check_index(index, path)
        try:
            metadata = get_local_safetensors_metadata(path)
        except SafetensorsParsingError as e:
            raise CheckpointError(f"{path}: {str(e).rstrip('.')}. Re-download the shard: tpaudit reads only its header",
                                  path=str(path)) from None
        except NotASafetensorsRepoError as e:  # pragma: no cover - guarded by has_safetensors
            raise CheckpointError(str(e), path=str(path)) from None
        except OSError as e:
            raise CheckpointError(f"cannot read the safetensors headers in {path}: {e}. Check the files",
                                  path=str(path)) from None
        except Exception as e:  # noqa: BLE001 - a header of the wrong JSON shape breaks the parser in many ways
            raise CheckpointError(f"{path}: a safetensors header is malformed ({type(e).__name__}: {e}). Re-download "
                                  "the shard: tpaudit reads only its header", path=str(path)) from None
        tensors = tensors_from_safetensors_metadata(metadata)
    else:
        others = _has_other_weights(path)
        if others:
            notes.append(f"config only: {path} holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, "
                         "which cannot be listed without unpickling; shapes come from the meta model and bytes from "
                         "the config's dtype")
        else:
            notes.append("config only: no safetensors checkpoint, so shapes come from the model built on the meta "
                         "device and bytes from the config's dtype")
    return ModelSource(ref=ref, kind="local", config=config, tensors=tensors, config_path=str(config_path),
                       config_dir=str(path), notes=tuple(notes))


def _check_index(index: Path, directory: Path) -> None:
    """Fail early, with the file name, when the index is malformed or names a shard that is not there."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index} is not a readable JSON index: {e}. Download it again",
                              path=str(index)) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index} has no weight_map of tensor name -> shard file. Download it again",
                              path=str(index))
    root = directory.resolve()
    for shard in sorted(set(weight_map.values())):
        target = (directory / shard).resolve()
        if not shard or os.path.isabs(shard) or root not in target.parents:
            raise CheckpointError(f"{index} names shard {shard!r} outside the model directory. Fix the index",
                                  path=str(index))
        if not (directory / shard).is_file():
            raise CheckpointError(
                f"{directory} is incomplete: the index lists {shard}, which is missing. Download the snapshot "
                "again or pass the Hub id",
                path=str(directory / shard),
            )
