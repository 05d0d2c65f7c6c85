"""The Python API: `tpaudit.check(...)` returns the same `Report` the CLI renders. No printing, no `sys.exit`;
failures are exceptions from `tpaudit.errors` with their facts as attributes."""

from __future__ import annotations

import json
import os
from typing import Any

from .checks.registry import CheckOptions
from .errors import UsageError
from .model import ModelSource, Report


def _source_from_config(config) -> ModelSource:
    return ModelSource(ref=f"<{type(config).__name__}>", kind="local", config=config.to_dict(), tensors=None,
                       notes=("config only: a config object was passed; shapes come from the model built on the meta "
                              "device and bytes from the config's dtype",))


def model_payload(model, distributed_config=None) -> dict[str, Any]:
    """What it takes to rebuild `model` on the meta device elsewhere: its config, class, dtype, merged plans and the
    `DistributedConfig` plan overrides (JSON-serialisable)."""
    overrides = {}
    if distributed_config is not None:
        for key in ("tp_plan", "ep_plan"):
            value = getattr(distributed_config, key, None)
            if isinstance(value, dict):
                overrides[key] = dict(value)
    return {
        "config": json.loads(model.config.to_json_string(use_diff=False)),
        "architecture": type(model).__name__,
        "dtype": str(next(iter(model.parameters())).dtype).removeprefix("torch."),
        "tp_plan": dict(model.tp_plan or {}),
        "ep_plan": dict(model.ep_plan or {}),
        "overrides": overrides,
    }


def check_payload(payload: dict, *, tp_size: int, ep_size: int = 1, options: CheckOptions | None = None,
                  suggest: bool = False) -> Report:
    """Audit a model described by `model_payload` (rebuilt on the meta device with its merged plans)."""
    from .audit import audit_source

    source = ModelSource(ref=f"<{payload['architecture']} object>", kind="local", config=payload["config"],
                         notes=("model object: rebuilt on the meta device from its config, class and merged plans",))
    return audit_source(source, tp_size=tp_size, ep_size=ep_size, architecture=payload["architecture"],
                        dtype=payload.get("dtype"), options=options, suggest=suggest,
                        instance_plans={"tp": payload.get("tp_plan"), "ep": payload.get("ep_plan")},
                        dist_overrides=payload.get("overrides") or None)


def check(model: Any, *, tp_size: int, ep_size: int = 1, plan: dict[str, str] | str | None = None,
          revision: str | None = None, token: str | None = None, dtype: str | None = None,
          max_replicated: str | int | None = None, suggest: bool = False,
          trust_remote_code: bool = False) -> Report:
    """Simulate `model` sharded at (tp_size, ep_size) with the installed transformers and lint its plan.

    Args:
        model: a Hub id (`"Qwen/Qwen3-VL-30B-A3B-Instruct"`), a local model directory or `config.json`, a snapshot
            file, a `PretrainedConfig`, or a `PreTrainedModel` on any device (meta included; it is rebuilt on the
            meta device from its config, class and merged plans, and never modified).
        tp_size (`int`): tensor-parallel size.
        ep_size (`int`, *optional*, defaults to 1): expert-parallel size (1 or `tp_size`).
        plan (`dict` or `str`, *optional*): rules (or a JSON file of them) replacing the base model's
            `base_model_tp_plan`, keys relative to the base model (as `--plan`).
        revision (`str`, *optional*), token (`str`, *optional*): Hub only.
        dtype (`str`, *optional*): load dtype (`from_pretrained(dtype=...)`), default `"auto"`.
        max_replicated (`str` or `int`, *optional*): `TPA004` budget: bytes (`int` or `"2GiB"`) or `"5%"`.
        suggest (`bool`, *optional*, defaults to `False`): add the `suggestion` section (see `--suggest`).
        trust_remote_code (`bool`, *optional*, defaults to `False`).

    Returns:
        `Report`: `report.findings`, `report.rank_param_bytes`, `report.replicated`, `report.to_json()` (the CLI's
        `--format json` contract).

    Raises:
        ModelReferenceError, ConfigError, CheckpointError, SnapshotError, HubError: the input cannot be read.
        PlanError: `plan` is malformed or names an unknown style.
        UsageError: invalid sizes, or sizes transformers refuses.
        UnsupportedVersionError: transformers or torch outside the tested range.

    Example:
        ```py
        >>> import tpaudit
        >>> report = tpaudit.check("fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz", tp_size=4)
        >>> report.worst_rank_param_bytes
        16362514912
        >>> tpaudit.check("fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz", tp_size=8).has_errors
        True
        >>> tpaudit.check("no/such/path.json", tp_size=2)
        Traceback (most recent call last):
        tpaudit.errors.ModelReferenceError: no/such/path.json does not exist and is not a Hub id (org/name). ...
        ```
    """
    from .audit import audit_source
    from .build import load_plan_file, validate_plan

    options = CheckOptions.from_budget(str(max_replicated)) if max_replicated is not None else CheckOptions()
    if isinstance(plan, (str, os.PathLike)):
        plan = load_plan_file(str(plan))
    elif plan is not None:
        validate_plan(plan)
    try:
        from transformers import PretrainedConfig, PreTrainedModel
    except ImportError as e:  # pragma: no cover - a dependency
        raise UsageError(f"transformers is not importable: {e}") from None
    if isinstance(model, PreTrainedModel):
        if plan is not None:
            raise UsageError("plan= applies to configs and checkpoints; for a model object, pass its "
                             "DistributedConfig overrides to from_pretrained instead")
        return check_payload(model_payload(model), tp_size=tp_size, ep_size=ep_size, options=options,
                             suggest=suggest)
    if isinstance(model, PretrainedConfig):
        return audit_source(_source_from_config(model), tp_size=tp_size, ep_size=ep_size, plan_override=plan,
                            dtype=dtype, options=options, suggest=suggest, config=model)
    if not isinstance(model, (str, os.PathLike)):
        raise UsageError(f"model must be a Hub id, a path, a PretrainedConfig or a PreTrainedModel, not "
                         f"{type(model).__name__}")
    from .sources import open_source

    source = open_source(str(model), revision=revision, token=token)
    return audit_source(source, tp_size=tp_size, ep_size=ep_size, plan_override=plan, dtype=dtype,
                        options=options, suggest=suggest, trust_remote_code=trust_remote_code)
