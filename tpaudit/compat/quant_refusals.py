"""What the loader refuses in a `quantization_config`, beyond what its parser already raises, and which library
releases accept a config the installed one refuses.

`from_pretrained` parses config.json's `quantization_config` with `AutoHfQuantizer.supports_quant_method` and
`AutoHfQuantizer.from_config` (transformers 5.23-5.25 `quantizers/auto.get_hf_quantizer`); whatever they raise makes
the load fail on every host with those releases, and the seam reports it as a refusal (TPA206). compressed-tensors'
parser accepts some `num_bits` its own code cannot load (`format_refusal`), and a library release that removed a
value explains the refusal of a config written for an older one (`accepted_by`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._types import QuantizationInfo

_QUANT_ARGS = ("weights", "input_activations", "output_activations")


def refused_by(method: str) -> str:
    """The releases that refuse: `"transformers 5.25.0"`, with the format's library for compressed-tensors."""
    from . import installed_version

    text = f"transformers {installed_version('transformers')}"
    if method == "compressed-tensors" and installed_version("compressed-tensors"):
        text += f" with compressed-tensors {installed_version('compressed-tensors')}"
    return text


def format_refusal(qc: dict[str, Any]) -> str | None:
    """Why compressed-tensors cannot load the `num_bits` of a config its parser (`QuantizationArgs`) accepted, or
    `None`.

    - an integer type needs at least 1 bit; the `pack-quantized` format at most 8
      (`compressors/pack_quantized/helpers.unpack_from_int32`: "Unpacking is only supported for num_bits in [1, 8]"),
      the others at most 32 (`QuantizationArgs.pytorch_dtype`: int8, int16 or int32 holds the values);
    - a float type is 4, 6 or 8 bits (`quantization/utils/helpers._calculate_range`: "Range calculation only
      supported for 4, 6 and 8 bits").

    Args:
        qc (`dict`): the `quantization_config` as config.json holds it.
    """
    if qc.get("quant_method") != "compressed-tensors":
        return None
    groups: dict[str, Any] = qc["config_groups"] if isinstance(qc.get("config_groups"), dict) else {}
    places = [(f"config_groups.{g}.{role}", group.get(role), group.get("format") or qc.get("format"))
              for g, group in groups.items() if isinstance(group, dict) for role in _QUANT_ARGS]
    places.append(("kv_cache_scheme", qc.get("kv_cache_scheme"), None))
    for where, args, fmt in places:
        if not isinstance(args, dict):
            continue
        bits, kind = args.get("num_bits", 8), str(args.get("type", "int")).lower()
        if not isinstance(bits, int) or isinstance(bits, bool):
            continue
        if kind == "int":
            packed = fmt == "pack-quantized" and where.endswith(".weights")
            high = 8 if packed else 32
            if not 1 <= bits <= high:
                why = ("the pack-quantized format unpacks weights of 1 to 8 bits only (compressed-tensors "
                       "`unpack_from_int32`: \"Unpacking is only supported for num_bits in [1, 8]\")" if packed else
                       "compressed-tensors holds integer values of 1 to 32 bits (int8, int16 or int32, "
                       "`QuantizationArgs.pytorch_dtype`)")
                return f"`quantization_config.{where}.num_bits` is {bits}: {why}"
        elif kind == "float" and bits not in (4, 6, 8):
            return (f"`quantization_config.{where}.num_bits` is {bits}: compressed-tensors has float formats of 4, 6 "
                    "and 8 bits only (`_calculate_range`: \"Range calculation only supported for 4, 6 and 8 bits\")")
    return None


# (library, what the refusal says, the newest release that accepts it, the release that removed it, what it is)
_REMOVED = (
    ("compressed-tensors", re.compile(r"actorder=('?)(group|dynamic)\1 has been removed|actorder=True previously"),
     "0.18.0", "0.19.0", "actorder 'group' (also written 'dynamic' or true)"),
)


def accepted_by(method: str, reason: str) -> str | None:
    """Which releases accept a config the installed library refuses because a release removed a value, or `None`.

    Source: compressed-tensors 0.18.0 `QuantizationArgs.validate_actorder` maps 'group', 'dynamic' and `True` to
    `ActivationOrdering.GROUP` (with a deprecation warning); 0.19.0 raises "actorder='group' has been removed".
    """
    from . import installed_version

    for library, pattern, last, removed_in, what in _REMOVED:
        if method == library and pattern.search(reason):
            return (f"{library} {last} and earlier accept it; {removed_in} removed {what} (installed: "
                    f"{installed_version(library)})")
    return None


def full_reason(error: BaseException, limit: int = 6000) -> str:
    """`"<type>: <message>"` on one line, whole up to `limit` characters; longer, the count of the rest is said
    (a parser's message echoes the config, which config.json's 16 MiB cap bounds only loosely)."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else f"{text[:limit]} ... ({len(text) - limit:,} more characters)"


def refusal(method: str, reason: str) -> QuantizationInfo:
    """The `QuantizationInfo` of a config the loader refuses: `reason` whole, the refusing releases, and which
    releases accept it (`accepted_by`)."""
    from ._types import QuantizationInfo

    return QuantizationInfo(method, reason=reason, refused=True, refused_by=refused_by(method),
                            accepted_by=accepted_by(method, reason))
