"""`tpaudit scan`: every architecture of the installed transformers, simulated as `check` does, as a CI gate for new
model configs and a map of plan coverage across the zoo.

Which model types: every entry of transformers' `CONFIG_MAPPING`. A type whose config (or a sub-config) has a
`base_model_tp_plan` or `base_model_ep_plan`, or whose model class has a class-level `_tp_plan`, is simulated; the
others are listed with status `no_plan` without building anything. The model class is the type's causal-LM class,
else its image-text-to-text class, else its base model class.

Depth policy: full depth. Each architecture is built from its default config on the meta device at its real depth and
width; building on the meta device allocates nothing and takes about 0.1 s per model, so shrinking the depth would buy
little and would have to keep every per-layer kind (dense-first layers, hybrid attention, MTP layers) represented.
At full depth they are represented by construction, and the bytes are the default config's exact bytes.

Workers are processes (`--jobs`), each importing torch and transformers once and simulating many types; a type that
fails to build is reported `build_failed` with the reason and never stops the scan.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

SCAN_SCHEMA = "tpaudit/scan/v1"
COMPONENTS = ("attention", "mlp", "experts", "shared_experts", "embeddings", "head", "vision", "audio")


def component_of(name: str) -> str | None:
    """The component a generic parameter name belongs to (for the coverage heat map); `None` for routers, which
    transformers keeps whole by design, and for anything unrecognised."""
    import re

    parts = name.split(".")
    if len(parts) >= 2 and re.search(r"(^|_)(gate|router)$", parts[-2]):
        return None
    n = name.lower()
    if any(k in n for k in ("visual", "vision", "image", "patch_embed", "pixel", "video", "multi_modal_projector")):
        return "vision"
    if any(k in n for k in ("audio", "speech", "whisper", "acoustic", "mel")):
        return "audio"
    if n.startswith("lm_head") or ".lm_head" in n or "output_embed" in n:
        return "head"
    if any(k in n for k in ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings")):
        return "embeddings"
    if "shared_expert" in n:
        return "shared_experts"
    if ".experts." in n or n.endswith(".experts") or ".experts_" in n:
        return "experts"
    if any(k in n for k in ("self_attn", ".attn.", "attention", "linear_attn", "mixer", "q_proj", "k_proj",
                            "v_proj", "o_proj")):
        return "attention"
    if any(k in n for k in (".mlp.", "feed_forward", ".ffn", "fc1", "fc2", "gate_proj", "up_proj", "down_proj")):
        return "mlp"
    return None


@dataclass
class ScanResult:
    """One architecture's row of the scan (JSON-serialisable via `to_json`)."""

    model_type: str
    status: str                      # ok | no_plan | build_failed | no_model_class
    architecture: str | None = None
    reason: str | None = None
    total_param_bytes: int | None = None
    worst_rank_param_bytes: int | None = None
    replicated_bytes: int | None = None
    replicated: list[dict] = field(default_factory=list)
    unused_rules: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    components: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.get("severity") == "error")

    def to_json(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "status": self.status, "architecture": self.architecture,
                "reason": self.reason, "total_param_bytes": self.total_param_bytes,
                "worst_rank_param_bytes": self.worst_rank_param_bytes, "replicated_bytes": self.replicated_bytes,
                "replicated": self.replicated, "unused_rules": self.unused_rules, "findings": self.findings,
                "components": self.components, "seconds": round(self.seconds, 3)}


def model_types() -> list[str]:
    """Every model type transformers registers a config for."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def _model_class_names(model_type: str, config_cls) -> list[str]:
    """Candidate model classes, most useful first: causal LM, image-text-to-text, base model. A composite config
    (one with a `text_config`) tries its image-text-to-text class first: its causal-LM class often expects the text
    config alone."""
    from transformers.models.auto import modeling_auto as auto

    names = []
    mappings = [auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                auto.MODEL_MAPPING_NAMES]
    if "text_config" in (getattr(config_cls, "sub_configs", None) or {}):
        mappings[0], mappings[1] = mappings[1], mappings[0]
    for mapping in mappings:
        name = mapping.get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and name not in names:
            names.append(name)
    return names


def _has_plan(config_cls, model_cls) -> bool:
    """Whether the config class, one of its sub-config classes, or the model class declares a TP/EP plan."""
    classes = [config_cls] + [c for c in (getattr(config_cls, "sub_configs", None) or {}).values() if c is not None]
    for c in classes:
        if getattr(c, "base_model_tp_plan", None) or getattr(c, "base_model_ep_plan", None):
            return True
    return bool(getattr(model_cls, "_tp_plan", None))


def scan_one(model_type: str, tp_size: int) -> ScanResult:
    """Build `model_type`'s default config on the meta device at full depth and simulate it at `tp_size`. Never
    raises: failures become `build_failed` rows."""
    start = time.perf_counter()
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        from ._compat import quiet_libraries
        from .audit import audit_source
        from .errors import TpauditError
        from .model import ModelSource

        config_cls = CONFIG_MAPPING[model_type]
        classes = [(n, getattr(transformers, n)) for n in _model_class_names(model_type, config_cls)
                   if hasattr(transformers, n)]
        if not classes:
            return ScanResult(model_type, "no_model_class", reason="no causal-LM, image-text-to-text or base model "
                                                                   "class", seconds=time.perf_counter() - start)
        if not any(_has_plan(config_cls, cls) for _, cls in classes):
            return ScanResult(model_type, "no_plan", architecture=classes[0][0],
                              reason="no base_model_tp_plan, base_model_ep_plan or class-level _tp_plan",
                              seconds=time.perf_counter() - start)
        with quiet_libraries():
            config = config_cls()
        source = ModelSource(ref=model_type, kind="local", config={"model_type": model_type})
        report, failure, class_name = None, None, classes[0][0]
        for class_name, _ in classes:  # the first class that builds from the default config
            try:
                report = audit_source(source, tp_size=tp_size, architecture=class_name, config=config,
                                      dtype="bfloat16")
                break
            except TpauditError as e:
                failure = failure or (class_name, str(e)[:300])
        if report is None:
            return ScanResult(model_type, "build_failed", architecture=failure[0], reason=failure[1],
                              seconds=time.perf_counter() - start)
        components: dict[str, dict[str, int]] = {}
        replicated_names = {f.name for f in report.replicated}
        for g in report.groups:
            comp = component_of(g.generic_name)
            if comp is None or g.tied_to is not None or len(g.global_shape) < 2:
                continue  # norms, biases and other vectors do not colour the heat map
            entry = components.setdefault(comp, {"bytes": 0, "replicated_bytes": 0})
            entry["bytes"] += g.total_bytes
            if g.generic_name in replicated_names:
                entry["replicated_bytes"] += g.total_bytes
        status = "no_plan" if any(f.kind == "no_plan" for f in report.findings) else "ok"
        return ScanResult(
            model_type, status, architecture=class_name, total_param_bytes=report.total_param_bytes,
            worst_rank_param_bytes=report.worst_rank_param_bytes, replicated_bytes=report.replicated_bytes,
            replicated=[{"name": f.name, "bytes": f.bytes, "count": f.count, "severity": f.severity}
                        for f in report.replicated],
            unused_rules=list(report.unused_rules), findings=[f.to_json() for f in report.findings],
            components=components, seconds=time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001 - one architecture never stops the scan
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return ScanResult(model_type, "build_failed", reason=f"{type(e).__name__}: {first}",
                          seconds=time.perf_counter() - start)


def _worker(args: tuple[list[str], int]) -> list[dict]:
    types, tp_size = args
    return [scan_one(t, tp_size).to_json() for t in types]


def _worker_init() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401  import once per worker process
    import transformers  # noqa: F401


@dataclass
class ScanReport:
    """Every scanned model type's row (`ScanResult.to_json()` dicts, sorted by model type) and how the scan ran."""

    tp_size: int
    models: list[dict]
    versions: dict[str, str]
    selected: list[str] | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for m in self.models:
            counts[m["status"]] = counts.get(m["status"], 0) + 1
        return {"schema": SCAN_SCHEMA, "tp_size": self.tp_size, "versions": self.versions,
                "selected": self.selected, "seconds": round(self.seconds, 1), "counts": counts,
                "models": self.models}


def scan(*, tp_size: int = 4, selected: list[str] | None = None, jobs: int | None = None) -> ScanReport:
    """Scan `selected` model types (default: all) at `tp_size` with `jobs` worker processes.

    Raises:
        UsageError: an unknown model type, or an invalid tp_size.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from . import __version__
    from ._compat import check_versions
    from .errors import UsageError
    from .plan import distributed_config

    start = time.perf_counter()
    versions = {"tpaudit": __version__, **check_versions()}
    distributed_config(tp_size)
    all_types = model_types()
    if selected:
        unknown = [t for t in selected if t not in all_types]
        if unknown:
            import difflib

            hints = [f"{u} (did you mean {difflib.get_close_matches(u, all_types, 1)[0]}?)"
                     if difflib.get_close_matches(u, all_types, 1) else u for u in unknown]
            raise UsageError(f"--model-type {', '.join(hints)} is not a model type of the installed transformers")
        types = list(dict.fromkeys(selected))
    else:
        types = all_types
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(types)))
    if jobs > 1 and len(types) <= 4 and selected is not None:
        jobs = 1  # starting workers (each imports torch and transformers) costs more than a few models
    if jobs == 1:
        rows = [scan_one(t, tp_size).to_json() for t in types]
    else:
        chunks = [(types[i::jobs], tp_size) for i in range(jobs)]
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init) as pool:
            rows = [row for part in pool.map(_worker, chunks) for row in part]
    rows.sort(key=lambda r: r["model_type"])
    return ScanReport(tp_size=tp_size, models=rows, versions=versions, selected=selected,
                      seconds=time.perf_counter() - start)
