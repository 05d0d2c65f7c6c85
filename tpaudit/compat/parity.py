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
- the model class's `get_init_context` (`modeling_utils.py`): the contexts it returns patch process-wide state
  (`PreTrainedModel.tie_weights`, `torch.linspace`, the default dtype) on entry and restore it on exit, so ranks
  building their models at the same time would restore each other's patches. A lock makes them build one at a time.

Outside the tested range these may change; `tpaudit._compat.check_versions` guards the range for the whole tool.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

__all__ = ["threaded_world", "init_rank", "leave_rank", "wake_ranks", "serialized_init", "TERMINATED"]

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


@contextlib.contextmanager
def serialized_init(model_class) -> Iterator[None]:
    """Make `model_class.from_pretrained` build one model at a time across threads, and put back the process-wide
    state its init contexts patch (`PreTrainedModel.tie_weights` / `init_weights`, `torch.linspace`, the default
    dtype) when the block ends.

    transformers 5.23 `PreTrainedModel.get_init_context` returns context managers that patch globals; the lock is
    entered before them and left after them.
    """
    import torch
    from transformers import PreTrainedModel

    lock = threading.Lock()
    original = model_class.__dict__.get("get_init_context")
    bound = model_class.get_init_context

    @contextlib.contextmanager
    def held():
        with lock:
            yield

    def get_init_context(cls, *args, **kwargs):
        return [held(), *bound(*args, **kwargs)]

    saved = (PreTrainedModel.tie_weights, PreTrainedModel.init_weights, torch.linspace, torch.get_default_dtype())
    model_class.get_init_context = classmethod(get_init_context)
    try:
        yield
    finally:
        if original is None:
            del model_class.get_init_context
        else:
            model_class.get_init_context = original
        PreTrainedModel.tie_weights, PreTrainedModel.init_weights, torch.linspace = saved[:3]
        torch.set_default_dtype(saved[3])

