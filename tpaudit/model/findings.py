"""Findings: what a check decides, where it points, and the subject it names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .shards import ParamShard

Severity = Literal["error", "warning", "note"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "note": 2}


@dataclass(frozen=True)
class Location:
    """Where a finding points, worked out before rendering (SARIF reads it as is).

    Attributes:
        path (`str`, *optional*): the file a user edits (the `--plan` file, `config.json`, a snapshot), or a URL for
            a Hub config.
        line (`int`, *optional*): the line in that file that names the rule key or config attribute.
        logical (`str`): the parameter, rule key or config attribute the finding is about.
        uri (`str`, *optional*): `path` as a SARIF artifact URI (percent-encoded; relative to `uri_base` when set,
            else a `file:` or `https:` URI), worked out by `run.pipeline.artifact_uri`.
        uri_base (`str`, *optional*): `"%SRCROOT%"` when `uri` is relative to the root of the git repository that
            holds the file, `None` otherwise.
    """

    path: str | None
    line: int | None
    logical: str
    uri: str | None = None
    uri_base: str | None = None


@dataclass(frozen=True)
class FindingSubject:
    """What a finding is about, as the stages after the checks need it (plan-file locations, `--suggest`, the tables):
    typed, so that no later stage reads a finding's JSON `facts`.

    Attributes:
        rule_key (`str`, *optional*): the `base_model_tp_plan` key (relative to the base model) a fix adds or edits,
            `layers.*.mlp.experts.gate_up_proj`.
        key_kind (`"module" | "parameter"`, *optional*): whether `rule_key` names a module or a parameter (a
            parameter rule of fused experts brings its module's rule).
        families (`tuple[str, ...]`): the generic parameter names the finding covers.
        shape (`tuple[int, ...]`): the global shape of the lead parameter (`()` when not about one parameter):
            `--suggest` compares it with a voting architecture's to tell which axis is which.
    """

    rule_key: str | None = None
    key_kind: Literal["module", "parameter"] | None = None
    families: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class FixOption:
    """One concrete alternative a finding's fix names, re-checked by the run stage (`run.fixes.verify_fixes`) with
    the whole check before the fix is shown.

    Attributes:
        label (`str`): the alternative in words, imperative ("Use expert parallelism: --tp 4 --ep 4").
        tp_size (`int`), ep_size (`int`): the sizes to re-check.
        plan_edits (`tuple[tuple[str, str | None], ...]`): edits of the `base_model_tp_plan` in force (relative keys;
            a `None` style drops the rule); empty for a sizes-only alternative.
        together (`bool`): the edit clears this finding alone and the report holds others of its kind (each keeps one
            piece of quantization metadata whole, TPA201/TPA203): the run stage re-checks every such edit of one
            (tp, ep) as one plan, the way a user applies them, and judges each finding by whether that plan clears
            it and adds no error.
    """

    label: str
    tp_size: int
    ep_size: int = 1
    plan_edits: tuple[tuple[str, str | None], ...] = ()
    together: bool = False


@dataclass(frozen=True)
class Finding:
    """One problem a check found.

    Attributes:
        code (`str`): stable rule code, `TPA` + 3 digits (`TPA001`).
        kind (`str`): snake_case JSON name of the finding family (`replicated_weight`).
        severity (`"error" | "warning" | "note"`): `error` makes `check` exit 1.
        target (`str`): what it is about: a generic parameter name, a full rule key, or a config attribute
            (`text_config.num_key_value_heads`).
        message (`str`): what is wrong, with the numbers.
        fix (`str`): an imperative fix title ("Add rule `layers.*.mlp.experts.gate_up_proj: packed_colwise`").
        facts (`dict`): the values behind the message (bytes, sizes, rank), JSON-serialisable.
        location (`Location`, *optional*): set by the report stage from the rule's declaration.
        subject (`FindingSubject`, *optional*): what the finding is about, typed, for the stages after the checks
            (not part of the JSON: `facts` says the same to JSON readers).
        fix_options (`tuple[FixOption, ...]`): the concrete alternatives `fix` names, for the run stage to re-check
            (not part of the JSON; `verified` reports them).
        fix_fallback (`str`): the advice shown when no alternative re-checks clean (names no size and no rule).
        verified (`dict`, *optional*): set by the run stage: `exit_code` and `errors` of the alternative the fix
            offers, and `alternatives` (each re-check).
    """

    code: str
    kind: str
    severity: Severity
    target: str
    message: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    location: Location | None = None
    subject: FindingSubject | None = None
    fix_options: tuple[FixOption, ...] = ()
    fix_fallback: str = ""
    verified: dict[str, Any] | None = None

    @property
    def fingerprint(self) -> str:
        """Identity used by `--baseline`: code and target (messages carry numbers that may move)."""
        return f"{self.code}:{self.target}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "kind": self.kind, "severity": self.severity, "target": self.target,
                               "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.verified is not None:
            out["verified"] = self.verified
        if self.facts:
            out["facts"] = self.facts
        return out

    @classmethod
    def from_json(cls, data: Any) -> "Finding":
        """A finding back from its `to_json()` (a report that crossed a process boundary, e.g. the guard's worker).

        Raises:
            ValueError: not a finding object: a field missing or of the wrong type, or an unknown severity.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a finding must be a JSON object, not {type(data).__name__}")
        code, kind, severity, target, message = (data.get(k) for k in ("code", "kind", "severity", "target", "message"))
        fix, facts, verified = data.get("fix", ""), data.get("facts", {}), data.get("verified")
        if not (isinstance(code, str) and isinstance(kind, str) and isinstance(target, str)
                and isinstance(message, str) and isinstance(fix, str) and isinstance(facts, dict)
                and isinstance(verified, (dict, type(None))) and severity in SEVERITY_ORDER):
            raise ValueError(f"not a finding: {str(data)[:120]}")
        return cls(code=code, kind=kind, severity=severity, target=target, message=message, fix=fix, facts=facts,
                   verified=verified)


@dataclass(frozen=True)
class ReplicatedFamily:
    """Parameters of one generic name that every rank holds whole because nothing shards them.

    Attributes:
        name (`str`): generic runtime name (`model.language_model.layers.*.mlp.experts.gate_up_proj`).
        count (`int`): how many parameters share it.
        bytes (`int`): their bytes together, which every rank holds.
        reason (`str`): `"no rule matches"` or the rule whose style does not shard parameters.
        severity (`str`, *optional*): the severity of the TPA001 finding that covers it (`None` for norms, biases,
            vectors, which no finding covers).
    """

    name: str
    count: int
    bytes: int
    reason: str
    severity: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "count": self.count, "bytes": self.bytes, "reason": self.reason}
        if self.severity:
            out["severity"] = self.severity
        return out


def why_unsharded(p: ParamShard) -> str:
    """Why nothing shards `p`: `"no rule matches"` or the rule whose style does not shard parameters."""
    if p.rule is None:
        return "no rule matches"
    return f"rule `{p.rule}: {p.style}` does not shard parameters"
