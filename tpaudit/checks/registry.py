"""The rule catalogue: one table of code -> check, and the context every check reads (stage 5).

    BuiltModel + ResolvedPlan + ShardMap (+ parity evidence) -> list[Finding]

A check is a function `check_<kind>(ctx) -> Iterable[Finding]` registered with `@rule(code, kind, ...)` in any module
of this package (modules are found, not listed: a new family is a new module). Its docstring is its catalogue entry
(`tpaudit explain CODE`, Markdown, SARIF `fullDescription`), with the headings **What it detects**, **Why it
matters**, **Example**, **Fix** and **References**. A rule declares, in its registry entry, what every consumer of its
findings needs, so that a new rule is its check module, its data and its tests and nothing else:

- `severity`: the default (highest) severity of its findings;
- `breaks_forward`: whether its error findings mean the ranks cannot compute the model (`tpaudit size` then calls
  the option invalid): `True`, `False`, or a predicate on the finding where only some of them do;
- `suggest`: what `--suggest` does with its error findings: `"vote"` (propose the style sibling architectures give a
  module of that name), `"keep_whole"` (a `replicate` rule for the parameter its subject names: whole on every
  rank), or `None`;
- `counts_replicated`: whether its findings are replicated bytes, which `strict_tp(max_replicated_bytes=...)` accepts
  within its budget;
- `fails_load`: whether its findings say transformers' own sharded load fails on some rank (what `tpaudit verify`
  compares a real load's failure with);
- `points_at`: where its findings point (the plan file, the config, the checkpoint).

`rule` refuses a registration that leaves one of the first five undeclared. Families take codes by hundreds (TPA0xx
coverage, TPA1xx divisibility, TPA2xx quantization, TPA3xx checkpoint, TPA4xx expert parallelism, TPA5xx layouts); a
code is never reused: a retired rule stays registered with `status="removed"`. `tests/rules/TPAxxx.json` holds each
code's passing and failing examples.

Checks never print and never exit; they read the context and return findings.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

from ..model import (SEVERITY_ORDER, Finding, LoadSection, ModelSource, ModuleFacts, ParamShard, ParityResult,
                     QuantizationInfo, ShardMap)

if TYPE_CHECKING:  # the earlier stages' values, named for the type checker only (no import at run time)
    from ..metamodel import BuiltModel
    from ..metamodel.facts import ModelFacts
    from ..metamodel.mapping import CheckpointMapping
    from ..plan import ResolvedPlan

_CODE = re.compile(r"^TPA\d{3}$")
_SECTION = re.compile(r"^\*\*(What it detects|Why it matters|Example|Fix|References)\*\*\s*$")
PointsAt = Literal["plan", "config", "checkpoint"]
SuggestAction = Literal["vote", "keep_whole"]
_UNDECLARED: Any = object()


@dataclass(frozen=True)
class Rule:
    """One registered rule.

    Attributes:
        code (`str`): `TPA` + 3 digits.
        kind (`str`): the JSON `kind` of its findings.
        check (`Callable`): the check function.
        family (`str`): the module that holds it (`coverage`, `divisibility`, ...).
        status (`"stable" | "removed"`).
        severity (`str`): the default (highest) severity of its findings.
        points_at (`"plan" | "config" | "checkpoint"`): the file a user edits to fix its findings: the `--plan`
            file (when one is given, else the config that ships the plan), the config (a size attribute), or the
            checkpoint.
        breaks_forward (`bool` or `Callable[[Finding], bool]`): whether its error findings mean the ranks cannot
            compute the model; a predicate where only some of them do (see `breaks_the_forward`).
        suggest (`"vote" | "keep_whole" | None`): what `--suggest` does with its error findings (module docstring).
        counts_replicated (`bool`): its findings are replicated bytes (judged against a replicated-bytes budget).
        fails_load (`bool`): its findings say transformers' sharded load fails on some rank.
    """

    code: str
    kind: str
    check: Callable[["CheckContext"], Iterable[Finding]]
    family: str
    status: str = "stable"
    severity: str = "error"
    points_at: PointsAt = "plan"
    breaks_forward: bool | Callable[[Finding], bool] = False
    suggest: SuggestAction | None = None
    counts_replicated: bool = False
    fails_load: bool = False

    def breaks_the_forward(self, finding: Finding) -> bool:
        """True when `finding` (one of this rule's) is an error its declaration says the ranks cannot compute past."""
        if finding.severity != "error":
            return False
        return self.breaks_forward(finding) if callable(self.breaks_forward) else bool(self.breaks_forward)

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        """The first line of the docstring."""
        return self.doc.splitlines()[0] if self.doc else self.kind

    def sections(self) -> dict[str, str]:
        """`{"What it detects": ..., "Why it matters": ..., "Example": ..., "Fix": ..., "References": ...}`."""
        out: dict[str, list[str]] = {}
        current = None
        for line in self.doc.splitlines()[1:]:
            m = _SECTION.match(line.strip())
            if m:
                current = m.group(1)
                out[current] = []
            elif current is not None:
                out[current].append(line)
        return {k: "\n".join(v).strip() for k, v in out.items()}


_RULES: dict[str, Rule] = {}


def rule(code: str, kind: str, *, severity: str = _UNDECLARED, breaks_forward: bool | Callable[[Finding], bool] =
         _UNDECLARED, suggest: SuggestAction | None = _UNDECLARED, counts_replicated: bool = _UNDECLARED,
         fails_load: bool = _UNDECLARED, status: str = "stable", points_at: PointsAt = "plan"):
    """Register a check under `code` with its declared behaviour (module docstring; every one of `severity`,
    `breaks_forward`, `suggest`, `counts_replicated` and `fails_load` must be given).

    Raises:
        ValueError: a malformed or duplicate code, an undeclared or ill-typed behaviour, or a docstring without the
            sections.
    """
    declared = {"severity": severity, "breaks_forward": breaks_forward, "suggest": suggest,
                "counts_replicated": counts_replicated, "fails_load": fails_load}

    def register(fn):
        if not _CODE.match(code):
            raise ValueError(f"malformed rule code {code!r}: expected TPA + 3 digits")
        if code in _RULES and _RULES[code].check is not fn:
            raise ValueError(f"rule code {code} registered twice ({_RULES[code].check.__name__}, {fn.__name__})")
        undeclared = [name for name, value in declared.items() if value is _UNDECLARED]
        if undeclared:
            raise ValueError(f"{code} ({fn.__name__}) declares no {', '.join(undeclared)}")
        if severity not in SEVERITY_ORDER:
            raise ValueError(f"{code} ({fn.__name__}) severity {severity!r} is not one of {sorted(SEVERITY_ORDER)}")
        if suggest not in (None, "vote", "keep_whole"):
            raise ValueError(f"{code} ({fn.__name__}) suggest {suggest!r} is not 'vote', 'keep_whole' or None")
        if not (isinstance(breaks_forward, bool) or callable(breaks_forward)):
            raise ValueError(f"{code} ({fn.__name__}) breaks_forward must be a bool or a predicate on a finding")
        if not isinstance(counts_replicated, bool) or not isinstance(fails_load, bool):
            raise ValueError(f"{code} ({fn.__name__}) counts_replicated and fails_load must be bools")
        r = Rule(code=code, kind=kind, check=fn, family=fn.__module__.rsplit(".", 1)[-1], status=status,
                 severity=severity, points_at=points_at, breaks_forward=breaks_forward, suggest=suggest,
                 counts_replicated=counts_replicated, fails_load=fails_load)
        missing = {"What it detects", "Why it matters", "Example", "Fix"} - set(r.sections())
        if missing:
            raise ValueError(f"{code} ({fn.__name__}) docstring lacks {sorted(missing)}")
        _RULES[code] = r
        return fn

    return register


@functools.lru_cache(maxsize=1)
def families() -> tuple[str, ...]:
    """Every module of this package that may hold rules (all but the private ones and this registry)."""
    from .. import checks

    return tuple(sorted(m.name for m in pkgutil.iter_modules(checks.__path__)
                        if not m.name.startswith("_") and m.name != "registry"))


_LOADED = False


def all_rules() -> list[Rule]:
    """Every registered rule, by code. Importing the family modules (once) registers them."""
    global _LOADED
    if not _LOADED:
        for family in families():
            importlib.import_module(f"{__package__}.{family}")
        _LOADED = True
    return [_RULES[c] for c in sorted(_RULES)]


def get_rule(code: str) -> Rule | None:
    """The registered rule for `code` (case-insensitive, e.g. `"tpa001"`), or `None`."""
    all_rules()
    return _RULES.get(code.upper())


# --- what consumers of findings ask a rule's declaration (a finding of no registered rule has no behaviour)
def breaks_the_forward(finding: Finding) -> bool:
    """True for an error finding whose rule declares that the ranks cannot compute the model with it
    (`Rule.breaks_forward`): `tpaudit size` calls such an option invalid."""
    r = get_rule(finding.code)
    return r is not None and r.breaks_the_forward(finding)


def counts_replicated(finding: Finding) -> bool:
    """True for a finding whose rule declares it replicated bytes (`Rule.counts_replicated`)."""
    r = get_rule(finding.code)
    return r is not None and r.counts_replicated


def fails_load(finding: Finding) -> bool:
    """True for a finding whose rule declares that transformers' sharded load fails with it (`Rule.fails_load`)."""
    r = get_rule(finding.code)
    return r is not None and r.fails_load


def suggest_actions() -> dict[str, SuggestAction]:
    """Rule code -> what `--suggest` does with its error findings (`Rule.suggest`), for the rules that declare one."""
    return {r.code: r.suggest for r in all_rules() if r.suggest is not None}


@dataclass(frozen=True)
class CheckOptions:
    """Options that change what the checks report.

    Attributes:
        max_replicated_bytes (`int`, *optional*): `--max-replicated` as bytes per rank.
        max_replicated_share (`float`, *optional*): `--max-replicated` as a share (0..1) of the model's bytes.
        unit (`str`): `"GiB"` or `"GB"`: the unit family of sizes in finding messages (`--units`); facts stay bytes.
    """

    max_replicated_bytes: int | None = None
    max_replicated_share: float | None = None
    unit: str = "GiB"

    @classmethod
    def from_budget(cls, text, unit: str = "GiB", *, name: str = "max_replicated") -> "CheckOptions":
        """`--max-replicated` value: `"5%"` -> share 0.05; `"2GiB"` / `"1e9"` / an `int` -> bytes.

        Raises:
            UsageError: neither a percentage nor a byte size.
        """
        from ..errors import UsageError
        from ..units import parse_bytes

        if isinstance(text, bool):
            raise UsageError(f"{name} {text!r} is neither a byte size nor a percentage")
        if isinstance(text, int):
            if text < 0:
                raise UsageError(f"{name} {text} must not be negative")
            return cls(max_replicated_bytes=text, unit=unit)
        value = str(text).strip()
        if value.endswith("%"):
            try:
                share = float(value[:-1]) / 100
            except ValueError:
                share = float("nan")
            if not 0 <= share <= 1:
                raise UsageError(f"{name} {text} is not a share between 0% and 100%")
            return cls(max_replicated_share=share, unit=unit)
        try:
            return cls(max_replicated_bytes=parse_bytes(value), unit=unit)
        except ValueError:
            raise UsageError(f"{name} {text} is neither a byte size (2GiB, 500MB, 1e9) nor a percentage "
                             "(5%)") from None


@dataclass(frozen=True)
class CheckContext:
    """What the checks read: the built model's facts, the resolved plan, the shard map and the parity evidence.

    Attributes:
        built (`BuiltModel`): the meta model and its facts (`built.facts`, text prefix, modules, mapping,
            quantization).
        plan (`ResolvedPlan`), shard_map (`ShardMap`).
        options (`CheckOptions`).
        parity (`ParityResult`, *optional*): the sharded forward's verdict, when it ran.
        load (`LoadSection`, *optional*): what transformers' own load does on every rank (`tpaudit.shard.load`);
            `None` for a config-only source.
    """

    built: BuiltModel
    plan: ResolvedPlan
    shard_map: ShardMap
    options: CheckOptions = field(default_factory=CheckOptions)
    parity: ParityResult | None = None
    load: LoadSection | None = None

    # --- facts of the built model, by the names checks use
    @property
    def source(self) -> ModelSource:
        return self.built.source

    @property
    def architecture(self) -> str:
        return self.built.architecture

    @property
    def text_prefix(self) -> str:
        return self.built.text_prefix

    @property
    def plan_owner(self) -> str:
        return self.built.plan_owner

    @property
    def lm_head_names(self) -> tuple[str, ...]:
        return self.built.lm_head_names

    @property
    def mapping(self) -> CheckpointMapping | None:
        return self.built.mapping

    @property
    def quantization(self) -> QuantizationInfo | None:
        return self.built.quantization

    @property
    def modules(self) -> dict[str, ModuleFacts]:
        return self.built.modules

    @property
    def facts(self) -> ModelFacts:
        """The model's facts (`facts.ModelFacts`): config values by the vocabulary's roles, per-layer geometry,
        modules, the quantization layout. Checks read these, never a live transformers config."""
        return self.built.facts

    @property
    def owner_class(self) -> str:
        return self.built.owner_class

    def relative_key(self, generic: str) -> str:
        """A full generic name as a key of `base_model_tp_plan` (`model.language_model.layers.*.x` -> `layers.*.x`)."""
        return self.built.relative_key(generic)

    def config_target(self, attr: str) -> str:
        """A config attribute as a finding target, dotted from the top-level config (`text_config.vocab_size`)."""
        return self.built.config_target(attr)

    def size(self, n: int) -> str:
        """`n` bytes in the report's unit family (`--units`), e.g. `"36.00 GiB"`."""
        from ..units import format_bytes

        return format_bytes(n, self.options.unit)

    def module_of(self, param_name: str) -> ModuleFacts | None:
        """`ModuleFacts` of the module owning `param_name`, or `None`."""
        return self.built.modules.get(param_name.rpartition(".")[0])

    def in_decoder(self, name: str) -> bool:
        """True for a parameter of the text base model or of the output embedding (`lm_head`)."""
        if name in self.built.lm_head_names:
            return True
        return not self.text_prefix or name.startswith(self.text_prefix + ".")


def run_checks(ctx: CheckContext) -> list[Finding]:
    """Run every stable rule and return its findings, sorted by severity, code and target."""
    findings: list[Finding] = []
    for r in all_rules():
        if r.status == "stable":
            findings.extend(r.check(ctx))
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.target))
