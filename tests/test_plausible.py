"""A config that makes no model is bad input (`tpaudit/metamodel/plausible.py`): exit 2 with one line naming the attribute, never
a report that passes and never an internal error. transformers' own default configs all pass the same rules."""

from __future__ import annotations

import json
import math

import pytest

from conftest import CASES, assert_one_error_line, run_bounded, run_main

GRANITE = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
MOE = {**GRANITE, "model_type": "granitemoe", "architectures": ["GraniteMoeForCausalLM"], "num_local_experts": 8,
       "num_experts_per_tok": 2}


def model_dir(tmp_path, config) -> str:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config, allow_nan=True))
    return str(d)


def assert_config_error(proc, *needles):
    assert_one_error_line(proc, *needles)


@pytest.mark.parametrize("base, change, needle", [
    (GRANITE, {"hidden_size": 10**9}, "hidden_size = 1000000000 is not a plausible size"),
    (GRANITE, {"intermediate_size": 2**30}, "intermediate_size = 1073741824 is not a plausible size"),
    (GRANITE, {"vocab_size": 0}, "vocab_size = 0 must be a positive integer"),
    (GRANITE, {"num_attention_heads": 2**21, "num_key_value_heads": 8}, "num_attention_heads = 2097152"),
    (GRANITE, {"num_hidden_layers": 0}, "num_hidden_layers = 0 must be a positive integer"),
    (GRANITE, {"head_dim": 64.5}, "head_dim = 64.5 is not an integer"),
    (GRANITE, {"head_dim": 0}, "head_dim = 0 must be a positive integer"),   # 0 only for an MLA head (glm5_next)
    (MOE, {"num_local_experts": 0}, "num_experts_per_tok = 2 exceeds num_local_experts = 0"),
    (MOE, {"num_local_experts": 3, "num_experts_per_tok": 8}, "num_experts_per_tok = 8 exceeds num_local_experts = 3"),
    (MOE, {"num_local_experts": -3}, "num_local_experts = -3 must not be negative"),
    (GRANITE, {"sliding_window": -1}, "sliding_window = -1 is not a window"),
    (GRANITE, {"sliding_window": "4k"}, "sliding_window = '4k' is not a window"),
    (GRANITE, {"rms_norm_eps": math.nan}, "rms_norm_eps = nan is not a usable epsilon"),
    (GRANITE, {"rms_norm_eps": math.inf}, "rms_norm_eps = inf is not a usable epsilon"),
    (GRANITE, {"rms_norm_eps": -1e-6}, "rms_norm_eps = -1e-06 is not a usable epsilon"),
    (GRANITE, {"rms_norm_eps": "1e-6"}, "rms_norm_eps"),   # transformers' own validator refuses a string
    (GRANITE, {"dtype": 7}, "dtype = 7 is not a floating torch dtype"),
    (GRANITE, {"dtype": "int8"}, "dtype = torch.int8 is not a floating torch dtype"),
    (GRANITE, {"base_model_tp_plan": "colwise"}, "base_model_tp_plan is a str ('colwise'), not a map of rule -> style"),
    (GRANITE, {"base_model_tp_plan": {"layers.*.self_attn.q_proj": 3}}, "base_model_tp_plan is a map with a key or"),
])
def test_values_that_make_no_model_are_input_errors(tmp_path, base, change, needle):
    config = {k: v for k, v in {**base, **change}.items()}
    if "dtype" in change:
        config.pop("torch_dtype", None)
    proc = run_main("check", model_dir(tmp_path, config), "--tp", "2")
    assert_config_error(proc, needle, "Fix the config")


def _granite_parameters(c) -> int:
    """Granite's parameters from its config, as its modeling code declares them: a tied embedding (vocab x hidden),
    per layer q and o (hidden x hidden), k and v (KV heads x head dim, by hidden), gate, up and down (intermediate x
    hidden each), two norms (hidden each); a final norm."""
    h, i, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    return c["vocab_size"] * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h


@pytest.mark.parametrize("change", [
    # every size at its cap: 8 * 10^18 parameters, a 16-exabyte model in bfloat16, each size plausible alone (slow:
    # 4096 layers are built on the meta device first)
    pytest.param({"hidden_size": 2**24, "intermediate_size": 2**24, "vocab_size": 2**24, "num_hidden_layers": 4096,
                  "num_attention_heads": 2**20, "num_key_value_heads": 2**20}, marks=pytest.mark.slow),
    # one layer just over the bound: 2^24 wide, 2^21 intermediate
    {"hidden_size": 2**24, "intermediate_size": 2**21, "vocab_size": 2**10, "num_hidden_layers": 1,
     "num_attention_heads": 2**16, "num_key_value_heads": 2**16},
])
def test_a_model_larger_than_any_real_one_is_an_input_error(tmp_path, change):
    config = {**GRANITE, **change}
    expected = _granite_parameters(config)
    assert expected > 10**14
    assert_config_error(run_main("check", model_dir(tmp_path, config), "--tp", "2", "--no-parity"),
                        f"makes a model of {expected:,} parameters", "100,000,000,000,000")


def test_the_largest_real_models_stay_under_the_bound(tmp_path):
    """A granite as large as the biggest published checkpoints and then some (about 2.2 trillion parameters) still
    builds and is judged; the bound sits a factor of 50 above them."""
    config = {**GRANITE, "hidden_size": 2**15, "intermediate_size": 2**18, "num_hidden_layers": 80,
              "num_attention_heads": 2**8, "num_key_value_heads": 2**3}
    assert 10**12 < _granite_parameters(config) < 10**14
    proc = run_main("check", model_dir(tmp_path, config), "--tp", "2", "--no-parity", "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["total_param_bytes"] == 2 * _granite_parameters(config)   # bfloat16


def test_torch_dtype_of_the_wrong_kind_is_named_too(tmp_path):
    config = {k: v for k, v in GRANITE.items() if k != "dtype"}
    config["torch_dtype"] = 7   # transformers reads the older spelling into `dtype`
    assert_config_error(run_main("check", model_dir(tmp_path, config), "--tp", "2"), "dtype = 7")


@pytest.mark.slow  # a whole interpreter that imports torch and transformers
def test_a_string_plan_is_refused_in_a_child_too(tmp_path):
    """It was a clear exit 2 before, then an internal error: the command as a user runs it, bounded."""
    proc = run_bounded("check", model_dir(tmp_path, {**GRANITE, "base_model_tp_plan": "colwise"}), "--tp", "2",
                       seconds=60, memory=8 << 30)
    assert_config_error(proc, "base_model_tp_plan is a str")


@pytest.mark.parametrize("change", [
    {"sliding_window": 0},            # qwen2_moe's default: no window
    {"sliding_window": None},
    {"rms_norm_eps": 0.0},
    {"dtype": "float32"},
])
def test_values_real_configs_use_pass(tmp_path, change):
    config = {**GRANITE, "num_hidden_layers": 2, **change}
    proc = run_main("check", model_dir(tmp_path, config), "--tp", "3", "--format", "json")
    assert proc.returncode == 1, proc.stderr     # vocab 49155 at tp 3 divides; 32 heads do not (TPA101 errors)


@pytest.mark.slow  # about 800 default configs (10 s)
def test_every_default_config_of_the_installed_transformers_passes():
    """No false alarm on transformers' own configs: the rules are checked on the default config of every model type
    (the ones `scan` builds), top-level and text config alike."""
    import warnings

    from tpaudit.compat import backend
    from tpaudit.errors import ConfigError
    from tpaudit.metamodel.plausible import check_plausible

    tf = backend()
    refused = {}
    checked = 0
    for model_type in sorted(tf.config_classes()):
        try:
            with warnings.catch_warnings(), tf.quiet():
                warnings.simplefilter("ignore")
                config = tf.config_from_class(model_type)
        except Exception:  # noqa: BLE001 - a default config transformers itself cannot make is not ours to judge
            continue
        owner, owner_path = tf.text_config(config)
        try:
            check_plausible(config, owner, owner_path, model_type, None)
        except ConfigError as e:
            refused[model_type] = e.reason
        checked += 1
    assert checked > 500
    # lxmert gives num_hidden_layers as a dict per tower (an encoder, never a decoder tpaudit audits). glm5_next's
    # default text config has head_dim 0: its config class sets head_dim = qk_rope_head_dim (0 by default) whatever
    # it is given, an MLA head with no rotary part, and transformers builds it: not refused.
    assert set(refused) <= {"lxmert"}, refused
    if "glm5_next_text" in tf.config_classes():
        config = tf.config_from_class("glm5_next_text")
        assert config.head_dim == config.qk_rope_head_dim == 0 and config.qk_nope_head_dim > 0


def test_an_index_that_maps_only_a_tensor_its_shard_lacks(tmp_path):
    """from_pretrained reads the checkpoint through the index: an entry whose tensor is not in its shard fails the
    load. An index mapping only such a tensor used to audit as an empty checkpoint with a report."""
    import struct

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**GRANITE, "num_hidden_layers": 2}))
    raw = json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, 4096]}}).encode()
    (d / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4096))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.does_not_exist.weight": "model-00001-of-00001.safetensors"}}))
    assert_config_error(run_main("check", str(d), "--tp", "2"), "maps tensor 'model.does_not_exist.weight' to "
                        "model-00001-of-00001.safetensors, whose header does not hold it")
