"""The one vocabulary table (`tpaudit/metamodel/vocabulary.py`) against the installed transformers.

"Every attribute transformers uses for a role is known to the table", mechanically: take the text config of every
model type whose text config declares a `base_model_tp_plan` (the models transformers can shard, whose facts the
checks read); every attribute of it that holds an int (or is declared `int` and left `None` by default) and whose name
matches one of `vocabulary.ROLE_FAMILIES` (`*heads*`, `*head_dim*`, `*hidden_size*`, `*intermediate_size*`,
`*experts*`, `*vocab_size*`, ...) must be a spelling of a role, an `attribute_map` alias of one, or listed in
`vocabulary.NOT_A_ROLE` with the reason.

Three ways, fastest first: the configuration modules' syntax trees (every module, in the fast loop: importing the ~800
config classes takes seconds), a sample of default configs built through the seam (fast loop), and every default config
(`slow`).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from tpaudit.metamodel import vocabulary as V


def _known(name: str, aliases: dict[str, str]) -> bool:
    if name in V.NOT_A_ROLE or V.config_role(name) is not None:
        return True
    target = aliases.get(name)
    return target is not None and (target in V.NOT_A_ROLE or V.config_role(target) is not None)


def _in_a_family(name: str) -> bool:
    return any(p.search(name) for p in V.ROLE_FAMILIES.values())


def test_every_entry_is_documented_and_spelled_once():
    """Each role has a name of its own, a doc, and no spelling twice; what `NOT_A_ROLE` lists is no role's spelling;
    the unions the consumers read are made of table entries."""
    for roles, names in ((V.CONFIG_ROLES, "attrs"), (V.MODULE_ROLES, "leaves")):
        assert len({r.name for r in roles}) == len(roles)
        for role in roles:
            spellings = getattr(role, names)
            assert spellings and len(set(spellings)) == len(spellings), role.name
            assert len(role.doc) > 20, role.name
    assert not [n for n in V.NOT_A_ROLE if V.config_role(n) is not None]
    assert all(len(why) > 20 for why in V.NOT_A_ROLE.values())
    for union in (V.SPLIT_SIZES, V.MLP_WIDTHS, V.SCALED_WIDTHS, V.EMBEDDING_ROWS, V.SINGLE_OUTPUTS, V.SINGLE_HEADS,
                  V.SINGLE_HEAD_DIMS):
        assert set(union) <= set(V.CONFIG_ROLES)
    assert set(V.KEY_CARRIERS) <= set(V.MODULE_ROLES) and V.KEY_CARRIERS[0] is V.KEY
    # the spellings the three former name lists held separately are in one entry each
    assert {"moe_num_experts", "n_routed_experts"} <= set(V.EXPERTS.attrs)
    assert "expert_ffn_hidden_size" in V.EXPERT_INTERMEDIATE and "kv_proj" in V.FUSED_KV


def _config_classes_from_source() -> dict[str, dict]:
    """Every class of every configuration module, by name: its `int`-annotated fields, its `attribute_map` literal,
    its base class names, and whether it declares a `base_model_tp_plan`."""
    models = Path(importlib.util.find_spec("transformers").origin).parent / "models"
    out: dict[str, dict] = {}
    for path in sorted(models.glob("*/configuration_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            entry = {"fields": set(), "aliases": {}, "bases": [ast.unparse(b) for b in cls.bases], "plan": False,
                     "where": f"{path.parent.name}/{path.name}"}
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    target, value = stmt.target.id, stmt.value
                    if re.search(r"\bint\b", ast.unparse(stmt.annotation)):
                        entry["fields"].add(target)
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    target, value = stmt.targets[0].id, stmt.value
                else:
                    continue
                if target == "base_model_tp_plan" and not (isinstance(value, ast.Constant) and value.value is None):
                    entry["plan"] = True
                if target == "attribute_map":
                    try:
                        entry["aliases"] = dict(ast.literal_eval(value))
                    except ValueError:
                        pass
            out.setdefault(cls.name, entry)
    return out


def test_config_modules_declare_no_role_attribute_the_table_lacks():
    """The syntax-tree walk: every class that declares (or inherits from a class of the same modules that declares)
    a `base_model_tp_plan`, its `int` fields in a role family."""
    classes = _config_classes_from_source()

    def planned(name: str, seen=()) -> bool:
        entry = classes.get(name)
        if entry is None or name in seen:
            return False
        return entry["plan"] or any(planned(b.rpartition(".")[2], seen + (name,)) for b in entry["bases"])

    def aliases(name: str, seen=()) -> dict[str, str]:
        entry = classes.get(name)
        if entry is None or name in seen:
            return {}
        out = {}
        for b in entry["bases"]:
            out.update(aliases(b.rpartition(".")[2], seen + (name,)))
        return {**out, **entry["aliases"]}

    walked, unknown = 0, {}
    for name, entry in classes.items():
        if not planned(name):
            continue
        walked += 1
        known_aliases = aliases(name)
        for field in entry["fields"]:
            if _in_a_family(field) and not _known(field, known_aliases):
                unknown.setdefault(field, entry["where"])
    assert walked > 100, walked  # the walk saw the planned configs (a parser change would leave it empty)
    assert not unknown, f"attributes in a role family the vocabulary does not know (add each to a role, or to " \
                        f"NOT_A_ROLE with the reason): {unknown}"


def _unknown_in_default_config(model_type: str, cls) -> list[str] | None:
    """The role-family attributes of `cls()`'s text config that the table does not know; `None` when the text config
    declares no `base_model_tp_plan` (or the default config cannot be built)."""
    try:
        config = cls()
        text = config.get_text_config(decoder=True)
    except Exception:  # noqa: BLE001 - a default config transformers itself cannot build (2 of ~820)
        return None
    if not getattr(text, "base_model_tp_plan", None):
        return None
    aliases = dict(getattr(type(text), "attribute_map", {}) or {})
    annotations: dict[str, object] = {}
    for klass in type(text).__mro__:
        for k, v in getattr(klass, "__annotations__", {}).items():
            annotations.setdefault(k, v)
    unknown = []
    for name in sorted(set(vars(text)) | set(aliases) | set(annotations)):
        if name.startswith("_") or not _in_a_family(name):
            continue
        try:
            value = getattr(text, name, None)
        except Exception:  # noqa: BLE001 - a per-layer attribute with no global value
            value = None
        declared_int = value is None and re.search(r"\bint\b", str(annotations.get(name, "")))
        if ((isinstance(value, int) and not isinstance(value, bool)) or declared_int) and not _known(name, aliases):
            unknown.append(name)
    return unknown


SAMPLE = ("llama", "qwen3_moe", "qwen3_vl_moe", "qwen3_next", "gemma4", "deepseek_v3", "deepseek_v4", "gpt_oss",
          "mixtral", "granitemoe", "codegen", "longcat_flash", "ernie4_5_moe", "dbrx", "jetmoe", "nemotron_h")


def test_default_configs_of_a_sample_of_model_types():
    """The fixtures' model types and those with their own spellings, built as transformers' default configs."""
    from tpaudit.compat import backend

    mapping = backend().config_classes()
    checked, unknown = 0, {}
    for model_type in SAMPLE:
        if model_type not in mapping:
            continue  # not in this transformers release
        found = _unknown_in_default_config(model_type, mapping[model_type])
        if found is not None:
            checked += 1
        if found:
            unknown[model_type] = found
    assert checked >= 10, checked
    assert not unknown, unknown


@pytest.mark.slow
def test_default_configs_of_every_model_type():
    """Every default config transformers registers (about 820 under 5.24; building them all takes some 15 s)."""
    from tpaudit.compat import backend

    mapping = backend().config_classes()
    checked, unknown = 0, {}
    for model_type in list(mapping.keys()):
        found = _unknown_in_default_config(model_type, mapping[model_type])
        if found is not None:
            checked += 1
        if found:
            unknown[model_type] = found
    assert checked > 150, checked
    assert not unknown, unknown
