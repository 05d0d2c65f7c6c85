"""What transformers 5.25 changed for TP/EP, modelled and tested against the installed release: the unit styles on
minicpm5_moe, the EP-only ergo, DeepSeek-V3's MLA attention rules, the hybrid models' attention rules, the deprecated
and removed styles, `DistributedConfig(tp_plan={})` at tp > 1, and the untested-release note of every command.
Expected values come from the configs (heads, head_dim) and from transformers' own plans and functions, never from
tpaudit's output. Tests of behaviour that 5.25 introduced are skipped under 5.23/5.24."""

from __future__ import annotations

import io
import math

import pytest

from releases import RELEASE

since_525 = pytest.mark.skipif(RELEASE < (5, 25), reason="transformers 5.25 behaviour")


def _check(config, tp: int, ep: int = 1, **kwargs):
    import tpaudit

    return tpaudit.check(config, tp_size=tp, ep_size=ep, **kwargs).to_json()


def _param(report: dict, suffix: str) -> dict:
    return next(p for p in report["params"] if p["name"].endswith(suffix))


@since_525
@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_unit_colwise_keeps_whole_kv_heads_per_rank(tp):
    """minicpm5_moe splits k_proj/v_proj with `unit_colwise`: the TP mesh is viewed as (groups, replicas) with
    groups = gcd(KV heads, tp_size), so every rank holds KV heads / groups whole heads (2 heads at tp 4: one each,
    duplicated on 2 ranks; at tp 3: both heads on every rank). No head is split, so TPA102 never fires."""
    from transformers import MiniCPM5MoeConfig

    config = MiniCPM5MoeConfig(num_hidden_layers=2)
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim
    assert (kv_heads, head_dim) == (2, 128)
    heads_per_rank = kv_heads // math.gcd(kv_heads, tp)
    report = _check(config, tp)
    for leaf in ("k_proj.weight", "v_proj.weight"):
        p = _param(report, f"self_attn.{leaf}")
        assert p["style"] == "unit_colwise"
        # totals over the layers, bfloat16
        assert p["rank_bytes"] == [config.num_hidden_layers * heads_per_rank * head_dim * config.hidden_size * 2] * tp
    assert not [f for f in report["findings"] if f["code"] == "TPA102"]
    assert report["kv_cache"]["kv_heads_per_rank"] == heads_per_rank
    assert report["kv_cache"]["bytes_per_token_per_rank"] == [2 * 2 * heads_per_rank * head_dim * 2] * tp


@since_525
def test_unit_colwise_local_shapes_are_transformers_own():
    """transformers' own `UnitColwiseParallel.shard_param` on a fake process group (rank 0 of 4) against the rows
    tpaudit reads for every rank of the (units, replicas) mesh: rank 0's local shape is the DTensor's own."""
    import torch
    import transformers.distributed.tensor_parallel  # noqa: F401 - fills the style registry
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
    from transformers.distributed.utils import TransformersDeviceMesh
    from types import SimpleNamespace

    from tpaudit.compat import _torch
    from tpaudit.compat.transformers_5_23.plans import _coordinate

    heads, head_dim, hidden, tp = 2, 16, 64, 4
    with torch.device("meta"):
        linear = torch.nn.Linear(hidden, heads * head_dim)
    config = SimpleNamespace(head_dim=head_dim, hidden_size=hidden, num_attention_heads=8)
    with _torch.fake_process_group(tp):
        dense = _torch.device_mesh((1, 1, 1, tp), ("pp", "dp_replicate", "fsdp", "tp"))
        expert = _torch.device_mesh((1, 1, 1, 1), ("pp", "dp_replicate", "efsdp", "ep"))
        manager = TransformersDeviceMesh(dense, expert)
        ALL_PARALLEL_STYLES["unit_colwise"].shard_param(linear, "weight", manager.get_mesh("tp"), config=config,
                                                        mesh_manager=manager)
        weight = linear.weight
        mesh = weight.device_mesh
        assert tuple(mesh.shape) == (math.gcd(heads, tp), tp // math.gcd(heads, tp))
        ours = [_torch.local_shape(tuple(weight.shape), tuple(mesh.shape), _coordinate(r, tuple(mesh.shape)),
                                   tuple(weight.placements)) for r in range(tp)]
        assert ours[0] == tuple(weight.to_local().shape)
    assert ours == [(head_dim, hidden)] * tp


@since_525
def test_ergo_has_only_an_expert_parallel_plan():
    """ergo ships `base_model_ep_plan` and no TP plan: tp alone is refused by `from_pretrained` (TPA003 quotes it);
    with ep the experts are split by expert and everything else is whole on every rank."""
    from transformers import ErgoConfig

    assert not getattr(ErgoConfig, "base_model_tp_plan", None) and ErgoConfig.base_model_ep_plan
    config = ErgoConfig(num_hidden_layers=2)
    report = _check(config, 2)
    no_plan = [f for f in report["findings"] if f["code"] == "TPA003"]
    assert no_plan and no_plan[0]["severity"] == "error"


@since_525
@pytest.mark.parametrize("model_type, block, attention, kwargs", [
    ("deepseek_v3", "self_attn", ["q_b_proj", "kv_b_proj", "o_proj"], {}),
    ("bamba", "self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"], {"attn_layer_indices": [1]}),  # default: none
    ("jamba", "self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"], {}),
    ("nemotron_h", "mixer", ["q_proj", "k_proj", "v_proj", "o_proj"], {}),
    ("granitemoe", "self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"], {}),
])
def test_attention_rules_added_in_5_25_shard_attention(model_type, block, attention, kwargs):
    """The attention rules 5.25 added (DeepSeek-V3's MLA, the hybrids', granitemoe's) shard those projections: each
    is sharded, split by its style's axis into tp_size pieces of its rows (colwise) or columns (rowwise)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    plan = cls.base_model_tp_plan
    config = cls(**kwargs)  # the default layer pattern (the hybrids' attention layers sit at set indices)
    report = _check(config, 2)
    for leaf in attention:
        style = plan[f"layers.*.{block}.{leaf}"]
        p = _param(report, f"layers.*.{block}.{leaf}.weight")
        assert p["style"] == style and p["sharding"] == "sharded", (leaf, p)
        dim = 0 if style.startswith("colwise") else 1
        assert p["local_shape"][dim] == math.ceil(p["shape"][dim] / 2)
        assert not [r for r in report["replicated"] if r["name"] == p["name"]]


@since_525
def test_tp_plan_empty_with_tp_is_expert_parallelism_alone():
    """`DistributedConfig(tp_plan={})` at tp > 1: 5.25 accepts it (the EP plan alone across the ranks), as its own
    `_resolve_parallel_plans` does; the attention then stays whole on every rank and the experts are split."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    from transformers.distributed import DistributedConfig

    from tpaudit.run.pipeline import Audit
    from tpaudit.metamodel import BuildOptions
    from tpaudit.model import ParallelSizes

    config = Qwen3MoeConfig(num_hidden_layers=2, num_experts=8)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tp_plan, ep_plan, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=2, ep_size=2, tp_plan={}))
    assert tp_plan == {} and ep_plan  # transformers' own answer
    from tpaudit.api import _source_from_config

    audit = Audit(_source_from_config(config), BuildOptions(config=config))
    report = audit.report(ParallelSizes.of(2, 2), dist_overrides={"tp_plan": {}}).to_json()
    q = _param(report, "self_attn.q_proj.weight")
    experts = _param(report, "mlp.experts.gate_up_proj")
    assert q["sharding"] != "sharded" and experts["local_shape"][0] == config.num_experts // 2


def test_verify_says_when_the_release_is_untested():
    """`verify` shows the untested-release note like every other command."""
    from rich.console import Console

    from tpaudit.report import get
    from tpaudit.verify import VerifyResult

    result = VerifyResult(tp_size=2, ep_size=1, ranks=[], mismatches=[], model={"ref": "m"},
                          versions={"transformers": "5.26.0.dev0", "untested": "transformers 5.26.0.dev0 is not a "
                                    "release tpaudit was tested with"})
    out = io.StringIO()
    get("verify", "table").fn(result, Console(file=out, width=120))
    assert "transformers 5.26.0.dev0 is not a release tpaudit was tested with" in out.getvalue()


@since_525
def test_scan_covers_the_model_types_new_in_5_25(tmp_path):
    """The seven model types 5.25 added with plans each get an audited row; minicpm5_moe's only errors are its routed
    experts, which its TP plan leaves to the EP plan (read from the config class)."""
    import json

    from conftest import run_main
    from transformers import MiniCPM5MoeConfig

    new = ["minicpm5_moe", "param2moe", "kolibri1_1", "ergo", "llava_onevision1_5", "ovis2_5", "pi05"]
    args = ["scan", "--tp", "4", "--jobs", "1", "--format", "json", "-o", str(tmp_path / "scan.json")]
    for t in new:
        args += ["--model-type", t]
    run_main(*args)
    rows = {m["model_type"]: m for m in json.loads((tmp_path / "scan.json").read_text())["models"]}
    assert sorted(rows) == sorted(new)
    assert {t: r["status"] for t, r in rows.items() if r["status"] not in ("ok", "no_plan")} == {}
    assert rows["ergo"]["status"] == "no_plan"          # an EP plan only
    experts = {k.rpartition(".")[2] for k in MiniCPM5MoeConfig.base_model_ep_plan if ".experts." in k}
    assert not any(".experts." in k for k in MiniCPM5MoeConfig.base_model_tp_plan)
    errors = {f["target"] for f in rows["minicpm5_moe"]["findings"] if f["severity"] == "error"}
    assert errors == {f"model.layers.*.mlp.experts.{p}" for p in experts}


def test_tpa001_under_a_users_plan_names_that_plan_not_the_shipped_one():
    """With `--plan`, the experts' TPA001 blames the plan in force (the user's), not the config class's shipped plan,
    and still gives expert parallelism as its fix (the model's EP plan covers them)."""
    from conftest import CASES, FIXTURES, audit
    import json

    plan = json.loads((CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json").read_text())
    report = audit(str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"), tp=4, plan=plan)
    experts = [f for f in report.findings if f.code == "TPA001" and ".mlp.experts." in f.target]
    assert len(experts) == 2
    for f in experts:
        assert "the plan in force has no rule for them" in f.message and "shipped" not in f.message
