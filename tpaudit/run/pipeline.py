"""The pipeline behind every command, one way from the source to the report (stage 6 assembles):

    ModelSource -> build (BuiltModel) -> plan (ResolvedPlan) -> simulate (ShardMap) -> load (LoadSection)
                -> [parity evidence] -> checks (findings) -> Report

Every entry point runs it the same way: `Audit.open(reference, build options)` (or `Audit(source, ...)` for a
source it made itself: a config object, a model object, a default config) builds the model once, then
`Audit.check(CheckRequest(...))` (the `check` command, the API, the guard, `verify`) or `Audit.report(sizes, ...)`
(one option of `size`, `batch`, `scan`, a `--suggest` round) resolves, simulates and checks. The simulation does not
consume the built model, so every option, every candidate plan and the guard's check share one build and one
checkpoint mapping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..metamodel import BuildOptions, BuiltModel, build_model
from ..checks.registry import CheckContext, CheckOptions, counts_replicated, get_rule, run_checks
from ..evidence import gather as gather_evidence
from ..shard.load import LoadMemo, decompression_note, first_forward_note, simulate_load
from ..model import (SEVERITY_ORDER, Finding, Location, ModelSource, ParallelSizes, ReplicatedFamily, Report,
                     total_bytes, why_unsharded)
from ..plan import ResolvedPlan, resolve_plan
from ..shard import simulate


@dataclass(frozen=True)
class CheckRequest:
    """What one `check` asks of a built model.

    Attributes:
        sizes (`ParallelSizes`): validated tp/ep sizes.
        options (`CheckOptions`): budgets, units.
        parity (`"auto" | "on" | "off"`): the parity check's mode (see `Audit.report`).
        plan_path (`str`, *optional*): the `--plan` file, where plan findings point.
        dist_overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides.
        suggest (`"never" | "always" | "on_errors"`): add a `--suggest` section: never, always, or only when the report
            has error findings (the guard).
        baseline (`frozenset[str]`, *optional*): fingerprints (`CODE:target`) an accepted baseline lists, dropped
            from the findings; `baseline_path` names the file.
    """

    sizes: ParallelSizes
    options: CheckOptions = field(default_factory=CheckOptions)
    parity: str = "auto"
    plan_path: str | None = None
    dist_overrides: dict | None = None
    suggest: str = "never"
    baseline: frozenset[str] | None = None
    baseline_path: str | None = None


class Audit:
    """One model, built once on the meta device; one `Report` per (sizes, plan).

    Args:
        source (`ModelSource`): from `sources.open_source`.
        options (`BuildOptions`, *optional*): class, dtype, plan override, config object, instance plans.

    Raises:
        UnsupportedVersionError, ConfigError, PlanError, UsageError: see `metamodel.build_model`.
    """

    def __init__(self, source: ModelSource, options: BuildOptions | None = None):
        from ..compat import versions

        self.versions = versions()
        self.source = source
        self.options = options or BuildOptions()
        self.built: BuiltModel = build_model(source, self.options)
        # the load stage's work that no placement changes, shared by every option of this model (`shard.load`)
        self._load_memo = LoadMemo()

    @classmethod
    def open(cls, ref: str, options: BuildOptions | None = None, *, revision: str | None = None,
             token: str | None = None, progress: bool = False) -> "Audit":
        """Read `ref` (a local directory, a snapshot file or a Hub id: `sources.open_source`) and build its model.

        Raises:
            ModelReferenceError, HubError, UsageError: the reference cannot be read (see `sources.open_source`).
            UnsupportedVersionError, ConfigError, PlanError: see `metamodel.build_model`.
        """
        from ..compat import versions
        from ..sources.beside import read_beside

        # the source is read beside the import of torch and transformers where the process allows it
        source, _ = read_beside(ref, versions, revision=revision, token=token, progress=progress)
        return cls(source, options)

    def check(self, request: CheckRequest) -> Report:
        """One `check`: the report for `request.sizes`, its fixes re-checked (`run.fixes.verify_fixes`: every
        concrete alternative a fix names is re-simulated and only the clean ones are offered), with the `--suggest`
        section and the baseline applied as asked.

        Raises:
            UsageError, PlanError: as `report`.
        """
        report = self.report(request.sizes, options=request.options, dist_overrides=request.dist_overrides,
                             parity=request.parity, plan_path=request.plan_path)
        from .fixes import verify_fixes

        report = verify_fixes(self, report, request.sizes, options=request.options,
                              dist_overrides=request.dist_overrides, parity=request.parity, accepted=request.baseline)
        if request.suggest == "always" or (request.suggest == "on_errors" and report.has_errors):
            from ..checks.registry import suggest_actions
            from ..plan.suggest import with_suggestion

            report = with_suggestion(self, report, request.sizes, actions=suggest_actions(), options=request.options,
                                     dist_overrides=request.dist_overrides)
        if request.baseline is not None:
            from .baseline import apply_baseline

            report = apply_baseline(report, set(request.baseline), request.baseline_path or "")
        return report

    def report(self, sizes: ParallelSizes, *, plan: dict[str, str] | None = None, options: CheckOptions | None = None,
               dist_overrides: dict | None = None, parity: str = "auto", plan_path: str | None = None,
               proposed: bool | None = None) -> Report:
        """Resolve, simulate and check one option.

        Args:
            sizes (`ParallelSizes`): validated tp/ep sizes.
            plan (`dict[str, str]`, *optional*): a `base_model_tp_plan` to use instead of the one the model was built
                with (keys relative to the base model); `None` keeps the built plan.
            options (`CheckOptions`, *optional*): budgets, units.
            dist_overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides.
            parity (`"auto" | "on" | "off"`): run the sharded-forward parity check when the plan needs evidence
                (`auto`), always (`on`, `--parity`), or never (`off`, `--no-parity`).
            plan_path (`str`, *optional*): the `--plan` file, where plan findings point.
            proposed (`bool`, *optional*): the plan is under review and gets the parity check in any case (default:
                when a plan is given here or was given at build time, `--plan`).

        Returns:
            `Report`.

        Raises:
            UsageError: transformers refuses the sizes or the plan.
            PlanError: `plan` names an unknown style.
        """
        options = options or CheckOptions()
        built = self.built
        resolved = resolve_plan(built, sizes, dist_overrides, plan=plan)
        shard_map = simulate(built, resolved)
        if proposed is None:
            proposed = plan is not None or self.options.plan_override is not None
        load = simulate_load(built, shard_map, self._load_memo)
        evidence = gather_evidence(built, resolved, shard_map, parity, proposed=proposed)
        ctx = CheckContext(built=built, plan=resolved, shard_map=shard_map, options=options, parity=evidence,
                           load=load)
        findings = locate(run_checks(ctx), built, resolved, plan_path)
        shown = load if load is not None and (built.quantization is not None or load.issues) else None
        return Report(model=_model_info(built), shard_map=shard_map, replicated=replicated_families(shard_map, findings),
                      unused_rules=tuple(resolved.unused_tp_rules) + tuple(resolved.unused_ep_rules),
                      findings=tuple(findings), plan=resolved.to_json(), notes=self._notes(load, options),
                      versions=dict(self.versions), kv_cache=_kv(built, shard_map), parity=evidence, loading=shown)

    def _notes(self, load=None, options: CheckOptions | None = None) -> tuple[str, ...]:
        notes = list(self.built.notes)
        if "untested" in self.versions:
            notes.insert(0, self.versions["untested"])
        unit = (options or CheckOptions()).unit
        if load is not None and load.decompressed:
            notes.append(decompression_note(load, unit))
        if load is not None and load.rank_first_forward_bytes is not None:
            notes.append(first_forward_note(load, unit))
        return tuple(notes)


def _kv(built: BuiltModel, shard_map):
    import torch

    from ..shard.kvcache import kv_section

    itemsize = torch.empty((), dtype=getattr(torch, built.dtype)).element_size()
    return kv_section(built.facts, shard_map, built.text_prefix, built.dtype, itemsize)


def _model_info(built: BuiltModel) -> dict:
    source = built.source
    tensors = source.tensors
    return {
        "ref": source.ref, "kind": source.kind, "repo_id": source.repo_id, "revision": source.revision,
        "commit": source.commit, "model_type": built.facts.model_type,
        "architecture": built.architecture, "dtype": built.dtype, "config_only": source.config_only,
        "checkpoint_tensor_count": len(tensors) if tensors is not None else None,
        "checkpoint_bytes": source.checkpoint_bytes,
        "quantization": built.quantization.to_json() if built.quantization else None,
        "config_path": source.config_path,
        "bytes_caveat": _bytes_caveat(built),
    }


# share of the checkpoint's bytes that may map to nothing before the report's byte counts get a caveat
_UNMAPPED_CAVEAT_SHARE = 0.10


def _bytes_caveat(built: BuiltModel) -> str | None:
    """One sentence when the report's bytes are not the checkpoint's: more than 10% of the checkpoint's bytes map to
    no parameter (TPA301) while parameters have no checkpoint tensor (TPA302) and are counted in their own dtype
    (Kimi-K2.5: per-expert int4 tensors the loader does not fill fused bf16 experts from, here). `None` otherwise."""
    mapping, total = built.mapping, built.source.checkpoint_bytes
    if mapping is None or not total or not mapping.unmapped or not mapping.missing:
        return None
    unmapped = total_bytes([t for t, _ in mapping.unmapped])
    if unmapped <= _UNMAPPED_CAVEAT_SHARE * total:
        return None
    return (f"{unmapped / total:.0%} of the checkpoint's {total:,} B map to no parameter (TPA301) while "
            f"{len(mapping.missing)} parameters have no checkpoint tensor and count in the model dtype (TPA302): the "
            "bytes below are the built model's, not what a load of this checkpoint holds")


def replicated_families(shard_map, findings: list[Finding]) -> tuple[ReplicatedFamily, ...]:
    """Families that no rule shards (the shard map's grouping, the one TPA001 walks), largest first, each with the
    severity of the finding whose subject covers it (of a rule that declares `counts_replicated`: TPA001)."""
    severity: dict[str, str] = {}
    for f in findings:
        if not counts_replicated(f):
            continue
        for name in f.subject.families if f.subject else ():
            if name not in severity or SEVERITY_ORDER[f.severity] < SEVERITY_ORDER[severity[name]]:
                severity[name] = f.severity
    out = [ReplicatedFamily(name=g.generic_name, count=g.count, bytes=g.total_bytes, reason=why_unsharded(g.first),
                            severity=severity.get(g.generic_name))
           for g in shard_map.replicated_groups()]
    return tuple(sorted(out, key=lambda f: (-f.bytes, f.name)))


def locate(findings: list[Finding], built: BuiltModel, resolved: ResolvedPlan,
           plan_path: str | None) -> list[Finding]:
    """Each finding with the `Location` its rule declares (`points_at`): the `--plan` file's line naming the rule key,
    the config's line naming the attribute, or the config file for checkpoint findings."""
    import dataclasses

    source = built.source
    if source.kind == "hub" and source.repo_id:
        config_file = f"https://huggingface.co/{source.repo_id}/blob/{source.commit or 'main'}/config.json"
    else:
        config_file = source.config_path
    lines = {path: _quoted_lines(path) for path in {plan_path, config_file}
             if path and not path.startswith("https://")}
    uris: dict[str | None, tuple[str | None, str | None]] = {}
    out = []
    for f in findings:
        rule = get_rule(f.code)
        points_at = rule.points_at if rule else "plan"
        if points_at == "plan" and plan_path:
            path, needle = plan_path, (f.subject.rule_key if f.subject else None) or resolved.relative(f.target)
        elif points_at == "config":
            path, needle = config_file, f.target.rpartition(".")[2]
        else:
            path, needle = config_file, None
        line = (lines.get(path) or {}).get(needle) if needle else None
        if path not in uris:
            uris[path] = artifact_uri(path) if path else (None, None)
        uri, base = uris[path]
        out.append(dataclasses.replace(f, location=Location(path=path, line=line, logical=f.target, uri=uri,
                                                            uri_base=base)))
    return out


SOURCE_ROOT = "%SRCROOT%"


def artifact_uri(path: str, cwd: str | None = None) -> tuple[str, str | None]:
    """A file a finding points at as a SARIF artifact URI (RFC 3986 `uri-reference`, percent-encoded), and its base.

    - A URL (a Hub config) is kept as it is.
    - A file inside a git repository (a `.git` folder or file in it or a parent folder): relative to the
      repository's root, with base `%SRCROOT%` (what GitHub code scanning resolves against the checked-out
      repository), e.g. `models/my%20model/config.json`.
    - Else, a file under the current directory: relative to it, without a base.
    - Else: an absolute `file:` URI (`file:///data/my%20model/config.json`).

    Args:
        path (`str`): the file as the report names it.
        cwd (`str`, *optional*): the current directory (default: `os.getcwd()`).

    Returns:
        `(uri, base)`: `base` is `"%SRCROOT%"` or `None`.
    """
    import os
    from urllib.parse import quote

    if path.startswith(("https://", "http://")):
        return path, None
    full = Path(os.path.abspath(path))
    here = Path(os.path.abspath(cwd or os.getcwd()))
    for folder in full.parents:
        if (folder / ".git").exists():
            return quote(full.relative_to(folder).as_posix(), safe="/"), SOURCE_ROOT
    if here == full or here in full.parents:
        return quote(full.relative_to(here).as_posix(), safe="/"), None
    return full.as_uri(), None


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _quoted_lines(path: str) -> dict[str, int]:
    """Every quoted string of a JSON file (a rule key, an attribute name) -> the first line it appears on: one pass,
    so locating any number of findings stays linear. Empty for an unreadable or gzip file."""
    from ..errors import TpauditError
    from ..sources.files import read_capped

    try:  # a regular file, capped: it was read (and checked) before, but may have been swapped since
        raw = read_capped(path, "file", 64 << 20)
    except TpauditError:
        return {}
    if raw[:2] == b"\x1f\x8b":  # a gzip snapshot: no line to point at
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {}
    out: dict[str, int] = {}
    for i, line in enumerate(text.splitlines(), 1):
        for m in _QUOTED.finditer(line):
            out.setdefault(m.group(1), i)
    return out


def audit_source(source: ModelSource, *, tp_size: int, ep_size: int = 1, plan_override: dict | None = None,
                 architecture: str | None = None, trust_remote_code: bool = False, dtype: str | None = None,
                 options: CheckOptions | None = None, config=None, instance_plans: dict | None = None,
                 dist_overrides: dict | None = None, parity: str = "auto", plan_path: str | None = None,
               proposed: bool | None = None) -> Report:
    """One report for one option: `Audit(source, ...).report(...)` (for callers that check one option).

    Raises:
        UnsupportedVersionError, ConfigError, PlanError, UsageError: see `Audit`.
    """
    sizes = ParallelSizes.of(tp_size, ep_size)
    audit = Audit(source, BuildOptions(plan_override=plan_override, architecture=architecture,
                                       trust_remote_code=trust_remote_code, dtype=dtype, config=config,
                                       instance_plans=instance_plans))
    return audit.report(sizes, options=options, dist_overrides=dist_overrides, parity=parity, plan_path=plan_path)


__all__ = ["Audit", "audit_source", "replicated_families", "locate"]
