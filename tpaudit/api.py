"""The Python API: `tpaudit.check(...)` returns the same `Report` the CLI renders. No printing, no `sys.exit`;
failures are exceptions from `tpaudit.errors` with their facts as attributes and messages in the API's terms."""

from __future__ import annotations

import os
from typing import Any

from .checks.registry import CheckOptions
from .errors import UsageError
from .model import ModelSource, ParallelSizes, Report

_PARITY = {None: "auto", "auto": "auto", True: "on", False: "off", "on": "on", "off": "off"}


def _source_from_config(config) -> ModelSource:
    return ModelSource(ref=f"<{type(config).__name__}>", kind="local", config=config.to_dict(), tensors=None,
                       notes=("config only: a config object was passed; shapes come from the model built on the meta "
                              "device and bytes from the config's dtype",))


def payload_audit(payload: dict):
    """An `Audit` of a model described by `compat.backend().model_payload` (rebuilt on the meta device with its
    config, class and merged plans), for the guard's worker."""
    from .run.pipeline import Audit
    from .metamodel import BuildOptions

    source = ModelSource(ref=f"<{payload['architecture']} object>", kind="local", config=payload["config"],
                         notes=("model object: rebuilt on the meta device from its config, class and merged plans",))
    return Audit(source, BuildOptions(architecture=payload["architecture"], dtype=payload.get("dtype"),
                                      instance_plans={"tp": payload.get("tp_plan"), "ep": payload.get("ep_plan")}))


def check(model: Any, *, tp_size: int, ep_size: int = 1, plan: dict[str, str] | str | None = None,
          revision: str | None = None, token: str | None = None, dtype: str | None = None,
          max_replicated: str | int | None = None, suggest: bool = False, trust_remote_code: bool = False,
          parity: bool | str | None = None) -> Report:
    """Simulate `model` sharded at (tp_size, ep_size) with the installed transformers and lint its plan.

    Args:
        model: a Hub id (`"Qwen/Qwen3-VL-30B-A3B-Instruct"`), a local model directory or `config.json`, a snapshot
            file, a `PretrainedConfig`, or a `PreTrainedModel` on any device (meta included; it is rebuilt on the
            meta device from its config, class and merged plans, and never modified).
        tp_size (`int`): tensor-parallel size (ranks).
        ep_size (`int`, *optional*, defaults to 1): expert-parallel size (1 or `tp_size`).
        plan (`dict` or `str`, *optional*): rules (or a JSON file of them) replacing the base model's
            `base_model_tp_plan`, keys relative to the base model (as `--plan`).
        revision (`str`, *optional*), token (`str`, *optional*): Hub only.
        dtype (`str`, *optional*): load dtype (`from_pretrained(dtype=...)`), default `"auto"`.
        max_replicated (`str` or `int`, *optional*): `TPA004` budget: bytes (`int` or `"2GiB"`) or `"5%"`.
        suggest (`bool`, *optional*, defaults to `False`): add the `suggestion` section (see `--suggest`).
        trust_remote_code (`bool`, *optional*, defaults to `False`).
        parity (`bool`, *optional*): `True` always runs the sharded-forward parity check, `False` never; default
            (`None`): when the plan needs evidence.

    Returns:
        `Report`: `report.findings`, `report.rank_param_bytes`, `report.replicated`, `report.to_json()` (the CLI's
        `--format json` contract).

    Raises:
        ModelReferenceError, ConfigError, CheckpointError, SnapshotError, HubError: the input cannot be read.
        PlanError: `plan` is malformed or names an unknown style.
        UsageError: invalid sizes (`tp_size` must be a positive `int`; `True`, `"2"` and `2.0` are refused), sizes
            transformers refuses, or a `model` of another type.
        UnsupportedVersionError: the installed transformers lacks what tpaudit calls.

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
    from .run.pipeline import Audit, CheckRequest
    from .metamodel import BuildOptions, load_plan_file, validate_plan
    from .compat import backend

    sizes = ParallelSizes.of(tp_size, ep_size)
    if parity not in _PARITY:
        raise UsageError(f"parity={parity!r} must be True, False or None")
    if not isinstance(suggest, bool) or not isinstance(trust_remote_code, bool):
        raise UsageError("suggest and trust_remote_code must be True or False")
    options = CheckOptions.from_budget(max_replicated) if max_replicated is not None else CheckOptions()
    plan_path = None
    if isinstance(plan, (str, os.PathLike)):
        plan_path = str(plan)
        plan = load_plan_file(plan_path)
    elif plan is not None:
        validate_plan(plan, origin="plan=")
    tf = backend()
    if tf.is_pretrained_model(model):
        if plan is not None:
            raise UsageError("plan= applies to configs and checkpoints; for a model object, pass its "
                             "DistributedConfig overrides to from_pretrained instead")
        audit = payload_audit(tf.model_payload(model))
    elif tf.is_pretrained_config(model):
        audit = Audit(_source_from_config(model), BuildOptions(plan_override=plan, dtype=dtype, config=model))
    elif isinstance(model, (str, os.PathLike)):
        audit = Audit.open(str(model), BuildOptions(plan_override=plan, dtype=dtype,
                                                    trust_remote_code=trust_remote_code),
                           revision=revision, token=token)
    else:
        raise UsageError(f"model must be a Hub id, a path, a PretrainedConfig or a PreTrainedModel, not "
                         f"{type(model).__name__}")
    return audit.check(CheckRequest(sizes, options=options, parity=_PARITY[parity], plan_path=plan_path,
                                    suggest="always" if suggest else "never"))
