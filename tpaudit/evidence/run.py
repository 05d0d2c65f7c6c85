"""`run_parity`: the small model on threaded ranks with the plan under review, compared with the unsharded model."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .._process import without_torchrun
from ..compat import PlanRejectedError, backend
from ..compat import parity as seam
from ..errors import UsageError
from ..model import ParityResult
from ..units import shorten
from .isolate import first_verdicts
from .ranks import record_reference, run_ranks
from .small_model import EP_KERNELS, KERNELS, SmallModel, build_small_model, one_thread, resolve_class
from .trace import trace

ISOLATION_BUDGET = 3.0
"""The isolation re-runs may take at most this many times the first run (the build, trace, reference and sharded
run of the plan as given)..."""
ISOLATION_FLOOR_SECONDS = 20.0
"""... or this many seconds, whichever is more (a first run of under a second leaves room for a few re-runs)."""


def run_parity(config, model_class, tp_plan: dict | None, tp_size: int, ep_size: int = 1, *, seed: int = 0,
               timeout: float = 120, checkpoint_keys=None, isolate: bool | None = None,
               small: SmallModel | None = None, head_limited: dict[str, str] | None = None) -> ParityResult:
    """Load a small model of `config`'s architecture on `tp_size` real ranks with the plan under review, run the same
    tokens through it and through the unsharded model, and compare (see `tpaudit.evidence`).

    The ranks are threads of this process on torch's multi-threaded process group; when this process already belongs
    to a process group, or an accelerator is visible, the same check runs in a subprocess on the CPU instead
    (`python -m tpaudit.evidence.worker`, one more import).

    Args:
        config (`PretrainedConfig`): the model's real config (a composite model is checked through its text decoder,
            where its plan lives; the result's `scope` says so).
        model_class (`type | str`): the class the real model uses, or its name in `transformers`.
        tp_plan (`dict[str, str]`, *optional*): the `base_model_tp_plan` under review, keys relative to the base
            model (`layers.*.self_attn.q_proj`); `None` = what the config ships. The class-level `_tp_plan`
            (`lm_head`) and the `embed_tokens` rule transformers adds stay as transformers merges them.
        tp_size (`int`): ranks to split over (>= 2 to split anything).
        ep_size (`int`, *optional*, defaults to 1): the `DistributedConfig` `ep_size`.
        seed (`int`, *optional*, defaults to 0): seed of the small model's weights and input.
        timeout (`float`, *optional*, defaults to 120): seconds before hung ranks are woken and reported.
        checkpoint_keys (`Iterable[str]`, *optional*): the real checkpoint's tensor names, so that the small model is
            stored the same way (see `build_small_model`: a plain `colwise` on fused experts is right for a
            checkpoint of per-expert tensors and wrong for one that stores them fused).
        isolate (`bool`, *optional*): `True` runs the ranks in a subprocess (a hard timeout, nothing of this
            process touched); `None` does so only when needed (see above).
        small (`SmallModel`, *optional*): the `small_model` that `split_outputs` traced for the same arguments, used
            instead of a second build when the run loads with its kernels (`ep_size` 1) in this process; the caller
            cleans it up.
        head_limited (`dict[str, str]`, *optional*): generic prefixed rule keys the static checks already know
            cannot split at this `tp_size` (heads or KV heads it does not divide: TPA101 / TPA102) -> why; their
            blocks are run whole at once when they fail (see `isolate`).

    Returns:
        `ParityResult`. A plan that crashes or diverges is a result (`passed=False`), never an exception.

    Raises:
        UsageError: `tp_size` or `ep_size` < 1, sizes `DistributedConfig` rejects (`ep_size` not a multiple of
            `tp_size`), or `model_class` is not a transformers model class.
    """
    if tp_size < 1 or ep_size < 1:
        raise UsageError(f"tp_size {tp_size} / ep_size {ep_size} is invalid: the parity check needs sizes >= 1. "
                         "Pass --tp 2 or more")
    resolve_class(model_class)
    try:
        backend().distributed_config(tp_size, ep_size)
    except PlanRejectedError as e:
        raise UsageError(f"tp_size {tp_size}, ep_size {ep_size} is rejected by transformers: {e.detail} Pass "
                         f"ep_size 1 or one DistributedConfig accepts with tp_size {tp_size}") from None
    start = time.perf_counter()
    if tp_size == 1 and ep_size == 1:
        return ParityResult(ran=False, reason="tp_size 1 and ep_size 1 split nothing: no sharded forward to compare",
                            tp_size=tp_size, ep_size=ep_size)
    why = "asked for" if isolate else seam.cannot_host_ranks() if isolate is None else None
    if why is not None:
        result = run_in_subprocess(config, model_class, tp_plan, tp_size, ep_size, seed=seed, timeout=timeout,
                                   checkpoint_keys=checkpoint_keys, head_limited=head_limited)
        return dataclasses.replace(result, reason=f"{result.reason} (ran in a subprocess: {why})",
                                   seconds=time.perf_counter() - start)
    kernels = EP_KERNELS if ep_size > 1 else KERNELS
    with one_thread():
        return _run_here(config, model_class, tp_plan, tp_size, ep_size, seed, timeout, start,
                         checkpoint_keys, small if small is not None and small.kernels == kernels else None,
                         head_limited)


def run_in_subprocess(config, model_class, tp_plan, tp_size: int, ep_size: int, *, seed: int, timeout: float,
                      checkpoint_keys=None, head_limited=None) -> ParityResult:
    """Run `tpaudit.evidence.run_parity` in a fresh CPU-only interpreter and return its `ParityResult`.

    A subprocess that dies, overruns `timeout` (plus 60 s for its imports) or answers something that is not a
    result is a result with `ran=False` saying so."""
    name = model_class if isinstance(model_class, str) else model_class.__name__
    with tempfile.TemporaryDirectory(prefix="tpaudit-parity-") as tmp:
        spec = {"model_type": config.model_type, "config": config.to_dict(), "model_class": name,
                "tp_plan": tp_plan, "tp_size": tp_size, "ep_size": ep_size, "seed": seed, "timeout": timeout,
                "checkpoint_keys": list(checkpoint_keys) if checkpoint_keys is not None else None,
                "head_limited": dict(head_limited or {}),
                "out": str(Path(tmp) / "result.json")}
        Path(tmp, "spec.json").write_text(json.dumps(spec, default=str))
        env = without_torchrun()
        env["CUDA_VISIBLE_DEVICES"] = ""
        try:
            proc = subprocess.run([sys.executable, "-m", "tpaudit.evidence.worker", str(Path(tmp, "spec.json"))],
                                  capture_output=True, text=True, env=env, timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            return ParityResult(ran=False, reason=f"the parity subprocess did not finish within {timeout + 60:g} s",
                                tp_size=tp_size, ep_size=ep_size)
        out = Path(spec["out"])
        if not out.is_file():
            tail = (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1:] or ["no output"]
            return ParityResult(ran=False, reason=f"the parity subprocess failed (exit {proc.returncode}): {tail[0]}",
                                tp_size=tp_size, ep_size=ep_size)
        try:
            return ParityResult.from_json(json.loads(out.read_text()))
        except ValueError as e:
            return ParityResult(ran=False, reason=f"the parity subprocess answered no result: {e}",
                                tp_size=tp_size, ep_size=ep_size)


def _run_here(config, model_class, tp_plan, tp_size, ep_size, seed, timeout, start,
              checkpoint_keys=None, given: SmallModel | None = None, head_limited=None) -> ParityResult:
    base = {"tp_size": tp_size, "ep_size": ep_size}
    small = given
    if small is None:
        try:
            small = build_small_model(config, model_class, tp_plan, tp_size, seed=seed,
                                      checkpoint_keys=checkpoint_keys, kernels=EP_KERNELS if ep_size > 1 else KERNELS)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - our limit, not the plan's: say so and do not judge
            why = shorten(f"{type(e).__name__}: {e}", 240, words=False)
            return ParityResult(ran=False, reason=f"the small model could not be built here: {why}",
                                seconds=time.perf_counter() - start, **base)
    own = given is None
    if not small.plan and not (ep_size > 1 and small.ep_plan):
        if own:
            small.cleanup()
        return ParityResult(ran=False, reason=f"the plan shards nothing in {small.model_class.__name__} (no TP rule "
                            "applies): there is no sharded forward to compare", seconds=time.perf_counter() - start,
                            shrunk=small.shrunk, layers=small.layers, model_class=small.model_class.__name__,
                            scope=small.scope, **base)
    try:
        try:
            found = small.found if small.traced else trace(small)[0]
            ref = record_reference(small)
        except Exception as e:  # noqa: BLE001 - the unsharded small model itself does not run: nothing to compare
            why = shorten(f"{type(e).__name__}: {e}", 240, words=False)
            return ParityResult(ran=False, reason=f"the small unsharded {small.model_class.__name__} does not run "
                                f"here: {why}", seconds=time.perf_counter() - start,
                                shrunk=small.shrunk, layers=small.layers, model_class=small.model_class.__name__,
                                scope=small.scope, **base)
        runs, finished = run_ranks(small, tp_size, ep_size, timeout, cut_sites=small.cut_sites)
        world = max(tp_size, ep_size)
        first_seconds = time.perf_counter() - start
        facts, verdicts, reruns, iso_seconds = first_verdicts(
            small, ref, found, tp_size, ep_size, timeout, runs, finished, head_limited,
            budget=max(ISOLATION_FLOOR_SECONDS, ISOLATION_BUDGET * first_seconds))
        reasons = [f"ran the plan on {world} threaded ranks (tp_size {tp_size}, ep_size {ep_size}) with a small "
                   f"{small.model_class.__name__} (layers {list(small.layers)} of the real model, one per kind)"]
        reasons += small.notes
        if found:
            reasons.append("the forward cuts into parts the output of " + ", ".join(sorted(found)))
        return ParityResult(
            ran=True, reason="; ".join(reasons), seconds=time.perf_counter() - start,
            modules_compared=facts.get("modules_compared", 0), max_abs_error=facts.get("max_abs_error"),
            first_divergent_module=facts.get("first_divergent_module"), rule=facts.get("rule"),
            style=facts.get("style"), observed_at=facts.get("observed_at"), error=facts.get("error"),
            passed=facts.get("passed"), fused=facts.get("fused", False),
            split=tuple(found[k] for k in sorted(found)), shrunk=small.shrunk, layers=small.layers,
            model_class=small.model_class.__name__, scope=small.scope, rank=facts.get("rank"),
            input_split=facts.get("input_split"), observed_layer=facts.get("observed_layer"), verdicts=verdicts,
            reruns=reruns, isolation_seconds=iso_seconds, **base)
    finally:
        if own:
            small.cleanup()
