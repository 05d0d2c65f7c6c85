"""Checkpoint names -> runtime names, as `from_pretrained` maps them, and what the meta model lacks or has in excess.

Plan rules match the model's runtime parameter names, not the checkpoint's. transformers renames and merges checkpoint
tensors at load (`block_sparse_moe.experts.3.w1.weight` -> `mlp.experts.gate_up_proj`; transposed fused experts), so
each checkpoint key goes through the loader's own `rename_source_key` with the loader's transforms (through the
seam, `compat.backend().renamer`).

**Once per family.** A checkpoint of 200,000 tensors has a few hundred families that differ only in layer and expert
indices. Keys are grouped by their generic form (indices -> `*`); one representative per family is renamed by
transformers, the indices it carries into the runtime name are read off by value, and the result is checked on two
more members (first, middle, last) before the family is expanded. A family whose renaming depends on the index
(`Inkling2IndexOffsetWeightRename`, a layer-pair collapse) fails that check and is renamed key by key.
`tests/test_mapping.py` proves the result equal to renaming every key on every fixture.

**Companions.** A checkpoint tensor that maps to no parameter but whose module exists is added to that module only
when it is a quantization tensor of a quantized checkpoint whose quantizer could not run here (`weight_packed`,
`weight_scale`, `weight_shape`, `qweight`, `scales`): transformers applies a module's rule to every parameter of the
module (`DistributedMixin._expand_parallel_plan` falls back to the parent module), whatever created it. The module's
own parameters the checkpoint does not hold (the unquantized `weight` the packed form replaces) are then removed.
Any other tensor without a parameter (a `q_proj.bias` on a bias-free model, DeepSeek-V3's MTP layer 61) is unmapped:
the loader drops unexpected keys, so it is reported (TPA301), never added.

**Shapes.** Each parameter's checkpoint tensors are run through the loader's own conversion ops on meta tensors (or
compared directly for a plain rename); a parameter whose converted shape differs from the model's is listed in
`shape_mismatches` (TPA303), as `from_pretrained` stops on it with "size mismatch".
"""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import chain, groupby, repeat, starmap
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter

from ..compat import Renamer
from ..model import CheckpointTensor, generic_name
from ..model.source import INDEX_RUNS, group_families, group_positions, name_family as _family

_INDEX = re.compile(r"(?<![^.])\d+(?=\.|$)")
_NAME, _DTYPE = itemgetter(0), itemgetter(1)  # a CheckpointTensor's name and dtype, at C speed

# Tensors a quantized checkpoint stores beside (or instead of) a module's weight.
QUANT_LEAVES = frozenset({"qweight", "qzeros", "scales", "g_idx", "weight_scale", "weight_scale_inv", "weight_packed",
                          "weight_shape", "weight_g_idx", "weight_zero_point", "input_scale", "activation_scale",
                          "weight_global_scale", "input_global_scale", "output_scale", "k_scale", "v_scale"})
QUANT_SUFFIXES = ("_scale_inv", "_scale", "_packed", "_shape", "_g_idx", "_zero_point", "_blocks", "_scales")


def is_quant_tensor_name(leaf: str) -> bool:
    """A quantization tensor's leaf name (`weight_scale_inv`, `qweight`, `gate_up_proj_blocks`, ...)."""
    return leaf in QUANT_LEAVES or any(leaf.endswith(s) and len(leaf) > len(s) for s in QUANT_SUFFIXES)


@dataclass
class ShapeMismatch:
    """A parameter whose checkpoint tensors, after the loader's conversions, do not have the model's shape.

    Attributes:
        name (`str`): runtime parameter name.
        checkpoint_names (`list[str]`): the tensors that load into it.
        checkpoint_shape (`tuple[int, ...]`): the converted shape.
        model_shape (`tuple[int, ...]`): the parameter's shape from the config.
    """

    name: str
    checkpoint_names: list[str]
    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]


@dataclass
class CheckpointMapping:
    """How a checkpoint's tensors land in the model.

    Attributes:
        by_param (`dict[str, list[str]]`): runtime name -> the checkpoint names that load into it.
        companions (`dict[str, CheckpointTensor]`): runtime name -> the checkpoint tensor added to its module.
        unmapped (`list[tuple[CheckpointTensor, str]]`): tensors (with their renamed key) that map to nothing.
        superseded (`list[str]`): model parameters removed because their module is stored in another form.
        missing (`list[str]`): model parameters no checkpoint tensor loads (the loader initialises them).
        casts (`dict[tuple[str, str], int]`): `(checkpoint dtype, runtime dtype)` -> count of float tensors the loader
            casts on load.
        shape_mismatches (`list[ShapeMismatch]`): see the module docstring.
        outside_parameters_bytes (`int`): bytes of checkpoint tensors a converter folds into state that is not a
            parameter (MXFP4 block scales).
        buffers (`list[str]`): checkpoint tensors that load into persistent buffers (not parameters, not counted).
        families (`int`), renamed_per_key (`int`): how the names were mapped (families; keys renamed one by one).
        sources (`dict[str, dict[str, list[CheckpointTensor]]]`): runtime name -> converter source pattern -> the
            checkpoint tensors a converter of the loader turns into that parameter (per-expert tensors merged, a
            fused tensor chunked, quantized tensors decompressed), in checkpoint order; plain renames are not listed.
        renamer (`Renamer`, *optional*): the loader's renaming and converters (opaque; the seam runs them again to
            simulate the load per rank).
        tensors (`tuple[CheckpointTensor, ...]`): the checkpoint's tensor table (`tensor(name)` looks one up).
        generic_tensor_names (`frozenset[str]`): every checkpoint tensor name with its layer and expert indices as
            `*` (`generic_name`), each once: `ModelSource.generic_tensor_names`, read off the families the names
            were renamed in (`_generic_names`) instead of one `generic_name` per tensor.
    """

    by_param: dict[str, list[str]] = field(default_factory=dict)
    companions: dict[str, CheckpointTensor] = field(default_factory=dict)
    unmapped: list[tuple[CheckpointTensor, str]] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    casts: dict[tuple[str, str], int] = field(default_factory=dict)
    shape_mismatches: list[ShapeMismatch] = field(default_factory=list)
    outside_parameters_bytes: int = 0
    buffers: list[str] = field(default_factory=list)
    families: int = 0
    renamed_per_key: int = 0
    sources: dict[str, dict[str, list[CheckpointTensor]]] = field(default_factory=dict)
    renamer: Renamer | None = None
    tensors: tuple[CheckpointTensor, ...] = ()
    generic_tensor_names: frozenset[str] = frozenset()

    def tensor(self, name: str) -> CheckpointTensor | None:
        """The checkpoint tensor named `name` (`None` when the checkpoint has none): indexed once, on first use."""
        index = self.__dict__.get("_by_name")
        if index is None:
            index = self.__dict__["_by_name"] = dict(zip(map(_NAME, self.tensors), self.tensors))
        return index.get(name)

    def unmapped_by_root(self, modules) -> dict[str, list[tuple[CheckpointTensor, str]]]:
        """The unmapped tensors grouped by the generic name of their missing root: the shortest prefix of the renamed
        key that is not a module of the model (`model.layers.61` -> `model.layers.*`, `mtp`), or the whole key when
        every module on its path exists (a tensor its module does not have). Values: `(tensor, concrete root)`, in
        checkpoint order.

        One walk per distinct module path (memoized), not per tensor: Kimi-K2.5's 207,360 unmapped tensors sit in
        23,040 expert modules.

        Args:
            modules (`Container[str]`): the model's module names (`named_modules()`).
        """
        from ..model import generic_name

        roots: dict[str, str | None] = {"": None}

        def root_of(path: str) -> str | None:
            """The shortest prefix of `path` (itself included) that is not a module, `None` when all are."""
            if path in roots:
                return roots[path]
            parent = path.rpartition(".")[0]
            found = root_of(parent) if parent else None
            if found is None and path not in modules:
                found = path
            roots[path] = found
            return found

        paths = [renamed.rpartition(".")[0] for _, renamed in self.unmapped]
        root_by_path = {path: root_of(path) for path in dict.fromkeys(paths)}
        generic: dict[str, str] = {}
        groups: dict[str, list[tuple[CheckpointTensor, str]]] = defaultdict(list)
        for (tensor, renamed), path in zip(self.unmapped, paths):
            root = root_by_path[path] or renamed
            g = generic.get(root)
            if g is None:
                g = generic[root] = generic_name(root)
            groups[g].append((tensor, root))
        return groups

    @cached_property
    def stored_unquantized(self) -> dict[str, list[tuple[CheckpointTensor, list[str]]]]:
        """Modules the quantizer laid out in a quantized form whose checkpoint stores them unquantized: concrete module
        name -> `[(the stored tensor, the module's quantized parameters nothing loads)]`.

        A module whose quantized parameters (`weight_packed`, `weight_scale`, `weight_shape`, `qweight`, ...) have no
        checkpoint tensor while the checkpoint's plain `weight` for it maps to nothing (the quantizer replaced the
        `weight` parameter): the loader drops the stored weight and leaves the quantized parameters uninitialised.
        When the stored tensor is a fused one the loader would chunk into several modules (`wqkv` into q/k/v), its
        renamed key names the first of them; the others are listed too when their own quantized parameters are
        missing. Computed once per mapping."""
        missing_by_module: dict[str, list[str]] = defaultdict(list)
        for name in self.missing:
            module, _, leaf = name.rpartition(".")
            if is_quant_tensor_name(leaf):
                missing_by_module[module].append(name)
        out: dict[str, list[tuple[CheckpointTensor, list[str]]]] = {}
        for tensor, renamed in self.unmapped:
            module, _, leaf = renamed.rpartition(".")
            if leaf not in ("weight", "bias") or module not in missing_by_module:
                continue
            missing = list(missing_by_module[module])
            if self.renamer is not None and self.renamer.siblings is not None:
                _, pattern = self.renamer.rename(tensor.name)
                for sibling in self.renamer.siblings(renamed, pattern) if pattern else ():
                    missing += missing_by_module.get(sibling.rpartition(".")[0], [])
            out.setdefault(module, []).append((tensor, missing))
        return out

    @cached_property
    def generic_unmapped_modules(self) -> frozenset[str]:
        """Generic names of the modules that hold unmapped tensors (each renamed key without its last part); read
        once the mapping is complete, computed once (every option of a `size` run checks the same mapping)."""
        from ..model import generic_name

        return frozenset(generic_name(m) for m in {r.rsplit(".", 1)[0] for _, r in self.unmapped})

    @cached_property
    def generic_missing_modules(self) -> frozenset[str]:
        """Generic names of the modules whose parameters no checkpoint tensor loads (TPA302's); computed once, like
        `generic_unmapped_modules`."""
        from ..model import generic_name

        return frozenset(generic_name(name).rsplit(".", 1)[0] for name in self.missing)


def _template(renamed: str, indices: tuple[str, ...]) -> str | None:
    """The renamed key with each index it carries replaced by `{position in the source indices}`; `None` when an
    index of the runtime name is not one of the source's, or matches several (ambiguous)."""
    out, last = [], 0
    for m in _INDEX.finditer(renamed):
        positions = [i for i, v in enumerate(indices) if v == m.group(0)]
        if len(positions) != 1:
            return None
        out.append(renamed[last:m.start()].replace("{", "{{").replace("}", "}}"))
        out.append("{%d}" % positions[0])
        last = m.end()
    out.append(renamed[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(out)


def _generic_names(families: dict[str, list[str]]) -> frozenset[str]:
    """`{generic_name(key) for every key}` from `group_families`: one `generic_name` per family, whose members differ
    only in the digits of index parts, which `generic_name` replaces by position, whatever the digits. A family where
    `generic_name` keeps an index (one at the start, `0.weight`, or right after another, the `2` of `a.1.2.b`: no
    dot of its own before it) is named key by key."""
    out: set[str] = set()
    for family, keys in families.items():
        if family.startswith("\0") or "\0.\0" in family:
            out.update(map(generic_name, keys))
        else:
            out.add(generic_name(keys[0]))
    return frozenset(out)


def _expand(family: str, template: str, members: list[str]) -> list[str] | None:
    """Every member of `family` renamed by the family's template: the indices of all members found in one regex pass
    over them joined by newlines, then `template.format` per member at C speed (`starmap`); `None` when the members
    do not each give the family's count of indices (a family whose keys start with an index)."""
    k = family.count("\0")
    flat = INDEX_RUNS.findall("\n".join(members))
    if not k or len(flat) != k * len(members):
        return None
    return list(starmap(template.format, zip(*[iter(flat)] * k)))


def rename_families(families: dict[str, list[str]], rename
                    ) -> tuple[dict[str, tuple[list[str], list[str | None]]], int]:
    """Rename every checkpoint key, once per family where the family allows it.

    Args:
        families (`dict[str, list[str]]`): `group_families(keys)`: family key -> its keys.
        rename (`Callable[[str], tuple[str, str | None]]`): the loader's renaming of one key (the seam's `Renamer`).

    Returns:
        `(family key -> (runtime names, converter source patterns), keys renamed one by one)`: two lists per family,
        aligned with its keys.
    """
    out: dict[str, tuple[list[str], list[str | None]]] = {}
    per_key = 0
    for family, members in families.items():
        n = len(members)
        if n < 4:
            pairs = list(map(rename, members))
            out[family] = [r for r, _ in pairs], [p for _, p in pairs]
            per_key += n
            continue
        done: dict[int, tuple[str, str | None]] = {}  # members the loader renamed itself, one by one
        template, pattern = None, None
        for i in range(3):  # a representative whose indices are unambiguous
            indices = _family(members[i])[1]
            renamed, pattern = done[i] = rename(members[i])
            if len(set(indices)) == len(indices):
                template = _template(renamed, indices)
                if template is not None:
                    break
        if template is not None:
            for i in (n // 2, n - 1):
                actual = done[i] = rename(members[i])
                if actual != (template.format(*_family(members[i])[1]), pattern):
                    template = None
                    break
        runtimes = _expand(family, template, members) if template is not None else None
        if runtimes is None:
            pairs = [done[i] if i in done else rename(key) for i, key in enumerate(members)]
            out[family] = [r for r, _ in pairs], [p for _, p in pairs]
            per_key += n
            continue
        # every member from the template at C speed; the members renamed one by one keep the loader's own answer
        patterns = [pattern] * n
        for i, (renamed, own_pattern) in done.items():
            runtimes[i], patterns[i] = renamed, own_pattern
        out[family] = runtimes, patterns
    return out, per_key


def map_checkpoint(model, tensors: tuple[CheckpointTensor, ...], hf_quantizer=None, *,
                   quantized: bool = False, positions: dict[str, list[int]] | None = None) -> CheckpointMapping:
    """Map every checkpoint tensor to a runtime name; add quantization companions to the meta model (in place).

    Args:
        model (`PreTrainedModel`): the meta-device model, after the quantizer's `preprocess_model` if one ran.
        tensors (`tuple[CheckpointTensor, ...]`): the checkpoint's tensor table.
        hf_quantizer (`HfQuantizer`, *optional*): the quantizer that ran (its conversions join the loader's).
        quantized (`bool`): the config declares a quantization (companions are only accepted then).
        positions (`dict[str, list[int]]`, *optional*): the tensors' positions grouped by the family of their names
            (`ModelSource.name_positions`), when the source has them already.

    Returns:
        `CheckpointMapping`.

    Source: transformers 5.23 `core_model_loading.convert_and_load_state_dict_in_model` (renaming, the base-model
    prefix fallback, dtype casts, "size mismatch"), `conversion_mapping.get_model_conversion_mapping`.
    """
    from ..compat import backend

    tf = backend()
    mapping = CheckpointMapping()
    renamer = tf.renamer(model, hf_quantizer)
    params = {name: (shape, dtype, floating) for name, shape, dtype, floating in tf.parameter_table(model)}
    state = tf.state_dict_keys(model)  # parameters and persistent buffers: what the loader loads into
    tied = tf.tied_keys(model)
    names = [t.name for t in tensors]
    if positions is None:
        positions = group_positions(names)
    families = group_families(names, positions)
    renamed, mapping.renamed_per_key = rename_families(families, renamer.rename)
    mapping.families = len(families)
    mapping.generic_tensor_names = _generic_names(families)  # the evidence stage's, without 200,000 regex calls

    may_claim = quantized and hf_quantizer is None  # companions: quantization tensors no quantizer took
    if may_claim:
        by_pattern = _classify_tensor_by_tensor(mapping, model, tensors, families, renamed, params, state, tied, tf)
    else:
        by_pattern = _classify_by_family(mapping, tensors, positions, renamed, params, state, tied, tf)

    # one tensor the loader splits into several parameters (a Chunk of a fused wqkv into q/k/v): the first target
    # is its renamed key; the others are filled by the same conversion, so they are not missing
    filled: set[str] = set()
    if renamer.siblings is not None:
        for runtime, patterns in by_pattern.items():
            for pattern in patterns:
                filled.update(s for s in renamer.siblings(runtime, pattern) if s in params)

    mapping.tensors = tensors  # before the shape check, which looks tensors up by name (`tensor`: one index)
    _check_shapes(mapping, model, tensors, by_pattern, params, renamer, tf)
    mapping.sources = {runtime: dict(patterns) for runtime, patterns in by_pattern.items()}
    mapping.renamer = renamer

    # Add companions; remove the params they replace (their module is stored in another, quantized form).
    touched = set()
    for name, tensor in mapping.companions.items():
        tf.add_parameter(model, name, tensor.shape, tensor.dtype)
        touched.add(name.rpartition(".")[0])
    if touched:
        for name, _, _, _ in tf.parameter_table(model):
            module_name = name.rpartition(".")[0]
            if module_name in touched and name not in mapping.by_param and name not in mapping.companions:
                tf.remove_parameter(model, name)
                mapping.superseded.append(name)
    mapping.missing = [name for name, *_ in tf.parameter_table(model)
                       if name not in mapping.by_param and name not in mapping.companions and name not in tied
                       and name not in filled]
    return mapping


def _classify_tensor_by_tensor(mapping: CheckpointMapping, model, tensors, families, renamed, params, state, tied,
                               tf, claim: bool = True) -> dict[str, dict[str, list[CheckpointTensor]]]:
    """`map_checkpoint`'s classification tensor by tensor, in checkpoint order, where companions may be claimed (a
    quantized checkpoint whose quantizer could not run: the first tensor to claim a name wins it). With
    `claim=False`, what `_classify_by_family` computes, the slow way (`tests/test_mapping.py` compares them)."""
    by_key: dict = {}
    for family, members in families.items():
        by_key.update(zip(members, zip(*renamed[family])))
    by_pattern: dict[str, dict[str, list[CheckpointTensor]]] = defaultdict(lambda: defaultdict(list))
    module_names = {n for n, _ in model.named_modules()} if claim else set()
    stored_names: dict[str, str] = {}
    for tensor in tensors:
        runtime, pattern = by_key[tensor.name]
        if runtime in state and runtime not in params and runtime not in tied:
            mapping.buffers.append(tensor.name)  # a persistent buffer (e.g. a router's correction bias)
            continue
        if runtime in params or runtime in tied:
            mapping.by_param.setdefault(runtime, []).append(tensor.name)
            if pattern is not None:
                by_pattern[runtime][pattern].append(tensor)
                if tensor.name.endswith("_scales") and not runtime.endswith("_scales"):
                    mapping.outside_parameters_bytes += tensor.nbytes
            _count_casts(mapping, (tensor,), params.get(runtime, (None, None, False)), stored_names, tf)
            continue
        module_name, _, leaf = runtime.rpartition(".")
        claimed = claim and is_quant_tensor_name(leaf)
        if (not claimed or module_name not in module_names or not leaf or runtime in mapping.companions
                or leaf in tf.module_buffers(model, module_name)):
            mapping.unmapped.append((tensor, runtime))
            continue
        mapping.companions[runtime] = tensor
    return by_pattern


def _classify_by_family(mapping: CheckpointMapping, tensors, positions, renamed, params, state, tied,
                        tf) -> dict[str, dict[str, list[CheckpointTensor]]]:
    """`map_checkpoint`'s classification where no companion can be claimed, a runtime name at a time instead of a
    tensor at a time (Kimi-K2.5: 208,550 tensors, 3,000 runtime names): each family's members are grouped by the
    runtime name they load into (a stable sort), and what a tensor becomes depends only on that name. Every list and
    mapping comes out in checkpoint order, as the tensor-by-tensor classification (`_classify_tensor_by_tensor`) makes
    them: by position."""
    # runtime name -> the positions of its tensors, a list per family; (runtime, pattern) -> the same
    by_runtime: dict[str, list[list[int]]] = defaultdict(list)
    by_runtime_pattern: dict[tuple[str, str], list[list[int]]] = defaultdict(list)
    for family, where in positions.items():
        runtimes, patterns = renamed[family]
        at = runtimes.__getitem__
        same_pattern = patterns.count(patterns[0]) == len(patterns)
        for runtime, group in groupby(sorted(range(len(runtimes)), key=at), key=at):
            idx = list(group)
            places = list(map(where.__getitem__, idx))
            by_runtime[runtime].append(places)
            if same_pattern:
                if patterns[0] is not None:
                    by_runtime_pattern[runtime, patterns[0]].append(places)
                continue
            split: dict[str, list[int]] = {}
            for i, place in zip(idx, places):
                if patterns[i] is not None:
                    split.setdefault(patterns[i], []).append(place)
            for pattern, pattern_places in split.items():
                by_runtime_pattern[runtime, pattern].append(pattern_places)

    def merged(parts: list[list[int]]) -> list[int]:
        return parts[0] if len(parts) == 1 else sorted(chain.from_iterable(parts))

    at_tensor = tensors.__getitem__
    buffers: list[int] = []
    unmapped: list[tuple[int, str]] = []
    params_in_order: list[tuple[int, str, list[int]]] = []
    for runtime, parts in by_runtime.items():
        places = merged(parts)
        if runtime in state and runtime not in params and runtime not in tied:
            buffers.extend(places)  # a persistent buffer (e.g. a router's correction bias)
        elif runtime in params or runtime in tied:
            params_in_order.append((places[0], runtime, places))
        else:
            unmapped.extend(zip(places, repeat(runtime)))
    params_in_order.sort()
    stored_names: dict[str, str] = {}
    first_cast: dict[tuple[str, str], int] = {}  # cast -> the position of its first tensor
    for _, runtime, places in params_in_order:
        members = list(map(at_tensor, places))
        mapping.by_param[runtime] = list(map(_NAME, members))
        _count_casts(mapping, members, params.get(runtime, (None, None, False)), stored_names, tf, places, first_cast)
    by_pattern: dict[str, dict[str, list[CheckpointTensor]]] = {}
    firsts = sorted((min(p[0] for p in parts), runtime, pattern, parts)
                    for (runtime, pattern), parts in by_runtime_pattern.items() if runtime in mapping.by_param)
    for _, runtime, pattern, parts in firsts:
        members = list(map(at_tensor, merged(parts)))
        by_pattern.setdefault(runtime, {})[pattern] = members
        if not runtime.endswith("_scales"):
            scales = list(map(str.endswith, map(_NAME, members), repeat("_scales")))
            if any(scales):
                mapping.outside_parameters_bytes += sum(t.nbytes for t, is_scale in zip(members, scales) if is_scale)
    if mapping.casts:  # first seen first, as tensor by tensor
        mapping.casts = dict(sorted(mapping.casts.items(), key=lambda kv: first_cast[kv[0]]))
    mapping.buffers = [tensors[i].name for i in sorted(buffers)]
    mapping.unmapped = [(tensors[i], runtime) for i, runtime in sorted(unmapped)]
    return by_pattern


def _count_casts(mapping: CheckpointMapping, members, param: tuple, stored_names: dict[str, str], tf,
                 places: list[int] | None = None, first: dict | None = None) -> None:
    """Count the float tensors among `members` (one parameter's) that the loader casts to the parameter's dtype;
    with `places` (the members' positions), record in `first` the position of each cast's first tensor."""
    _, dtype, floating = param
    if not floating:
        return
    dtypes = list(map(_DTYPE, members))
    for stored_dtype in dict.fromkeys(dtypes):
        if not stored_dtype.startswith(("F", "BF")):
            continue
        stored = stored_names.get(stored_dtype)
        if stored is None:
            stored = stored_names[stored_dtype] = str(tf.torch_dtype(stored_dtype)).removeprefix("torch.")
        if stored != dtype:
            key = (stored_dtype, dtype)
            mapping.casts[key] = mapping.casts.get(key, 0) + dtypes.count(stored_dtype)
            if places is not None and first is not None:
                place = places[dtypes.index(stored_dtype)]
                first[key] = min(first.get(key, place), place)


def _check_shapes(mapping: CheckpointMapping, model, tensors, by_pattern, params, renamer, tf) -> None:
    """Converted checkpoint shape vs parameter shape (the loader's "size mismatch"), once per distinct combination of
    parameter family, model shape and stored shapes: a few hundred checks for a checkpoint of any size."""
    from ..model import generic_name

    seen: set[tuple] = set()
    for runtime, names in mapping.by_param.items():
        if runtime not in params:
            continue
        model_shape = params[runtime][0]
        stored = [mapping.tensor(n) for n in names[:2]]  # the key reads two: 384 fused experts need not be listed
        key = (generic_name(runtime), model_shape, tuple(t.shape for t in stored), len(names))
        if key in seen:
            continue
        seen.add(key)
        if runtime in by_pattern:
            shape = tf.converted_shape(renamer, runtime, {p: [(t.shape, t.dtype) for t in ts]
                                                          for p, ts in by_pattern[runtime].items()}, model)
        elif len(names) == 1:
            shape = stored[0].shape
        else:
            shape = None
        if shape is not None and tuple(shape) != tuple(model_shape):
            mapping.shape_mismatches.append(ShapeMismatch(runtime, names, tuple(shape), tuple(model_shape)))
