"""`tpaudit size`: which (tp_size, ep_size) fits a GPU, with the KV cache, from the exact simulation.

For each option the model is simulated as `check` does (transformers' own plan and TP/EP code), so replicated weights
and uneven shards count on the rank that holds them. Per rank:

    weights   the rank's parameter bytes (exact)
    KV cache  per-token bytes of each layer on that rank x tokens kept: full-attention layers keep `context`
              tokens, sliding/chunked layers `min(window, context)`, times `batch`; linear-attention layers keep a
              fixed state per sequence (conv state + float32 recurrent state), held whole by every rank
    overhead  the overhead policy (below)

The worst rank decides whether the option fits. An option whose plan splits a KV head (TPA102), whose load of the
checkpoint fails in transformers' own loader (TPA304), or that transformers refuses to shard (experts that `ep_size`
does not divide), is invalid, with the reason.

Longest context, per option: `bytes_left_for_kv_cache = capacity - weights - overhead - linear-attention state` on
each rank; `max_context_tokens` is the largest integer context whose KV cache for `batch` sequences, computed
exactly as the option's `kv_cache_bytes` is (`_kv_bytes`, same rounding), fits that on every rank, capped by the text
config's `max_position_embeddings` (`max_context_cap_tokens`).

Training (`training=TrainingSetup(...)`, see `sizing/training.py`): per rank, parameters + gradients + master weights +
optimizer states + the activation budget + the same overhead, against the capacity; the recommendation is then the
smallest valid option whose training states fit.

Overhead policy (default, documented in the README): 1 GiB per GPU for the CUDA context and communication buffers,
plus 8% of the GPU's memory for the allocator's fragmentation and activation workspace. `--overhead 4GiB` replaces
it with a fixed amount, `--overhead 10%` with a share of the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..metamodel import vocabulary as V
from ..errors import UsageError
from ..model import KVCacheSection, ModelSource
from .context import (ContextFit, _kv_bytes, context_fit, max_context_for_rank,  # noqa: F401 (re-exported)
                      max_position_embeddings)
from .training import (ACTIVATIONS_NOTE, OPTIMIZER_NOTES, PER_RANK_NOTE, RankTraining, TrainingSetup, frozen_families,
                       rank_training)

SIZE_SCHEMA = "tpaudit/size/v1"
DEFAULT_CONTEXT_BYTES = 1 << 30
DEFAULT_RESERVE_SHARE = 0.08


@dataclass(frozen=True)
class OverheadPolicy:
    """Bytes per GPU that are neither weights nor KV cache: `fixed_bytes + reserve_share x capacity`."""

    fixed_bytes: int = DEFAULT_CONTEXT_BYTES
    reserve_share: float = DEFAULT_RESERVE_SHARE

    def bytes_for(self, capacity: int) -> int:
        """Overhead bytes for a GPU of `capacity` bytes."""
        return self.fixed_bytes + int(self.reserve_share * capacity)

    def describe(self) -> str:
        """The policy in words, for reports."""
        parts = []
        if self.fixed_bytes:
            parts.append(f"{self.fixed_bytes:,} B fixed (CUDA context, communication buffers)")
        if self.reserve_share:
            parts.append(f"{self.reserve_share:.0%} of GPU memory (allocator, activations)")
        return " + ".join(parts) or "none"


def parse_overhead(text: str | None) -> OverheadPolicy:
    """`None` -> the default policy; `"10%"` -> a share of GPU memory; `"4GiB"` -> fixed bytes.

    Raises:
        UsageError: neither form.
    """
    from ..units import parse_bytes

    if text is None:
        return OverheadPolicy()
    value = text.strip()
    if value.endswith("%"):
        try:
            share = float(value[:-1]) / 100
        except ValueError:
            share = float("nan")
        if not 0 <= share < 1:
            raise UsageError(f"--overhead {text} is not a share of GPU memory between 0% and 100% (exclusive)")
        return OverheadPolicy(fixed_bytes=0, reserve_share=share)
    try:
        return OverheadPolicy(fixed_bytes=parse_bytes(value), reserve_share=0.0)
    except ValueError:
        raise UsageError(f"--overhead {text} is neither a byte size (4GiB) nor a share of GPU memory (10%)") from None


@dataclass(frozen=True)
class RankMemory:
    """One rank of one option: `param_bytes + kv_cache_bytes + state_bytes + overhead_bytes = total_bytes`."""

    rank: int
    param_bytes: int
    kv_cache_bytes: int
    state_bytes: int
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.kv_cache_bytes + self.state_bytes + self.overhead_bytes


@dataclass(frozen=True)
class TrainingFit:
    """One option's model states for training, per rank, against the GPU's capacity.

    Attributes:
        ranks (`tuple[RankTraining, ...]`): every rank (see `training.rank_training`).
        overhead_bytes (`int`): the overhead policy's bytes per GPU.
        capacity_bytes (`int`): the GPU's memory.
    """

    ranks: tuple[RankTraining, ...]
    overhead_bytes: int
    capacity_bytes: int

    @property
    def worst(self) -> RankTraining:
        """The rank with the largest model states + activation budget (the lowest such rank)."""
        return max(self.ranks, key=lambda r: (r.total_bytes, -r.rank))

    def required_bytes(self, rank: RankTraining) -> int:
        """What `rank` needs on its GPU: model states + activation budget + overhead."""
        return rank.total_bytes + self.overhead_bytes

    @property
    def fits(self) -> bool:
        """The worst rank's model states + activation budget + overhead are at most the capacity."""
        return self.required_bytes(self.worst) <= self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        """The option's `training` object: the worst rank's components, `worst_rank_total_bytes` (model states +
        activation budget), overhead, `required_bytes` (+ overhead), `free_bytes`, `fits` and `ranks`."""
        w = self.worst
        return {"worst_rank": w.rank, "param_bytes": w.param_bytes, "grad_bytes": w.grad_bytes,
                "master_weight_bytes": w.master_weight_bytes, "optimizer_bytes": w.optimizer_bytes,
                "activation_budget_bytes": w.activation_budget_bytes,
                "model_state_bytes": w.model_state_bytes, "worst_rank_total_bytes": w.total_bytes,
                "overhead_bytes": self.overhead_bytes, "required_bytes": self.required_bytes(w),
                "free_bytes": self.capacity_bytes - self.required_bytes(w), "fits": self.fits,
                "trainable_elements": w.trainable_elements, "frozen_elements": w.frozen_elements,
                "ranks": [r.to_json() for r in self.ranks]}


@dataclass(frozen=True)
class SizeOption:
    """One (tp_size, ep_size) choice.

    Attributes:
        tp_size (`int`), ep_size (`int`).
        valid (`bool`): `False` when the plan splits a KV head, the load fails, or transformers refuses the sizes.
        reason (`str`, *optional*): why it is invalid.
        ranks (`tuple[RankMemory, ...]`): every rank's memory (empty when the simulation could not run).
        kv_cache_bytes_per_token_per_rank (`int`): worst rank, all cached layers.
        capacity_bytes (`int`): the GPU's memory.
        total_param_bytes (`int`): the whole model, for the naive `total / N` comparison.
        errors (`list[str]`): codes and targets of the error findings of this option (context, not a verdict).
        context_fit (`ContextFit`, *optional*): the longest context that fits (`None` when the simulation could not
            run).
        training (`TrainingFit`, *optional*): model states for training, when asked for.
    """

    tp_size: int
    ep_size: int
    valid: bool
    reason: str | None
    ranks: tuple[RankMemory, ...]
    kv_cache_bytes_per_token_per_rank: int
    capacity_bytes: int
    total_param_bytes: int
    errors: list[str] = field(default_factory=list)
    context_fit: ContextFit | None = None
    training: TrainingFit | None = None

    @property
    def training_fits(self) -> bool:
        """Valid, and the worst rank's training states + activation budget + overhead fit (False without training)."""
        return self.valid and self.training is not None and self.training.fits

    @property
    def worst(self) -> RankMemory | None:
        """The rank with the largest total (the lowest such rank), `None` when the simulation could not run."""
        return max(self.ranks, key=lambda r: (r.total_bytes, -r.rank)) if self.ranks else None

    @property
    def fits(self) -> bool:
        """Valid, and the worst rank's total is at most the GPU's capacity."""
        return self.valid and self.worst is not None and self.worst.total_bytes <= self.capacity_bytes

    @property
    def clean(self) -> bool:
        """Valid, and no error finding."""
        return self.valid and not self.errors

    @property
    def gpus(self) -> int:
        """GPUs the option needs: `max(tp_size, ep_size)` (transformers puts TP and EP on the same ranks)."""
        return max(self.tp_size, self.ep_size)

    @property
    def why(self) -> str | None:
        """One line: why the option is invalid, or which error findings its plan has; `None` when it is clean."""
        if not self.valid:
            return self.reason
        if not self.errors:
            return None
        shown = ", ".join(self.errors[:3]) + (f" and {len(self.errors) - 3} more" if len(self.errors) > 3 else "")
        return f"loads, but its plan has {len(self.errors)} error finding(s): {shown}"

    @property
    def naive_param_bytes(self) -> int:
        """What `total / world_size` would claim each rank holds."""
        return -(-self.total_param_bytes // max(self.tp_size, self.ep_size))

    def to_json(self) -> dict[str, Any]:
        """The option as JSON: worst-rank serving figures, the longest context, `training` (`null` unless asked
        for), and every rank."""
        w = self.worst
        ctx = self.context_fit.to_json() if self.context_fit else dict.fromkeys(
            ("bytes_left_for_kv_cache", "max_context_tokens", "max_context_cap_tokens", "max_context_limited_by",
             "max_context_rank"))
        return {
            "tp_size": self.tp_size, "ep_size": self.ep_size, "valid": self.valid, "reason": self.reason,
            "worst_rank": w.rank if w else None,
            "worst_rank_param_bytes": w.param_bytes if w else None,
            "kv_cache_bytes_per_token_per_rank": self.kv_cache_bytes_per_token_per_rank,
            "kv_cache_bytes": w.kv_cache_bytes if w else None,
            "state_bytes": w.state_bytes if w else None,
            "overhead_bytes": w.overhead_bytes if w else None,
            "total_bytes": w.total_bytes if w else None,
            "free_bytes": self.capacity_bytes - w.total_bytes if w else None,
            "fits": self.fits,
            "naive_param_bytes": self.naive_param_bytes,
            "errors": self.errors,
            "why": self.why,
            **ctx,
            "training": self.training.to_json() if self.training else None,
            "ranks": [{"rank": r.rank, "param_bytes": r.param_bytes, "kv_cache_bytes": r.kv_cache_bytes,
                       "state_bytes": r.state_bytes, "overhead_bytes": r.overhead_bytes,
                       "total_bytes": r.total_bytes} for r in self.ranks],
        }


@dataclass(frozen=True)
class SizeReport:
    """All options for one model and GPU, and the recommendation (the smallest valid tp, then ep, that fits)."""

    model: dict[str, Any]
    gpu: dict[str, Any]
    context: int
    batch: int
    kv_dtype: str
    overhead: OverheadPolicy
    options: tuple[SizeOption, ...]
    versions: dict[str, str]
    notes: tuple[str, ...] = ()
    training: TrainingSetup | None = None
    training_notes: tuple[str, ...] = ()
    frozen: tuple[dict, ...] = ()
    ep_untried: bool = False
    ep_searched: tuple[tuple[int, int], ...] = ()

    @property
    def no_fit_advice(self) -> str | None:
        """What to try when nothing is recommended (`None` when something is): a valid layout that fits in memory
        differs from 'no memory', and a model with an expert-parallel plan whose EP layouts were not asked for gets
        told about `--ep`."""
        if self.recommended is not None:
            return None
        fits = [o for o in self.options if (o.training is not None and o.training.fits if self.training
                                            else o.worst is not None and o.worst.total_bytes <= o.capacity_bytes)]
        if fits and not any(o.valid for o in fits):
            advice = ("No valid option fits: the options that fit in memory are invalid (the reasons are above; "
                      "tpaudit check --suggest proposes rules for a plan's errors)")
        elif self.training:
            budget = ", or a smaller activation budget" if self.training.activation_budget_bytes else ""
            advice = ("No option fits for training: use more or larger GPUs, shard the states further (ZeRO/FSDP), a "
                      f"lighter optimizer (--optimizer adafactor), --no-master-weights{budget}")
        else:
            advice = "No option fits: use more or larger GPUs, a shorter context, or a smaller KV dtype"
        if self.ep_untried:
            advice += ("; the model has an expert-parallel plan and no EP layout was tried: pass --ep 1,2,4,8 (EP "
                       "splits the experts by expert)")
        return advice + "."

    @property
    def recommended(self) -> SizeOption | None:
        """The option to run, `None` when no valid option fits. With `training`, "fits" means the model states
        (+ activation budget + overhead) fit; else the weights + KV cache (+ overhead) do.

        An option without error findings (`clean`) is always preferred to one with them; among the preferred, the
        fewest GPUs (`max(tp_size, ep_size)`), then the smallest worst rank, then the smaller tp and ep."""
        fitting = [o for o in self.options if (o.training_fits if self.training else o.fits)]
        if not fitting:
            return None
        clean = [o for o in fitting if o.clean]
        return min(clean or fitting, key=lambda o: (o.gpus, self._worst_bytes(o), o.tp_size, o.ep_size))

    def _worst_bytes(self, option: SizeOption) -> int:
        """The worst rank's bytes that decide the fit (training states + overhead with `training`)."""
        if self.training:
            return option.training.required_bytes(option.training.worst) if option.training else 0
        return option.worst.total_bytes if option.worst else 0

    @property
    def recommended_why(self) -> str | None:
        """Why the recommended option was chosen, in words (`None` when nothing is recommended)."""
        rec = self.recommended
        if rec is None:
            return None
        if rec.clean:
            return "the option without error findings that fits on the fewest GPUs, then the smallest worst rank"
        shown = ", ".join(rec.errors[:3]) + (f" and {len(rec.errors) - 3} more" if len(rec.errors) > 3 else "")
        return (f"no option without error findings fits; this one loads and fits on the fewest GPUs but its plan has "
                f"{len(rec.errors)} error finding(s): {shown}")

    def to_json(self) -> dict[str, Any]:
        """The `tpaudit/size/v1` JSON object (sizes in integer bytes)."""
        rec = self.recommended
        return {
            "schema": SIZE_SCHEMA, "model": self.model, "gpu": self.gpu, "context": self.context,
            "batch": self.batch, "kv_dtype": self.kv_dtype,
            "overhead_policy": {"fixed_bytes": self.overhead.fixed_bytes,
                                "reserve_share": self.overhead.reserve_share,
                                "description": self.overhead.describe()},
            "options": [o.to_json() for o in self.options],
            "recommended": {"tp_size": rec.tp_size, "ep_size": rec.ep_size} if rec else None,
            "recommended_why": self.recommended_why,
            "ep_searched": [list(p) for p in self.ep_searched],
            "recommended_for": "training" if self.training else "serving",
            "no_fit_advice": self.no_fit_advice,
            "training": ({**self.training.to_json(), "notes": list(self.training_notes),
                          "frozen_parameters": list(self.frozen)} if self.training else None),
            "versions": self.versions, "notes": list(self.notes),
        }


def _kv_heads_split(kv: KVCacheSection | None) -> str | None:
    """Why an option is invalid because its plan splits a KV head (ranks would hold a fraction of a head), from the
    KV-cache section's per-rank heads; `None` when every rank holds whole heads."""
    if not kv:
        return None
    heads = kv.kv_heads_per_rank if isinstance(kv.kv_heads_per_rank, list) else [kv.kv_heads_per_rank]
    split = [h for h in heads if not float(h).is_integer()]
    if not split:
        return None
    whole = kv.kv_heads if isinstance(kv.kv_heads, list) else [kv.kv_heads]
    return (f"the plan splits a KV head: the {' / '.join(str(h) for h in whole)} KV heads leave ranks "
            f"holding {', '.join(f'{h:g}' for h in split)} KV heads in at least one cached layer, so the KV cache "
            "and the sharded attention disagree (TPA102)")


# `check`'s notes that give one option's figures; `size` says the same once, for every option
_PER_OPTION_NOTES = ("quantization: the load decompresses", "quantization: compressed-tensors decompresses")
FIRST_FORWARD_NOTE = ("quantization: compressed-tensors decompresses every compressed module in place on the first "
                      "forward pass (its ct_decompress_hook; transformers loads without dequantize by default): the "
                      "weights of each option are what a rank holds from then on, more than after the load")
DECOMPRESSED_NOTE = ("quantization: the load decompresses quantized checkpoint tensors to the model dtype (the "
                     "quantizer's own dequantize operation): the weights of each option are the decompressed bytes "
                     "(tpaudit check shows what each rank reads of the checkpoint)")


def _serving_weights(report) -> tuple[int, ...]:
    """Parameter bytes per rank while serving: what the load holds, or, where compressed-tensors decompresses every
    compressed module on the first forward pass, what it holds from then on (the larger of the two, per rank)."""
    load = report.loading
    after = load.rank_first_forward_bytes if load is not None else None
    if after is None:
        return tuple(report.rank_param_bytes)
    return tuple(max(a, b) for a, b in zip(report.rank_param_bytes, after))


def _forward_breaks(report) -> str | None:
    """Why an option is invalid because its plan loads but its ranks cannot compute the model (findings whose rule
    declares `breaks_forward`: quantization metadata or scales a rank lacks, a block a rank boundary cuts, a fused
    output scrambled, a style that does not fit, attention heads split); `None` when it has none of them."""
    from ..checks.registry import breaks_the_forward

    breaking = [f for f in report.findings if breaks_the_forward(f)]
    if not breaking:
        return None
    first = breaking[0]
    more = f" (and {len(breaking) - 1} more)" if len(breaking) > 1 else ""
    return f"the plan breaks the forward: {first.code} {first.target}{more}"


def _load_fails(load) -> str | None:
    """Why an option is invalid because transformers' own load of the checkpoint fails on some rank (TPA304), from the
    report's load section; `None` when it does not."""
    failing = [i for i in (load.issues if load is not None else ()) if i.kind in ("raises", "shape")]
    if not failing:
        return None
    first = failing[0]
    what = f"`{first.op}` raises {first.error}" if first.kind == "raises" else (
        f"the loader gives a {list(first.local_shape)} shard for the {list(first.expected_shape)} one")
    more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
    return f"the load fails: {first.name}: {what}{more} (TPA304)"


def size_model(source: ModelSource, *, capacity_bytes: int, gpu_name: str | None, tp_sizes: list[int],
               ep_sizes: list[int] | None = None, context: int = 8192, batch: int = 1, kv_dtype: str | None = None,
               overhead: OverheadPolicy | None = None, plan_override: dict | None = None,
               architecture: str | None = None, trust_remote_code: bool = False,
               dtype: str | None = None, training: TrainingSetup | None = None) -> SizeReport:
    """Simulate every (tp, ep) option and size each rank against `capacity_bytes`.

    Args:
        source (`ModelSource`): the model.
        capacity_bytes (`int`): memory of one GPU, bytes.
        gpu_name (`str`, *optional*): preset name, for the report.
        tp_sizes (`list[int]`): tensor-parallel sizes to try.
        ep_sizes (`list[int]`, *optional*): expert-parallel sizes, each combined with every tp size; a pair the
            installed transformers refuses (5.23-5.25 without FSDP: ep_size 1 or tp_size) is an invalid option with
            transformers' reason. Default (`None` or empty): `[1]`, and for a model with an expert-parallel plan also
            every layout transformers accepts on each tp size's ranks (`expert_layouts`; the report's `ep_searched`
            and a note say which).
        context (`int`): tokens per sequence kept in the KV cache.
        batch (`int`): sequences.
        kv_dtype (`str`, *optional*): cache dtype (`bfloat16`, `float16`, `float8_e4m3fn`, `float32`); default: the
            model's dtype.
        overhead (`OverheadPolicy`, *optional*): default 1 GiB + 8% of capacity.
        plan_override, architecture, trust_remote_code, dtype: as for `check`.
        training (`TrainingSetup`, *optional*): also size each option's training model states (see
            `sizing/training.py`); the recommendation then follows them.

    Returns:
        `SizeReport`: per option the serving figures, the longest context (`context_fit`) and, with `training`,
        the model states per rank.

    Raises:
        UsageError: a size out of range, a non-positive context or batch, or a bad kv dtype.
        ConfigError, PlanError: as for `check`.
    """
    import torch

    from ..run.pipeline import Audit
    from ..metamodel import BuildOptions
    from ..model import MAX_WORLD_SIZE, ParallelSizes

    if context < 1 or batch < 1:
        raise UsageError(f"--context {context} / --batch {batch} must be positive integers")
    overhead = overhead or OverheadPolicy()
    search_ep = not ep_sizes
    ep_sizes = ep_sizes or [1]
    for flag, values in (("--tp", tp_sizes), ("--ep", ep_sizes)):
        if any(v < 1 or v > MAX_WORLD_SIZE for v in values):
            raise UsageError(f"{flag} {','.join(map(str, values))}: each size must be between 1 and {MAX_WORLD_SIZE}")
    pairs = sorted({(tp, ep) for tp in tp_sizes for ep in ep_sizes})
    audit = Audit(source, BuildOptions(plan_override=plan_override, architecture=architecture,
                                       trust_remote_code=trust_remote_code, dtype=dtype))
    versions = audit.versions
    searched = expert_layouts(audit, tp_sizes) if search_ep else []
    pairs = sorted(set(pairs) | set(searched))
    options, model_info, notes, kv_name = [], None, set(), kv_dtype
    cap_tokens = max_position_embeddings(source.config)
    if cap_tokens is not None and context > cap_tokens:
        notes.add(f"--context {context:,} exceeds the model's max_position_embeddings ({cap_tokens:,}): the KV cache "
                  "is sized as asked, but the model is not configured for sequences that long")
    frozen: dict[str, dict] = {}
    # every pair asked for gets a row: one transformers refuses (its DistributedConfig / sharding, through the seam)
    # is an invalid row with transformers' reason, so no size silently disappears
    for tp, ep in pairs:
        try:
            report = audit.report(ParallelSizes.of(tp, ep), parity="off")
        except UsageError as e:
            options.append(SizeOption(tp, ep, False, str(e), (), 0, capacity_bytes, 0))
            continue
        model_info = model_info or report.model
        notes.update(n for n in report.notes if not n.startswith(_PER_OPTION_NOTES))
        if report.loading is not None and report.loading.rank_first_forward_bytes is not None:
            notes.add(FIRST_FORWARD_NOTE)
        if report.loading is not None and report.loading.decompressed:
            notes.add(DECOMPRESSED_NOTE)
        kv = report.kv_cache
        kv_name = kv_dtype or (kv.dtype if kv else report.model["dtype"])
        kv_torch = getattr(torch, kv_name, None) if kv_name else None
        if not isinstance(kv_torch, torch.dtype) or not kv_torch.is_floating_point:
            raise UsageError(f"--kv-dtype {kv_name!r} is not a cache dtype. Pass bfloat16, float16, float8_e4m3fn or "
                             "float32")
        kv_itemsize = kv_torch.itemsize
        scale = kv_itemsize / kv.itemsize if kv else 1.0
        state = int(kv.linear_state_bytes_per_sequence * scale) * batch if kv else 0
        over = overhead.bytes_for(capacity_bytes)
        weights = _serving_weights(report)
        ranks = tuple(RankMemory(r, weights[r], _kv_bytes(kv, r, context, batch, scale) if kv else 0, state, over)
                      for r in range(report.shard_map.world_size))
        reason = _kv_heads_split(kv) or _load_fails(report.loading) or _forward_breaks(report)
        per_token = int(round(max(kv.bytes_per_token_per_rank) * scale)) if kv else 0
        fit = context_fit(kv, weights, capacity_bytes=capacity_bytes, overhead_bytes=over,
                          state_bytes=state, batch=batch, scale=scale, cap_tokens=cap_tokens)
        train = None
        if training is not None:
            train = TrainingFit(rank_training(report.shard_map, training), over, capacity_bytes)
            for fam in frozen_families(report.shard_map):
                frozen.setdefault(fam["name"], fam)
        options.append(SizeOption(tp, ep, reason is None, reason, ranks, per_token, capacity_bytes,
                                  report.total_param_bytes,
                                  [f"{f.code} {f.target}" for f in report.findings if f.severity == "error"],
                                  fit, train))
    if model_info is None:
        model_info = {"ref": source.ref, "repo_id": source.repo_id}
    gpu = {"name": gpu_name, "memory_bytes": capacity_bytes}
    training_notes: tuple[str, ...] = ()
    if training is not None:
        training_notes = (ACTIVATIONS_NOTE, OPTIMIZER_NOTES[training.optimizer], PER_RANK_NOTE)
        if frozen:
            training_notes += (f"{len(frozen)} parameter families get no gradient or optimizer state (quantized or "
                               "integer tensors and their quantization metadata); they count as parameters only",)
    from ..compat import backend

    ep_untried = all(ep == 1 for _, ep in pairs) and bool(backend().merged_plans(audit.built.model)[1])
    if searched:
        tried = ", ".join(f"tp {tp} ep {ep}" for tp, ep in searched)
        notes.add(f"expert layouts: the model has an expert-parallel plan and no --ep was given, so each tp size was "
                  f"also tried with the ep sizes transformers {versions.get('transformers', '')} accepts on the same "
                  f"ranks ({tried}); --ep 1 sizes tensor parallelism alone")
    return SizeReport(model=model_info, gpu=gpu, context=context, batch=batch, kv_dtype=kv_name or "model dtype",
                      overhead=overhead, options=tuple(options), versions=versions, notes=tuple(sorted(notes)),
                      training=training, training_notes=training_notes, frozen=tuple(frozen.values()),
                      ep_untried=ep_untried, ep_searched=tuple(searched))


def expert_layouts(audit, tp_sizes: list[int]) -> list[tuple[int, int]]:
    """The `(tp_size, ep_size)` pairs with `ep_size > 1` that the installed transformers accepts on each tp size's
    ranks (`ep_size` from 2 to `tp_size`, asked of its own `DistributedConfig` validation through the seam:
    `accepted_ep_sizes`; 5.23-5.25 accept `ep_size = tp_size`), for a model with an expert-parallel plan; `[]` for a
    model without one.

    Args:
        audit (`Audit`): the built model.
        tp_sizes (`list[int]`): the tp sizes asked for.

    Returns:
        The pairs, ascending.
    """
    from ..compat import backend

    tf = backend()
    if not tf.merged_plans(audit.built.model)[1]:
        return []
    return sorted((tp, ep) for tp in set(tp_sizes) for ep in tf.accepted_ep_sizes(tp, range(2, tp + 1)))
