"""Small pieces of transformers' plan logic that tpaudit keeps as its own copies, each pinned to the original.

These copies exist because the code that needs them must not import transformers (sources, renderers, the data
model), or because tpaudit asks a question transformers only answers as a side effect (which TP rules an EP plan
drops). `tests/test_compat_pins.py` compares every function here with transformers' own on many inputs, in every
supported release: a release that changes one of them fails that test before it can move a number.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import re
from typing import Mapping

from . import styles

_LAYER_NUMBER = re.compile(r"\.\d+(\.|$)")


def generic_name(name: str) -> str:
    """`model.layers.3.mlp.experts.7.w1.weight` -> `model.layers.*.mlp.experts.*.w1.weight`.

    Numbers between dots (or between a dot and the end) become `*`; digits inside a name (`w1`) stay.

    Source: transformers 5.23 `distributed.parallel_utils.replace_layer_number_by_wildcard` (same regex).
    """
    return _LAYER_NUMBER.sub(lambda m: ".*" + m.group(1), name)


def parameter_rule(name: str, plan: Mapping[str, str], is_weight: bool = True) -> str | None:
    """The plan key that applies to the concrete parameter (or module) `name`: its own generic name, else (for a
    parameter, `is_weight=True`) its module's generic name. `None` when neither is a key of `plan`.

    Source: transformers 5.23 `distributed.parallel_utils._get_parameter_plan`, which returns the style; this returns
    the key, so a report can name the rule.
    """
    generic = generic_name(name)
    if generic in plan:
        return generic
    if is_weight and "." in generic:
        module = generic.rsplit(".", 1)[0]
        if module in plan:
            return module
    return None


def ep_dropped_rules(tp_rules: Mapping[str, str], ep_rules: Mapping[str, str]) -> tuple[str, ...]:
    """TP rule keys that an EP plan replaces: a TP rule on a module that has an EP rule, or on one of its children.

    Source: transformers 5.23 `DistributedMixin._resolve_parallel_plans` ("EP rules take precedence: drop TP rules
    on EP modules and their children"), applied to the generic keys.
    """
    if not ep_rules:
        return ()
    is_expert = re.compile(rf"(?:{'|'.join(map(re.escape, ep_rules))})(?:\..+)?").fullmatch
    return tuple(sorted(k for k in tp_rules if is_expert(k)))


def unused_rules(rules: Mapping[str, str], names: set[str]) -> tuple[str, ...]:
    """Rule keys that name no module and no parameter: `names` are the model's module and parameter names with
    layer numbers as `*` (`generic_name`).

    Source: transformers 5.23 `DistributedMixin._validate_parallel_plan` (`plan.keys() - names`), which only logs
    them on rank 0 at load time.
    """
    return tuple(sorted(k for k in rules if k not in names))


# ----------------------------------------------------------------------------------------------------------------------
# Styles: what each registered style does to a linear layer's parameters and output
# ----------------------------------------------------------------------------------------------------------------------
OUTPUT_AXIS = "out"
INPUT_AXIS = "in"

# style -> (axis of a linear layer it splits, output gathered back to whole, split factor of packed styles)
# Source: transformers 5.23 `distributed/tensor_parallel.py` registrations: `colwise*` wrap the weight in
# `Shard(ndim - 2)` (output features), `rowwise*` in `Shard(-1)` (input features, bias replicated),
# `packed_colwise` / `packed_rowwise` in `_StridedShard(split_factor=2)`; `colwise_gather_output` and `colwise_rep`
# redistribute the output to `Replicate()`.
_LINEAR_STYLES: dict[str, tuple[str, bool, int]] = {
    styles.COLWISE: (OUTPUT_AXIS, False, 1),
    styles.COLWISE_GATHER_OUTPUT: (OUTPUT_AXIS, True, 1),
    styles.COLWISE_REP: (OUTPUT_AXIS, True, 1),
    styles.PACKED_COLWISE: (OUTPUT_AXIS, False, 2),
    styles.ROWWISE: (INPUT_AXIS, False, 1),
    styles.ROWWISE_SPLIT_INPUT: (INPUT_AXIS, False, 1),
    styles.ROWWISE_REP: (INPUT_AXIS, False, 1),
    styles.PACKED_ROWWISE: (INPUT_AXIS, False, 2),
    # transformers 5.25: whole heads per rank on a 2-D (units, replicas) view of the TP mesh, duplicated when there are
    # fewer heads than ranks (`UnitColwiseParallel`: [Shard(ndim - 2), Replicate()]; `UnitRowwiseParallel`:
    # [Shard(-1), Replicate()], bias replicated). Each rank's rows are read from the DTensor itself.
    styles.UNIT_COLWISE: (OUTPUT_AXIS, False, 1),
    styles.UNIT_ROWWISE: (INPUT_AXIS, False, 1),
}

def style_axis(style: str | None) -> str | None:
    """`"out"` for the colwise family (splits output features), `"in"` for the rowwise family, else `None`."""
    entry = _LINEAR_STYLES.get(style or "")
    return entry[0] if entry else None


def style_gathers_output(style: str | None) -> bool:
    """True when the style redistributes the layer's output back to whole on every rank (`colwise_gather_output`,
    `colwise_rep`): every rank then computes with all heads / all parts of the output."""
    entry = _LINEAR_STYLES.get(style or "")
    return bool(entry and entry[1])


def style_split_factor(style: str | None) -> int:
    """Packed blocks a style splits separately (2 for `packed_colwise` / `packed_rowwise`, else 1)."""
    entry = _LINEAR_STYLES.get(style or "")
    return entry[2] if entry else 1


def linear_styles() -> tuple[str, ...]:
    """The styles this module describes (each pinned to transformers' behaviour by a test)."""
    return tuple(_LINEAR_STYLES)
