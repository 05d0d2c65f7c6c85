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
    from ..model import SAFETENSORS_DTYPE_BYTES

    out: list[CheckpointTensor] = []
    for filename in sorted(metadata.files_metadata):
        file_meta = metadata.files_metadata[filename]
        items = sorted(file_meta.tensors.items(), key=lambda kv: tuple(kv[1].data_offsets))
        for name, info in items:
            if info.dtype not in SAFETENSORS_DTYPE_BYTES:
                raise CheckpointError(
                    f"{filename}: tensor {name} has dtype {info.dtype!r}, which safetensors does not define. "
                    "The header is corrupt or from a newer format; re-download the shard",
                    path=filename,
                )
            out.append(CheckpointTensor(name=name, dtype=info.dtype, shape=tuple(int(x) for x in info.shape),
                                        file=filename))
    return tuple(out)


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
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read the safetensors headers in {path}: {e}. Check the files",
                                  path=str(path)) from None
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
    for shard in sorted(set(weight_map.values())):
        if os.sep in shard or shard.startswith(".."):
            raise CheckpointError(f"{index} names shard {shard!r} outside the model directory", path=str(index))
        if not (directory / shard).is_file():
            raise CheckpointError(
                f"{directory} is incomplete: the index lists {shard}, which is missing. Download the snapshot "
                "again or pass the Hub id",
                path=str(directory / shard),
            )
