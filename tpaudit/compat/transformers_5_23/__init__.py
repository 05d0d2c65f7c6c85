"""The seam for the transformers 5.23 release line: 5.23.x and 5.24.x, whose private functions tpaudit calls have
the same source (checked function by function; `tests/test_compat_pins.py` holds the copies to the originals).

Every call into transformers' (and torch's) internals that tpaudit makes lives in this class. A later release line
that changes one of them is a subclass in a module of its own that overrides the methods that differ, and a line in
`compat/__init__.py`'s `LINES`.

The class is cut in two mixins by stage: `meta_model.MetaModelSeam` (configs, model classes, quantizers, the meta
model) and `plans.PlanSeam` (checkpoint names, the load, plans, sharding); this module keeps the capability
probes, the library quieting and the load-time guard.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from .. import _torch, loading
from .. import parity as _parity
from .._probe import Capability, missing
from .._types import DistConfig, Model
from .._seam import require_seam
from ..styles import StyleVocabulary
from .meta_model import MetaModelSeam
from .plans import PlanSeam


@require_seam
class Transformers523(MetaModelSeam, PlanSeam):
    """transformers 5.23.x / 5.24.x on torch 2.13-2.14.

    Attributes:
        versions (`dict[str, str]`): `transformers`, `torch`, `huggingface_hub` as installed.
        tested (`bool`): the installed transformers is a release this line was tested with.
    """

    LINE: ClassVar[str] = "5.23"
    TESTED_RELEASES: ClassVar[tuple[str, ...]] = ("5.23", "5.24")     # major.minor the test suite runs against in CI
    SUPPORTED: ClassVar[str] = ">=5.23,<5.25"
    STYLES: ClassVar[type[StyleVocabulary]] = StyleVocabulary  # the style names this line registers, grouped by meaning
    CAPABILITIES: ClassVar[tuple[Capability, ...]] = (
        Capability("transformers", "PreTrainedModel._resolve_parallel_plans", ("distributed_config",)),
        Capability("transformers", "PreTrainedModel.maybe_distribute_model",
                   ("model", "distributed_config", "mesh_manager")),
        Capability("transformers", "PreTrainedModel.init_parallel_plans"),
        Capability("transformers", "PreTrainedModel.get_init_context",
                   ("dtype", "is_quantized", "_is_ds_init_called", "allow_all_kernels")),
        Capability("transformers", "PreTrainedModel._get_dtype_plan", ("dtype",)),
        Capability("transformers.core_model_loading", "rename_source_key",
                   ("source_key", "weight_renamings", "weight_converters", "base_model_prefix", "meta_state_dict")),
        Capability("transformers.core_model_loading", "WeightRenaming"),
        Capability("transformers.core_model_loading", "WeightConverter"),
        Capability("transformers.core_model_loading", "build_glob_alternation", ("globs",)),
        Capability("transformers.conversion_mapping", "get_model_conversion_mapping",
                   ("model", "key_mapping", "hf_quantizer")),
        Capability("transformers.distributed", "DistributedConfig"),
        Capability("transformers.distributed.utils", "TransformersDeviceMesh", ("dense_mesh", "expert_mesh")),
        Capability("transformers.distributed.parallel_utils", "ALL_PARALLEL_STYLES"),
        Capability("transformers.distributed.parallel_utils", "_get_parameter_plan", ("parameter_name", "plan")),
        Capability("transformers.distributed.parallel_utils", "replace_layer_number_by_wildcard", ("name",)),
        Capability("transformers.distributed.tensor_parallel", "get_kv_heads_per_rank",
                   ("tp_plan", "num_heads", "tp_size")),
        Capability("transformers.distributed.expert_parallel", "apply_expert_parallelism"),
        Capability("transformers.distributed.mixin", "DistributedMixin.maybe_distribute_model"),
        Capability("transformers.configuration_utils", "get_head_shapes", ("config",)),
        Capability("transformers.modeling_utils", "str_to_torch_dtype"),
        Capability("transformers.quantizers.auto", "AutoHfQuantizer.from_config", ("quantization_config",)),
        Capability("transformers.utils.generic", "ContextManagers"),
        Capability("transformers.initialization", "no_init_weights"),
        Capability("transformers.models.auto.configuration_auto", "CONFIG_MAPPING"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
        Capability("transformers.models.auto.modeling_auto", "MODEL_MAPPING_NAMES"),
    ) + _torch.CAPABILITIES + loading.CAPABILITIES + _parity.CAPABILITIES

    versions: dict[str, str]
    tested: bool

    def __init__(self, versions: dict[str, str], tested: bool):
        self.versions = dict(versions)
        self.tested = tested

    @classmethod
    def probe(cls) -> list[str]:
        """What the installed libraries lack of what this line calls (empty when it can run)."""
        return missing(cls.CAPABILITIES)

    # ------------------------------------------------------------------------------------------------------------------
    # Quiet libraries
    # ------------------------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Silence transformers' and torch's own warnings and logs while tpaudit simulates (it reports those facts)."""
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        torch_logger = logging.getLogger("torch")
        torch_level = torch_logger.level
        torch_logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            torch_logger.setLevel(torch_level)

    # ------------------------------------------------------------------------------------------------------------------
    # The load-time guard
    # ------------------------------------------------------------------------------------------------------------------
    def install_distribute_hook(self, hook: Callable[..., Any]) -> object:
        """Make `from_pretrained` call `hook(original, cls, model, distributed_config, mesh_manager)` at the step
        between building the model and reading weights. Returns a token for `remove_distribute_hook`.

        transformers 5.23 has no public hook there: this wraps `DistributedMixin.maybe_distribute_model`."""
        from transformers.distributed.mixin import DistributedMixin

        original = DistributedMixin.__dict__["maybe_distribute_model"]

        def wrapped(cls: Any, model: Any, distributed_config: Any, mesh_manager: Any) -> Any:
            return hook(original.__func__, cls, model, distributed_config, mesh_manager)

        DistributedMixin.maybe_distribute_model = classmethod(wrapped)
        return original

    def remove_distribute_hook(self, token: object) -> None:
        from transformers.distributed.mixin import DistributedMixin

        DistributedMixin.maybe_distribute_model = token

    def model_payload(self, model: Model, distributed_config: DistConfig | None = None) -> dict[str, Any]:
        """What it takes to rebuild a user's `model` on the meta device in another process: its config, class,
        dtype, merged plans and the `DistributedConfig` plan overrides (JSON-serialisable)."""
        import json

        overrides = {}
        if distributed_config is not None:
            for key in ("tp_plan", "ep_plan"):
                value = getattr(distributed_config, key, None)
                if isinstance(value, dict):
                    overrides[key] = dict(value)
        param = next(iter(model.parameters()), None)
        return {
            "config": json.loads(model.config.to_json_string(use_diff=False)),
            "architecture": type(model).__name__,
            "dtype": str(param.dtype).removeprefix("torch.") if param is not None else None,
            "tp_plan": dict(model.tp_plan or {}),
            "ep_plan": dict(model.ep_plan or {}),
            "overrides": overrides,
        }

    def deprecated_styles(self) -> dict[str, str]:
        """Styles the installed release still applies but has announced the removal of, with its advice (none in
        5.23/5.24)."""
        return {}

    def removed_styles(self) -> dict[str, str]:
        """Styles earlier releases registered that the installed one refuses, with why (none in 5.23/5.24)."""
        return {}

    def is_pretrained_model(self, obj: object) -> bool:
        """`isinstance(obj, transformers.PreTrainedModel)`."""
        from transformers import PreTrainedModel

        return isinstance(obj, PreTrainedModel)

    def is_pretrained_config(self, obj: object) -> bool:
        """`isinstance(obj, transformers.PretrainedConfig)`."""
        from transformers import PretrainedConfig

        return isinstance(obj, PretrainedConfig)

    def sizes_of(self, distributed_config: DistConfig) -> tuple[int, int]:
        """`(tp_size, ep_size)` of a `DistributedConfig`."""
        return int(distributed_config.tp_size), int(distributed_config.ep_size)
