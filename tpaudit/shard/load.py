"""What transformers' own load does with the checkpoint on every rank (the load stage, after the shard map).

    BuiltModel + ShardMap -> LoadSection (bytes each rank reads and holds; what goes wrong, and where)

`from_pretrained` under TP/EP reads each checkpoint tensor sharded on read, by the placements of the parameter it
loads into, and runs the loader's converters (per-expert merges, fused-tensor chunks, a quantizer's dequantize
operation) on each rank's pieces. For every parameter a converter fills, this stage runs those same two steps with
transformers' own code for every rank (`compat.backend().load_reader` / `load_convert`, see `compat/loading.py`):

- on meta tensors where no operation reads values, else on small CPU tensors of zeros that carry the real values of
  the metadata an operation reads (a compressed-tensors `weight_shape` is the logical `[out, in]` of its weight);
- once per family of parameters with the same shapes, placements and sources (the layers of a model repeat), and on
  at most `KEEP` pieces per source pattern, one (`KEEP_DATA`) where the operations run on zeros of the real size (the
  operations treat every expert alike; the count of pieces a rank keeps is checked against the parameter's local
  shape apart);
- once per distinct input for every option of one built model (`LoadMemo`: `size`'s tp sizes, the re-check of a
  fix's `--ep N`, `--suggest`'s rounds): the converter sees only the pieces, so alike pieces give alike results.

It yields, per rank, the checkpoint bytes the rank reads (`rank_stored_bytes`) beside the bytes it holds, which
differ where the quantizer decompresses while loading (Kimi-K2.5's int4 experts become bfloat16); and `LoadIssue`s
where a step raises (the load fails), where the converted shard does not have the parameter's local shape, or where
metadata an operation reads arrives empty or partial on some rank. Plain renames (one stored tensor per parameter,
no operation) read exactly the parameter's local shard, in the stored dtype.

Source: transformers 5.23-5.25 `core_model_loading.convert_and_load_state_dict_in_model`,
`distributed/sharding_utils.DtensorShardOperation`, `integrations/compressed_tensors.CompressedTensorsDequantize`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from ..compat import LoadStepError, SourceSpec, backend
from ..model import SAFETENSORS_DTYPE_BITS, LoadFamily, LoadIssue, LoadSection, ParamShard, ShardMap, generic_name

KEEP = 2
"""Pieces per source pattern the converter's operations run on (every expert is converted alike)."""
KEEP_DATA = 1
"""The same where the pieces are zeros of the real size, not meta tensors (some piece carries values the operations
read: a compressed-tensors `weight_shape`). That operation (`CompressedTensorsDequantize`) converts the experts one by
one, each alike, into a buffer of one row per expert, so one piece per pattern shows what every piece becomes; a second
would double the time and the memory of the largest step of the stage (Kimi-K2.5's int4 experts held whole at tp 8:
two bfloat16 experts of `gate_up_proj` are 112 MiB before their concatenation)."""
MAX_DATA_ELEMENTS = 1 << 26
"""Above this many elements in one rank's pieces, operations that read values are not run here (memory)."""


@dataclass
class LoadMemo:
    """What the load stage works out once per built model and reuses for each of its options (tp/ep sizes, plans):
    nothing in it depends on the placements.

    Attributes:
        sources (`dict[str, _Sources]`): parameter name -> the checkpoint tensors its family loads from.
        signatures (`dict[str, tuple]`): parameter name -> the stored shapes and dtypes of its sources (`_family_key`).
        first_forward (`list`): `[what compressed-tensors' decompression hook leaves]` once computed, else empty.
        converted (`dict[tuple, tuple]`): the converter's outcome per distinct input (`_convert_key`): `("ran",
            {output key: shape})` or `("raises", LoadStepError)`.
    """

    sources: dict = field(default_factory=dict)
    signatures: dict = field(default_factory=dict)
    first_forward: list = field(default_factory=list)
    converted: dict = field(default_factory=dict)


def simulate_load(built, shard_map: ShardMap, memo: LoadMemo | None = None) -> LoadSection | None:
    """Run transformers' shard-on-read and converter operations for every rank; `None` for a config-only source.

    Args:
        built (`BuiltModel`): with its checkpoint mapping (`built.mapping`).
        shard_map (`ShardMap`): the parameters and their placements for one (tp_size, ep_size).
        memo (`LoadMemo`, *optional*): shared by every option of `built` (`run.pipeline.Audit` holds one); a fresh
            one when omitted.

    Returns:
        `LoadSection`: bytes each rank reads (stored dtypes) and holds, the converted families, the issues.
    """
    tf = backend()
    memo = memo if memo is not None else LoadMemo()
    first_forward = _first_forward_bytes(tf, built, shard_map, memo)
    mapping = built.mapping
    if mapping is None:
        if first_forward is None:
            return None
        return LoadSection(rank_stored_bytes=None, rank_resident_bytes=tuple(shard_map.rank_param_bytes),
                           rank_first_forward_bytes=first_forward)
    world = shard_map.world_size
    stored = [0] * world
    families: dict[tuple, list[ParamShard]] = defaultdict(list)
    for p in shard_map.params:
        if p.tied_to is not None:
            continue
        sources = mapping.sources.get(p.name)
        if sources:
            families[_family_key(p, sources, shard_map, memo)].append(p)
            continue
        tensor = _stored_tensor(p.name, mapping)
        if tensor is None:
            continue  # no checkpoint tensor: the loader initialises it
        bits = SAFETENSORS_DTYPE_BITS.get(tensor.dtype, p.itemsize * 8)
        for r in range(world):
            stored[r] += math.prod(p.local_shapes[r]) * bits // 8
    out_families, issues = [], []
    on_data = _runs_on_data(memo)
    for members in families.values():
        family, found = _simulate_family(tf, built, members, mapping, shard_map, memo)
        out_families.append(family)
        issues.extend(found)
        for r in range(world):
            stored[r] += family.rank_stored_bytes[r]
    if _runs_on_data(memo) > on_data:
        from .._process import trim_heap

        trim_heap()  # operations ran on zeros of real size: hand their freed heap back before the next option
    return LoadSection(rank_stored_bytes=tuple(stored), rank_resident_bytes=tuple(shard_map.rank_param_bytes),
                       families=tuple(out_families), issues=tuple(issues), rank_first_forward_bytes=first_forward)


def _runs_on_data(memo: LoadMemo) -> int:
    """How many distinct inputs the operations ran on as tensors of zeros (`_convert_key`'s third item)."""
    return sum(1 for key in memo.converted if key[2])


def _first_forward_bytes(tf, built, shard_map: ShardMap, memo: LoadMemo) -> tuple[int, ...] | None:
    """Per-rank parameter bytes after compressed-tensors decompresses every compressed module in place on the first
    forward pass (`None` when the model has no such hook): each compressed module's parameters are replaced by what
    compressed-tensors' own `decompress_module` leaves (see `compat.loading.decompressed_on_first_forward`); a new
    parameter (the decompressed `weight`) is split by the placements of the quantized weight it replaces, one that
    stays (`weight_scale`) keeps its own shards."""
    if not memo.first_forward:
        memo.first_forward.append(tf.decompressed_on_first_forward(built.model))
    after = memo.first_forward[0]
    if after is None:
        return None
    import torch

    world = shard_map.world_size
    out = list(shard_map.rank_param_bytes)
    by_module: dict[str, dict[str, ParamShard]] = defaultdict(dict)
    for p in shard_map.params:
        if p.tied_to is None and p.module_name in after:
            by_module[p.module_name][p.name.rpartition(".")[2]] = p
    sizes: dict[str, int] = {}
    for module, leaves in after.items():
        params = by_module.get(module, {})
        ref = params.get("weight_packed") or params.get("weight") or params.get("qweight")
        mesh = _mesh_size(ref, shard_map) if ref is not None else 1
        for r in range(world):
            out[r] -= sum(p.rank_bytes(r) for p in params.values())
            for leaf, (shape, dtype) in leaves.items():
                if dtype not in sizes:
                    sizes[dtype] = torch.empty((), dtype=getattr(torch, dtype)).element_size()
                kept = params.get(leaf)
                if kept is not None and kept.global_shape == shape:
                    local = kept.local_shapes[r]
                elif ref is not None and ref.placements:
                    local = tf.local_shape(shape, ref.placements, mesh, r % mesh)
                else:
                    local = shape
                out[r] += math.prod(local) * sizes[dtype]
    return tuple(out)


def _stored_tensor(name: str, mapping):
    if name in mapping.companions:
        return mapping.companions[name]
    names = mapping.by_param.get(name)
    if not names or len(names) != 1:
        return None
    return mapping.tensor(names[0])


def _mesh_size(p: ParamShard, shard_map: ShardMap) -> int:
    return shard_map.ep_size if p.plan == "ep" else shard_map.tp_size


_SHAPE_AND_DTYPE = itemgetter(2, 1)  # `(t.shape, t.dtype)` of a CheckpointTensor, at C speed


def _family_key(p: ParamShard, sources: dict, shard_map: ShardMap, memo: LoadMemo) -> tuple:
    signature = memo.signatures.get(p.name)
    if signature is None:
        signature = memo.signatures[p.name] = tuple((pattern, len(ts), tuple(sorted(set(map(_SHAPE_AND_DTYPE, ts)))))
                                                    for pattern, ts in sources.items())
    return p.generic_name, p.global_shape, p.placements, _mesh_size(p, shard_map), signature


def _alike_patterns(specs: dict[str, list]) -> set[str]:
    """The source patterns whose pieces all have one stored shape and dtype and carry no values (`_read_alike`)."""
    return {pattern for pattern, ss in specs.items()
            if len({(spec.shape, spec.dtype) for spec in ss}) == 1 and all(spec.values is None for spec in ss)}


def _read_alike(reader, specs: list, torch_dtype, keep: int = KEEP) -> tuple[int, list, int, tuple | None]:
    """Shard-on-read of pieces that all have one stored shape and dtype and carry no values, as the loop over them one
    by one in `_read_rank` reads them, with one `shard_tensor` call per kind of piece (owned by this rank or
    not) instead of one per piece.

    Returns:
        `(pieces read, the first `keep` of them as (spec, local shape), bytes read, (error, position) of the first
        piece whose read raises or None)`.
    """
    first = specs[0]
    bits = SAFETENSORS_DTYPE_BITS.get(first.dtype, 8)
    if reader is None:
        shape = first.shape
        return len(specs), [(spec, shape) for spec in specs[:keep]], \
            len(specs) * (math.prod(shape) * bits // 8), None
    kinds = reader.owned_flags([spec.tensor_idx for spec in specs])
    outcome: dict[bool, tuple[int, ...] | LoadStepError | None] = {}
    for kind in dict.fromkeys(kinds):
        try:
            outcome[kind] = reader.local_shape(specs[kinds.index(kind)], torch_dtype)
        except LoadStepError as e:
            outcome[kind] = e
    failed = None
    read = bytes_read = 0
    for kind, shape in outcome.items():
        if isinstance(shape, LoadStepError):
            position = kinds.index(kind)
            if failed is None or position < failed[1]:
                failed = (shape, position)
        elif shape is not None:
            count = kinds.count(kind)
            read += count
            bytes_read += count * (math.prod(shape) * bits // 8)
    kept = []
    for spec, kind in zip(specs, kinds):
        shape = outcome[kind]
        if shape is not None and not isinstance(shape, LoadStepError):
            kept.append((spec, shape))
            if len(kept) == keep:
                break
    return read, kept, bytes_read, failed


def _shape_values(tensor, by_name: dict, rep: ParamShard, facts) -> tuple[int, ...] | None:
    """The values of a compressed-tensors `X_shape` tensor: the logical `[out, in]` of the weight it describes (what
    its compressor stored, `torch.tensor(weight.shape)`): `out` from the packed sibling's rows, `in` from the parameter
    it loads into (the last dimension, or the one before for a transposed experts layout). `None` when unknown."""
    leaf = tensor.name.rpartition(".")[2]
    if not leaf.endswith("_shape") or tensor.shape != (2,) or not tensor.dtype.startswith(("I", "U")):
        return None
    packed = by_name.get(tensor.name[: -len("_shape")] + "_packed")
    if packed is None or not packed.shape or len(rep.global_shape) < 2:
        return None
    transposed = bool(getattr(facts, "is_transposed", False)) if facts is not None else False
    in_dim = rep.global_shape[-2] if transposed and len(rep.global_shape) == 3 else rep.global_shape[-1]
    return packed.shape[0], in_dim


@dataclass
class _Sources:
    """The checkpoint tensors one family of parameters loads from, as every rank's read sees them.

    Attributes:
        ordered (`dict[str, list[CheckpointTensor]]`): source pattern -> its tensors, in the loader's natural order.
        by_name (`dict[str, CheckpointTensor]`): every one of them by name.
        specs (`dict[str, list[SourceSpec]]`): pattern -> what the seam's reader takes of each tensor (shape, dtype,
            position, the values of compressed-tensors `X_shape` metadata).
        uniform (`set[str]`): the patterns read alike (`_alike_patterns`).
        dtypes (`dict[str, torch.dtype]`): stored dtype name -> torch dtype.
        data (`bool`): some piece carries values an operation reads (then pieces are zeros, not meta tensors).
        first_pattern (`str`): the pattern that names the converter.
    """

    ordered: dict
    by_name: dict
    specs: dict
    uniform: set
    dtypes: dict
    data: bool
    first_pattern: str

    @property
    def keep(self) -> int:
        """Pieces per pattern the operations run on: `KEEP_DATA` on zeros of the real size, else `KEEP`."""
        return KEEP_DATA if self.data else KEEP

    @property
    def counted_pattern(self) -> str:
        """The pattern whose count of pieces on a rank is the count the operations stack: the first whose pieces carry
        no values. Metadata that carries values (a compressed-tensors `weight_shape`) can reach a rank for experts it
        does not hold (1-D, read with the dense path of the experts' Shard(0)), and `CompressedTensorsDequantize`
        iterates the packed pieces (`zip(quantized, scales)`), not the shapes; the patterns' order is the checkpoint's,
        and compressed-tensors' own compressor writes `weight_shape` as int64, which safetensors stores first."""
        return next((p for p, ss in self.specs.items() if all(s.values is None for s in ss)), next(iter(self.specs)))

    @classmethod
    def of(cls, tf, built, rep: ParamShard, mapping) -> "_Sources":
        from ..compat.loading import natural_key

        ordered = {pattern: sorted(ts, key=lambda t: natural_key(t.name))
                   for pattern, ts in mapping.sources[rep.name].items()}
        by_name = {t.name: t for ts in ordered.values() for t in ts}
        facts = built.modules.get(rep.name.rpartition(".")[0])  # the experts module, for its layout flags
        specs = {pattern: [SourceSpec(t.shape, t.dtype, i, _shape_values(t, by_name, rep, facts))
                           for i, t in enumerate(ts)] for pattern, ts in ordered.items()}
        return cls(ordered=ordered, by_name=by_name, specs=specs, uniform=_alike_patterns(specs),
                   dtypes={t.dtype: tf.torch_dtype(t.dtype) for t in by_name.values()},
                   data=any(s.values is not None for ss in specs.values() for s in ss),
                   first_pattern=next(iter(ordered)))


@dataclass
class _RankRead:
    """What shard-on-read gives one rank: pieces read per pattern (`counts`), the first `_Sources.keep` of each (`pieces`),
    their elements (`size`), the checkpoint bytes read (`stored`) and the first read that raised (`error`: the
    `LoadStepError` and the generic name of its tensor)."""

    counts: dict = field(default_factory=dict)
    pieces: dict = field(default_factory=dict)
    size: int = 0
    stored: int = 0
    error: tuple | None = None


def _simulate_family(tf, built, members: list[ParamShard], mapping, shard_map: ShardMap, memo: LoadMemo) \
        -> tuple[LoadFamily, list[LoadIssue]]:
    """One family of parameters alike (same shapes, placements and sources): on every rank, read its sources sharded
    (`_read_rank`), then run the converter's operations on the pieces (`_convert_rank`); the issues found and the
    bytes read, per rank (those of one member times the members)."""
    rep = members[0]
    world = shard_map.world_size
    mesh = _mesh_size(rep, shard_map)
    renamer = mapping.renamer
    src = memo.sources.get(rep.name)
    if src is None:
        src = memo.sources[rep.name] = _Sources.of(tf, built, rep, mapping)
    operations = tf.converter_operations(renamer, src.first_pattern)
    why_not = None
    if src.first_pattern in renamer.quantizer_ops and built.quantization is not None and built.quantization.gpu_view:
        why_not = (f"the quantizer's own load operations ({', '.join(operations)}) need the target GPU's kernels; "
                   "shard-on-read was simulated, the operations were not")
    stored = [0] * world
    results: dict[int, tuple] = {}  # rank -> (kind, detail, extra) of what happened (`_issues`)
    lost_by_pattern: dict[str, list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    rebuilt: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # (rank, rebuilt in_features, true)
    simulated, reason = True, None
    for r in range(world):
        try:
            reader = tf.load_reader(rep.global_shape, rep.placements, mesh, r % mesh) if rep.placements else None
        except LoadStepError as e:
            results[r] = ("raises", e, None)
            continue
        read = _read_rank(tf, renamer, src, reader, r, lost_by_pattern, rebuilt)
        stored[r] += read.stored
        if read.error is not None:
            results[r] = ("raises", read.error[0], read.error[1])
        elif why_not is not None:
            simulated, reason = False, why_not
        elif src.data and read.size > MAX_DATA_ELEMENTS:
            simulated, reason = False, (f"the operations read values, and one rank's pieces hold {read.size:,} "
                                        "elements: not run here")
        else:
            results[r] = _convert_rank(tf, renamer, src, rep.name, built.model, reader, read, memo.converted)

    issues = _issues(rep, results, lost_by_pattern, rebuilt, src.ordered, shard_map, " -> ".join(operations),
                     src.keep, src.counted_pattern)
    # decompressed: the quantizer's dequantize operation runs on tensors stored in a quantized dtype (integer words,
    # float8/float4); a float tensor passing through the same generic converter (an embedding) is only cast
    decompressed = src.first_pattern in renamer.dequantizing and any(
        t.dtype.startswith(("I", "U", "F8", "F4")) for t in src.by_name.values())
    family = LoadFamily(
        name=rep.generic_name, count=len(members), tensor_count=len(src.by_name) * len(members),
        checkpoint_names=tuple(generic_name(ts[0].name) for ts in src.ordered.values()), operations=operations,
        decompressed=decompressed, stored_dtypes=tuple(sorted({t.dtype for t in src.by_name.values()})),
        dtype=rep.dtype, rank_stored_bytes=tuple(s * len(members) for s in stored),
        rank_resident_bytes=tuple(sum(p.rank_bytes(r) for p in members) for r in range(world)),
        simulated=simulated, reason=reason)
    return family, issues


def _read_rank(tf, renamer, src: _Sources, reader, rank: int, lost_by_pattern: dict, rebuilt: dict) -> _RankRead:
    """Shard-on-read of every source piece for `rank` (`reader`: the seam's reader for its placements, `None` for a
    parameter without placements: every piece whole). Metadata a rank gets only part of is added to
    `lost_by_pattern` (once per rank and pattern), with the input size the converter rebuilds from its packed
    sibling where the piece is empty (`rebuilt`)."""
    out = _RankRead()
    for pattern, ss in src.specs.items():
        if pattern in src.uniform:  # every piece alike: one read per kind of piece, counted (Kimi-K2.5: 384 experts)
            n, kept, bytes_read, failed = _read_alike(reader, ss, src.dtypes[ss[0].dtype], src.keep)
            out.stored += bytes_read
            if failed is not None and out.error is None:
                out.error = (failed[0], generic_name(src.ordered[pattern][failed[1]].name))
            out.size += sum(math.prod(shape) for _, shape in kept)
            out.counts[pattern] = n
            out.pieces[pattern] = [spec for spec, _ in kept]
            continue
        kept = []
        n = 0
        for spec in ss:
            try:
                shape = reader.local_shape(spec, src.dtypes[spec.dtype]) if reader is not None else spec.shape
            except LoadStepError as e:
                if out.error is None:
                    out.error = (e, generic_name(src.ordered[pattern][spec.tensor_idx].name))
                continue
            if shape is None:
                continue
            n += 1
            out.stored += math.prod(shape) * SAFETENSORS_DTYPE_BITS.get(spec.dtype, 8) // 8
            if spec.values is not None and math.prod(shape) < math.prod(spec.shape):
                if not lost_by_pattern[pattern] or lost_by_pattern[pattern][-1][0] != rank:
                    lost_by_pattern[pattern].append((rank, shape))
                    if math.prod(shape) == 0:
                        rebuilt[pattern].append(_rebuilt(tf, renamer, pattern, spec, src, reader, rank))
            if len(kept) < src.keep:
                kept.append(spec)
                out.size += math.prod(shape)
        out.counts[pattern] = n
        out.pieces[pattern] = kept
    return out


def _convert_rank(tf, renamer, src: _Sources, param_name: str, model, reader, read: _RankRead,
                  converted: dict) -> tuple:
    """The converter's operations on one rank's pieces, with transformers' own code: `("ran", {output key: shape},
    counts)` or `("raises", LoadStepError, None)`. `converted` (`LoadMemo.converted`, shared by every option of the
    model) holds the outcome per distinct input (`_convert_key`): the pieces are built, and the operations run, only
    for an input not seen before."""
    try:
        key = _convert_key(tf, renamer, src, param_name, reader, read)
        if key not in converted:
            collected = {pattern: [t for t in (_piece(reader, s, src.dtypes[s.dtype], src.data) for s in kept)
                                   if t is not None]
                         for pattern, kept in read.pieces.items()}
            try:
                converted[key] = ("ran", tf.load_convert(renamer, src.first_pattern, param_name, collected, model))
            except LoadStepError as e:
                # its fields, not the exception: its traceback and context hold the frames of the operations, and
                # with them the pieces (Kimi-K2.5: 35 MiB of zeros kept for the rest of the check)
                converted[key] = ("raises", (e.stage, e.op, e.error))
            del collected
        kind, value = converted[key]
        if kind == "raises":
            raise LoadStepError(*value)
    except LoadStepError as e:
        return ("raises", e, None)
    return ("ran", value, read.counts)


def _piece(reader, spec: SourceSpec, torch_dtype, data: bool):
    """One rank's piece of `spec` as the operations get it (`RankReader.materialize`, or the whole tensor for a
    parameter without placements); `None` where the rank drops it."""
    return reader.materialize(spec, torch_dtype, data) if reader is not None else _whole(spec, torch_dtype, data)


def _convert_key(tf, renamer, src: _Sources, param_name: str, reader, read: _RankRead) -> tuple:
    """Everything the converter's operations see of one rank's input: the converter (its first source pattern), the
    target parameter, whether pieces carry values, and per pattern each piece's local shape, stored dtype and, for
    metadata that carries values (a compressed-tensors `weight_shape`), the values this rank reads; an empty
    `weight_shape` counts as the `[rows, in]` the converter rebuilds in its place (`_fallback_shape`; that the two
    convert alike is pinned by tests/test_compat_pins.py). Every other piece is zeros or a meta tensor, so two inputs
    with one key give one outcome; only the small metadata pieces are built.

    Raises:
        LoadStepError: the rank's shard-on-read of a piece raises.
    """
    pieces = []
    for pattern, kept in read.pieces.items():
        signature = []
        for spec in kept:
            torch_dtype = src.dtypes[spec.dtype]
            if spec.values is not None and src.data:
                t = _piece(reader, spec, torch_dtype, True)
                if t is None:
                    continue
                values = tuple(t.reshape(-1).tolist())
                if not values and len(spec.shape) == 1 and spec.shape[0] == 2:
                    # an empty `weight_shape`: the converter rebuilds `[rows, in]` from the packed piece and goes on
                    # as with those values (`_fallback_shape`), so the input is keyed as the one that carries them
                    fallback = _fallback_shape(tf, renamer, pattern, spec, src, reader)
                    if fallback is not None and len(fallback[0]) == 2:  # `[quant.shape[0], quant.shape[1] * 32 // bits]`
                        signature.append((tuple(spec.shape), spec.dtype, (fallback[0][0], fallback[1])))
                        continue
                signature.append((tuple(t.shape), spec.dtype, values))
                continue
            shape = reader.local_shape(spec, torch_dtype) if reader is not None else spec.shape
            if shape is not None:
                signature.append((tuple(shape), spec.dtype, None))
        pieces.append((pattern, tuple(signature)))
    return src.first_pattern, param_name, src.data, tuple(pieces)


def _rebuilt(tf, renamer, pattern: str, spec: SourceSpec, src: _Sources, reader, rank: int):
    """`(rank, rebuilt in_features, true in_features)` where a rank's metadata piece is empty and the converter rebuilds
    the input size from its packed sibling's width (compressed-tensors MoE decompression), else `None`."""
    if spec.values is None:
        return None
    fallback = _fallback_shape(tf, renamer, pattern, spec, src, reader)
    return None if fallback is None else (rank, fallback[1], spec.values[-1])


def _fallback_shape(tf, renamer, pattern: str, spec: SourceSpec, src: _Sources, reader) \
        -> tuple[tuple[int, ...], int] | None:
    """`(the rank's packed piece's local shape, in_features)` where compressed-tensors' MoE decompression rebuilds the
    input size because the rank's `weight_shape` piece (`spec`) arrives empty: the packed width times the values per
    word (`compat.loading.packed_width_fallback`, a copy pinned to transformers' converter by tests/test_compat_pins.py);
    `None` where the converter rebuilds none, or the rank keeps no packed piece or cannot read it (its read error is
    reported on its own)."""
    name = src.ordered[pattern][spec.tensor_idx].name
    packed = src.by_name.get(name[: -len("_shape")] + "_packed")
    if packed is None or reader is None:
        return None
    siblings = next((ts for ts in src.ordered.values() if packed in ts), [packed])
    local = None
    for idx in range(len(siblings)):  # the packed piece of an expert this rank keeps (all experts are alike)
        try:
            local = reader.local_shape(SourceSpec(packed.shape, packed.dtype, idx), src.dtypes[packed.dtype])
        except LoadStepError:
            return None
        if local is not None:
            break
    if not local:
        return None
    width = tf.packed_width_fallback(renamer, pattern, local[-1])
    return None if width is None else (tuple(local), width)


def _whole(spec: SourceSpec, torch_dtype, data: bool):
    import torch

    if spec.values is not None and data:
        return torch.tensor(spec.values, dtype=torch_dtype).reshape(spec.shape)
    return torch.zeros(spec.shape, dtype=torch_dtype) if data else torch.empty(spec.shape, dtype=torch_dtype,
                                                                               device="meta")


def _expected(rep: ParamShard, key: str, shard_map: ShardMap, out_keys) -> ParamShard | None:
    """The parameter an output key fills: `rep` itself, or a sibling named like `rep` with the output key in place of
    the one `rep`'s name contains (a `Chunk` of `wqkv` into `q_proj`, `k_proj`, `v_proj`)."""
    if len(out_keys) == 1 or key in rep.name:
        return rep
    anchor = next((k for k in out_keys if k in rep.name), None)
    if anchor is None:
        return None
    head, _, tail = rep.name.partition(anchor)
    return shard_map.param(head + key + tail)


def _issues(rep: ParamShard, results: dict, lost_by_pattern: dict, rebuilt: dict, ordered: dict,
            shard_map: ShardMap, operations: str, keep: int = KEEP, counted: str | None = None) -> list[LoadIssue]:
    """One family's `LoadIssue`s, ranks grouped by what went wrong: a step that raises, a converted shard whose shape
    is not the parameter's local shape (`operations`: the converter's, for the message; `keep`: the pieces per
    pattern they ran on, so a rank that read more is compared by its count of pieces of pattern `counted`, default
    the first: `_Sources.counted_pattern`), metadata a rank read only part of."""
    grouped: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    details: dict[tuple, dict] = {}
    key: tuple[Any, ...]
    for r, (kind, detail, extra) in sorted(results.items()):
        if kind == "raises":
            key = ("raises", detail.stage, detail.op, detail.error, extra)
            details.setdefault(key, {"error": detail.error, "source": extra, "stage": detail.stage, "op": detail.op})
            grouped[key].append(r)
            continue
        out, counts = detail, extra
        truncated = any(n > keep for n in counts.values())
        first_count = counts[counted] if counted in counts else next(iter(counts.values()), 0)
        for key_name, shape in out.items():
            target = _expected(rep, key_name, shard_map, list(out))
            if target is None:
                continue
            expected = target.local_shapes[r]
            if truncated and shape and expected:
                ok = tuple(shape[1:]) == tuple(expected[1:]) and first_count == expected[0]
                shown = (first_count,) + tuple(shape[1:])
            else:
                ok = tuple(shape) == tuple(expected)
                shown = tuple(shape)
            if not ok:
                key = ("shape", target.generic_name, shown, tuple(expected))
                details.setdefault(key, {"name": target.generic_name, "local_shape": shown,
                                         "expected_shape": tuple(expected)})
                grouped[key].append(r)
    issues = []
    for key, ranks in grouped.items():
        d = details[key]
        if key[0] == "raises":
            issues.append(LoadIssue(kind="raises", name=rep.generic_name, ranks=tuple(ranks), stage=d["stage"],
                                    op=d["op"], error=d["error"], source=d["source"]))
        else:
            issues.append(LoadIssue(kind="shape", name=d["name"], ranks=tuple(ranks), stage="convert",
                                    op=operations, local_shape=d["local_shape"], expected_shape=d["expected_shape"]))
    for pattern, lost in lost_by_pattern.items():
        tensor = ordered[pattern][0]
        issues.append(LoadIssue(kind="metadata_lost", name=rep.generic_name, ranks=tuple(r for r, _ in lost),
                                stage="read", op="DtensorShardOperation.shard_tensor", source=generic_name(tensor.name),
                                lost=tuple(lost), full_shape=tensor.shape,
                                rebuilt=tuple(x for x in rebuilt.get(pattern, ()) if x is not None)))
    return issues


def first_forward_note(load: LoadSection, unit: str = "GiB") -> str:
    """The report's note for a model compressed-tensors decompresses on its first forward pass: the worst rank's
    bytes after the load and after that pass, exact, in `unit`'s family."""
    from ..units import format_bytes

    after, held = load.rank_first_forward_bytes, load.rank_resident_bytes
    worst = max(range(len(after)), key=lambda r: (after[r], -r))
    return (f"quantization: compressed-tensors decompresses every compressed module in place on the first forward "
            f"pass (its ct_decompress_hook; transformers loads without dequantize by default): rank {worst} holds "
            f"{held[worst]:,} B ({format_bytes(held[worst], unit)}) after the load and {after[worst]:,} B "
            f"({format_bytes(after[worst], unit)}) from the first forward on; size counts the latter")


def decompression_note(load: LoadSection, unit: str = "GiB") -> str:
    """The report's note for a load that decompresses quantized tensors: which parameters, by which operation, and the
    bytes the worst rank reads (stored) and holds (resident), both exact, in `unit`'s family."""
    from ..units import format_bytes

    families = load.decompressed
    stored = load.rank_stored_bytes
    held = load.rank_resident_bytes
    worst = max(range(len(held)), key=lambda r: (held[r], -r))
    tensors = sum(f.tensor_count for f in families)
    names = ", ".join(f"`{f.name}`" for f in families[:3]) + (f" and {len(families) - 3} more" if len(families) > 3
                                                                 else "")
    ops = sorted({op for f in families for op in f.operations[:1]})
    stored_dtypes = sorted({d for f in families for d in f.stored_dtypes})
    return (f"quantization: the load decompresses {names} ({'/'.join(stored_dtypes)} in the checkpoint) to "
            f"{families[0].dtype} with the quantizer's own {', '.join(ops)}: rank {worst} reads {stored[worst]:,} B "
            f"({format_bytes(stored[worst], unit)}) of the checkpoint and holds {held[worst]:,} B "
            f"({format_bytes(held[worst], unit)}) after the load ({sum(f.count for f in families):,} parameters from "
            f"{tensors:,} checkpoint tensors)")
