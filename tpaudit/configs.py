"""Reading config attributes the way every stage needs them: also from heterogeneous (per-layer) configs.

transformers' per-layer configs (Gemma 4's global layers with their own KV-head count and head_dim) raise on access
to an attribute whose value differs across layers; these helpers return `None` for such a global read and list every
per-layer value on request. The per-layer reading itself is in the seam (`compat`).
"""

from __future__ import annotations

from typing import Any

from .compat import backend


def value(config, name: str) -> Any:
    """`getattr(config, name, None)`, `None` when the attribute has no single global value."""
    return backend().config_value(config, name)


def values(config, name: str) -> list:
    """Every distinct value of `name` across the layers (`per_layer_config[i].name`), else the single global value;
    empty when absent."""
    tf = backend()
    out = []
    for c in tf.layer_configs(config) or [config]:
        v = tf.config_value(c, name)
        if v is not None and v not in out:
            out.append(v)
    return out


def attribute_for(config, fragment: str, wanted: int, preferred: str, raw: dict | None = None) -> tuple[str, Any]:
    """The config attribute that sets a per-layer value: `preferred` when its global value is `wanted`, else the
    attribute whose name contains `fragment` and whose global value is `wanted` (Gemma 4's
    `num_global_key_value_heads` = 4 for its global layers, while `num_key_value_heads` = 16); else `preferred` with
    the per-layer note.

    `raw` is the config.json section the config was read from: transformers may fold such an attribute into the
    per-layer configs and keep no attribute of that name (Gemma 4's `num_global_key_value_heads`), while config.json,
    the file a user edits, still names it.

    Returns:
        `(attribute name, its global value)`; `("per_layer_config.<preferred>", wanted)` when no attribute holds
        `wanted` globally (only the per-layer configs do).
    """
    tf = backend()
    if tf.config_value(config, preferred) == wanted:
        return preferred, wanted
    names = sorted(n for n in vars(config) if fragment in n and not n.startswith("_"))
    for n in names:
        if tf.config_value(config, n) == wanted:
            return n, wanted
    if isinstance(raw, dict):
        if raw.get(preferred) == wanted:
            return preferred, wanted
        for n in sorted(k for k in raw if isinstance(k, str) and fragment in k):
            if raw[n] == wanted and not isinstance(raw[n], bool):
                return n, wanted
    return f"per_layer_config.{preferred}", wanted
