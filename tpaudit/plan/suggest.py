"""`--suggest`: plan rules for replicated weight families, learned from the plans of sibling architectures in the
installed transformers, then applied in a second simulation so the before/after bytes are measured, not guessed.

Every config class registered in transformers' `CONFIG_MAPPING` with a `base_model_tp_plan` votes: a replicated
family's rule key (`layers.*.mlp.shared_expert.gate_proj`) is looked up first as is, then by ever shorter suffixes
(`shared_expert.gate_proj`, then `gate_proj`); the most specific level with votes decides, and the most common style
there wins. A parameter of a module (`experts.gate_up_proj`) also brings the module rule its siblings pair with it
(`experts: moe_tp_experts`).
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Sequence

from ..compat.styles import REPLICATE
from ..model import FindingSubject


@functools.lru_cache(maxsize=1)
def sibling_plans() -> dict[str, dict[str, str]]:
    """model_type -> `base_model_tp_plan` of every config class transformers registers that has one.

    Reading them imports every configuration module (about 6 s on 2 cores), so the table is kept on disk for the
    installed transformers: `$HF_HOME/tpaudit/sibling-plans/<version>-<where>.json`, keyed by the release and the path
    and modification time of its `models/` folder (an editable checkout that changes gets a new table). A cache that
    cannot be read or written is ignored.
    """
    path = _plans_cache_path()
    if path is not None:
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(cached, dict) and all(isinstance(v, dict) for v in cached.values()):
                return cached
        except (OSError, ValueError):
            pass
    from ..compat import backend

    tf = backend()
    mapping = tf.config_classes()
    out = {}
    with tf.quiet():
        for model_type in list(mapping.keys()):
            try:
                plan = getattr(mapping[model_type], "base_model_tp_plan", None)
            except Exception:  # noqa: BLE001 - a config module that cannot import here casts no vote
                continue
            if isinstance(plan, dict) and plan:
                out[model_type] = dict(plan)
    if path is not None:
        from ..sources.files import write_text_atomic

        try:
            write_text_atomic(path, json.dumps(out))
        except OSError:
            pass
    return out


def _plans_cache_path():
    import hashlib
    from pathlib import Path

    import transformers
    from huggingface_hub import constants

    from ..compat import installed_version

    models = Path(transformers.__file__).parent / "models"
    try:
        stamp = f"{models}:{models.stat().st_mtime_ns}"
    except OSError:
        return None
    key = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    home = Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser()
    return home / "tpaudit" / "sibling-plans" / f"{installed_version('transformers')}-{key}.json"


@dataclass
class Suggestion:
    """One proposed rule: `key` (relative to the base model) -> `style`, with the architectures that vote for it."""

    key: str
    style: str
    voters: list[str] = field(default_factory=list)
    matched: str | int = ""  # the plan pattern that voted; `1` (as reports have it) for a rule a finding asks for
    votes: int = 0


class Unresolved(NamedTuple):
    """A replicated family `--suggest` proposes no rule for: its rule `key` (relative to the base model) and why."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"`{self.key}`: {self.reason}"


def _votes_for(key: str, plans: dict[str, dict[str, str]]) -> tuple[str, Counter, dict[str, list[str]]]:
    """(matched pattern, style votes, style -> voters) at the most specific level that has votes."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        suffix = ".".join(parts[-n:])
        if n == len(parts):
            hits = [(mt, plan[key]) for mt, plan in plans.items() if key in plan]
        else:
            hits = [(mt, style) for mt, plan in plans.items() for k, style in plan.items()
                    if k == suffix or k.endswith("." + suffix)]
        if suffix in ("weight", "bias") or (n == 1 and suffix.isdigit()):
            break
        if hits:
            votes = Counter(style for _, style in hits)
            voters: dict[str, list[str]] = defaultdict(list)
            for mt, style in hits:
                if mt not in voters[style]:
                    voters[style].append(mt)
            return suffix, votes, voters
    return "", Counter(), {}


def hidden_axes(shape: tuple[int, ...], hidden: int | None) -> tuple[int, ...] | None:
    """Which axes after the expert axis of a 3-D fused-experts parameter are the model's hidden size: `(2,)` for
    `[E, 2I, H]` (Qwen3-MoE's `gate_up_proj`), `(1,)` for `[E, H, 2I]` (Llama4's, stored transposed). `None` when it
    cannot tell (not 3-D, no hidden size, or both or neither axis is it)."""
    if len(shape) != 3 or not hidden:
        return None
    axes = tuple(i for i in (1, 2) if shape[i] == hidden)
    return axes if len(axes) == 1 else None


@functools.lru_cache(maxsize=64)
def voter_layout(model_type: str, suffix: str) -> tuple[int, ...] | None:
    """`hidden_axes` of the parameter named `...{suffix}` in the default model of `model_type` (its config class's
    defaults, built on the meta device as `check` builds any model), `None` when it cannot be built or has none.

    Source: the model class transformers registers for the config (`metamodel.build_model`)."""
    from ..metamodel import BuildOptions, build_model
    from ..metamodel import vocabulary as V
    from ..model import ModelSource
    from ..compat import backend

    tf = backend()
    try:
        with tf.quiet():
            config = tf.config_classes()[model_type]()
            built = build_model(ModelSource(ref=f"<{model_type} defaults>", kind="local", config=config.to_dict(),
                                            tensors=None), BuildOptions())
    except Exception:  # noqa: BLE001 - an architecture that cannot be built here casts no vote on layouts
        return None
    hidden = next(iter(built.facts.role_values(V.HIDDEN)[1]), None)
    for name, param in built.model.named_parameters():
        if _generic(name).endswith("." + suffix):
            return hidden_axes(tuple(param.shape), hidden)
    return None


def _layout_voters(voters: list[str], matched: str, ours: tuple[int, ...], limit: int = 3) -> list[str] | None:
    """The voters (at most `limit`, in order) whose parameter named `matched` has the same layout as ours; `None`
    when none of them does."""
    same = [v for v in voters[:limit] if voter_layout(v, matched) == ours]
    return same or None


def suggest_rules(report, base_plan: dict[str, str], text_prefix: str, layouts: dict | None = None,
                  defer: set[str] | None = None, hidden: int | None = None, *,
                  actions: Mapping[str, str]) -> tuple[list[Suggestion], list[Unresolved]]:
    """Rules for the error findings of `report` whose rule declares a `--suggest` action: `"vote"` (a replicated
    family: the style sibling architectures vote for) or `"keep_whole"` (quantization metadata or a scale split by its
    module's rule: a `replicate` rule keeps the key the finding's subject names whole on every rank).

    Args:
        report (`Report`): the first simulation.
        base_plan (`dict[str, str]`): the base model's current `base_model_tp_plan` (relative keys).
        text_prefix (`str`): module path of the base model the keys are relative to (`model.language_model`).
        layouts (`dict[str, ModuleFacts]`, *optional*): relative module key -> facts of fused experts modules stored
            transposed or interleaved; their parameters get no colwise/rowwise-family proposal (the siblings that
            vote for those styles store `[E, out, in]`, concatenated).
        defer (`set[str]`, *optional*): keys not to propose in this round.
        actions (`dict[str, str]`): rule code -> its declared action (`checks.registry.suggest_actions()`).
        hidden (`int`, *optional*): the model's hidden size: a 3-D fused-experts parameter's vote counts only the
            architectures whose same parameter has the hidden size on the same axis (`voter_layout`), so Llama4's
            rules for its transposed `[E, H, 2I]` experts are not proposed for `[E, 2I, H]` ones, nor the reverse.

    Returns:
        `(suggestions, unresolved)`: the proposed rules, and the families no sibling shards (each `Unresolved`: its
        key and the reason).
    """
    plans = sibling_plans()
    suggestions: dict[str, Suggestion] = {}
    unresolved: list[Unresolved] = []
    for f in report.findings:
        action = actions.get(f.code)
        if action == "keep_whole" and f.severity == "error" and f.subject and f.subject.rule_key:
            # quantization metadata or a scale the module's rule splits: its own finding names the rule that keeps
            # it whole on every rank (transformers looks a parameter's own rule up before its module's)
            key = f.subject.rule_key
            if key not in base_plan and key not in suggestions and key not in (defer or ()):
                suggestions[key] = Suggestion(key, REPLICATE, [f.code], 1, 1)
            continue
        if action != "vote" or f.severity != "error":
            continue
        subject = f.subject or FindingSubject()
        key = subject.rule_key or f.target
        if key in base_plan or key in suggestions or key in (defer or ()) or any(key == u.key for u in unresolved):
            continue
        module_facts = (layouts or {}).get(key.rpartition(".")[0]) if subject.key_kind == "parameter" else None
        if module_facts is not None:
            layout = []
            if module_facts.is_transposed:
                layout.append("stored [E, in, out]")
            if module_facts.is_concatenated is False:
                layout.append("gate and up interleaved")
            unresolved.append(Unresolved(key, f"its experts ({module_facts.type}) are {' and '.join(layout)}, unlike "
                                              "the architectures whose experts rules would match; shard them by "
                                              "expert (--ep) or write a rule for this layout"))
            continue
        if text_prefix and not f.target.startswith(text_prefix + "."):
            unresolved.append(Unresolved(key, f"a class-level rule (e.g. `_tp_plan = {{\"{key}\": ...}}` on the model "
                                              "class), which a base_model_tp_plan cannot express"))
            continue
        matched, votes, voters = _votes_for(key, plans)
        if not votes:
            unresolved.append(Unresolved(key, "no architecture in this transformers shards a module of that name"))
            continue
        ours = hidden_axes(subject.shape, hidden) if subject.key_kind == "parameter" else None
        if ours is not None:
            ranked = [(st, n, _layout_voters(voters[st], matched, ours)) for st, n in votes.most_common()]
            ranked = [(st, n, same) for st, n, same in ranked if same]
            if not ranked:
                unresolved.append(Unresolved(key, f"the architectures whose rules match `{matched}` store it with "
                                                  f"the hidden size on another axis (ours: {list(subject.shape)}); "
                                                  "shard them by expert (--ep) or write a rule for this layout"))
                continue
            style, count, same = ranked[0]
            voters = {**voters, style: same}
        else:
            style, count = votes.most_common(1)[0]
        suggestions[key] = Suggestion(key, style, voters[style][:5], matched, count)
        # A parameter of a module (`experts.gate_up_proj`) brings its module's rule (`experts: moe_tp_experts`).
        module = key.rpartition(".")[0]
        if subject.key_kind == "parameter" and module and module not in base_plan and module not in suggestions:
            m_matched, m_votes, m_voters = _votes_for(module, plans)
            if m_votes:
                m_style, m_count = m_votes.most_common(1)[0]
                suggestions[module] = Suggestion(module, m_style, m_voters[m_style][:5], m_matched, m_count)
    return list(suggestions.values()), unresolved


def snippet(owner_class: str, base_plan: dict[str, str], suggestions: list[Suggestion],
            removed: Sequence[str] = ()) -> str:
    """A ready `base_model_tp_plan` for `owner_class`: the added rules marked with their voters, the rules that
    matched nothing dropped (listed in a comment)."""
    lines = [f"# {owner_class}"]
    if removed:
        lines.append(f"# removed (they match nothing): {', '.join(removed)}")
    lines.append("base_model_tp_plan = {")
    for key, style in base_plan.items():
        lines.append(f'    "{key}": "{style}",')
    for s in suggestions:
        if s.voters and all(v.startswith("TPA") for v in s.voters):  # a fix a finding names, not a vote
            lines.append(f'    "{s.key}": "{s.style}",  # added: kept whole on every rank ({", ".join(s.voters)})')
        else:
            lines.append(f'    "{s.key}": "{s.style}",  # added: as in {s.votes} plan(s), e.g. '
                         f'{", ".join(s.voters[:3])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _expert_parallel(report, sizes) -> tuple[set[str], list[int]]:
    """Rule keys of the error findings whose fix is expert parallelism (their concrete alternatives, proposed by the
    checks, name an ep size > 1 on the same tp size: routed experts the model's EP plan covers), and those ep sizes
    (transformers accepts them on the same ranks)."""
    keys: set[str] = set()
    eps: set[int] = set()
    for f in report.findings:
        ep = [o.ep_size for o in f.fix_options if o.ep_size > 1 and o.tp_size == sizes.tp_size and not o.plan_edits]
        if f.severity == "error" and ep and f.subject is not None and f.subject.rule_key:
            # a finding about one family of routed experts (not a whole-plan one whose fix also names --ep)
            eps.update(ep)
            keys.add(f.subject.rule_key)
            if f.subject.key_kind == "parameter":
                keys.add(f.subject.rule_key.rpartition(".")[0])
    return keys, sorted(eps)


def _fixed_counts(before, after) -> dict[str, int]:
    """Error findings of `before` that `after` no longer has, counted by code."""
    left = {f.fingerprint for f in after.findings if f.severity == "error"}
    counts: dict[str, int] = {}
    for f in before.findings:
        if f.severity == "error" and f.fingerprint not in left:
            counts[f.code] = counts.get(f.code, 0) + 1
    return counts


def with_suggestion(audit, report, sizes, *, actions: Mapping[str, str], options=None, dist_overrides=None):
    """`report` with a `suggestion` section: the configuration that works, searched as plan rules and an ep size
    together, each candidate re-checked with the whole check (`Audit.report`: the load stage, and the parity check
    where the candidate's layouts need evidence).

    - Routed experts whose fix is expert parallelism (the checks propose `--ep N` for experts the model's EP plan
      covers, e.g. every MoE of transformers 5.25, whose TP plans no longer name the experts) get an ep size, not
      expert TP rules voted from another architecture's plan (Llama4 stores its experts transposed).
    - The other error-severity replicated families get rules voted by sibling plans (`suggest_rules`); a second
      round proposes rules for what the first left replicated (transformers adds `embed_tokens: embedding_rowwise`
      by itself once a plan exists, so the input embedding is only proposed when that did not happen).
    - Among the ep sizes transformers accepts on the same ranks, the candidate with the fewest errors wins (then
      the smaller worst rank). The section says what it fixed (`fixed`, by code), what remains and why, and
      `snippet` (what is printed) is set only when the re-check has no error.

    Each candidate is a value handed to the resolution: the built model never changes.

    Args:
        audit (`Audit`): the pipeline that produced `report` (its built model is reused, not rebuilt).
        report (`Report`): the first simulation.
        sizes (`ParallelSizes`), options (`CheckOptions`), dist_overrides (`dict`): as for `Audit.report`.
        actions (`dict[str, str]`): rule code -> its declared `--suggest` action (`checks.registry.suggest_actions()`;
            handed in, as the plan stage comes before the checks).

    Returns:
        A copy of `report` with `suggestion` set (`SuggestionSection`).
    """
    import dataclasses

    from ..model import ParallelSizes, SuggestionSection

    built = audit.built
    prefix = built.text_prefix + "." if built.text_prefix else ""
    if built.instance_plans:  # a model object: its merged plan, not its config class's, is the one in force
        tp_rules = report.plan["tp_rules"]
        injected = report.plan["injected_rules"]
        base_plan = {k[len(prefix):]: v for k, v in tp_rules.items() if k.startswith(prefix) and k not in injected}
    else:
        base_plan = dict(built.original_plan)
    layouts = {built.relative_key(_generic(name)): f for name, f in built.modules.items()
               if f.is_transposed or f.is_concatenated is False}

    def rerun(plan, at):
        # A candidate is re-simulated; the parity check runs where its layouts need evidence (the candidate's
        # rules are transformers' own styles for the same kind of module in sibling architectures).
        return audit.report(at, plan=plan, options=options, dist_overrides=dist_overrides, proposed=False)

    def summary(r) -> dict:
        return {"worst_rank_param_bytes": r.worst_rank_param_bytes, "replicated_bytes": r.replicated_bytes,
                "errors": r.count("error"), "warnings": r.count("warning")}

    ep_keys, ep_sizes = _expert_parallel(report, sizes)
    from ..metamodel import vocabulary as V

    hidden = next(iter(built.facts.role_values(V.HIDDEN)[1]), None) if built.facts is not None else None
    suggestions, unresolved = suggest_rules(report, base_plan, built.text_prefix, layouts,
                                            defer={"embed_tokens"} | ep_keys, hidden=hidden, actions=actions)
    dead = {k[len(prefix):] if k.startswith(prefix) else k for k in report.unused_rules}
    dead = {k for k in dead if k in base_plan}  # rules that match nothing leave the suggested plan
    base_plan = {k: v for k, v in base_plan.items() if k not in dead}
    fields: dict[str, Any] = dict(
        rules={s.key: s.style for s in suggestions}, removed=sorted(dead), unresolved=[str(u) for u in unresolved],
        voters={s.key: {"matched": s.matched, "votes": s.votes, "examples": s.voters} for s in suggestions},
        before=summary(report))
    if suggestions or ep_sizes:
        best = None
        for ep in ep_sizes or [sizes.ep_size]:
            at = ParallelSizes.of(sizes.tp_size, ep)
            chosen = list(suggestions)
            plan = {**base_plan, **{s.key: s.style for s in chosen}}
            after = rerun(plan, at)
            more, unresolved_more = suggest_rules(after, plan, built.text_prefix, layouts, defer=ep_keys,
                                                  hidden=hidden, actions=actions)
            if more:
                chosen += more
                plan.update({s.key: s.style for s in more})
                after = rerun(plan, at)
            rank = (after.count("error"), after.worst_rank_param_bytes, ep)
            if best is None or rank < best[0]:
                best = (rank, at, chosen, plan, after, unresolved_more)
        _, at, chosen, plan, after, unresolved_more = best
        if any(not all(v.startswith("TPA") for v in s.voters) for s in chosen) and not after.count("error"):
            # voted rules split parameters the way another architecture does: the proposal is printed only if the
            # sharded forward agrees (the parity check, as for any plan under review)
            after = audit.report(at, plan=plan, options=options, dist_overrides=dist_overrides, proposed=True)
        before_errors = {f.fingerprint for f in report.findings if f.severity == "error"}
        remaining = [f for f in after.findings if f.severity == "error"]
        clean = not remaining
        expert = None
        if at.ep_size != sizes.ep_size:
            expert = {"ep_size": at.ep_size, "families": sorted(ep_keys),
                      "why": ("the model's own expert-parallel plan splits these routed experts by expert (the fix "
                              "their findings name, re-checked); expert rules voted from another architecture's "
                              "tensor-parallel plan need not fit their layout")}
        fields.update(
            unresolved=sorted({str(u) for u in unresolved} | {str(u) for u in unresolved_more}),
            rules={s.key: s.style for s in chosen},
            voters={s.key: {"matched": s.matched, "votes": s.votes, "examples": s.voters} for s in chosen},
            after=summary(after), plan=plan,
            snippet=snippet(built.owner_class, base_plan, chosen, sorted(dead)) if clean else None,
            new_errors=[f.to_json() for f in after.findings
                        if f.severity == "error" and f.fingerprint not in before_errors],
            remaining_errors=[f"{f.code} {f.target}" for f in remaining],
            remaining_why=[f"{f.code} {f.target}: {f.message}" for f in remaining],
            tp_plan_override={prefix + s.key: s.style for s in chosen},
            tp_size=at.tp_size, ep_size=at.ep_size, expert_parallel=expert, clean=clean,
            fixed=_fixed_counts(report, after))
    return dataclasses.replace(report, suggestion=SuggestionSection(**fields))


def _generic(name: str) -> str:
    from ..compat.logic import generic_name

    return generic_name(name)
