"""The load stage's values: what transformers' own load does with the checkpoint on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

LoadIssueKind = Literal["raises", "shape", "metadata_lost"]


@dataclass(frozen=True)
class LoadIssue:
    """Something transformers' own load does wrong with one parameter family on some ranks, found by running its
    shard-on-read and converter operations for those ranks (`tpaudit.shard.load`).

    Attributes:
        kind (`"raises" | "shape" | "metadata_lost"`): a step raises (the load fails); the converted local shard does
            not have the parameter's local shape (the load fails on its size check or holds the wrong values); a
            small metadata tensor an operation reads (compressed-tensors `weight_shape`) arrives empty or partial.
        name (`str`): the generic runtime parameter (`model.layers.*.mlp.experts.gate_up_proj`).
        ranks (`tuple[int, ...]`): the ranks it happens on.
        stage (`"read" | "convert"`): shard-on-read, or a converter operation.
        op (`str`): the operation (`DtensorShardOperation.shard_tensor`, `CompressedTensorsDequantize`, ...).
        error (`str`, *optional*): the exception type and first line, for `raises`.
        source (`str`, *optional*): the generic checkpoint name involved (`...experts.*.gate_proj.weight_shape`).
        local_shape (`tuple[int, ...]`, *optional*): what the operations produced on `ranks[0]` (per expert for
            a per-expert merge: the leading dimension is the count of pieces the rank kept).
        expected_shape (`tuple[int, ...]`, *optional*): the parameter's local shape on `ranks[0]`.
        lost (`tuple[tuple[int, tuple[int, ...]], ...]`): for `metadata_lost`, `(rank, local shape)` of the metadata
            tensor on every rank that gets less than all of it.
        full_shape (`tuple[int, ...]`, *optional*): the metadata tensor's stored shape (`(2,)`).
        rebuilt (`tuple[tuple[int, int, int], ...]`): for `metadata_lost`, `(rank, rebuilt, true)` input sizes where
            the rank's piece is empty and the quantizer's operation rebuilds the input size from the packed width
            (compressed-tensors: `packed_cols * (32 // num_bits)`, exact only when `num_bits` divides 32).
    """

    kind: LoadIssueKind
    name: str
    ranks: tuple[int, ...]
    stage: str
    op: str
    error: str | None = None
    source: str | None = None
    local_shape: tuple[int, ...] | None = None
    expected_shape: tuple[int, ...] | None = None
    lost: tuple[tuple[int, tuple[int, ...]], ...] = ()
    full_shape: tuple[int, ...] | None = None
    rebuilt: tuple[tuple[int, int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "ranks": list(self.ranks), "stage": self.stage, "op": self.op,
                "error": self.error, "source": self.source,
                "local_shape": list(self.local_shape) if self.local_shape is not None else None,
                "expected_shape": list(self.expected_shape) if self.expected_shape is not None else None,
                "lost": [[r, list(s)] for r, s in self.lost],
                "full_shape": list(self.full_shape) if self.full_shape is not None else None,
                "rebuilt": [list(x) for x in self.rebuilt]}


@dataclass(frozen=True)
class LoadFamily:
    """Parameters (one generic name) whose checkpoint tensors a converter of the loader turns into the parameter:
    per-expert tensors merged into fused experts, a fused `wqkv` chunked, quantized tensors decompressed.

    Attributes:
        name (`str`): generic runtime parameter name.
        count (`int`): parameters of that name.
        tensor_count (`int`): checkpoint tensors that load into them (all `count` parameters).
        checkpoint_names (`tuple[str, ...]`): the generic checkpoint names that load into it, in the loader's order.
        operations (`tuple[str, ...]`): the converter's operations, in order (`CompressedTensorsDequantize`,
            `MergeModulelist`, `Concatenate`).
        decompressed (`bool`): one of them is the quantizer's own dequantize operation: the parameter holds
            decompressed values in `dtype`, not the stored quantized form.
        stored_dtypes (`tuple[str, ...]`): safetensors dtypes of the checkpoint tensors (`I32`, `BF16`).
        dtype (`str`): the parameter's dtype, what each rank holds.
        rank_stored_bytes (`tuple[int, ...]`): checkpoint bytes each rank reads for all `count` parameters.
        rank_resident_bytes (`tuple[int, ...]`): bytes each rank holds of them after the load.
        simulated (`bool`): the converter's operations ran on every rank's pieces; `False` when they could not here
            (`reason`), e.g. an operation that needs a GPU kernel.
        reason (`str`, *optional*): why not.
    """

    name: str
    count: int
    tensor_count: int
    checkpoint_names: tuple[str, ...]
    operations: tuple[str, ...]
    decompressed: bool
    stored_dtypes: tuple[str, ...]
    dtype: str
    rank_stored_bytes: tuple[int, ...]
    rank_resident_bytes: tuple[int, ...]
    simulated: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "tensor_count": self.tensor_count,
                "checkpoint_names": list(self.checkpoint_names),
                "operations": list(self.operations), "decompressed": self.decompressed,
                "stored_dtypes": list(self.stored_dtypes), "dtype": self.dtype,
                "rank_stored_bytes": list(self.rank_stored_bytes),
                "rank_resident_bytes": list(self.rank_resident_bytes), "simulated": self.simulated,
                "reason": self.reason}


@dataclass(frozen=True)
class LoadSection:
    """What transformers' own load does with the checkpoint on every rank (`tpaudit.shard.load.simulate_load`).

    Attributes:
        rank_stored_bytes (`tuple[int, ...]`, *optional*): checkpoint bytes each rank reads (its shards of every
            checkpoint tensor that loads into a parameter), in the stored dtypes; `None` without a checkpoint.
        rank_resident_bytes (`tuple[int, ...]`): parameter bytes each rank holds after the load (the shard map's).
        families (`tuple[LoadFamily, ...]`): the parameters a converter fills, by generic name.
        issues (`tuple[LoadIssue, ...]`): what goes wrong, by family.
        rank_first_forward_bytes (`tuple[int, ...]`, *optional*): parameter bytes each rank holds once
            compressed-tensors has decompressed every compressed module in place on the first forward pass (its
            `ct_decompress_hook`, transformers' default path); `None` when the load keeps no such hook.
    """

    rank_stored_bytes: tuple[int, ...] | None
    rank_resident_bytes: tuple[int, ...]
    families: tuple[LoadFamily, ...] = ()
    issues: tuple[LoadIssue, ...] = ()
    rank_first_forward_bytes: tuple[int, ...] | None = None

    @property
    def decompressed(self) -> tuple[LoadFamily, ...]:
        """The families the quantizer decompresses while loading."""
        return tuple(f for f in self.families if f.decompressed)

    def to_json(self) -> dict[str, Any]:
        return {"rank_stored_bytes": list(self.rank_stored_bytes) if self.rank_stored_bytes is not None else None,
                "rank_resident_bytes": list(self.rank_resident_bytes),
                "rank_first_forward_bytes": (list(self.rank_first_forward_bytes)
                                             if self.rank_first_forward_bytes is not None else None),
                "families": [f.to_json() for f in self.families], "issues": [i.to_json() for i in self.issues]}
