"""The evidence stage: the sharded forward of a small model as evidence about a plan (the parity check).

    source -> build -> plan -> shard -> **evidence** -> checks -> report

A static view of a plan cannot tell how a model's forward uses a projection's output: a fused QKV laid out per head
(`[head][q, k, v]`, GPT-NeoX's `query_key_value`) survives a plain `colwise` split when `tp_size` divides the heads,
one laid out as blocks (`[Q_all | K_all | V_all]`) does not, and nothing in either's name says which. The parity
check runs the forward instead:

1. **A small model of the same architecture** (`small_model.py`): the same model class and plan, the same head and
   KV-head counts and layer-type pattern, one decoder layer of each kind, every width scaled down so that each split
   keeps its structure. Config attribute names: `tpaudit/metamodel/vocabulary.py`, the one table of them.
2. **The suspects** (`trace.py`, `split_outputs`): one traced forward of the small unsharded model records where the
   model cuts a split output into parts.
3. **The sharded run** (`ranks.py`, `run.py`: `run_parity`): the small model loaded with `from_pretrained(dir,
   distributed_config=DistributedConfig(...))` on `tp_size` threaded ranks, every module's output compared with the
   unsharded model's.
4. **Blame** (`blame.py`): the first divergence attributed to the split that caused it.
5. **One verdict per rule** (`isolate.py`): re-runs with each failing rule repaired until the forward matches, so
   that every rule is an error, cleared, or not exercised with the reason.

`stage.gather` decides when an option of a report needs the check, and reads and writes the parity verdict cache
(`cache.py`); `worker.py` runs the check in a subprocess when this process cannot host the ranks. Every torch and
transformers internal this package touches goes through `tpaudit.compat` (`compat.parity`); its results are the data
model's `ParityResult`, `SplitOutput` and `RuleVerdict`; the findings they are evidence for are written by
`tpaudit.checks.layout` (`parity_findings`).

Example:

```python
from tpaudit.evidence import run_parity, split_outputs
from tpaudit.checks.layout import parity_findings
from tpaudit.compat.styles import COLWISE

split_outputs(config, "Phi3ForCausalLM", {"layers.*.self_attn.qkv_proj": COLWISE}, tp_size=4)  # suspects
result = run_parity(config, "Phi3ForCausalLM", plan, tp_size=2, checkpoint_keys=names)  # never raises
parity_findings(result)                                                                  # [Finding(TPA501, ...)]
```
"""

from __future__ import annotations

from ..model import ParityResult, RuleVerdict, SplitOutput
from .run import run_parity
from .small_model import (KERNELS, EP_KERNELS, SmallModel, build_small_model, shrink_config,  # noqa: F401
                          small_model)
from .stage import candidates, gather, skipped
from .trace import split_outputs

__all__ = ["gather", "skipped", "candidates", "run_parity", "split_outputs", "small_model", "build_small_model",
           "shrink_config", "SmallModel", "ParityResult", "RuleVerdict", "SplitOutput"]
