"""tpaudit: lint tensor-parallel sharding plans of Hugging Face transformers models before anyone rents GPUs.

Python API (imports torch and transformers on first use, not at `import tpaudit`):

- `tpaudit.check(model, tp_size=..., ep_size=1, plan=None, revision=None) -> Report`
- `tpaudit.batch(models, tp_sizes=..., ep_sizes=(1,), jobs=1, executor="local") -> Iterator[BatchResult]`: many
  models at several sizes, cached and parallel (see `tpaudit.run.batch` for the cache and executors).
- `tpaudit.strict_tp(...)`: a context manager / decorator that makes `from_pretrained(..., distributed_config=...)`
  raise `ReplicatedWeightsError` before any weight is read when the plan would leave weights replicated.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (ExitCode, ReplicatedWeightsError, TpauditError)  # noqa: E402  (light: no torch)

__all__ = ["check", "batch", "strict_tp", "Report", "Finding", "BatchResult", "TpauditError", "ReplicatedWeightsError",
           "ExitCode", "__version__"]


def __getattr__(name: str):
    if name == "check":
        from .api import check

        return check
    if name in ("batch", "BatchResult"):
        from .run import batch as batching

        return getattr(batching, name)
    if name == "strict_tp":
        from .verify.guard import strict_tp

        return strict_tp
    if name in ("Report", "Finding"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'tpaudit' has no attribute {name!r}")
