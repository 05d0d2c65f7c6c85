"""Every torch and transformers piece the parity check (`tpaudit.evidence`) touches, in one place (transformers
5.23-5.24, torch 2.13-2.14).

The parity check runs `tp_size` ranks as threads of this process on torch's multi-threaded process group, loading a
small model with the public `from_pretrained(..., distributed_config=...)`, and follows tensors through one forward
with a `TorchFunctionMode`. Making that work takes a few private pieces, all here, each listed in `CAPABILITIES`
(probed at start-up with the rest of the seam, `compat.backend()`):

- torch's multi-threaded process group (`torch.testing._internal.distributed.multi_threaded_pg`): its install /
  uninstall of a thread-local `torch.distributed` world, the `threaded` backend it registers, and the hook that wakes
  ranks blocked in a collective when another rank fails (`ProcessLocalGroup.exception_handle`);
- torch's thread isolation mode for process-group names (`torch._C._distributed_c10d._set_thread_isolation_mode`),
  without which two ranks register the same group name;
- transformers' loader switch `HF_DEACTIVATE_ASYNC_LOAD` (`core_model_loading.py`): the loader otherwise shards
  weights in a worker thread pool, whose threads do not belong to any rank's world;
- the model class's `prepare_distribute_model` (`distributed/mixin.py`), wrapped so that ranks load one at a time
  once their device mesh exists: the contexts `get_init_context` returns patch process-wide state
  (`PreTrainedModel.tie_weights`, `torch.linspace`, the default dtype), which another rank's load would read;
- `torch.utils.weak.WeakIdKeyDictionary` (tensors keyed by identity while a trace follows them), DTensor's local
  shards, and transformers' progress-bar switches, auto class tables and `AutoConfig.for_model`.

The rest of the parity check imports only public torch tensor operations (`torch.arange`, `torch.no_grad`, ...).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

from ._probe import Capability

__all__ = ["CAPABILITIES", "threaded_world", "init_rank", "leave_rank", "wake_ranks", "serialized_loading",
           "TERMINATED", "function_mode", "weak_id_dict", "local_tensor", "sharded_local", "cannot_host_ranks",
           "no_progress_bars", "config_for_model", "model_class", "text_route", "decoder_class_names"]

CAPABILITIES = (
    Capability("torch.testing._internal.distributed.multi_threaded_pg", "_install_threaded_pg"),
    Capability("torch.testing._internal.distributed.multi_threaded_pg", "_uninstall_threaded_pg"),
    Capability("torch.testing._internal.distributed.multi_threaded_pg", "ProcessLocalGroup.reset"),
    Capability("torch.testing._internal.distributed.multi_threaded_pg", "ProcessLocalGroup.exception_handle"),
    Capability("torch._C._distributed_c10d", "_set_thread_isolation_mode"),
    Capability("torch.utils.weak", "WeakIdKeyDictionary"),
    Capability("torch.overrides", "TorchFunctionMode"),
    Capability("torch.distributed", "HashStore"),
    Capability("torch.distributed.tensor", "Replicate"),
    Capability("transformers.distributed.mixin", "DistributedMixin.prepare_distribute_model",
               ("distributed_config", "device_map")),
    Capability("transformers.distributed", "DistributedConfig", ("tp_size", "ep_size", "tp_plan", "ep_plan")),
    Capability("transformers.utils.logging", "is_progress_bar_enabled"),
    Capability("transformers.utils.logging", "disable_progress_bar"),
    Capability("transformers.utils.logging", "enable_progress_bar"),
    Capability("transformers", "AutoConfig.for_model", ("model_type",)),
)
"""What the parity check calls, probed with the rest of the seam (`Transformers523.CAPABILITIES`)."""

TERMINATED = "Test termination event occurs."
"""The `SystemExit` message a rank gets when another rank failed and woke it from a collective."""


# ----------------------------------------------------------------------------------------------------------------------
# Threaded ranks
# ----------------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def threaded_world() -> Iterator[Any]:
    """Install torch's multi-threaded process group for the duration of the block and yield the store the ranks
    share (a `torch.distributed.HashStore`).

    On exit the previous (process-wide) `torch.distributed` world comes back, whatever the ranks left behind, and
    so do the loader's thread pool switch and the transformers progress bars.
    """
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg as mtp
    from transformers.utils import logging as hf_logging

    saved_env = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    bars = hf_logging.is_progress_bar_enabled()
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    hf_logging.disable_progress_bar()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    mtp.ProcessLocalGroup.reset()
    mtp._install_threaded_pg()
    try:
        yield dist.HashStore()
    finally:
        mtp.ProcessLocalGroup.reset()
        mtp._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        if saved_env is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = saved_env
        if bars:
            hf_logging.enable_progress_bar()


def init_rank(rank: int, world_size: int, store: Any) -> None:
    """Join the threaded world as `rank` of `world_size` (call from the rank's own thread)."""
    import torch.distributed as dist

    dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)


def leave_rank() -> None:
    """Destroy this thread's process group, if it still has one."""
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()


def wake_ranks(exc: BaseException) -> None:
    """Wake every rank blocked in a collective after `exc` ended one rank: they leave with `SystemExit(TERMINATED)`
    instead of waiting forever."""
    from torch.testing._internal.distributed import multi_threaded_pg as mtp

    mtp.ProcessLocalGroup.exception_handle(exc)


class _LoadLock:
    """One rank at a time between its mesh set-up and the end of its `from_pretrained`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = threading.local()

    def acquire(self) -> None:
        if not getattr(self._held, "value", False):
            self._lock.acquire()
            self._held.value = True

    def release(self) -> None:
        """Call in the rank's thread once its `from_pretrained` returned or raised."""
        if getattr(self._held, "value", False):
            self._held.value = False
            self._lock.release()


@contextlib.contextmanager
def serialized_loading(model_class: Any) -> Iterator[_LoadLock]:
    """Make the ranks' `model_class.from_pretrained` calls load one at a time after their (collective) mesh set-up,
    and put back the process-wide state transformers patches while it builds a model.

    transformers 5.23 `PreTrainedModel.get_init_context` returns context managers that patch globals on entry and
    restore them on exit (`PreTrainedModel.tie_weights` becomes a no-op, `torch.linspace` and the default dtype
    change); a rank finishing its load (`tie_weights` in `_finalize_model_loading`) while another builds its model
    would read the patched no-op and leave `lm_head` untied. `from_pretrained` first sets up the device mesh
    (`prepare_distribute_model`, a collective every rank must enter), so the lock is taken right after it returns and
    released by the rank (`lock.release()`) when its `from_pretrained` ends. Loading has no collective after that.
    """
    import torch
    from transformers import PreTrainedModel

    lock = _LoadLock()
    original = model_class.__dict__.get("prepare_distribute_model")
    bound = model_class.prepare_distribute_model

    def prepare_distribute_model(cls: Any, *args: Any, **kwargs: Any) -> Any:
        out = bound(*args, **kwargs)
        lock.acquire()
        return out

    saved = (PreTrainedModel.tie_weights, PreTrainedModel.init_weights, torch.linspace, torch.get_default_dtype())
    model_class.prepare_distribute_model = classmethod(prepare_distribute_model)
    try:
        yield lock
    finally:
        if original is None:
            del model_class.prepare_distribute_model
        else:
            model_class.prepare_distribute_model = original
        PreTrainedModel.tie_weights, PreTrainedModel.init_weights, torch.linspace = saved[:3]
        torch.set_default_dtype(saved[3])


def cannot_host_ranks() -> str | None:
    """Why the ranks cannot run as threads of this process (`None` when they can): a process group already
    initialised here (under torchrun, or inside `strict_tp`), or an accelerator transformers would place the ranks
    on."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "this process already belongs to a process group"
    if getattr(torch, "accelerator", None) is not None and torch.accelerator.is_available():
        return "an accelerator is visible (the check runs on the CPU)"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# Following tensors
# ----------------------------------------------------------------------------------------------------------------------
def function_mode() -> Any:
    """torch's `TorchFunctionMode` base class: a subclass's `__torch_function__` sees every torch function call made
    inside `with Mode():` (`torch.overrides`)."""
    from torch.overrides import TorchFunctionMode

    return TorchFunctionMode


def weak_id_dict() -> Any:
    """A dict keyed by tensor identity that does not keep its keys alive (`torch.utils.weak.WeakIdKeyDictionary`)."""
    from torch.utils.weak import WeakIdKeyDictionary

    return WeakIdKeyDictionary()


def local_tensor(x: Any) -> Any:
    """The rank's local shard of a DTensor, else `x` itself."""
    from torch.distributed.tensor import DTensor

    return x.to_local() if isinstance(x, DTensor) else x


def sharded_local(p: Any) -> Any:
    """The local shard of a parameter some placement shards on this rank (a DTensor that is not replicated on every
    mesh dimension), else `None`."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(p, DTensor) and any(not isinstance(pl, Replicate) for pl in p.placements):
        return p.to_local()
    return None


# ----------------------------------------------------------------------------------------------------------------------
# transformers' model classes and configs
# ----------------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off for the block (then as they were)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def config_for_model(model_type: str, values: dict[str, Any]) -> Any:
    """`AutoConfig.for_model(model_type, **values)`: a config rebuilt from its `to_dict()` (the parity subprocess).

    Raises:
        ValueError: transformers does not know `model_type`.
    """
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values)


def model_class(model_class: Any) -> Any:
    """The transformers model class `model_class` names (a class, or its name in `transformers`), else `None`."""
    from transformers import PreTrainedModel

    from . import backend

    if isinstance(model_class, str):
        return backend().model_class_by_name(model_class)
    if isinstance(model_class, type) and issubclass(model_class, PreTrainedModel):
        return model_class
    return None


def decoder_class_names(text_config: Any, near: Any = None) -> list[str]:
    """Model classes that can run a text config on its own, most useful first: its causal LM, then its base model.

    When the auto tables register no class for the text config's type (Ernie-4.5-VL-MoE's
    `ernie4_5_vl_moe_text`, Unlimited-OCR's `unlimited_ocr_text`), the modeling module of `near` (the composite model
    class) is searched for model classes whose `config_class` is exactly the text config's class, a causal LM
    first, then the others in the order the module defines them (`Ernie4_5_VLMoeTextModel`).

    Source: transformers 5.23 `models/auto/modeling_auto.py` (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`,
    `MODEL_MAPPING_NAMES`), through `Transformers523.model_class_names` without the image-text-to-text table (a text
    config's own classes); `PreTrainedModel.config_class` (5.25)."""
    import sys

    from transformers import PreTrainedModel
    from transformers.models.auto import modeling_auto as auto

    names: list[str] = []
    for mapping in (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_MAPPING_NAMES):
        name = mapping.get(text_config.model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and name not in names:
            names.append(name)
    module = sys.modules.get(getattr(near, "__module__", None) or "")
    if names or module is None:
        return names
    own = [n for n, c in vars(module).items() if isinstance(c, type) and issubclass(c, PreTrainedModel)
           and c.__module__ == module.__name__ and getattr(c, "config_class", None) is type(text_config)
           and not n.endswith("PreTrainedModel")]
    return sorted(own, key=lambda n: not n.endswith("ForCausalLM"))


def text_route(config: Any) -> tuple[Any, bool]:
    """`(text_config, composite)`: the config whose plan the base model follows (the decoder's text config of a
    composite model, else `config`), and whether it differs from `config`.

    Source: transformers 5.23 `PretrainedConfig.get_text_config(decoder=True)` (`Transformers523.text_config`)."""
    from . import backend

    try:
        text, _ = backend().text_config(config)
    except AttributeError:
        return config, False
    return text, text is not config


def required_forward_inputs(model_class: Any) -> list[str]:
    """The arguments `model_class.forward` requires (no default) besides the token ids: inputs the parity check's
    token-id batch cannot give (PI0's robot `state`).

    Source: the model's own `forward` signature (`inspect.signature`; transformers 5.25 `PI0ForConditionalGeneration`
    requires `state`)."""
    import inspect

    try:
        params = inspect.signature(model_class.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in ("self", "input_ids")
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


@contextlib.contextmanager
def collected_library_messages() -> Iterator[list[str]]:
    """Collect what transformers' and torch's loggers and Python warnings say inside the block instead of letting it
    reach the terminal (a kernel falling back to its reference implementation during a small model's forward);
    yields the list it fills, one `"transformers: <first line>"` (or `"<WarningClass>: ..."`) entry per message.

    Source: transformers 5.25 `utils.logging` (the `transformers` library logger and its own handler, which
    `integrations/hub_kernels.py`'s `logger.warning_once` writes through)."""
    import logging
    import warnings

    got: list[str] = []

    def line(text: object) -> str:
        first = str(text).strip().splitlines()[0] if str(text).strip() else ""
        return first[:300]

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - a logging.Handler
            try:
                got.append(f"{record.name.split('.')[0]}: {line(record.getMessage())}")
            except Exception:  # noqa: BLE001 - a message that cannot be formatted is dropped, never raised
                pass

    handler = _Collect(logging.WARNING)
    loggers = [logging.getLogger("transformers"), logging.getLogger("torch")]
    saved = [(lg, list(lg.handlers), lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                yield got
            finally:
                got.extend(f"{w.category.__name__}: {line(w.message)}" for w in caught)
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers = handlers
            lg.propagate = propagate


REDUCING_STYLES = frozenset({"moe_tp_experts"})
"""Styles whose module all-reduces its own output across the ranks: inside it each rank computes a partial result
(its share of every expert's hidden units; transformers 5.24's `moe_identity_expert` divides the identity expert's
input by `tp_size` so that the sum restores it), so only the module's own output pairs with the unsharded one.

Source: transformers 5.24/5.25 `distributed/tensor_parallel.py` (`MoeTensorParalellExperts` all-reduces the experts'
output; `MoeIdentityParallel`'s docstring: "the moe_tp_experts will sum across GPUs")."""
