"""Tiny checkpoints in real quantized formats, written with each format's own library (for the tests that load them on
real ranks or check them statically). Nothing here is tpaudit code: the tensors come from compressed-tensors'
compressors and packers, or are laid out as transformers' fine-grained FP8 quantizer stores them.

Every model is small enough to load on 2 gloo ranks in seconds; the shapes are chosen so that tp 2 splits whole
quantization groups and blocks unless a test wants otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, head_dim=16, max_position_embeddings=64)


def _llama(dtype: str = "bfloat16"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA, dtype=dtype)
    config.architectures = ["LlamaForCausalLM"]
    return LlamaForCausalLM(config).to(getattr(torch, dtype)), config


def compressed_tensors_dense(out: Path, preset: str, fmt: str, *, strategy: str | None = None,
                             group_size: int | None = None) -> Path:
    """A tiny Llama quantized by compressed-tensors itself: its preset scheme (`W8A16`, `W4A16`, `FP8_DYNAMIC`) on
    every `Linear` but `lm_head`, compressed by its own `ModelCompressor` (`weight_packed`/`weight_scale`/
    `weight_shape` for pack-quantized, FP8 `weight` + `weight_scale` for float-quantized), saved with the
    `quantization_config` the compressor writes. `strategy="channel"` gives per-channel `[out, 1]` scales."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from safetensors.torch import save_file

    model, config = _llama()
    scheme = QuantizationScheme(targets=["Linear"], **PRESET_SCHEMES[preset])
    if strategy == "channel":
        scheme.weights.strategy, scheme.weights.group_size = "channel", None
    elif group_size is not None:
        scheme.weights.group_size = group_size
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                        format=fmt))
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "weight_scale"):
                m.weight_scale.fill_(0.01)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def fp8_block(out: Path, block: int = 32) -> Path:
    """A tiny Llama in transformers' fine-grained FP8 layout (`quant_method: fp8`): every decoder projection's weight
    in `float8_e4m3fn` with a float32 `weight_scale_inv` of one value per `block x block` block."""
    import torch
    from safetensors.torch import save_file

    model, config = _llama()
    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith("proj.weight") and ".layers." in name:
            o, i = t.shape
            tensors[name] = t.to(torch.float8_e4m3fn).contiguous()
            tensors[name + "_scale_inv"] = torch.ones(o // block, i // block, dtype=torch.float32)
        else:
            tensors[name] = t.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    doc = config.to_dict()
    doc["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block]}
    (out / "config.json").write_text(json.dumps(doc, indent=1))
    return out


KIMI_LIKE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
                 first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                 num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32,
                 qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_shared_experts=1,
                 max_position_embeddings=64)


def compressed_tensors_moe(out: Path, bits: int = 4, group: int = 32,
                           ignore: tuple[str, ...] = ("lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                                      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"),
                           shape_dtype: str = "int32") -> Path:
    """A tiny DeepSeek-V3 stored as Kimi-K2.5 stores its routed experts: per expert and projection, compressed-tensors
    `weight_packed` (int32, packed by compressed-tensors' own `pack_to_int32`), `weight_scale` (bfloat16, one per
    `group` inputs) and `weight_shape` (int32 `[out, in]`); the quantization_config of Kimi-K2.5 (int, symmetric,
    group strategy, `targets: ["Linear"]`, ignoring attention, shared experts and dense MLPs). Every other tensor is
    the model's own bfloat16 weight. `shape_dtype="int64"`: `weight_shape` as compressed-tensors' own compressor
    writes it (`torch.tensor(weight.shape)`), which safetensors stores ahead of the int32 words (by alignment)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(**KIMI_LIKE, dtype="bfloat16")
    config.architectures = ["DeepseekV3ForCausalLM"]
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    tensors = {k: t.contiguous() for k, t in model.state_dict().items() if ".mlp.experts." not in k}
    shapes = {"gate_proj": (KIMI_LIKE["moe_intermediate_size"], KIMI_LIKE["hidden_size"]),
              "up_proj": (KIMI_LIKE["moe_intermediate_size"], KIMI_LIKE["hidden_size"]),
              "down_proj": (KIMI_LIKE["hidden_size"], KIMI_LIKE["moe_intermediate_size"])}
    for layer in range(KIMI_LIKE["first_k_dense_replace"], KIMI_LIKE["num_hidden_layers"]):
        for e in range(KIMI_LIKE["n_routed_experts"]):
            for proj, (o, i) in shapes.items():
                base = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (o, i), dtype=torch.int8)
                tensors[base + ".weight_packed"] = pack_to_int32(q, bits).contiguous()
                tensors[base + ".weight_scale"] = torch.full((o, i // group), 0.01, dtype=torch.bfloat16)
                tensors[base + ".weight_shape"] = torch.tensor([o, i], dtype=getattr(torch, shape_dtype))
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    doc = config.to_dict()
    doc["quantization_config"] = {
        "config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                      "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                  "group_size": group, "num_bits": bits, "observer": "minmax",
                                                  "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                                                  "type": "int"}}},
        "format": "pack-quantized", "ignore": list(ignore),
        "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    (out / "config.json").write_text(json.dumps(doc, indent=1))
    return out


def qwen3_vl_moe(out: Path) -> Path:
    """A tiny qwen3_vl_moe saved with `save_pretrained` (its experts stored as transformers writes them)."""
    import torch
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    torch.manual_seed(0)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  deepstack_visual_indexes=[0])
    text = {**LLAMA, "num_key_value_heads": 2, "rope_scaling": rope, "moe_intermediate_size": 48, "num_experts": 4,
            "num_experts_per_tok": 2}
    Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=vision,
                                                        dtype="float32")).save_pretrained(out)
    return out


def qwen3_vl_moe_as_published(out: Path) -> Path:
    """The tiny qwen3_vl_moe with its fused experts stored as Qwen3-VL-30B-A3B-Instruct's checkpoint stores them
    (`gate_up_proj [E, hidden, 2 x intermediate]`, `down_proj [E, intermediate, hidden]`: the listing in fixtures/),
    i.e. transposed against the runtime parameters, which the loader's `Transpose` turns back."""
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    saved = qwen3_vl_moe(out.parent / (out.name + "-runtime-layout"))
    shutil.copytree(saved, out, dirs_exist_ok=True)
    tensors = load_file(str(saved / "model.safetensors"))
    fused = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
    save_file({k: (v.transpose(1, 2).contiguous() if k.endswith(fused) else v) for k, v in tensors.items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out
