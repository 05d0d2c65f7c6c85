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

Workers are processes (`--jobs`, through `tpaudit.run.executor`, the executor `batch` uses too), each importing torch
and transformers once and simulating many types; a type that transformers cannot build is reported `build_failed`
with the reason, a tpaudit bug while scanning one is an `internal_error` row (the scan then exits 4), and neither stops
the scan.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

SCAN_SCHEMA = "tpaudit/scan/v1"
PARITY_TASKS_PER_WORKER = 30
"""With the parity check, a worker process is replaced after this many model types (and a scan of more types runs
in a worker even with `--jobs 1`): the small models' forwards leave allocator pools and caches behind that only the
process's end returns. Measured on the whole 5.25 zoo: see `scripts/benchmark.py --section scan-parity`."""
COMPONENTS = ("attention", "mlp", "experts", "shared_experts", "embeddings", "head", "vision", "audio")


def component_of(name: str) -> str | None:
    """The component a generic parameter name belongs to (for the coverage heat map); `None` for routers, which
    transformers keeps whole by design, and for anything unrecognised."""

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
    """One architecture's row of the scan (JSON-serialisable via `to_json`).

    Attributes:
        model_type (`str`), status (`str`: `ok`, `no_plan`, `build_failed`, `no_model_class`, `internal_error`),
        architecture (`str`, *optional*), reason (`str`, *optional*): why it did not build or has no plan.
        total_param_bytes, worst_rank_param_bytes, replicated_bytes (`int`, *optional*): as in `tpaudit/check/v1`.
        replicated (`list[dict]`), unused_rules (`list[str]`), findings (`list[dict]`): as in the check report.
        components (`dict`): component -> `{"bytes", "replicated_bytes"}` for the heat map.
        parity (`dict`, *optional*): the parity section when `--parity` ran it.
        parity_error (`str`, *optional*): why the parity check could not build or run its small model, with the
            option that skips it; the row keeps the static audit's status and findings (`parity` then says it did not
            run).
        seconds (`float`): wall time of this row.
        warnings (`list[str]`): what transformers and torch logged or warned while this row was scanned, one entry per
            message (`"transformers: ..."`), collected instead of printed.
    """

    model_type: str
    status: str
    architecture: str | None = None
    reason: str | None = None
    total_param_bytes: int | None = None
    worst_rank_param_bytes: int | None = None
    replicated_bytes: int | None = None
    replicated: list[dict] = field(default_factory=list)
    unused_rules: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    components: dict[str, dict[str, int]] = field(default_factory=dict)
    parity: dict | None = None
    parity_error: str | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        """Error-severity findings of this model type."""
        return sum(1 for f in self.findings if f.get("severity") == "error")

    @property
    def failing(self) -> bool:
        """It does not build, hit a tpaudit bug, or has an error finding (what the CI gate fails on)."""
        return self.status in ("build_failed", "internal_error") or self.errors > 0

    @property
    def parity_outcome(self) -> str | None:
        """What the parity check gave this row: `"passed"` (every compared output matched), `"failed"` (a rank raised
        or an output diverged), `"could_not_run"` (it was needed or asked for, but no small model was built or ran,
        or the run compared nothing), `"not_checked"` (not needed: nothing the forward cuts into parts, one rank, or
        switched off), `None` without `--parity`."""
        from ..evidence.cache import NOT_NEEDED
        from ..evidence.stage import SWITCHED_OFF

        if self.parity_error is not None:
            return "could_not_run"
        p = self.parity
        if p is None or (p.get("reason") or "").startswith(SWITCHED_OFF):
            return None
        if p.get("ran"):
            return {True: "passed", False: "failed"}.get(p.get("passed"), "could_not_run")
        reason = p.get("reason") or ""
        if reason.startswith(NOT_NEEDED) or reason.startswith("not run: one rank"):
            return "not_checked"
        return "could_not_run"

    @property
    def replicated_share(self) -> float | None:
        """Replicated bytes over the model's bytes (`None` when it did not build)."""
        if not self.total_param_bytes:
            return None
        return (self.replicated_bytes or 0) / self.total_param_bytes

    def error_families(self, limit: int = 3) -> str:
        """The replicated families with an error finding, the first `limit` of them, and how many more."""
        errs = [r["name"] for r in self.replicated if r.get("severity") == "error"]
        text = ", ".join(errs[:limit])
        return text + (f" (+{len(errs) - limit})" if len(errs) > limit else "")

    def to_json(self) -> dict[str, Any]:
        out = {"model_type": self.model_type, "status": self.status, "architecture": self.architecture,
               "reason": self.reason, "total_param_bytes": self.total_param_bytes,
               "worst_rank_param_bytes": self.worst_rank_param_bytes, "replicated_bytes": self.replicated_bytes,
               "replicated": self.replicated, "unused_rules": self.unused_rules, "findings": self.findings,
               "components": self.components, "seconds": round(self.seconds, 3)}
        if self.parity is not None:
            out["parity"] = self.parity
        if self.parity_error is not None:
            out["parity_error"] = self.parity_error
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_json(cls, row: dict) -> "ScanResult":
        """The row a worker process sent back."""
        return cls(**{k: row.get(k) for k in ("model_type", "status", "architecture", "reason", "total_param_bytes",
                                              "worst_rank_param_bytes", "replicated_bytes", "parity",
                                              "parity_error")},
                   replicated=row.get("replicated") or [], unused_rules=row.get("unused_rules") or [],
                   findings=row.get("findings") or [], components=row.get("components") or {},
                   seconds=row.get("seconds") or 0.0, warnings=row.get("warnings") or [])


def model_types() -> list[str]:
    """Every model type transformers registers a config for."""
    from ..compat import backend

    return sorted(backend().config_classes().keys())


_PARITY_OFF_HINT = "Skip it with --no-parity"


def _first_lines(e: BaseException) -> str:
    # the first two lines: validators put the reason on the second ("...'validate_architecture':\n ValueError: ...")
    first = " ".join(ln.strip() for ln in str(e).strip().splitlines()[:2])[:300]
    return f"{type(e).__name__}: {first}"


def scan_one(model_type: str, tp_size: int, parity: str = "off") -> ScanResult:
    """`_scan_one`, with what transformers and torch log or warn meanwhile collected into the row (`warnings`) instead
    of reaching the terminal between the scan's own lines."""
    from ..compat.parity import collected_library_messages

    with collected_library_messages() as said:
        row = _scan_one(model_type, tp_size, parity)
    row.warnings = list(said)
    return row


def _scan_one(model_type: str, tp_size: int, parity: str = "off") -> ScanResult:
    """Build `model_type`'s default config on the meta device at full depth and simulate it at `tp_size`.

    What transformers refuses is a row: a default config it cannot make, or a model class that does not build from
    it, is `build_failed` with the reason. Anything else that raises is a tpaudit bug and is not caught here: the
    executor (`tpaudit.run.executor`) makes it an `internal_error` row, and the scan exits 4.

    Args:
        model_type (`str`): a key of transformers' `CONFIG_MAPPING`.
        tp_size (`int`): the tensor-parallel size.
        parity (`"off" | "auto" | "on"`): the parity check (`scan --parity` runs it where the plan needs evidence).
    """
    start = time.perf_counter()
    from .pipeline import Audit
    from ..metamodel import BuildOptions
    from ..compat import backend
    from ..errors import ConfigError, ParityUnavailableError, TpauditError
    from ..model import ModelSource, ParallelSizes

    tf = backend()
    config_cls = tf.config_classes()[model_type]
    classes = [(n, c) for n in tf.model_class_names(model_type, config_cls)
               if (c := tf.model_class_by_name(n)) is not None]
    if not classes:
        return ScanResult(model_type, "no_model_class", reason="no causal-LM, image-text-to-text or base model "
                                                               "class", seconds=time.perf_counter() - start)
    if not any(tf.declares_plan(config_cls, cls) for _, cls in classes):
        return ScanResult(model_type, "no_plan", architecture=classes[0][0],
                          reason="no base_model_tp_plan, base_model_ep_plan or class-level _tp_plan",
                          seconds=time.perf_counter() - start)
    try:
        config = tf.config_from_class(model_type)
    except Exception as e:  # noqa: BLE001 - transformers' own default config: its validators refuse it
        return ScanResult(model_type, "build_failed", architecture=classes[0][0],
                          reason=f"{_first_lines(e)} (transformers' default {model_type} config)",
                          seconds=time.perf_counter() - start)
    source = ModelSource(ref=model_type, kind="local", config={"model_type": model_type})
    report, failure, class_name, parity_error = None, None, classes[0][0], None
    for class_name, _ in classes:  # the first class that builds from the default config
        try:
            audit = Audit(source, BuildOptions(architecture=class_name, config=config, dtype="bfloat16"))
            try:
                report = audit.report(ParallelSizes.of(tp_size), parity=parity)
            except ParityUnavailableError as e:  # no small model: the static audit stands, the row says why
                parity_error = f"{e.reason}. {_PARITY_OFF_HINT}"
                report = audit.report(ParallelSizes.of(tp_size), parity="off")
            break
        except TpauditError as e:
            # the config is transformers' own default for the type: advice to fix "the config" does not apply
            reason = e.reason if isinstance(e, ConfigError) else str(e).strip()
            failure = failure or (class_name, f"{reason} (transformers' default {model_type} config)")
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
    parity_json = report.parity.to_json() if report.parity is not None else None
    if parity_error is not None and parity_json is not None:
        parity_json["reason"] = f"could not run: {parity_error}"
    return ScanResult(
        model_type, status, architecture=class_name, total_param_bytes=report.total_param_bytes,
        worst_rank_param_bytes=report.worst_rank_param_bytes, replicated_bytes=report.replicated_bytes,
        replicated=[{"name": f.name, "bytes": f.bytes, "count": f.count, "severity": f.severity}
                    for f in report.replicated],
        unused_rules=list(report.unused_rules), findings=[f.to_json() for f in report.findings],
        components=components, parity=parity_json, parity_error=parity_error, seconds=time.perf_counter() - start)


def _row(model_type: str, tp_size: int, parity: str) -> dict:
    """What a worker sends back: one row as JSON. After a parity check the worker returns the memory its small models
    freed to the system (`_process.release_memory`)."""
    row = scan_one(model_type, tp_size, parity).to_json()
    if parity != "off" and (row.get("parity") or {}).get("ran"):
        from .._process import release_memory

        release_memory()
    return row


def _worker_init() -> None:
    from .._process import tune_gc

    tune_gc(long_lived=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401  import once per worker process
    import transformers  # noqa: F401


@dataclass
class ScanReport:
    """Every scanned model type's row, sorted by model type, and how the scan ran.

    Attributes:
        tp_size (`int`), models (`list[ScanResult]`), versions (`dict`), selected (`list[str]`, *optional*): the model
        types asked for (`None`: all), seconds (`float`).
    """

    tp_size: int
    models: list[ScanResult]
    versions: dict[str, str]
    selected: list[str] | None
    seconds: float

    @property
    def counts(self) -> dict[str, int]:
        """Rows by status."""
        counts: dict[str, int] = {}
        for m in self.models:
            counts[m.status] = counts.get(m.status, 0) + 1
        return counts

    @property
    def parity_counts(self) -> dict[str, int] | None:
        """The parity check's outcomes over the rows (`None` without `--parity`): `checked` (types whose parity run
        gave a verdict), `passed`, `failed`, `could_not_run` (needed or asked for, but no verdict: see each row's
        `parity_error` or `parity.reason`), `not_checked` (nothing needed evidence)."""
        outcomes = [m.parity_outcome for m in self.models]
        if not any(o is not None for o in outcomes):
            return None
        counts = {k: outcomes.count(k) for k in ("passed", "failed", "could_not_run", "not_checked")}
        return {"checked": counts["passed"] + counts["failed"], **counts}

    @property
    def library_warnings(self) -> list[tuple[str, int]]:
        """Each distinct message transformers or torch logged or warned during the scan, with how many times the
        rows saw it, most frequent first (a `warning_once` message counts once per worker process)."""
        counts: dict[str, int] = {}
        for m in self.models:
            for w in m.warnings:
                counts[w] = counts.get(w, 0) + 1
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def to_json(self) -> dict[str, Any]:
        out = {"schema": SCAN_SCHEMA, "tp_size": self.tp_size, "versions": self.versions,
               "selected": self.selected, "seconds": round(self.seconds, 1), "counts": self.counts}
        if (parity := self.parity_counts) is not None:
            out["parity_counts"] = parity
        if said := self.library_warnings:
            out["library_warnings"] = [{"message": m, "count": c} for m, c in said]
        out["models"] = [m.to_json() for m in self.models]
        return out


def scan(*, tp_size: int = 4, selected: list[str] | None = None, jobs: int | None = None,
         parity: str = "off") -> ScanReport:
    """Scan `selected` model types (default: all) at `tp_size` with `jobs` worker processes.

    Raises:
        UsageError: an unknown model type, an invalid tp_size, or jobs below 1.
        UnsupportedVersionError: the installed transformers lacks what the seam calls.
    """
    from ..compat import versions as installed_versions
    from ..errors import UnsupportedVersionError, UsageError
    from .executor import TaskFailed, internal_error_reason, run_tasks
    from ..model import ParallelSizes

    start = time.perf_counter()
    ParallelSizes.of(tp_size)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"jobs={jobs!r} is invalid: pass 1 or more worker processes, or None for the CPU count")
    versions = installed_versions()
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
    rows = []
    recycle = PARITY_TASKS_PER_WORKER if parity != "off" else None
    for (model_type, _, _), outcome in run_tasks(_row, [(t, tp_size, parity) for t in types], jobs=jobs,
                                                 initializer=_worker_init, propagate=(UnsupportedVersionError,),
                                                 max_tasks_per_child=recycle):
        if isinstance(outcome, TaskFailed):  # a tpaudit bug (exit 4), or a worker that stopped
            status = "internal_error" if outcome.kind == "internal" else "build_failed"
            reason = internal_error_reason(outcome.error, f"'tpaudit scan --model-type {model_type}'") \
                if outcome.kind == "internal" else f"the worker process stopped: {outcome.error}"
            rows.append(ScanResult(model_type, status, reason=reason))
        else:
            rows.append(ScanResult.from_json(outcome))
    rows.sort(key=lambda r: r.model_type)
    return ScanReport(tp_size=tp_size, models=rows, versions=versions, selected=selected,
                      seconds=time.perf_counter() - start)
