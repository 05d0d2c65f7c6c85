"""Private torch and transformers internals the parity check needs, in one place (transformers 5.23, torch 2.13).

The parity check (`tpaudit.parity`) runs `tp_size` ranks as threads of this process on torch's multi-threaded
process group, loading the model with the public `from_pretrained(..., distributed_config=...)`. Making that work
takes a few private pieces, all here:

- torch's multi-threaded process group (`torch.testing._internal.distributed.multi_threaded_pg`): its install /
  uninstall of a thread-local `torch.distributed` world, the `threaded` backend it registers, and the hook that wakes
  ranks blocked in a collective when another rank fails (`ProcessLocalGroup.exception_handle`);
- torch's thread isolation mode for process-group names (`torch._C._distributed_c10d._set_thread_isolation_mode`),
  without which two ranks register the same group name;
- transformers' loader switch `HF_DEACTIVATE_ASYNC_LOAD` (`core_model_loading.py`): the loader otherwise shards
  weights in a worker thread pool, whose threads do not belong to any rank's world;
- the model class's `prepare_distribute_model` (`distributed/mixin.py`), wrapped so that ranks load one at a time
  once their device mesh exists: the contexts `get_init_context` returns patch process-wide state
  (`PreTrainedModel.tie_weights`, `torch.linspace`, the default dtype), which another rank's load would read.

Outside the tested releases these may change; the seam's capability probes (`compat.backend()`) guard the whole tool.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

__all__ = ["threaded_world", "init_rank", "leave_rank", "wake_ranks", "serialized_loading", "TERMINATED"]

TERMINATED = "Test termination event occurs."
"""The `SystemExit` message a rank gets when another rank failed and woke it from a collective."""


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


def init_rank(rank: int, world_size: int, store) -> None:
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

    def __init__(self):
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
def serialized_loading(model_class) -> Iterator[_LoadLock]:
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

    def prepare_distribute_model(cls, *args, **kwargs):
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
