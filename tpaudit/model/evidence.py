"""The evidence stage's values: what the sharded forward of a small model showed (`tpaudit.evidence`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PARITY_TOLERANCE = 1e-4
"""Relative tolerance of the parity check: an output differs when `max |sharded - unsharded| > PARITY_TOLERANCE *
max(1, max |unsharded|)` (float32 reordering noise is a few 1e-6 in the small model; a wrong split moves an output by
the order of its own magnitude)."""


def _check(value: Any, types: type | tuple[type, ...], what: str) -> Any:
    """`value` when it is one of `types` (bool is not an int here), else `ValueError` naming `what`."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{what}: expected {types}, got a bool")
    if not isinstance(value, types):
        raise ValueError(f"{what}: expected {types}, got {type(value).__name__}")
    return value


def _opt(value: Any, types: type | tuple[type, ...], what: str) -> Any:
    return None if value is None else _check(value, types, what)


def _pair(value: Any) -> tuple[str, str]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, str) for x in value)):
        raise ValueError("verdict.fix_partners[]: expected [rule, style]")
    return value[0], value[1]


@dataclass(frozen=True)
class SplitOutput:
    """A module (or parameter) the plan splits on its output, whose output the forward then cuts into parts.

    Attributes:
        module (`str`): generic name, e.g. `model.layers.*.self_attn.qkv_proj` or
            `model.layers.*.mlp.experts.gate_up_proj` (a parameter with its own rule).
        rule (`str`): the plan key that splits it (generic, prefixed), as transformers looks it up.
        style (`str`): the rule's style: `colwise` or `packed_colwise` (for an `[E, in, out]` experts tensor, whose
            output is its last dimension, also `rowwise`).
        action (`str`): what the forward does to the output, in words (`"split into parts of [128, 128, 256, 256]
            features out of 768, per-head rows of 48 features, wider than any head (16): several projections packed
            per head"`).
        cut (`"blocks" | "groups"`): the parts are blocks of the whole output (`[Q_all | K_all | V_all]`,
            `[gate | up]`), or repeat in groups of `period` features (`[head][q, k, v]`, CodeGen's 4 groups of
            `[q | v | k]`).
        op (`str`): the torch function that cut it (`split`, `chunk`, `slice`, ...).
        parts (`tuple[int, ...]`): the features each piece of that cut keeps.
        total (`int`): the features of the output the cut applies to (in the small model).
        period (`int`): features per group (`total` for blocks): the shard of a plain `colwise` split keeps the parts
            together only when it holds whole groups, i.e. when `tp_size` divides `groups`.
    """

    module: str
    rule: str
    style: str
    action: str
    cut: str = "blocks"
    op: str = ""
    parts: tuple[int, ...] = ()
    total: int = 0
    period: int = 0

    @property
    def groups(self) -> int:
        """Number of groups the output repeats its parts in (1 for blocks of the whole output)."""
        return self.total // self.period if self.period else 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"module": self.module, "rule": self.rule, "style": self.style, "action": self.action}
        if self.total:
            out.update(cut=self.cut, op=self.op, parts=list(self.parts), total=self.total, period=self.period,
                       groups=self.groups)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SplitOutput":
        """The inverse of `to_json`, validating every field.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        _check(d, dict, "split entry")
        parts = tuple(_check(p, int, "split.parts[]") for p in _check(d.get("parts", []), list, "split.parts"))
        cut = _check(d.get("cut", "blocks"), str, "split.cut")
        if cut not in ("blocks", "groups"):
            raise ValueError(f"split.cut: unknown value {cut!r}")
        return cls(module=_check(d.get("module"), str, "split.module"), rule=_check(d.get("rule"), str, "split.rule"),
                   style=_check(d.get("style"), str, "split.style"), action=_check(d.get("action"), str,
                                                                                   "split.action"),
                   cut=cut, op=_check(d.get("op", ""), str, "split.op"), parts=parts,
                   total=_check(d.get("total", 0), int, "split.total"),
                   period=_check(d.get("period", 0), int, "split.period"))


VERDICT_STATUSES = ("error", "cleared", "not_exercised")
VERDICT_KINDS = ("packed_layout", "style_mismatch")


@dataclass(frozen=True)
class RuleVerdict:
    """What the parity check decided about one rule of the plan (or one module that lacks a rule).

    Attributes:
        rule (`str`, *optional*): the plan key (generic, prefixed: `model.layers.*.self_attn.o_proj`); `None` for a
            module that no rule splits but that receives a split input (a missing reduction).
        style (`str`, *optional*): the rule's style (`None` with `rule`).
        module (`str`): generic name of the module (or parameter) the rule applies to.
        status (`"error" | "cleared" | "not_exercised"`): the rule breaks the sharded forward (alone, or together with
            the rest of its block); it held in a run whose outputs matched the unsharded model; or the check could not
            run it (`why` says why).
        kind (`"packed_layout" | "style_mismatch"`, *optional*): for an error, whether the split scrambles the parts
            of an output the forward cuts into parts (`split` holds that cut) or is a style that does not fit how
            the model uses an unfused module.
        why (`str`): how the verdict was reached, in words (`"held in a run whose 84 compared outputs matched"`,
            `"module never reached by the forward"`, `"inside an expert-parallel module (EP scope)"`).
        observed_at (`str`, *optional*): generic module name where the failure showed (the first output that
            differed, or the module running when a rank raised).
        observed_layer (`int`, *optional*): the real layer index (of the small model's kept layer) it showed in.
        exception (`str`, *optional*): what a rank raised, one line (`"rank 0: RuntimeError: ..."`).
        max_abs_error (`float`, *optional*): the largest `|sharded - unsharded|` where the outputs differed.
        rank (`int`, *optional*): the rank where the failure showed first.
        input_split (`bool`, *optional*): whether the module's input reached it split (each rank a slice).
        fix_style (`str`, *optional*): a style for this rule with which the sharded forward matched the unsharded
            model (re-run with it; `None` when none was found).
        together_with (`tuple[str, ...]`): other rules of the same block that fail with this one.
        split (`SplitOutput`, *optional*): for a `packed_layout` error, the cut of its output.
        fix_partners (`tuple[tuple[str, str], ...]`): `(rule, style)` of the partners `fix_style` needs (the
            rowwise projection that reduced this rule's split output takes the whole one), re-run with it.
        tp_sizes_ok (`tuple[int, ...]`): smaller tp sizes at which the rule, as the plan has it, ran clean (re-run on
            the same small model): for an output cut in groups, a size that divides the number of groups.
    """

    rule: str | None
    style: str | None
    module: str
    status: str
    kind: str | None = None
    why: str = ""
    observed_at: str | None = None
    observed_layer: int | None = None
    exception: str | None = None
    max_abs_error: float | None = None
    rank: int | None = None
    input_split: bool | None = None
    fix_style: str | None = None
    together_with: tuple[str, ...] = ()
    split: SplitOutput | None = None
    fix_partners: tuple[tuple[str, str], ...] = ()
    tp_sizes_ok: tuple[int, ...] = ()

    @property
    def target(self) -> str:
        """What a finding about it points at: the rule key, else the module."""
        return self.rule or self.module

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["together_with"] = list(self.together_with)
        out["split"] = self.split.to_json() if self.split is not None else None
        out["fix_partners"] = [list(p) for p in self.fix_partners]
        out["tp_sizes_ok"] = list(self.tp_sizes_ok)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RuleVerdict":
        """The inverse of `to_json`, validating every field.

        Raises:
            ValueError: a field is missing, of the wrong type, or an unknown status or kind.
        """
        _check(d, dict, "verdict")
        status = _check(d.get("status"), str, "verdict.status")
        kind = _opt(d.get("kind"), str, "verdict.kind")
        if status not in VERDICT_STATUSES or (kind is not None and kind not in VERDICT_KINDS):
            raise ValueError(f"verdict: unknown status {status!r} or kind {kind!r}")
        err = d.get("max_abs_error")
        split = d.get("split")
        return cls(rule=_opt(d.get("rule"), str, "verdict.rule"), style=_opt(d.get("style"), str, "verdict.style"),
                   module=_check(d.get("module"), str, "verdict.module"), status=status, kind=kind,
                   why=_check(d.get("why", ""), str, "verdict.why"),
                   observed_at=_opt(d.get("observed_at"), str, "verdict.observed_at"),
                   observed_layer=_opt(d.get("observed_layer"), int, "verdict.observed_layer"),
                   exception=_opt(d.get("exception"), str, "verdict.exception"),
                   max_abs_error=None if err is None else float(_check(err, (int, float), "verdict.max_abs_error")),
                   rank=_opt(d.get("rank"), int, "verdict.rank"),
                   input_split=_opt(d.get("input_split"), bool, "verdict.input_split"),
                   fix_style=_opt(d.get("fix_style"), str, "verdict.fix_style"),
                   together_with=tuple(_check(x, str, "verdict.together_with[]")
                                       for x in _check(d.get("together_with", []), list, "verdict.together_with")),
                   split=None if split is None else SplitOutput.from_json(split),
                   fix_partners=tuple(_pair(p) for p in _check(d.get("fix_partners", []), list,
                                                                "verdict.fix_partners")),
                   tp_sizes_ok=tuple(_check(x, int, "verdict.tp_sizes_ok[]")
                                     for x in _check(d.get("tp_sizes_ok", []), list, "verdict.tp_sizes_ok")))


@dataclass(frozen=True)
class ParityResult:
    """What the sharded forward showed (the report's `parity` section).

    Attributes:
        ran (`bool`): the sharded forward was attempted.
        reason (`str`): why it ran (or did not) and how: the ranks, the layers kept, the checkpoint layout, and what
            it does not cover (quantized weights run unquantized; a composite model is checked through its text
            decoder; a subprocess when this process could not host the ranks).
        tp_size (`int`), ep_size (`int`): the `DistributedConfig` sizes the ranks loaded with.
        modules_compared (`int`): module calls whose output was compared on some rank (whole, or as the rank's slice)
            in the run of the plan as given.
        max_abs_error (`float`, *optional*): the largest `|sharded - unsharded|` over every compared output of every
            rank (logits included); `None` when nothing could be compared.
        first_divergent_module (`str`, *optional*): generic name of the module (or parameter) whose split made the
            forward diverge first: the first module (in execution order) whose output differs or that raised when
            its own rule is at fault (its input still matched), else the split it consumed (`observed_at` says
            where it showed); `None` when nothing diverged.
        rule (`str`, *optional*), style (`str`, *optional*): the plan rule and style that split it (`None` when the
            module has no rule, e.g. one that receives a split input unreduced).
        observed_at (`str`, *optional*): generic name of the module where the divergence showed (the first whose
            output differed, or the one running when a rank raised).
        error (`str`, *optional*): the exception a rank raised, one line (`"rank 0: RuntimeError: ..."`).
        passed (`bool`, *optional*): `True` when every rank ran, at least one module output was compared and every
            compared output matched; `False` when a rank raised or an output differed; `None` when the check did not
            run or compared nothing (no evidence either way).
        seconds (`float`): wall time of the check (the isolation re-runs included).
        fused (`bool`): the module blamed first is one whose output the forward cuts into parts (a fused or packed
            projection, see `split`): a `packed_layout` error rather than a style mismatch.
        split (`tuple[SplitOutput, ...]`): the fused or packed projections the trace found.
        shrunk (`dict[str, list[int]]`): config attribute -> `[real, small]` for every attribute the small model
            scales (dotted for nested configs).
        layers (`tuple[int, ...]`): the real layer indices the small model keeps, one per kind, in order.
        model_class (`str`, *optional*): the class that was loaded.
        scope (`str`): `"whole model"`, or what part of a composite model was checked.
        tolerance (`float`): the relative tolerance (`PARITY_TOLERANCE`).
        rank (`int`, *optional*): the rank that raised or diverged first.
        input_split (`bool`, *optional*): when the module blamed is where the divergence showed, whether its input
            reached it split (each rank a slice) or whole; `None` otherwise.
        observed_layer (`int`, *optional*): the real model's layer index (of the kept layer) where the divergence
            showed, e.g. 5 for Gemma 4's first global-attention layer.
        verdicts (`tuple[RuleVerdict, ...]`): one per rule of the small model's plans (and per module found to lack a
            rule), errors first: what the run of the plan and the isolation re-runs decided.
        reruns (`int`): sharded runs after the first, to isolate the rules that broke it.
        isolation_seconds (`float`): wall time of those re-runs.
        cached (`bool`): the result was read from the parity cache (`tpaudit.evidence.cache`), not computed now.
        cache_problem (`str`, *optional*): why the cache did not answer although it was asked: an entry for these
            inputs was refused (not authenticated by this user's cache key, corrupt, a FIFO) and the check ran
            again, or there is no usable cache key. `None` for a hit, a plain miss, or the cache switched off.
    """

    ran: bool
    reason: str
    tp_size: int
    ep_size: int = 1
    modules_compared: int = 0
    max_abs_error: float | None = None
    first_divergent_module: str | None = None
    rule: str | None = None
    style: str | None = None
    observed_at: str | None = None
    error: str | None = None
    passed: bool | None = None
    seconds: float = 0.0
    fused: bool = False
    split: tuple[SplitOutput, ...] = ()
    shrunk: dict[str, list[int]] = field(default_factory=dict)
    layers: tuple[int, ...] = ()
    model_class: str | None = None
    scope: str = "whole model"
    tolerance: float = PARITY_TOLERANCE
    rank: int | None = None
    input_split: bool | None = None
    observed_layer: int | None = None
    verdicts: tuple[RuleVerdict, ...] = ()
    reruns: int = 0
    isolation_seconds: float = 0.0
    cached: bool = False
    cache_problem: str | None = None

    _EXTRA = ("verdicts", "reruns", "isolation_seconds", "cached", "cache_problem")

    def verdict(self, target: str) -> RuleVerdict | None:
        """The verdict whose rule (or, for a missing rule, module) is `target`."""
        return next((v for v in self.verdicts if v.target == target or v.module == target), None)

    def errors(self) -> tuple[RuleVerdict, ...]:
        """The verdicts with status `"error"`."""
        return tuple(v for v in self.verdicts if v.status == "error")

    def to_json(self) -> dict[str, Any]:
        """The report's `parity` section (JSON-serialisable). The per-rule keys (`verdicts`, `reruns`,
        `isolation_seconds`) appear once the check ran; `cached` only for a result read from the cache."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in self._EXTRA}
        out["split"] = [s.to_json() for s in self.split]
        out["shrunk"] = {k: list(v) for k, v in self.shrunk.items()}
        out["layers"] = list(self.layers)
        out["seconds"] = round(self.seconds, 3)
        if self.ran and self.verdicts:
            out["verdicts"] = [v.to_json() for v in self.verdicts]
            out["reruns"] = self.reruns
            out["isolation_seconds"] = round(self.isolation_seconds, 3)
        if self.cached:
            out["cached"] = True
        if self.cache_problem:
            out["cache_problem"] = self.cache_problem
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ParityResult":
        """The inverse of `to_json` (the parity subprocess's answer, a cache entry), validating every field: a value
        of the wrong type is refused, never trusted.

        Raises:
            ValueError: a field is missing, unknown or of the wrong type.
        """
        _check(d, dict, "parity")
        known = set(cls.__dataclass_fields__)
        if unknown := set(d) - known:
            raise ValueError(f"parity: unknown keys {sorted(unknown)}")
        num = (int, float)

        def opt_float(key: str) -> float | None:
            v = d.get(key)
            return None if v is None else float(_check(v, num, f"parity.{key}"))

        shrunk = _check(d.get("shrunk", {}), dict, "parity.shrunk")
        for k, v in shrunk.items():
            if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in v)):
                raise ValueError(f"parity.shrunk[{k!r}]: expected [real, small]")
        return cls(
            ran=_check(d.get("ran"), bool, "parity.ran"), reason=_check(d.get("reason"), str, "parity.reason"),
            tp_size=_check(d.get("tp_size"), int, "parity.tp_size"),
            ep_size=_check(d.get("ep_size", 1), int, "parity.ep_size"),
            modules_compared=_check(d.get("modules_compared", 0), int, "parity.modules_compared"),
            max_abs_error=opt_float("max_abs_error"),
            first_divergent_module=_opt(d.get("first_divergent_module"), str, "parity.first_divergent_module"),
            rule=_opt(d.get("rule"), str, "parity.rule"), style=_opt(d.get("style"), str, "parity.style"),
            observed_at=_opt(d.get("observed_at"), str, "parity.observed_at"),
            error=_opt(d.get("error"), str, "parity.error"), passed=_opt(d.get("passed"), bool, "parity.passed"),
            seconds=float(_check(d.get("seconds", 0.0), num, "parity.seconds")),
            fused=_check(d.get("fused", False), bool, "parity.fused"),
            split=tuple(SplitOutput.from_json(s) for s in _check(d.get("split", []), list, "parity.split")),
            shrunk={k: list(v) for k, v in shrunk.items()},
            layers=tuple(_check(x, int, "parity.layers[]") for x in _check(d.get("layers", []), list,
                                                                            "parity.layers")),
            model_class=_opt(d.get("model_class"), str, "parity.model_class"),
            scope=_check(d.get("scope", "whole model"), str, "parity.scope"),
            tolerance=float(_check(d.get("tolerance", PARITY_TOLERANCE), num, "parity.tolerance")),
            rank=_opt(d.get("rank"), int, "parity.rank"),
            input_split=_opt(d.get("input_split"), bool, "parity.input_split"),
            observed_layer=_opt(d.get("observed_layer"), int, "parity.observed_layer"),
            verdicts=tuple(RuleVerdict.from_json(v) for v in _check(d.get("verdicts", []), list, "parity.verdicts")),
            reruns=_check(d.get("reruns", 0), int, "parity.reruns"),
            isolation_seconds=float(_check(d.get("isolation_seconds", 0.0), num, "parity.isolation_seconds")),
            cached=_check(d.get("cached", False), bool, "parity.cached"),
            cache_problem=_opt(d.get("cache_problem"), str, "parity.cache_problem"))
