"""The seam: tpaudit's copies of transformers logic (`tpaudit.compat.logic`) against transformers' own functions, on
many inputs, in whichever supported release is installed; and the capability gate."""

from __future__ import annotations

import itertools
import math
import logging
from pathlib import Path

import pytest


_PLAN_ATTRIBUTES = {"base_model_tp_plan", "base_model_ep_plan"}


@pytest.fixture(scope="module")
def plans():
    """Every `base_model_tp_plan` / `base_model_ep_plan` a config class of the installed transformers spells out as a
    literal (hundreds of real rules), read from the configuration modules' syntax trees: importing the ~800 config
    classes to read the same dicts took 6-7 s of every test session. A plan a class builds by code (a comprehension)
    is left out; there are one or two."""
    import ast
    import importlib.util

    models = Path(importlib.util.find_spec("transformers").origin).parent / "models"
    out, by_code = [], []
    for path in sorted(models.glob("*/configuration_*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(name in text for name in _PLAN_ATTRIBUTES):
            continue
        for cls in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    target = stmt.target
                else:
                    continue
                if not (isinstance(target, ast.Name) and target.id in _PLAN_ATTRIBUTES):
                    continue
                try:
                    plan = ast.literal_eval(stmt.value)
                except ValueError:
                    by_code.append(f"{path.name}:{stmt.lineno}")
                    continue
                if isinstance(plan, dict) and plan:
                    out.append(plan)
    assert len(out) > 200 and len(by_code) < len(out) // 20, by_code
    return out


@pytest.fixture(scope="module")
def names(plans):
    """Concrete names derived from the plans' keys (layer/expert numbers filled in) plus weights, biases and scales
    of each, and names with digits inside components."""
    out = set()
    for plan in plans:
        for key in plan:
            for n in (0, 7, 61):
                concrete = key.replace("*", str(n))
                out.update({concrete, f"model.{concrete}", f"{concrete}.weight", f"{concrete}.bias",
                            f"{concrete}.weight_scale_inv", f"model.language_model.{concrete}.weight"})
    out.update({"w1", "layers.0.w1.weight", "h.11.attn.c_attn.weight", "blocks.3.0.conv.weight", "a.b10.c",
                "x.1", "1.x", "model.layers.12", ".0.", "layers.0.mlp.experts.13.w2.weight"})
    return sorted(out)


def test_generic_name_is_transformers_own(names):
    from transformers.distributed.parallel_utils import replace_layer_number_by_wildcard

    from tpaudit.compat.logic import generic_name

    for name in names:
        assert generic_name(name) == replace_layer_number_by_wildcard(name), name


def test_parameter_rule_is_transformers_own(plans, names):
    from transformers.distributed.parallel_utils import _get_parameter_plan

    from tpaudit.compat.logic import parameter_rule

    checked = 0
    for plan, name, is_weight in itertools.product(plans[:150], names[:400], (True, False)):
        key = parameter_rule(name, plan, is_weight=is_weight)
        assert (plan[key] if key is not None else None) == _get_parameter_plan(name, plan, is_weight=is_weight), \
            (name, is_weight)
        checked += key is not None
    assert checked > 300  # many names actually match a rule


def _meta_model(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _tiny_moe_config():
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                num_experts=4, num_experts_per_tok=2, vocab_size=128)


def test_ep_dropped_rules_and_unused_rules_are_transformers_own():
    """Resolve a real model with transformers at tp = ep = 2 and compare which TP rules survive, and which rules it
    reports as matching nothing, with tpaudit's copies."""
    from tpaudit.compat import backend
    from tpaudit.compat.logic import ep_dropped_rules, generic_name, unused_rules

    tf = backend()
    model = _meta_model(_tiny_moe_config())
    tp_rules, ep_rules = tf.merged_plans(model)
    # the experts' TP rules as transformers 5.23/5.24 shipped them (5.25 dropped them from the plan): EP replaces them
    experts = {"model.layers.*.mlp.experts.gate_up_proj": "packed_colwise", "model.layers.*.mlp.experts.down_proj":
               "rowwise"}
    tf.set_merged_plans(model, {**tp_rules, **experts, "model.layers.*.mlp.no_such_proj": "colwise"}, ep_rules)
    tp_rules, ep_rules = tf.merged_plans(model)
    assert ep_rules  # qwen3_moe ships an EP plan
    dc = tf.distributed_config(2, 2)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, logger = Keep(), logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        applied_tp, _, _ = model._resolve_parallel_plans(dc)  # transformers' own, with its own logging
    finally:
        logger.removeHandler(handler)
    tf.set_merged_plans(model, tp_rules, ep_rules)
    survivors = {generic_name(k) for k in applied_tp}
    dropped = set(ep_dropped_rules(tp_rules, ep_rules))
    assert set(experts) <= dropped and all(".mlp.experts" in k for k in dropped)  # 5.24 also ships `mlp.experts`
    kept = {k: v for k, v in tp_rules.items() if k not in dropped}
    for key in tp_rules:
        applied = any(s == key or s.startswith(key + ".") for s in survivors)
        if key in dropped:
            assert not applied, key
    # transformers validates the TP plan left after the drop and logs what matches nothing: the same set
    import re

    logged = re.search(r"`tp_plan` rules \[(.*?)\] match nothing", "\n".join(records))
    theirs = tuple(sorted(x.strip().strip("'") for x in logged.group(1).split(","))) if logged else ()
    assert unused_rules(kept, tf.model_names(model)) == theirs
    assert "model.layers.*.mlp.no_such_proj" in theirs


@pytest.mark.parametrize("style", ["colwise", "colwise_gather_output", "colwise_rep", "packed_colwise", "rowwise",
                                   "rowwise_split_input", "rowwise_rep", "packed_rowwise"])
def test_style_placements_are_transformers_own(style):
    """Apply each linear style to a Linear with transformers on a fake process group: the weight's split axis, the
    packed split factor and whether the output is gathered must be what `compat.logic` says."""
    import torch
    import transformers.distributed.tensor_parallel  # noqa: F401 - 5.23 fills the style registry when it is imported
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

    from tpaudit.compat import _torch
    from tpaudit.compat.logic import style_axis, style_gathers_output, style_split_factor

    impl = ALL_PARALLEL_STYLES[style]
    with torch.device("meta"):
        linear = torch.nn.Linear(8, 16)
    with _torch.fake_process_group(2):
        mesh = _torch.device_mesh((2,), ("tp",))
        impl.shard_param(linear, "weight", mesh)
        kind, dim, sf, _ = _torch.describe_placement(linear.weight.placements[0])
    assert {0: "out", 1: "in"}[dim % 2] == style_axis(style)
    assert sf == style_split_factor(style)
    from torch.distributed.tensor import Replicate

    gathered = getattr(impl, "output_layouts", None) == Replicate() and style_axis(style) == "out"
    assert gathered == style_gathers_output(style)


# The transformers class behind each style family (`distributed/tensor_parallel.py`, `expert_parallel.py`)
_FAMILY_CLASSES = {
    "COLWISE_FAMILY": {"ColwiseParallel", "PackedColwiseParallel"},
    "ROWWISE_FAMILY": {"RowwiseParallel", "PackedRowwiseParallel"},
    "EMBEDDING": {"EmbeddingParallel"},
    "NO_OP": {"TensorParallelLayer", "ReplicatedWithGradAllReduce"},
    "EXPERTS_MODULE": {"MoeExpertsParallel", "EpDispatchExpertsParallel"},
    "EXPLICIT_REPLICATE": {"TensorParallelLayer", "ReplicatedWithGradAllReduce", "SequenceParallel",
                           "MlaKvAProjParallel", "AllReduceParallel", "MoeIdentityParallel"},
}


def test_the_style_vocabulary_is_the_installed_registry():
    """The release line's style names are the keys transformers registers, and each family of `compat.styles` holds
    exactly the registered styles of its transformers classes (by class name, read from the registry)."""
    import transformers.distributed.expert_parallel  # noqa: F401 - fills the EP styles when imported
    import transformers.distributed.tensor_parallel  # noqa: F401 - fills the TP styles when imported
    from torch.distributed.tensor import Replicate
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

    from tpaudit.compat import backend
    from tpaudit.compat.styles import vocabulary

    styles = vocabulary()
    assert styles is backend().STYLES
    assert styles.REGISTERED == set(ALL_PARALLEL_STYLES), (
        f"the {styles.LINE} line's styles differ from transformers {backend().versions['transformers']}'s: "
        f"{sorted(styles.REGISTERED ^ set(ALL_PARALLEL_STYLES))}")
    for family, classes in _FAMILY_CLASSES.items():
        theirs = {name for name, impl in ALL_PARALLEL_STYLES.items() if type(impl).__name__ in classes}
        assert getattr(styles, family) == theirs, family
    gathered = {name for name in styles.COLWISE_FAMILY
                if getattr(ALL_PARALLEL_STYLES[name], "output_layouts", None) == Replicate()}
    assert styles.GATHERED_OUTPUT == gathered
    assert styles.SPLIT_OUTPUT == styles.COLWISE_FAMILY - gathered
    assert styles.OWN_SPLIT == styles.COLWISE_FAMILY | styles.ROWWISE_FAMILY | styles.EMBEDDING
    assert styles.LAST_DIM == {n for n in styles.ROWWISE_FAMILY if n in ("rowwise", "packed_rowwise")}


def test_the_two_style_tables_agree():
    """`compat.logic`'s linear-style table (axis, gathered output, split factor: pinned to each style's `shard_param`
    above) and the vocabulary's families (pinned to transformers' classes above) describe the same styles alike: every
    colwise-family style splits the output axis, every rowwise-family style the input axis, exactly the gathered ones
    gather. The unit styles of 5.25 are in the table but in no family (their classes are neither `ColwiseParallel` nor
    `RowwiseParallel`: each rank keeps whole heads)."""
    from tpaudit.compat.logic import linear_styles, style_axis, style_gathers_output
    from tpaudit.compat.styles import vocabulary

    styles = vocabulary()
    table = set(linear_styles())
    assert styles.COLWISE_FAMILY | styles.ROWWISE_FAMILY <= table
    assert table <= styles.REGISTERED | {"unit_colwise", "unit_rowwise"}
    assert all(style_axis(s) == "out" for s in styles.COLWISE_FAMILY)
    assert all(style_axis(s) == "in" for s in styles.ROWWISE_FAMILY)
    assert {s for s in table if style_gathers_output(s)} == styles.GATHERED_OUTPUT
    assert table - styles.COLWISE_FAMILY - styles.ROWWISE_FAMILY == {"unit_colwise", "unit_rowwise"}


_SHARD_CASES = [  # (parameter shape, placement, checkpoint tensor shape, tensor_idx)
    ((4, 96, 64), ("strided_shard", 1, 2), (48, 64), 1),     # per-expert piece of packed_colwise fused experts
    ((4, 96, 64), ("strided_shard", 1, 2), (4, 64, 96), None),  # a stored [E, H, 2I] tensor, sliced before Transpose
    ((4, 96, 64), ("strided_shard", 1, 2), (2,), 0),         # a 1-D weight_shape collected for the 3-D experts
    ((8, 64, 48), ("shard", 0, 1), (64, 48), 5),             # EP: an expert this rank does or does not own
    ((8, 64, 48), ("shard", 0, 1), (2,), 3),                 # EP: the 1-D weight_shape, read with the dense path
    ((8, 64, 48), ("shard", 2, 1), (64, 12), 2),             # rowwise on the experts' input axis
    ((64, 33), ("shard", 1, 1), (64, 1), None),              # a per-channel [out, 1] scale under a rowwise rule
    ((37, 16), ("shard", 0, 1), (37, 16), None),             # an uneven colwise split
]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_shard_operation_is_transformers_own(world):
    """`compat.loading.RankShardOperation` (transformers' `DtensorShardOperation` with the rank's coordinate put in
    place of a live DTensor's) against the original on a real DTensor of a fake process group joined AS that rank,
    for every rank: the same local shape, the same dropped piece, the same exception."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers.distributed.sharding_utils import DtensorShardOperation

    from tpaudit.compat import _torch, loading

    def outcome(op, source_shape, idx):
        try:
            out = op.shard_tensor(torch.empty(source_shape, device="meta"), tensor_idx=idx)
        except Exception as e:  # noqa: BLE001 - the exception itself is compared
            return type(e).__name__
        return None if out is None else tuple(out.shape)

    for rank in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            mesh = _torch.device_mesh((world,), ("tp",))
            for shape, (kind, dim, sf), source, idx in _SHARD_CASES:
                placement = _torch.placement(kind, dim, sf)
                local = _torch.local_shape(shape, (world,), [rank], (placement,))
                param = DTensor.from_local(torch.empty(local, device="meta"), mesh, (placement,), run_check=False,
                                           shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())
                theirs = outcome(DtensorShardOperation(param), source, idx)
                ours = outcome(loading.rank_shard_operation(shape, (placement,), world, rank), source, idx)
                assert ours == theirs, (shape, kind, dim, source, idx, rank, world)
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("bits, width", [(4, 64), (8, 64), (3, 64), (5, 96)])
def test_packed_width_fallback_is_transformers_own(bits, width):
    """`compat.loading.packed_width_fallback` against compressed-tensors' MoE decompression itself: run
    `CompressedTensorsDequantize` on one expert whose `weight_shape` arrived empty (channel strategy, so no group
    size intervenes) and read the width it decompressed to."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from transformers.core_model_loading import WeightConverter
    from transformers.integrations.compressed_tensors import CompressedTensorsDequantize
    from transformers.quantizers.auto import AutoHfQuantizer

    from tpaudit.compat import loading

    config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": bits, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}}}}
    quantizer = AutoHfQuantizer.from_config(config, pre_quantized=True)
    op = CompressedTensorsDequantize(quantizer)
    rows = 8
    packed = pack_to_int32(torch.zeros(rows, width, dtype=torch.int8), bits)
    inputs = {"experts.*.down_proj.weight_packed": [packed],
              "experts.*.down_proj.weight_scale": [torch.ones(rows, 1, dtype=torch.bfloat16)],
              "experts.*.down_proj.weight_shape": [torch.tensor([], dtype=torch.int32)]}

    class Model:
        def get_parameter(self, name):
            return torch.empty(1, dtype=torch.bfloat16, device="meta")

    out = op.convert(inputs, source_patterns=list(inputs), target_patterns=["experts.down_proj"], full_layer_name="x",
                     model=Model())
    theirs = next(iter(out.values())).shape[-1]
    converter = WeightConverter(list(inputs), ["experts.down_proj"], [op])
    assert loading.packed_width_fallback(converter, packed.shape[-1]) == theirs


@pytest.mark.parametrize("bits, width, group", [(4, 64, None), (3, 64, None), (5, 96, None), (4, 64, 32),
                                                 (3, 64, 32)])
def test_an_empty_weight_shape_converts_as_the_rebuilt_one(bits, width, group):
    """The load stage keys a rank's input whose `weight_shape` piece is empty as the input carrying `[rows, rebuilt
    in_features]` (`shard.load._convert_key`), so the two share one run of the operations: compressed-tensors' MoE
    decompression must give the same outcome for both (the output's shape and dtype, or the error), whether the
    rebuilt size is right (4 bits) or wrong (3 bits: 60 of 64, which a group size of 32 then refuses)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from transformers.core_model_loading import WeightConverter
    from transformers.integrations.compressed_tensors import CompressedTensorsDequantize
    from transformers.quantizers.auto import AutoHfQuantizer

    from tpaudit.compat import loading

    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "channel"}
    config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": bits, "type": "int", "symmetric": True, "dynamic": False, **strategy}}}}
    op = CompressedTensorsDequantize(AutoHfQuantizer.from_config(config, pre_quantized=True))
    rows = 8
    packed = pack_to_int32(torch.zeros(rows, width, dtype=torch.int8), bits)
    scale = torch.ones(rows, width // group if group else 1, dtype=torch.bfloat16)
    rebuilt = loading.packed_width_fallback(WeightConverter(["experts.*.down_proj.weight_packed"],
                                                            ["experts.down_proj"], [op]), packed.shape[-1])

    class Model:
        def get_parameter(self, name):
            return torch.empty(1, dtype=torch.bfloat16, device="meta")

    def outcome(shape: torch.Tensor):
        inputs = {"experts.*.down_proj.weight_packed": [packed.clone()], "experts.*.down_proj.weight_scale": [scale],
                  "experts.*.down_proj.weight_shape": [shape]}
        try:
            out = op.convert(inputs, source_patterns=list(inputs), target_patterns=["experts.down_proj"],
                             full_layer_name="x", model=Model())
        except Exception as e:  # noqa: BLE001 - the error is part of the outcome
            return type(e).__name__, str(e)
        return [(tuple(v.shape), v.dtype) for v in out.values()]

    empty = outcome(torch.tensor([], dtype=torch.int32))
    assert empty == outcome(torch.tensor([rows, rebuilt], dtype=torch.int32))
    # what each case is there to cover: 32 // bits values a word, so 3 and 5 bits rebuild less than they packed,
    # and 60 columns are refused by groups of 32
    assert rebuilt == math.ceil(width * bits / 32) * (32 // bits)
    refused = group is not None and rebuilt % group != 0
    assert empty == (("ValueError", empty[1]) if refused else [((1, rows, rebuilt), torch.bfloat16)]), empty


def test_a_missing_capability_is_exit_2_naming_transformers(monkeypatch):
    """A release whose probes fail: one line naming the release, what is missing, and the supported range."""
    import tpaudit.compat as compat
    from tpaudit.compat._probe import Capability
    from tpaudit.errors import ExitCode, UnsupportedVersionError

    for line in compat._lines():  # every release line lacks it: no line can run
        monkeypatch.setattr(line, "CAPABILITIES",
                            line.CAPABILITIES + (Capability("transformers", "PreTrainedModel._gone_in_5_99"),))
    compat.reset_for_tests()
    try:
        with pytest.raises(UnsupportedVersionError) as e:
            compat.backend()
        text = str(e.value)
        assert f"transformers {compat.installed_version('transformers')}" in text
        assert "PreTrainedModel._gone_in_5_99 does not exist" in text and ">=5.23,<5.26" in text
        assert "5.23.x, 5.24.x and 5.25.x" in text
        assert e.value.exit_code == ExitCode.INPUT
    finally:
        monkeypatch.undo()
        compat.reset_for_tests()


def test_the_threaded_process_group_is_probed_at_start_up():
    """The parity check's private torch pieces (the multi-threaded process group, thread isolation of group names)
    are start-up capabilities like the rest of the seam, present in the installed torch, and a missing one fails the
    probe naming it."""
    from tpaudit.compat import parity as seam
    from tpaudit.compat._probe import Capability, missing
    from tpaudit.compat.transformers_5_23 import Transformers523

    names = {c.name for c in seam.CAPABILITIES}
    assert {"testing._internal.distributed.multi_threaded_pg._install_threaded_pg",
            "testing._internal.distributed.multi_threaded_pg.ProcessLocalGroup.exception_handle",
            "_C._distributed_c10d._set_thread_isolation_mode"} <= names
    assert set(seam.CAPABILITIES) <= set(Transformers523.CAPABILITIES)
    assert missing(seam.CAPABILITIES) == []
    gone = Capability("torch.testing._internal.distributed.multi_threaded_pg", "_install_threaded_pg_v2")
    assert missing((gone,)) == ["testing._internal.distributed.multi_threaded_pg._install_threaded_pg_v2 does not "
                                "exist"]


def test_the_parity_rule_lookup_is_transformers_own(plans, names):
    """The parity check looks rules up with the seam's pinned copy (`compat.logic.parameter_rule`), as the loader's
    `_get_parameter_plan` does, for modules and parameters alike."""
    from transformers.distributed.parallel_utils import _get_parameter_plan

    from tpaudit.evidence.trace import rule_for

    for plan in plans[:60]:
        full = {**plan, **{f"model.{k}": v for k, v in plan.items()}}
        for name in names[:400]:
            for is_param in (True, False):
                key, style = rule_for(full, name, is_param)
                assert style == _get_parameter_plan(name, full, is_weight=is_param), (name, is_param)


def test_a_parameter_the_seam_passes_is_probed():
    from tpaudit.compat._probe import Capability

    assert Capability("transformers.core_model_loading", "rename_source_key", ("source_key",)).missing() is None
    assert "takes no no_such_arg" in Capability("transformers.core_model_loading", "rename_source_key",
                                                ("no_such_arg",)).missing()
    assert "cannot be imported" in Capability("transformers.no_such_module", "x").missing()


def test_an_untested_release_that_passes_the_probes_runs_and_says_so(monkeypatch):
    import tpaudit.compat as compat

    real = compat.installed_version
    monkeypatch.setattr(compat, "installed_version",
                        lambda d: "5.26.0.dev0" if d == "transformers" else real(d))
    compat.reset_for_tests()
    try:
        versions = compat.versions()
        assert versions["transformers"] == "5.26.0.dev0"
        assert "not a release tpaudit was tested with" in versions["untested"]
        # which releases are supported, and how to pin one
        assert "5.23.x, 5.24.x and 5.25.x" in versions["untested"]
        assert "pip install 'transformers==5.25.*'" in versions["untested"]
    finally:
        monkeypatch.undo()
        compat.reset_for_tests()


def test_the_supported_range_is_written_once():
    """The supported transformers releases: each release line's `SUPPORTED`, joined by `compat.supported_range()`;
    the package's dependency and the README's install advice say the same range."""
    import tomllib

    from tpaudit.compat import supported_range

    spec = supported_range()
    root = Path(__file__).resolve().parent.parent
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"transformers{spec}" in deps
    readme = (root / "README.md").read_text()
    assert f"transformers{spec}" in readme and f"transformers {spec}" in readme
    assert not [d for d in deps if d.startswith("transformers") and d != f"transformers{spec}"]


def test_the_evidence_stage_imports_no_torch_or_transformers_internal():
    """The parity check's package reaches torch and transformers only through the seam (`compat.parity`): its own
    modules import `torch` for public tensor operations and nothing from transformers, and the worker is reached
    from `run.py` lazily (no import cycle)."""
    import ast

    import tpaudit.evidence as evidence

    package = Path(evidence.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith("transformers"), (path.name, name)
                assert name == "torch" or not name.startswith("torch"), (path.name, name)


def _tiny_llama_config():
    from transformers import AutoConfig

    return AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


@pytest.mark.parametrize("config, overrides", [
    (_tiny_moe_config, None),
    (_tiny_moe_config, {"tp_plan": {"model.layers.*.self_attn.q_proj": "rowwise"}}),
    (_tiny_llama_config, None),
    (_tiny_llama_config, {"tp_plan": {"model.layers.*.mlp.down_proj": "colwise"}}),
])
def test_resolution_memo_gives_what_transformers_resolves(config, overrides):
    """`resolve_plans` resolves each set of options once per model (`_resolution_key`: the sizes matter to
    `_resolve_parallel_plans` only as "above 1 or not"): every option's memoized answer (applied plans, merged plans,
    the raw resolution handed to `shard`) must equal a fresh resolution by transformers of that option alone."""
    from tpaudit.compat import EmptyPlanError, PlanRejectedError, backend

    tf = backend()
    model = _meta_model(config())
    options = [(2, 1), (4, 1), (8, 1), (2, 2), (4, 4), (2, 1), (16, 1), (4, 4)]

    def resolve(tp, ep):
        try:
            return tf.resolve_plans(model, tf.distributed_config(tp, ep, overrides))
        except (EmptyPlanError, PlanRejectedError) as e:  # llama has no EP plan: the refusal must match too
            return type(e).__name__, str(e)

    memoized = [resolve(tp, ep) for tp, ep in options]
    # one resolution per set of options that differ only in their sizes above 1 (refusals are not kept)
    resolved = {(tp > 1, ep > 1) for (tp, ep), answer in zip(options, memoized) if not isinstance(answer[0], str)}
    assert resolved and len(model.__dict__["_tpaudit_resolutions"]) == len(resolved)
    for (tp, ep), answer in zip(options, memoized):
        model.__dict__.pop("_tpaudit_resolutions")
        assert resolve(tp, ep) == answer, (tp, ep)
        assert model.__dict__["_tpaudit_resolutions"] or isinstance(answer[0], str)
    if overrides is None:
        assert tf.merged_plans(model) == memoized[0][2:4]  # the model's own plans are back after every call


def test_every_distribute_tensor_call_is_wrapped_in_a_parameter():
    """`compat._torch.distribute_once` hands one `DTensor` to every call with the same inputs; that is safe only while
    each caller wraps it in `nn.Parameter` (which detaches a new one) and keeps nothing else of it. Every call in the
    installed transformers' distributed package must be `torch.nn.Parameter(distribute_tensor(...), ...)`, and every
    module that binds the name must be one the seam patches."""
    import ast
    import importlib.util

    from tpaudit.compat.transformers_5_23.plans import _distributing_modules

    package = Path(importlib.util.find_spec("transformers.distributed").origin).parent
    patched = {Path(m.__file__).resolve() for m in _distributing_modules()}
    calls = 0
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        binds = any(isinstance(n, ast.ImportFrom) and any(a.name == "distribute_tensor" for a in n.names)
                    for n in ast.walk(tree))
        assert not binds or path.resolve() in patched, path.name
        wrapped = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.nn.Parameter", "nn.Parameter"):
                wrapped.update(id(a) for a in node.args[:1])
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "distribute_tensor":
                calls += 1
                assert id(node) in wrapped, f"{path.name}:{node.lineno}"
    assert calls >= 5  # the TP styles and the expert styles


@pytest.mark.parametrize("name, sizes", [
    ("qwen3-vl-30b-a3b-instruct", [(2, 1), (4, 1), (8, 1)]),  # packed_colwise experts (_StridedShard), colwise
    ("deepseek-v3", [(8, 1), (8, 8)]),  # MLA, EP experts
    ("qwen3-30b-a3b", [(4, 1), (4, 4)]),  # EP experts
    ("llama-3.1-8b-instruct", [(3, 1), (8, 1)]),  # uneven shards
])
def test_distribute_once_shards_as_torch_does(fixture_path, name, sizes, monkeypatch):
    """Every parameter's placements and every rank's local shape with `distribute_once` must be what the same
    application gives with torch's `distribute_tensor` called for every parameter; and the memo must have served
    most calls (the speed it exists for)."""
    import contextlib

    import torch.distributed.tensor as dtensor

    from tpaudit.compat import _torch, backend
    from tpaudit.compat.transformers_5_23.plans import _distributing_modules
    from tpaudit.metamodel import BuildOptions
    from tpaudit.run.pipeline import Audit
    from tpaudit.sources import open_source

    tf = backend()
    built = Audit(open_source(fixture_path(name)), BuildOptions()).built
    counted = {"torch": 0}
    real = dtensor.distribute_tensor

    def counting(*args, **kwargs):
        counted["torch"] += 1
        return real(*args, **kwargs)

    def shard(tp, ep, memo: bool):
        with monkeypatch.context() as m:  # torch's function counted wherever it is bound
            for module in (dtensor, *_distributing_modules()):
                m.setattr(module, "distribute_tensor", counting)
            if not memo:
                m.setattr(_torch, "distribute_once", lambda modules: contextlib.nullcontext())
            counted["torch"] = 0
            return tf.shard(built.model, tf.distributed_config(tp, ep), tp, ep), counted["torch"]

    for tp, ep in sizes:
        plain, calls = shard(tp, ep, memo=False)
        memoized, served = shard(tp, ep, memo=True)
        assert memoized == plain, (name, tp, ep)
        assert calls >= sum(p.placements is not None for p in plain) > 0
        assert 0 < served < calls / 2, (name, tp, ep, served, calls)
