"""TPA2xx, the quantization config itself: a `quantization_config` whose method the installed transformers does not
know. (The findings about quantized tensors under a plan are in `quant.py`.)"""

from __future__ import annotations

from typing import Iterable

from ..model import Finding
from .registry import CheckContext, rule


@rule("TPA205", "unknown_quant_method", severity="warning", points_at="config")
def check_unknown_quant_method(ctx: CheckContext) -> Iterable[Finding]:
    """A `quantization_config` whose `quant_method` the installed transformers does not register.

    **What it detects**
    config.json's `quantization_config.quant_method` names no quantizer of the installed transformers (a typo such
    as `fp-8`, a method from a newer release, or a fork's own), as `AutoHfQuantizer.supports_quant_method` answers.

    **Why it matters**
    `from_pretrained` then skips quantization altogether (it logs "Unknown quantization type ... we will skip the
    quantization") and loads the checkpoint's tensors as stored: packed integer weights and their scales become
    plain parameters, and the sizes of a quantized checkpoint are no longer what its quantizer would lay out. tpaudit
    sizes such a model from the checkpoint header (its note says so); the warning says the loader would do no
    better.

    **Example**
    `"quantization_config": {"quant_method": "evil", "bits": 4}` on any model.

    **Fix**
    Write a method transformers registers (`fp8`, `awq`, `gptq`, `compressed-tensors`, `mxfp4`, ...), install the
    transformers release that has it, or remove `quantization_config` for an unquantized checkpoint.

    **References**
    transformers `quantizers/auto.py` (`AutoHfQuantizer.supports_quant_method`, `AUTO_QUANTIZER_MAPPING`).
    """
    q = ctx.quantization
    if q is None or q.known:
        return
    top = isinstance(ctx.source.config, dict) and ctx.source.config.get("quantization_config") is not None
    target = "quantization_config.quant_method" if top else ctx.config_target("quantization_config.quant_method")
    from ..compat import installed_version

    yield Finding(
        code="TPA205", kind="unknown_quant_method", severity="warning", target=target,
        message=f"`{target}` is {q.method[:80]!r}, which transformers {installed_version('transformers')} does not "
                "know: from_pretrained skips quantization "
                "and loads the checkpoint's tensors as stored",
        fix="Write a quant_method transformers registers (fp8, awq, gptq, compressed-tensors, mxfp4, ...) or remove "
            "quantization_config",
        facts={"quant_method": q.method})
