"""`--format sarif`: SARIF 2.1.0 for code scanning. Each finding is a result whose `ruleId` is its code; its location
is the one the report stage worked out from the rule's declaration (`Finding.location`: the `--plan` file for plan
findings when there is one, else the model's config, at the line that names the rule key or config attribute), and
the parameter or rule as a logical location. Artifact URIs are percent-encoded and relative to the git repository
that holds the file (`uriBaseId` `%SRCROOT%`), else to the current directory, else absolute `file:` URIs
(`run.pipeline.artifact_uri`). Each rule carries `helpUri` (its row of the README's findings table). Nothing is read or
computed here."""

from __future__ import annotations

import json

from ..model import Report
from . import renderer
from .wording import cache_phrase

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/tpaudit/"
HELP_URI = INFORMATION_URI + "#{anchor}"
"""A rule's `helpUri`: its row of the findings table in the README (the project page), anchored by the lower-case
code (`#tpa001`); `tpaudit explain CODE` prints the same entry offline, and `help` carries it in the log."""


@renderer("check", "sarif")
def render(report: Report, **_) -> str:
    """The report as a SARIF 2.1.0 log (one run), ending with a newline."""
    from ..checks.registry import get_rule

    codes = sorted({f.code for f in report.findings})
    rules: list = []
    index: dict = {}
    for code in codes:
        r = get_rule(code)
        sections = r.sections() if r else {}
        help_md = "\n\n".join(f"**{k}**\n\n{v}" for k, v in sections.items())
        index[code] = len(rules)
        rules.append({
            "id": code, "name": r.kind if r else code,
            "shortDescription": {"text": r.summary if r else code},
            "fullDescription": {"text": sections.get("What it detects", r.summary if r else code)},
            "help": {"text": help_md, "markdown": help_md},
            "helpUri": HELP_URI.format(anchor=code.lower()),
            "defaultConfiguration": {"level": r.severity if r else "warning"},
            "properties": {"tags": ["tensor-parallel", r.family if r else "tpaudit"]},
        })
    results = []
    for f in report.findings:
        location: dict = {"logicalLocations": [{"fullyQualifiedName": f.target, "kind": "member"}]}
        if f.location is not None and f.location.path:
            artifact: dict = {"uri": f.location.uri or f.location.path}
            if f.location.uri_base:
                artifact["uriBaseId"] = f.location.uri_base
            physical: dict = {"artifactLocation": artifact}
            if f.location.line:
                physical["region"] = {"startLine": f.location.line}
            location["physicalLocation"] = physical
        text = f.message + (f" Fix: {f.fix}." if f.fix else "")
        results.append({
            "ruleId": f.code, "ruleIndex": index[f.code], "level": f.severity,
            "message": {"text": text}, "locations": [location],
            "partialFingerprints": {"tpaudit/v1": f.fingerprint},
            "properties": {"kind": f.kind, "target": f.target, "facts": f.facts},
        })
    m = report.model
    invocation: dict = {"executionSuccessful": True}
    properties = {"model": m.get("repo_id") or m.get("ref"), "tp_size": report.tp_size, "ep_size": report.ep_size,
                  "worst_rank_param_bytes": report.worst_rank_param_bytes, "versions": report.versions}
    p = report.parity
    if p is not None and (p.cached or p.cache_problem):
        # where the parity verdict came from, when the cache had a say (a verdict the findings above rest on)
        properties["parity_cache"] = {"cached": p.cached, **({"problem": p.cache_problem} if p.cache_problem else {})}
        invocation["toolExecutionNotifications"] = [{"level": "note", "message": {
            "text": f"Parity verdict {cache_phrase(p)}."}}]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "tpaudit", "version": report.versions.get("tpaudit", ""),
                                "semanticVersion": report.versions.get("tpaudit", ""),
                                "informationUri": INFORMATION_URI, "rules": rules}},
            "results": results,
            "invocations": [invocation],
            "properties": properties,
        }],
    }
    return json.dumps(log, indent=2) + "\n"
