"""The package's shape: every import resolves, only the seam touches torch's and transformers' internals, the stages
import each other without a cycle and only in the order data flows, the top level holds stage packages and shared
modules only, and long modules say why they are long.

Read from the source files with `ast` (nothing is imported), so an import that only runs inside a function, and would
break only when that path runs, is checked too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpaudit"
LONG_MODULE_LINES = 650


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages as their `__init__.py`)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str):
    """`(target module, imported names, line, top level?)` for every tpaudit import of module `name`."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "tpaudit":
                target = node.module
            else:
                continue
            yield target, [a.name for a in node.names], node.lineno, id(node) in top
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tpaudit":
                    yield alias.name, [], node.lineno, id(node) in top


def test_every_tpaudit_import_resolves_also_inside_functions():
    broken = []
    for name in MODULES:
        for target, names, line, _ in _imports(name):
            if target not in MODULES:
                broken.append(f"{name}:{line} imports {target}, which does not exist")
                continue
            if MODULES[target].name != "__init__.py":
                continue
            for n in names:  # `from .pkg import mod`: a submodule, or a name the package defines
                if f"{target}.{n}" in MODULES or n == "*":
                    continue
                tree = ast.parse(MODULES[target].read_text(encoding="utf-8"))
                defined = {getattr(t, "id", None) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                           for t in node.targets}
                defined |= {node.name for node in ast.walk(tree)
                            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
                defined |= {a.asname or a.name for node in ast.walk(tree)
                            if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
                defined |= {node.target.id for node in ast.walk(tree)
                            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
                if n not in defined:
                    broken.append(f"{name}:{line} imports {n} from {target}, which does not define it")
    assert not broken, "\n".join(broken)


def test_the_module_level_imports_have_no_cycle():
    graph = {name: {t for t, _, _, top in _imports(name) if top and t in MODULES and t != name} for name in MODULES}
    # `from . import x` of a package: the submodule is the edge
    for name in MODULES:
        for target, names, _, top in _imports(name):
            if top and target in MODULES and MODULES[target].name == "__init__.py":
                graph[name] |= {f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES and
                                f"{target}.{n}" != name}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            # a package's __init__ importing its own submodules, which import the package's other submodules, is the
            # normal shape of a package: only cycles through a module that is not its ancestor count
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_only_the_seam_touches_torch_or_transformers_internals():
    """Outside `tpaudit/compat/`, torch and transformers appear only through their public names: no module path and no
    attribute with a leading underscore (`torch._C`, `transformers.modeling_utils._get_dtype`)."""
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("tpaudit.compat"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for m in modules:
                parts = m.split(".")
                if parts[0] in ("torch", "transformers") and any(p.startswith("_") for p in parts[1:]):
                    offenders.append(f"{name}:{node.lineno} {m}")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in ("torch", "transformers"):
                    offenders.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


# Every key of transformers' `ALL_PARALLEL_STYLES` in 5.23, 5.24 and 5.25 (`distributed/tensor_parallel.py` and
# `distributed/expert_parallel.py`), written out here so the test does not read them from the seam it polices.
STYLE_NAMES = ("colwise", "colwise_gather_output", "colwise_rep", "packed_colwise", "unit_colwise", "rowwise",
               "rowwise_split_input", "rowwise_rep", "packed_rowwise", "unit_rowwise", "embedding_rowwise",
               "embedding_colwise", "replicate", "replicated_with_grad_allreduce", "sequence_parallel",
               "mla_kv_a_proj", "all_reduce", "moe_identity_expert", "moe_tp_experts", "local_params", "grouped_gemm",
               "ep_dispatch_experts")
_STYLE_WORD = re.compile(r"(?<![\w.])(" + "|".join(sorted(STYLE_NAMES, key=len, reverse=True)) + r")(?!\w)")


def _style_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """`(line, text)` of every string constant that is not documentation (a bare string statement: module, class and
    function docstrings, attribute notes) and names a parallel style, whole or as a word of a message."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and _STYLE_WORD.search(n.value)]


def test_no_style_name_outside_the_seam():
    """A parallel style name (`"colwise"`, `"packed_colwise"`, ...) is written only in `tpaudit/compat/`
    (`compat/styles.py`): a release that renames, adds or drops a style is then one module. Messages name styles
    through the seam's constants too; docstrings may show them."""
    offenders = []
    for name, path in sorted(MODULES.items()):
        if name.startswith("tpaudit.compat"):
            continue
        for line, text in _style_literals(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{name}:{line} {text[:80]!r}")
    assert not offenders, "\n".join(offenders)


def test_the_style_literal_test_sees_a_literal():
    """The scan above catches a style name as a whole string, inside a message, and not in a docstring."""
    tree = ast.parse('''"""Use `colwise` here."""\nA = "packed_colwise"\nB = f"Use `{k}: rowwise_split_input` or so"\n'''
                     '''C = "layers.colwise_x"\n''')
    assert [line for line, _ in _style_literals(tree)] == [2, 3]


def test_a_long_module_says_why_it_is_long():
    unexplained = []
    for name, path in sorted(MODULES.items()):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > LONG_MODULE_LINES and "Longer than most modules" not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{name}: {lines} lines and no reason at its top")
    assert not unexplained, "\n".join(unexplained)


# The pipeline's stages in the order data flows; a module may import its own stage and earlier ones, never a later
# one. Shared by all: the data model, the seam, errors, units and process settings (below every stage).
STAGES = ["sources", "metamodel", "plan", "shard", "evidence", "checks", "run", "sizing", "api", "verify", "report",
          "cli"]
SHARED = {"model", "compat", "errors", "units", "_process"}


def _stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_top_level_holds_stage_packages_and_shared_modules_only():
    top = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__" and
           (p.suffix == ".py" or (p / "__init__.py").is_file())}
    expected = set(STAGES) | SHARED | {"__init__", "__main__"}
    assert top == expected, f"unexpected: {sorted(top - expected)}, missing: {sorted(expected - top)}"


def test_no_stage_imports_a_later_stage():
    """`tpaudit/__init__.py` (the lazy API face: `tpaudit.check`, `tpaudit.batch`, ...) and `__main__` are exempt;
    every other import, inside functions too, flows from a later stage to an earlier one or to the shared modules."""
    order = {s: i for i, s in enumerate(STAGES)}
    backwards = []
    for name in MODULES:
        here = _stage(name)
        if here is None or here == "__main__":
            continue
        for target, names, line, _ in _imports(name):
            # `from .. import api`: the imported names are the modules
            for there in [_stage(target)] if target != "tpaudit" else names:
                if here in SHARED and there not in SHARED and there in order:
                    backwards.append(f"{name}:{line} (shared) -> {target} ({there})")
                elif here in order and there in order and order[there] > order[here]:
                    backwards.append(f"{name}:{line} ({here}) -> {target} ({there})")
    assert not backwards, backwards
