"""The rule catalogue: one table of code -> check, and the context every check reads.

A check is a function `check_<kind>(ctx) -> Iterable[Finding]` registered with `@rule(code, kind)`. Its docstring is
its catalogue entry (`tpaudit explain CODE`, Markdown, SARIF `fullDescription`), written with the headings
**What it detects**, **Why it matters**, **Example**, **Fix** and **References**. Families take codes by hundreds
(TPA0xx coverage, TPA1xx divisibility, TPA2xx quantization, TPA3xx checkpoint, TPA4xx expert parallelism); a code
is never reused: a retired rule stays registered with `status="removed"`.

Checks never print and never exit; they read the context and return findings.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..model import Finding, ModelSource, ShardMap

_CODE = re.compile(r"^TPA\d{3}$")
_SECTION = re.compile(r"^\*\*(What it detects|Why it matters|Example|Fix|References)\*\*\s*$")


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
    """

    code: str
    kind: str
    check: Callable[["CheckContext"], Iterable[Finding]]
    family: str
    status: str = "stable"
    severity: str = "error"

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
FAMILIES = ("coverage", "divisibility", "quant", "checkpoint", "expert", "layout")


def rule(code: str, kind: str, *, severity: str = "error", status: str = "stable"):
    """Register a check under `code`. Refuses malformed or duplicate codes and docstrings without the sections."""

    def register(fn):
        if not _CODE.match(code):
            raise ValueError(f"malformed rule code {code!r}: expected TPA + 3 digits")
        if code in _RULES:
            raise ValueError(f"rule code {code} registered twice ({_RULES[code].check.__name__}, {fn.__name__})")
        r = Rule(code=code, kind=kind, check=fn, family=fn.__module__.rsplit(".", 1)[-1], status=status,
                 severity=severity)
        missing = {"What it detects", "Why it matters", "Example", "Fix"} - set(r.sections())
        if missing:
            raise ValueError(f"{code} ({fn.__name__}) docstring lacks {sorted(missing)}")
        _RULES[code] = r
        return fn

    return register


def all_rules() -> list[Rule]:
    """Every registered rule, by code. Importing the families registers them."""
    import importlib

    for family in FAMILIES:
        importlib.import_module(f"{__package__}.{family}")
    return [_RULES[c] for c in sorted(_RULES)]


def get_rule(code: str) -> Rule | None:
    """The registered rule for `code` (case-insensitive, e.g. `"tpa001"`), or `None`."""
    all_rules()
    return _RULES.get(code.upper())


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
    def from_budget(cls, text: str) -> "CheckOptions":
        """`--max-replicated` value: `"5%"` -> share 0.05; `"2GiB"` / `"1e9"` -> bytes.

        Raises:
            UsageError: neither a percentage nor a byte size.
        """
        from ..errors import UsageError
        from ..units import parse_bytes

        value = str(text).strip()
        if value.endswith("%"):
            try:
                share = float(value[:-1]) / 100
            except ValueError:
                share = float("nan")
            if not 0 <= share <= 1:
                raise UsageError(f"--max-replicated {text} is not a share between 0% and 100%")
            return cls(max_replicated_share=share)
        try:
            return cls(max_replicated_bytes=parse_bytes(value))
        except ValueError:
            raise UsageError(f"--max-replicated {text} is neither a byte size (2GiB, 500MB, 1e9) nor a percentage "
                             "(5%)") from None


@dataclass(frozen=True)
class CheckContext:
    """What the checks read: the input, the built model's facts, the resolved plan and the shard map.

    Attributes:
        source (`ModelSource`): the input as read.
        config (`PretrainedConfig`): the transformers config the model was built from.
        architecture (`str`): model class name.
        text_prefix (`str`): path of the base model that owns the plan (`model.language_model`).
        plan_owner (`str`): attribute path of the config owning `base_model_tp_plan` (`text_config` or `""`).
        lm_head_names (`tuple[str, ...]`): parameters of the output embedding (`lm_head.weight`).
        plan (`ResolvedPlan`), shard_map (`ShardMap`).
        mapping (`CheckpointMapping`, *optional*): `None` for config-only inputs.
        quantization (`dict`, *optional*): see `BuiltModel.quantization`.
        modules (`dict[str, ModuleFacts]`): concrete module name -> facts (type, linear sizes, head_dim).
        options (`CheckOptions`).
    """

    source: ModelSource
    config: Any
    architecture: str
    text_prefix: str
    plan_owner: str
    lm_head_names: tuple[str, ...]
    plan: Any
    shard_map: ShardMap
    mapping: Any = None
    quantization: dict | None = None
    modules: dict[str, Any] = field(default_factory=dict)
    options: CheckOptions = field(default_factory=CheckOptions)

    def relative_key(self, generic: str) -> str:
        """A full generic name as a key of `base_model_tp_plan` (`model.language_model.layers.*.x` -> `layers.*.x`)."""
        prefix = self.text_prefix + "." if self.text_prefix else ""
        return generic[len(prefix):] if prefix and generic.startswith(prefix) else generic

    def size(self, n: int) -> str:
        """`n` bytes in the report's unit family (`--units`), e.g. `"36.00 GiB"`."""
        from ..units import format_bytes

        return format_bytes(n, self.options.unit)

    @property
    def text_config(self):
        """The config that owns the base model's plan (the text config of a composite model)."""
        return getattr(self.config, self.plan_owner, self.config) if self.plan_owner else self.config

    def config_target(self, attr: str) -> str:
        """A config attribute as a finding target, dotted from the top-level config (`text_config.vocab_size`)."""
        return f"{self.plan_owner}.{attr}" if self.plan_owner else attr

    def module_of(self, param_name: str):
        """`ModuleFacts` of the module owning `param_name`, or `None`."""
        return self.modules.get(param_name.rpartition(".")[0])

    def in_decoder(self, name: str) -> bool:
        """True for a parameter of the text base model or of the output embedding (`lm_head`)."""
        if name in self.lm_head_names:
            return True
        return not self.text_prefix or name.startswith(self.text_prefix + ".")


def config_value(config, name: str):
    """`getattr(config, name, None)` that also survives configs whose attributes raise on access (transformers'
    heterogeneous per-layer configs raise `AmbiguousGlobalPerLayerAttributeError` for per-layer attributes)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001
        return None


def config_values(config, name: str) -> list:
    """Every distinct value of `name` across the layers: `per_layer_config[i].name` for heterogeneous configs, else
    the single global value (empty when absent)."""
    try:
        layers = list(config.per_layer_config or [])
    except Exception:  # noqa: BLE001 - not a heterogeneous config (or one whose layer list is broken)
        layers = []
    values = []
    for c in layers or [config]:
        v = config_value(c, name)
        if v is not None and v not in values:
            values.append(v)
    return values


def run_checks(ctx: CheckContext) -> list[Finding]:
    """Run every stable rule and return its findings, sorted by severity, code and target."""
    from ..model import SEVERITY_ORDER

    findings: list[Finding] = []
    for r in all_rules():
        if r.status == "stable":
            findings.extend(r.check(ctx))
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.target))
