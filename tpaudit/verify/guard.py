"""`tpaudit.strict_tp()`: fail `from_pretrained(..., distributed_config=...)` before silent replication happens.

transformers 5.23 has no public hook between building the model on the meta device and reading weights, so the
guard asks the seam (`compat.backend().install_distribute_hook`) to wrap the step `from_pretrained` calls right there
(`DistributedMixin.maybe_distribute_model`: after the quantizer's module replacement, before
`_load_pretrained_model`). The wrapper runs tpaudit's analysis on that model and raises `ReplicatedWeightsError` when
error-severity findings remain; only then does the original method run. The seam's capability probes run on entry
(`UnsupportedVersionError` when the installed transformers lacks what the guard wraps).

Under torchrun the process already belongs to the real process group, and tpaudit's simulation needs a process
group of its own, so the analysis runs in a short-lived subprocess (`python -m tpaudit.verify.guard_worker`) that
rebuilds the model on the meta device from its config, class, merged plans and the `DistributedConfig` overrides. Every
rank does this on its own, so every rank raises the same error and none waits in a collective.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from .._process import without_torchrun
from ..errors import ReplicatedWeightsError, TpauditError
from ..model import Finding

_lock = threading.Lock()
_depth = 0
_token = None
_active: list["strict_tp"] = []


@dataclass(frozen=True)
class GuardReading:
    """What the guard reads of the worker's report, typed and validated once: the report crossed a process boundary
    as JSON (`Report.to_json()`, `tpaudit/check/v1`, with a `suggestion` section when errors exist).

    Attributes:
        findings (`tuple[Finding, ...]`): every finding (`Finding.from_json` of each).
        replicated_bytes (`int`): bytes per rank no rule shards (`replicated_bytes`; 0 when absent).
        rank_param_bytes (`tuple[int, ...]`): parameter bytes of each rank (`ranks[].param_bytes`), by rank.
        plan_snippet (`str`, *optional*): the suggested `base_model_tp_plan` as Python (`suggestion.snippet`).
    """

    findings: tuple[Finding, ...]
    replicated_bytes: int
    rank_param_bytes: tuple[int, ...]
    plan_snippet: str | None

    @classmethod
    def from_json(cls, report: Any) -> "GuardReading":
        """Read a report JSON object.

        Raises:
            ValueError: not a report object, or a field the guard reads has the wrong type.
        """
        if not isinstance(report, dict):
            raise ValueError(f"a report must be a JSON object, not {type(report).__name__}")
        findings, ranks = report.get("findings", []), report.get("ranks") or []
        replicated = report.get("replicated_bytes") or 0
        suggestion = report.get("suggestion") or {}
        if not isinstance(findings, list) or not isinstance(ranks, list) or not isinstance(suggestion, dict):
            raise ValueError("a report's findings and ranks must be lists, its suggestion an object")
        per_rank = tuple(r.get("param_bytes") if isinstance(r, dict) else None for r in ranks)
        snippet = suggestion.get("snippet")
        if not all(_is_int(b) for b in (replicated, *per_rank)) or not isinstance(snippet, (str, type(None))):
            raise ValueError("a report's byte counts must be integers and its suggestion's snippet text")
        return cls(findings=tuple(Finding.from_json(f) for f in findings), replicated_bytes=int(replicated),
                   rank_param_bytes=tuple(int(b) for b in per_rank), plan_snippet=snippet)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def analyse_in_subprocess(payload: dict, tp_size: int, ep_size: int, timeout: float = 600) -> dict:
    """Run the check of `payload` (see `api.model_payload`) in a fresh interpreter; returns the report JSON plus a
    `suggestion` section when errors exist.

    Raises:
        TpauditError: the worker failed (its one-line error is kept).
    """
    env = without_torchrun(None, "CUDA_VISIBLE_DEVICES")  # the analysis runs on the meta device, never a GPU
    request = json.dumps({"payload": payload, "tp_size": tp_size, "ep_size": ep_size})
    try:
        proc = subprocess.run([sys.executable, "-m", "tpaudit.verify.guard_worker"], input=request, capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise TpauditError(f"tpaudit's analysis did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TpauditError(f"tpaudit's analysis failed: {last}")
    return json.loads(proc.stdout)


class strict_tp(contextlib.ContextDecorator):
    """Refuse to load a model that a TP/EP plan would leave half-sharded.

    Use it around `from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))`, as a context manager or a
    decorator. Before any weight is read, the model the loader just built is analysed with tpaudit's checks; when
    error-severity findings remain (replicated decoder weights, no plan, indivisible heads, misaligned quantization
    blocks, ...), `ReplicatedWeightsError` is raised on every rank.

    Args:
        allow (`Iterable[str]`, *optional*): generic names or finding targets to accept
            (`"model.layers.*.mlp.shared_expert.gate_proj.weight"`); `fnmatch` patterns work.
        max_replicated_bytes (`int`, *optional*): accept replicated weights as long as their bytes per rank stay at
            or below this many (the other error findings still raise).
        codes (`Iterable[str]`, *optional*): only these rule codes can raise (default: every error finding).

    Raises:
        ReplicatedWeightsError: from inside `from_pretrained`, with `.findings`, `.report` (the JSON contract
            `Report.to_json()`, with a `suggestion` section) and `.plan_snippet`.
        UnsupportedVersionError: on entry, when the installed transformers lacks what the guard wraps.

    Example:
        ```py
        >>> import tpaudit
        >>> from transformers import AutoModelForCausalLM
        >>> from transformers.distributed import DistributedConfig
        >>> with tpaudit.strict_tp():
        ...     model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen1.5-MoE-A2.7B",
        ...                                                  distributed_config=DistributedConfig(tp_size=4))
        tpaudit.errors.ReplicatedWeightsError: 3 error finding(s) for Qwen2MoeForCausalLM at tp_size 4, ep_size 1;
        nothing was loaded: ...
        ```
    """

    def __init__(self, *, allow: Iterable[str] = (), max_replicated_bytes: int | None = None,
                 codes: Iterable[str] | None = None):
        self.allow = tuple(allow)
        self.max_replicated_bytes = max_replicated_bytes
        self.codes = set(codes) if codes is not None else None

    def __enter__(self) -> "strict_tp":
        global _depth, _token
        from ..compat import backend

        tf = backend()
        with _lock:
            if _depth == 0:
                _token = tf.install_distribute_hook(_guarded)
            _depth += 1
            _active.append(self)
        return self

    def __exit__(self, *exc) -> Literal[False]:
        global _depth
        from ..compat import backend

        with _lock:
            _active.remove(self)
            _depth -= 1
            if _depth == 0:
                backend().remove_distribute_hook(_token)
        return False

    def blocking(self, findings: Iterable[Finding], replicated_bytes: int = 0) -> list[Finding]:
        """The error findings this guard does not accept.

        Args:
            findings (`Iterable[Finding]`): a report's findings (`Report.findings`, or `Finding.from_json` of each).
            replicated_bytes (`int`): the report's replicated bytes per rank, judged against `max_replicated_bytes`.
        """
        import fnmatch

        from ..checks.registry import counts_replicated

        out = []
        for f in findings:
            if f.severity != "error":
                continue
            if self.codes is not None and f.code not in self.codes:
                continue
            if any(fnmatch.fnmatchcase(f.target, pattern) for pattern in self.allow):
                continue
            if (counts_replicated(f) and self.max_replicated_bytes is not None
                    and replicated_bytes <= self.max_replicated_bytes):
                continue
            out.append(f)
        return out


def _guarded(original, cls, model, distributed_config, mesh_manager):
    if mesh_manager is not None and distributed_config is not None:
        from ..compat import backend

        tp_size, ep_size = backend().sizes_of(distributed_config)
        if tp_size > 1 or ep_size > 1:
            _check_before_load(model, distributed_config, tp_size, ep_size)
    return original(cls, model, distributed_config, mesh_manager)


def _check_before_load(model, distributed_config, tp_size: int, ep_size: int) -> None:
    from ..compat import backend

    guard = _active[-1]
    payload = backend().model_payload(model, distributed_config)
    report = analyse_in_subprocess(payload, tp_size, ep_size)
    try:
        reading = GuardReading.from_json(report)
    except ValueError as e:
        raise TpauditError(f"tpaudit's analysis returned a report the guard cannot read: {e}") from None
    problems = guard.blocking(reading.findings, reading.replicated_bytes)
    if not problems:
        return
    snippet = reading.plan_snippet
    lines = [f"{len(problems)} error finding(s) for {type(model).__name__} at tp_size {tp_size}, "
             f"ep_size {ep_size}; nothing was loaded:"]
    for f in problems[:12]:
        per_rank = f.facts.get("bytes_per_rank")
        lines.append(f"  {f.code} {f.target}" + (f" ({per_rank:,} B on every rank)" if per_rank else ""))
    if len(problems) > 12:
        lines.append(f"  ... {len(problems) - 12} more")
    if reading.rank_param_bytes:
        per_rank_text = ", ".join(f"{b:,}" for b in reading.rank_param_bytes[:8])
        lines.append(f"  per-rank parameter bytes: {per_rank_text}")
    if snippet:
        lines.append("A plan that covers them (tpaudit check --suggest):\n" + snippet)
    raise ReplicatedWeightsError("\n".join(lines), report=report, findings=problems, plan_snippet=snippet)
