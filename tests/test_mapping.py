"""Checkpoint names are mapped once per family (`mapping.rename_all`); the result must equal transformers' renaming of
every key, one by one, on every fixture, and on renamings whose result depends on the index."""

from __future__ import annotations

import gzip
import re

import pytest

from conftest import FIXTURES


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
    from tpaudit.metamodel.mapping import rename_all

    source, rename = _renamer(str(FIXTURES / f"{name}.snapshot.json.gz"))
    assert source.tensors is not None
    keys = [t.name for t in source.tensors]
    by_family, families, per_key = rename_all(keys, rename)
    assert by_family == {k: rename(k) for k in keys}
    assert families < len(keys) / 5 or len(keys) < 1000  # the point: far fewer renamings than keys


def test_family_mapping_on_the_cases_checkpoints(tmp_path):
    from test_cases import materialise

    from tpaudit.metamodel.mapping import rename_all

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

    from tpaudit.metamodel.mapping import rename_all

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
    from tpaudit.metamodel.mapping import rename_all

    def rename(key):
        parts = key.split(".")
        i = int(parts[2])
        parts[2] = str(i // 2)
        parts.insert(3, "mlp" if i % 2 else "self_attn")
        return ".".join(parts), None

    keys = [f"model.layers.{i}.proj.weight" for i in range(48)]
    mapped, _, _ = rename_all(keys, rename)
    assert mapped == {k: rename(k) for k in keys}
