"""TPA2xx, the quantization config itself: a `quantization_config` whose method the installed transformers does not
know (TPA205), or refuses (TPA206). (The findings about quantized tensors under a plan are in `quant.py`.)"""

from __future__ import annotations

from typing import Iterable

from ..model import Finding
from .registry import CheckContext, rule


@rule("TPA205", "unknown_quant_method", severity="warning", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="config")
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


@rule("TPA206", "quant_config_refused", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="config")
def check_refused_quant_config(ctx: CheckContext) -> Iterable[Finding]:
    """A `quantization_config` that transformers or its format's library refuses when `from_pretrained` parses it.

    **What it detects**
    config.json's `quantization_config` raises where `from_pretrained` reads it (`AutoHfQuantizer.from_config`: the
    method's config class and, for compressed-tensors, its pydantic schema): `num_bits` 4.5 or null, a `group_size`
    of 0 or `"32"`, an unknown `strategy`, `type` or `quantization_status`, an FP8 `weight_block_size` of
    `[0, 0]`, no `quant_method` at all; or compressed-tensors accepts a `num_bits` its own code cannot load (0, -1,
    9 bits packed into int32 words, 2^40). The finding quotes the library's reason whole, and where a library
    release removed the value (compressed-tensors 0.19.0 removed `actorder: "group"`), which releases accept it.

    **Why it matters**
    The load fails on every host with these releases, before any weight is read. tpaudit sizes the model from the
    checkpoint header instead (its other findings, such as a sharded `weight_shape` or `g_idx`, hold for the
    releases that accept the config). A refusal that depends on the host (no GPU for a kernel) is not this rule:
    it stays a note naming the host.

    **Example**
    `"weights": {"num_bits": 4, "strategy": "group", "group_size": 0}` in a compressed-tensors config group.

    **Fix**
    Correct the value the reason names, or install the library release that accepts the config (for `actorder:
    "group"`: compressed-tensors 0.18.0 or earlier, or write `actorder: "weight"`).

    **References**
    transformers `quantizers/auto.py` (`get_hf_quantizer`, `AutoHfQuantizer.from_config`); compressed-tensors
    `quantization/quant_args.py` (`QuantizationArgs` validators), `compressors/pack_quantized/helpers.py`.
    """
    q = ctx.quantization
    if q is None or not q.refused:
        return
    top = isinstance(ctx.source.config, dict) and ctx.source.config.get("quantization_config") is not None
    target = "quantization_config" if top else ctx.config_target("quantization_config")
    accepted = f"; {q.accepted_by}" if q.accepted_by else ""
    yield Finding(
        code="TPA206", kind="quant_config_refused", severity="error", target=target,
        message=f"from_pretrained refuses `{target}` ({q.method}) with {q.refused_by}, so the checkpoint does not "
                f"load with these releases: {q.reason}{accepted}",
        fix="Correct the value the reason names" + (", or install a release that accepts it" if accepted else ""),
        facts={"quant_method": q.method, "reason": q.reason, "refused_by": q.refused_by,
               "accepted_by": q.accepted_by})
