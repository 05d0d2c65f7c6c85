"""Checkpoint names are mapped once per family (`mapping.rename_families`); the result must equal transformers' renaming of
every key, one by one, on every fixture, and on renamings whose result depends on the index."""

from __future__ import annotations

import gzip
import re

import pytest

from conftest import FIXTURES


def rename_all(keys, rename):
    """`mapping.rename_families` as one mapping: `(key -> (runtime name, pattern), families, keys renamed one by
    one)`."""
    from tpaudit.metamodel.mapping import group_families, rename_families

    families = group_families(keys)
    by_family, per_key = rename_families(families, rename)
    out = {}
    for family, members in families.items():
        out.update(zip(members, zip(*by_family[family])))
    return out, len(families), per_key


def _lists_tensors(path) -> bool:
    """Whether a fixture snapshot lists tensors, read from the tail of the file (a snapshot's `"tensors"` entry comes
    last), so that collecting this module does not parse 40 MB of JSON in every pytest process."""
    return re.search(rb'"tensors":\s*null\s*}\s*$', gzip.decompress(path.read_bytes())[-64:]) is None


WITH_TENSORS = sorted(p.name.removesuffix(".snapshot.json.gz") for p in FIXTURES.glob("*.snapshot.json.gz")
                      if _lists_tensors(p))


def _renamer(ref: str):
    """The loader's renaming of one key for the model of `ref` (built by tpaudit on the meta device)."""
    from tpaudit.run.pipeline import Audit
    from tpaudit.compat import backend
    from tpaudit.sources import open_source

    source = open_source(ref)
    built = Audit(source).built
    return source, backend().renamer(built.model, built.quantizer).rename


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("kimi-k2.5", "deepseek-v3") else n
                                  for n in WITH_TENSORS])  # per-key mapping of 200k / 92k keys: outside the fast loop
def test_family_mapping_equals_per_key_mapping_on_every_fixture(name):
    
    source, rename = _renamer(str(FIXTURES / f"{name}.snapshot.json.gz"))
    assert source.tensors is not None
    keys = [t.name for t in source.tensors]
    by_family, families, per_key = rename_all(keys, rename)
    assert by_family == {k: rename(k) for k in keys}
    assert families < len(keys) / 5 or len(keys) < 1000  # the point: far fewer renamings than keys


def test_family_mapping_on_the_cases_checkpoints(tmp_path):
    from test_cases import materialise

    
    for case in ("06-mixtral-stale-rules-after-moe-refactor", "10-fp8-qwen3-vl-moe-expert-scales-ep",
                 "11-compressed-tensors-weight-shape-g-idx-sharded"):
        model_dir, _ = materialise(case, tmp_path)
        source, rename = _renamer(str(model_dir))
        keys = [t.name for t in source.tensors]
        assert rename_all(keys, rename)[0] == {k: rename(k) for k in keys}, case


def test_an_index_dependent_renaming_is_renamed_key_by_key():
    """transformers' own `Inkling2IndexOffsetWeightRename` moves `attn_queries.i` to layer `i + 1`: a family template
    read off one key would put every other key in the wrong layer. The check on further members catches it."""
    from transformers.core_model_loading import Inkling2IndexOffsetWeightRename, WeightRenaming, rename_source_key

    
    renamings = [Inkling2IndexOffsetWeightRename(source_patterns=r"attn_res\.attn_queries\.(\d+)",
                                                 target_patterns=r"layers.\1.attention_input.query", offset=1),
                 WeightRenaming(source_patterns=r"attn_norm", target_patterns=r"input_layernorm")]

    def rename(key):
        return rename_source_key(key, renamings, [])

    keys = [f"model.attn_res.attn_queries.{i}" for i in range(40)] + \
        [f"model.layers.{i}.attn_norm.weight" for i in range(40)]
    mapped, _, per_key = rename_all(keys, rename)
    assert mapped == {k: rename(k) for k in keys}
    assert mapped["model.attn_res.attn_queries.7"][0] == "model.layers.8.attention_input.query"
    assert per_key == 40  # the offset family, key by key; the plain rename, once per family


def test_a_layer_pair_collapse_is_renamed_key_by_key():
    """A renaming where checkpoint layers 2i and 2i+1 become layer i (transformers 5.24's `LayerPairCollapse` for
    dory): the index of the runtime name is not one of the checkpoint's."""
    
    def rename(key):
        parts = key.split(".")
        i = int(parts[2])
        parts[2] = str(i // 2)
        parts.insert(3, "mlp" if i % 2 else "self_attn")
        return ".".join(parts), None

    keys = [f"model.layers.{i}.proj.weight" for i in range(48)]
    mapped, _, _ = rename_all(keys, rename)
    assert mapped == {k: rename(k) for k in keys}


def test_generic_tensor_names_read_off_the_families_equal_one_generic_name_per_key():
    # the build's set (one `generic_name` per family) must be the per-key set, on real listings and on the names where
    # `generic_name` keeps an index: at the start, and right after another index (`a.1.2.b` -> `a.*.2.b`)
    import random

    from tpaudit.compat.logic import generic_name
    from tpaudit.metamodel.mapping import _generic_names, group_families
    from tpaudit.sources import open_source

    for name in ("qwen3-vl-30b-a3b-instruct", "deepseek-v3", "qwen3-30b-a3b-thinking-2507-fp8"):
        keys = [t.name for t in open_source(str(FIXTURES / f"{name}.snapshot.json.gz")).tensors]
        assert _generic_names(group_families(keys)) == {generic_name(k) for k in keys}, name
    edges = ["0.weight", "1.weight", "a.1.2.b", "a.10.2.b", "a.1.20.b", "a.1.2.3.4", "a.5.6.7.8", "w1.weight",
             "w2.weight", "0.1.x", "3.4.x", "x.1", "x.22"]
    assert _generic_names(group_families(edges)) == {generic_name(k) for k in edges}
    rng = random.Random(24)
    parts = ["a", "b1", "0", "1", "12", "", "x", "007"]
    for _ in range(2000):
        keys = list({".".join(rng.choice(parts) for _ in range(rng.randint(1, 5))) for _ in range(8)})
        assert _generic_names(group_families(keys)) == {generic_name(k) for k in keys}, keys


def test_family_expansion_keeps_special_characters_and_reordered_indices():
    # a family's names are expanded from one template: names with regex and format metacharacters (backslash,
    # braces, `$`, `+`), indices the runtime name reorders, and families of keys that start with an index must come
    # out as the renaming of each key gives them
    
    def rename(key):
        parts = key.split(".")
        digits = [p for p in parts if p.isdigit()]
        words = [p for p in parts if not p.isdigit()]
        # indices reversed, one word wrapped in characters that mean something to re.sub and str.format
        return ".".join(["m{0}\\1$+"] + list(reversed(digits)) + words), ("p" if len(digits) > 1 else None)

    keys = [f"a.{i}.b.{j}.w\\x{{}}+" for i in range(6) for j in range(5)] + \
        [f"{i}.c.weight" for i in range(7)] + [f"d.{i}.e" for i in range(9)] + ["f.g", "h.1.i"]
    mapped, families, _ = rename_all(keys, rename)
    assert mapped == {k: rename(k) for k in keys}
    assert families == 5


def _classified_both_ways(ref: str):
    """The build's checkpoint mapping of `ref`, classified a runtime name at a time (as every build does) and tensor by
    tensor (`_classify_tensor_by_tensor`, the plain loop over the checkpoint in order), as comparable values with
    every order kept."""
    from unittest import mock

    from tpaudit.metamodel import BuildOptions, build_model, mapping as m
    from tpaudit.sources import open_source

    def values(built):
        mp = built.mapping
        return {"by_param": list(mp.by_param.items()),
                "sources": [(r, [(p, [t.name for t in ts]) for p, ts in ps.items()]) for r, ps in mp.sources.items()],
                "unmapped": [(t.name, r) for t, r in mp.unmapped], "buffers": mp.buffers,
                "casts": list(mp.casts.items()), "outside": mp.outside_parameters_bytes, "missing": mp.missing,
                "mismatches": [(x.name, x.checkpoint_shape) for x in mp.shape_mismatches],
                "companions": list(mp.companions)}

    def slow(mapping, tensors, positions, renamed, params, state, tied, tf):
        families = m.group_families([t.name for t in tensors], positions)
        return m._classify_tensor_by_tensor(mapping, None, tensors, families, renamed, params, state, tied, tf,
                                            claim=False)

    fast = values(build_model(open_source(ref), BuildOptions()))
    with mock.patch.object(m, "_classify_by_family", slow):
        loop = values(build_model(open_source(ref), BuildOptions()))
    return fast, loop


@pytest.mark.parametrize("name", ["gpt-oss-20b", "deepseek-v3", "qwen3-vl-30b-a3b-instruct",
                                  "qwen3-30b-a3b-thinking-2507-fp8", "qwen3.5-35b-a3b"])
def test_classifying_a_runtime_name_at_a_time_equals_the_tensor_by_tensor_loop(name):
    fast, loop = _classified_both_ways(str(FIXTURES / f"{name}.snapshot.json.gz"))
    assert fast == loop
    assert fast["by_param"]  # the comparison saw a mapping


@pytest.mark.slow
def test_classifying_a_runtime_name_at_a_time_equals_the_loop_on_every_fixture():
    from tpaudit.sources import open_source

    compared = 0
    for path in sorted(FIXTURES.glob("*.snapshot.json.gz")):
        if open_source(str(path)).tensors is None:
            continue  # config only: no checkpoint to classify
        fast, loop = _classified_both_ways(str(path))
        assert fast == loop, path.name
        compared += 1
    assert compared >= 8
