"""`tpaudit verify`: load the model on real ranks with `from_pretrained(..., distributed_config=...)` and compare
what each rank holds with what `check` predicts.

Flow: the launcher (this process) starts `torchrun --nproc-per-node N -m tpaudit.verify.worker SPEC` (NCCL on CUDA,
gloo on CPU, where transformers picks the backend from the device), with a timeout. Each rank loads the model, writes
its own record (per parameter: local shape, dtype, bytes, placement; its allocated memory; or the loader's error)
to a file, and the ranks gather their records on rank 0. The launcher reads the records, runs the static prediction
for the same inputs, and compares per parameter and per rank. Each rank's file survives a rank that hangs or dies,
so the report names the rank that failed.

When `tpaudit verify` itself runs under torchrun (RANK / WORLD_SIZE in the environment), it is the worker: rank 0
gathers the records with `gather_object`, predicts, prints the report and broadcasts the exit code.

`--plan FILE` checks a plan override before it is deployed: its rules (keys relative to the base model, as in
`configuration_*.py`) are given with full keys as `DistributedConfig(tp_plan=...)`, which transformers merges into the
model's own plan at load (a rule the file does not name keeps the model's style); the prediction resolves the same
`DistributedConfig`.

`--zero-weights` first writes a checkpoint with the source's real headers and a sparse data region (reads as zeros,
costs no disk) and loads that: a full-size model's shard sizes can be confirmed without downloading weights.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._process import TORCHRUN_ENV, without_torchrun
from ..errors import LaunchError, LoadFailedError, UsageError
from ..units import shorten

VERIFY_SCHEMA = "tpaudit/verify/v1"


def under_torchrun() -> bool:
    """True when this process is a torchrun worker (its environment names a rank and a world size)."""
    return all(k in os.environ for k in TORCHRUN_ENV[:3])


# ----------------------------------------------------------------------------------------------------------------------
# Worker side: load and measure
# ----------------------------------------------------------------------------------------------------------------------
def measure(model, device_type: str) -> dict[str, Any]:
    """What this rank holds: per parameter (tied pairs once, as `named_parameters()` yields them) the local shape,
    dtype, bytes and placement; and the memory allocated (`torch.cuda.memory_allocated` / max on CUDA; on CPU the
    bytes of the distinct storages behind parameters and buffers)."""
    import torch
    from torch.distributed.tensor import DTensor

    params, total = {}, 0
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        nbytes = local.numel() * local.element_size()
        placement = ", ".join(str(x) for x in p.placements) if isinstance(p, DTensor) else "whole"
        params[name] = {"shape": list(local.shape), "dtype": str(local.dtype).removeprefix("torch."),
                        "bytes": nbytes, "placement": placement}
        total += nbytes
    if device_type == "cuda":
        allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    else:
        seen, allocated = set(), 0
        for t in list(model.parameters()) + list(model.buffers()):
            local = t.to_local() if isinstance(t, DTensor) else t
            storage = local.untyped_storage()
            key = storage.data_ptr(), storage.nbytes()
            if key not in seen:
                seen.add(key)
                allocated += storage.nbytes()
        peak = None
    return {"params": params, "param_bytes": total, "allocated_bytes": allocated, "max_allocated_bytes": peak}


def load_and_measure(spec: dict) -> dict:
    """Load `spec["path"]` with the loader's TP/EP on this rank and return its record (never raises)."""
    rank = int(os.environ.get("RANK", 0))
    record: dict[str, Any] = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", 1)), "ok": False}
    start = time.perf_counter()
    try:
        import torch
        import transformers
        from transformers.distributed import DistributedConfig

        from ..metamodel import load_config, model_class
        from ..model import ModelSource
        from ..sources.local import read_config

        config_path = Path(spec["path"]) / "config.json"
        source = ModelSource(ref=spec["path"], kind="local", config=read_config(config_path),
                             config_dir=str(config_path.parent))
        config = load_config(source, trust_remote_code=spec.get("trust_remote_code", False))
        cls, _ = model_class(config, spec.get("architecture"), spec.get("trust_remote_code", False))
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        record["device"] = device_type
        # use_kernels=False: transformers' own forward, nothing fetched (5.25 turns Hub kernels on by default)
        # tp_plan: `--plan`'s rules with full keys, merged by transformers into the model's plan (None: the model's)
        dist = DistributedConfig(tp_size=spec["tp_size"], ep_size=spec["ep_size"], tp_plan=spec.get("tp_plan"))
        kwargs = {"distributed_config": dist, "use_kernels": False}
        if spec.get("dtype"):
            kwargs["dtype"] = spec["dtype"]
        if device_type == "cuda" and max(spec["tp_size"], spec["ep_size"]) == 1:
            kwargs["device_map"] = {"": f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"}  # no mesh places it at tp 1
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        model = cls.from_pretrained(spec["path"], **kwargs)
        record.update(measure(model, device_type))
        record["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the record carries the loader's own error, shortened
        record["error"] = shorten(f"{type(e).__name__}: {e}", 300, words=False)
    record["seconds"] = round(time.perf_counter() - start, 2)
    out_dir = spec.get("out_dir")
    if out_dir:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    return record


# ----------------------------------------------------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class VerifyResult:
    """Measured against predicted, per rank and per parameter."""

    tp_size: int
    ep_size: int
    ranks: list[dict]
    mismatches: list[dict]
    model: dict = field(default_factory=dict)
    load_error: dict | None = None
    versions: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        """Every rank loaded and holds exactly the predicted shards."""
        return self.load_error is None and not self.mismatches

    def to_json(self) -> dict[str, Any]:
        return {"schema": VERIFY_SCHEMA, "tp_size": self.tp_size, "ep_size": self.ep_size, "match": self.match,
                "ranks": self.ranks, "mismatches": self.mismatches, "load_error": self.load_error,
                "model": self.model, "versions": self.versions, "notes": self.notes}


def compare(shard_map, records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per-rank totals and per-parameter mismatches between a predicted `ShardMap` and measured rank records.

    A mismatch is a parameter whose local shape, dtype or bytes differ, or one that only one side has. Tied copies
    are predicted once, as `named_parameters()` yields them once.
    """
    predicted = {p.name: p for p in shard_map.params if p.tied_to is None}
    ranks, mismatches = [], []
    for rec in sorted(records, key=lambda r: r["rank"]):
        r = rec["rank"]
        measured = rec["params"]
        for name, p in predicted.items():
            m = measured.get(name)
            want = {"shape": list(p.local_shapes[r]), "dtype": p.dtype, "bytes": p.rank_bytes(r)}
            if m is None:
                mismatches.append({"rank": r, "name": name, "predicted": want, "measured": None})
            elif (m["shape"], m["dtype"], m["bytes"]) != (want["shape"], want["dtype"], want["bytes"]):
                mismatches.append({"rank": r, "name": name, "predicted": want,
                                   "measured": {k: m[k] for k in ("shape", "dtype", "bytes", "placement")}})
        for name in measured.keys() - predicted.keys():
            mismatches.append({"rank": r, "name": name, "predicted": None, "measured": measured[name]})
        ranks.append({"rank": r, "predicted_param_bytes": shard_map.rank_param_bytes[r],
                      "measured_param_bytes": rec["param_bytes"], "allocated_bytes": rec["allocated_bytes"],
                      "max_allocated_bytes": rec.get("max_allocated_bytes"), "load_seconds": rec.get("seconds")})
    return ranks, mismatches


def predict(path: str, tp_size: int, ep_size: int, dtype: str | None, architecture: str | None,
            trust_remote_code: bool, device: str = "cuda", plan: dict[str, str] | None = None,
            plan_path: str | None = None):
    """The static prediction for the directory the ranks loaded (the same checkpoint headers), for the device they
    load on: on `cpu` a quantizer that dequantizes without a GPU (FP8, MXFP4) is predicted to do so, as the ranks'
    own `validate_environment` decides; on `cuda` the quantized layout a GPU keeps.

    `plan` (rule -> style, keys relative to the base model: `--plan`) is resolved as the ranks load it: with full
    keys (`plan_overrides`) as `DistributedConfig(tp_plan=...)`, merged by transformers into the model's plan.

    Raises:
        UsageError: transformers refuses the sizes or the merged plan (see `run.pipeline.Audit.report`).
    """
    from ..run.pipeline import Audit, CheckRequest
    from ..metamodel import BuildOptions
    from ..model import ParallelSizes

    audit = Audit.open(path, BuildOptions(dtype=dtype, architecture=architecture,
                                          trust_remote_code=trust_remote_code, gpu_view=device == "cuda"))
    overrides = {"tp_plan": plan_overrides(audit.built.text_prefix, plan)} if plan is not None else None
    return audit.check(CheckRequest(ParallelSizes.of(tp_size, ep_size), parity="off", dist_overrides=overrides,
                                    plan_path=plan_path))


def plan_overrides(text_prefix: str | None, plan: dict[str, str] | None) -> dict[str, str] | None:
    """`plan`'s rules (keys relative to the base model, `--plan`) with the full keys `DistributedConfig(tp_plan=...)`
    takes: the text decoder's prefix in front (`layers.*.mlp.experts.gate_up_proj` ->
    `model.language_model.layers.*.mlp.experts.gate_up_proj` for Qwen3-VL-MoE). None for no plan.

    Source: transformers `DistributedConfig.tp_plan` ("override individual rules of that plan; unspecified rules are
    kept"), merged into the model's plan by its plan resolution at `from_pretrained`."""
    if plan is None:
        return None
    prefix = f"{text_prefix}." if text_prefix else ""
    return {prefix + key: style for key, style in plan.items()}


def predicted_failure(report) -> str:
    """What the prediction said about a load that failed: the load failures it found (TPA304), or that it found
    none."""
    from ..checks.registry import fails_load

    found = [f for f in report.findings if fails_load(f)]
    if not found:
        return "tpaudit check did not predict this failure (please report it)"
    first = found[0]
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return f"tpaudit check predicted it: {first.code} {first.target}{more}"


# ----------------------------------------------------------------------------------------------------------------------
# Launcher side
# ----------------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_model_dir(ref: str, *, zero_weights: bool, revision: str | None, token: str | None,
                      workdir: Path) -> tuple[str, list[str]]:
    """The directory the ranks load: the model itself, or with `zero_weights` a sparse checkpoint written from any
    source's headers. Returns `(path, notes)`.

    Raises:
        UsageError: a snapshot or Hub id without `--zero-weights`, or a source without a tensor table.
    """
    from ..sources import classify_reference, open_source
    from ..sources.sparse import write_sparse_checkpoint

    kind = classify_reference(ref)
    if not zero_weights:
        if kind == "snapshot":
            raise UsageError(f"{ref} is a snapshot: it records headers, not weights. Add --zero-weights to load a "
                             "checkpoint with its real headers and zero data")
        if kind == "hub":
            raise UsageError(f"verify loads weights: add --zero-weights to confirm {ref}'s shard sizes from its "
                             "headers without downloading them, or download it and pass the directory")
        return ref, []
    source = open_source(ref, revision=revision, token=token)
    if source.tensors is None:
        raise UsageError(f"{ref} has no safetensors tensor table, so --zero-weights cannot build its checkpoint. "
                         "Pass a model with safetensors headers")
    target = workdir / "zero-weights"
    write_sparse_checkpoint(source, target)
    total = source.checkpoint_bytes or 0
    return str(target), [f"--zero-weights: loaded a sparse checkpoint with {ref}'s real headers ({total:,} B of "
                         "zeros that take no disk)"]


def launch(path: str, *, tp_size: int, ep_size: int, nproc: int, device: str, dtype: str | None,
           architecture: str | None, trust_remote_code: bool, timeout: float, workdir: Path,
           progress=None, tp_plan: dict[str, str] | None = None) -> list[dict]:
    """Run the worker on `nproc` ranks under torchrun; return every rank's record. `progress(phase, detail)`, when
    given, hears how many ranks have started and loaded, about twice a second while they load (each rank writes
    `rank<N>.started` when its process begins, `rank<N>.json` when it is done). `tp_plan` (full keys,
    `plan_overrides`) is handed to every rank's `DistributedConfig`.

    The ranks run in `workdir`, not the current directory: `-m` puts the working directory first on `sys.path`, where
    a `tpaudit/` folder (a clone) would be imported in place of the installed package
    (`tpaudit._process.exit_if_shadowed`).

    Raises:
        LaunchError: torchrun could not start.
        LoadFailedError: a rank failed to load, or hung past `timeout` (the rank is named).
    """
    out_dir = workdir / "ranks"
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = {"path": os.path.abspath(path), "tp_size": tp_size, "ep_size": ep_size, "dtype": dtype, "architecture": architecture,
            "trust_remote_code": trust_remote_code, "out_dir": str(out_dir), "tp_plan": tp_plan}
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps(spec))
    env = without_torchrun()
    env.setdefault("OMP_NUM_THREADS", "1")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # transformers picks gloo for the CPU
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(_free_port()), "-m", "tpaudit.verify.worker", str(spec_file)]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, cwd=str(workdir))
    except OSError as e:
        raise LaunchError(f"cannot start torchrun: {e}. Check that torch is installed in {sys.executable}") from None
    start = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - start)
        try:
            stdout, stderr = proc.communicate(timeout=max(0.01, min(0.5, left)))  # retrying loses no output
            hung = False
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() - start < timeout:
                if progress is not None:
                    started, loaded = (len(list(out_dir.glob(f"rank*.{ext}"))) for ext in ("started", "json"))
                    progress("loading", f"{started}/{nproc} ranks started, {loaded}/{nproc} loaded, "
                                        f"{time.monotonic() - start:.0f} s")
                continue
        hung = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        break
    records = []
    for r in range(nproc):
        f = out_dir / f"rank{r}.json"
        if f.is_file():
            records.append(json.loads(f.read_text()))
    failed = [rec for rec in records if not rec.get("ok")]
    if failed:
        first = failed[0]
        raise LoadFailedError(f"the model failed to load on rank {first['rank']} of {nproc}: {first.get('error')}",
                              rank=first["rank"], loader_message=first.get("error"))
    missing = sorted(set(range(nproc)) - {rec["rank"] for rec in records})
    if missing:
        if hung:
            raise LoadFailedError(f"rank {missing[0]} did not finish loading within {timeout:g} s (hung); the "
                                  "workers were stopped", rank=missing[0])
        tail = shorten(((stderr or stdout or "").strip().splitlines()[-1:] or ["no output"])[0], 300, words=False)
        if proc.returncode and not records:
            raise LaunchError(f"torchrun exited with {proc.returncode} before any rank reported: {tail}")
        raise LoadFailedError(f"rank {missing[0]} exited without a result (torchrun exit {proc.returncode}): {tail}",
                              rank=missing[0])
    return records


def run_verify(ref: str, *, tp_size: int, ep_size: int = 1, device: str = "cpu", nproc: int | None = None,
               zero_weights: bool = False, dtype: str | None = None, architecture: str | None = None,
               trust_remote_code: bool = False, revision: str | None = None, token: str | None = None,
               timeout: float = 900, progress=None, plan: dict[str, str] | None = None,
               plan_path: str | None = None) -> VerifyResult:
    """Load `ref` on `nproc` real ranks and compare with the prediction (the launcher side of `tpaudit verify`).

    Args:
        ref (`str`): a model directory (or, with `zero_weights`, any source `check` accepts).
        tp_size (`int`), ep_size (`int`): the `DistributedConfig` sizes.
        device (`"cpu" | "cuda"`): gloo on CPU, NCCL on CUDA.
        nproc (`int`, *optional*): ranks to start; default `max(tp_size, ep_size)`.
        zero_weights (`bool`): load a sparse checkpoint with the real headers instead of weights.
        timeout (`float`): seconds before a hung load is stopped.
        plan (`dict[str, str]`, *optional*): `--plan`'s rules (keys relative to the base model), loaded as
            `DistributedConfig(tp_plan=...)` overrides merged into the model's plan, and predicted the same way;
            `plan_path` names its file in findings.
        progress (`Callable[[str, str], None]`, *optional*): told each phase as it starts (`"preparing"`,
            `"predicting"`, `"starting"`, `"loading"` with the ranks started and loaded, `"comparing"`) and a detail.

    Returns:
        `VerifyResult` (`match` when every rank holds what was predicted, to the byte).

    Raises:
        UsageError, LaunchError, LoadFailedError: bad input, torchrun not starting, a rank failing to load.
    """
    import math

    from ..compat import versions as installed_versions

    versions = installed_versions()
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= 7 * 86400):
        raise UsageError(f"--timeout {timeout} must be a positive number of seconds (at most a week)")
    from ..model import ParallelSizes

    world = ParallelSizes.of(tp_size, ep_size).world_size
    nproc = world if nproc is None else nproc
    if nproc != world:
        raise UsageError(f"--nproc {nproc} must equal the world size max(--tp, --ep) = {world} (transformers 5.23 "
                         "without FSDP)")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device} is not supported. Pass cpu or cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
            raise UsageError(f"--device cuda needs {nproc} visible GPU(s); this machine has "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}. Use --device cpu")
    def say(phase: str, detail: str) -> None:
        if progress is not None:
            progress(phase, detail)

    with tempfile.TemporaryDirectory(prefix="tpaudit-verify-") as tmp:
        workdir = Path(tmp)
        say("preparing", "writing a sparse checkpoint from the headers" if zero_weights else "reading the model")
        path, notes = prepare_model_dir(ref, zero_weights=zero_weights, revision=revision, token=token,
                                        workdir=workdir)
        # Predict first: a config, dtype or plan that cannot work is an input error (exit 2) before any rank starts.
        say("predicting", "building the meta model and every rank's shards")
        report = predict(path, tp_size, ep_size, dtype, architecture, trust_remote_code, device, plan=plan,
                         plan_path=plan_path)
        tp_plan = plan_overrides(report.plan.get("text_prefix"), plan)
        if tp_plan is not None:
            notes = notes + [f"--plan{' ' + plan_path if plan_path else ''}: the ranks loaded with {len(tp_plan)} rule(s) as "
                             "DistributedConfig(tp_plan=...) overrides, merged into the model's plan"]
        say("starting", f"{nproc} ranks under torchrun ({'NCCL' if device == 'cuda' else 'gloo'})")
        try:
            records = launch(path, tp_size=tp_size, ep_size=ep_size, nproc=nproc, device=device, dtype=dtype,
                             architecture=architecture, trust_remote_code=trust_remote_code, timeout=timeout,
                             workdir=workdir, progress=progress, tp_plan=tp_plan)
        except LoadFailedError as e:
            raise LoadFailedError(f"{e}; {predicted_failure(report)}", rank=e.rank, loader_message=e.loader_message,
                                  hint=e.hint) from None
    say("comparing", f"{len(records)} ranks' shards with the prediction")
    ranks, mismatches = compare(report.shard_map, records)
    model = {k: report.model.get(k) for k in ("ref", "model_type", "architecture", "dtype")}
    model["ref"] = ref
    return VerifyResult(tp_size=tp_size, ep_size=ep_size, ranks=ranks, mismatches=mismatches, model=model,
                        versions=versions, notes=notes + [f"device: {records[0].get('device')}"])


def run_as_worker(ref: str, *, tp_size: int, ep_size: int, dtype: str | None, architecture: str | None,
                  trust_remote_code: bool, plan: dict[str, str] | None = None,
                  plan_path: str | None = None) -> tuple[VerifyResult | None, int]:
    """`tpaudit verify` launched by the user under torchrun: load on this rank, gather the records on rank 0, which
    predicts and compares; the exit code is broadcast so every rank exits with it. With `plan` (`--plan`), every
    rank predicts first, for the full keys its `DistributedConfig(tp_plan=...)` loads with. Returns `(result on
    rank 0 else None, exit code)`."""
    import torch.distributed as dist

    from ..compat import versions as installed_versions

    def prediction(device: str):
        return predict(ref, tp_size, ep_size, dtype, architecture, trust_remote_code, device, plan=plan,
                       plan_path=plan_path)

    tp_plan = None
    if plan is not None:
        import torch

        tp_plan = plan_overrides(prediction("cuda" if torch.cuda.is_available() else "cpu").plan.get("text_prefix"),
                                 plan)
    record = load_and_measure({"path": ref, "tp_size": tp_size, "ep_size": ep_size, "dtype": dtype,
                               "architecture": architecture, "trust_remote_code": trust_remote_code,
                               "tp_plan": tp_plan})
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    records: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(record, records, dst=0)
    result, code = None, 0
    if dist.get_rank() == 0:
        failed = [r for r in records if not r.get("ok")]
        device = records[0].get("device") or "cpu"
        if failed:
            report = prediction(device)
            result = VerifyResult(tp_size, ep_size, [], [], load_error={"rank": failed[0]["rank"],
                                                                        "message": failed[0].get("error"),
                                                                        "predicted": predicted_failure(report)})
            code = 3
        else:
            report = prediction(device)
            ranks, mismatches = compare(report.shard_map, records)
            result = VerifyResult(tp_size, ep_size, ranks, mismatches,
                                  model={"ref": ref, "architecture": report.model.get("architecture")},
                                  versions=installed_versions())
            code = 0 if result.match else 1
    box = [code]
    dist.broadcast_object_list(box, src=0)
    dist.destroy_process_group()
    return result, box[0]
