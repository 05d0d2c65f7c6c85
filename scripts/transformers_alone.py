#!/usr/bin/env python3
"""A lower bound for any `check` that resolves plans with transformers' own code: transformers alone, doing the least
of what a check must do, with no tpaudit code at all.

It imports what every check imports (torch, transformers, `modeling_utils`, transformers' TP code), reads the model's
`config.json` out of a tpaudit snapshot (the first megabyte of it: no tensor rows), and builds the model on the meta
device with the class `from_pretrained` would pick. It does not read the checkpoint's tensor listing, map names,
resolve or apply the plan, or check anything, and it switches the garbage collector off, so a real check can only
take longer. `scripts/benchmark.py` times it as a whole process next to the yardstick import.

With `--no-teardown` it ends as tpaudit's command line does (`os._exit` once its output is flushed): the
interpreter's shutdown, which frees every object one by one (about 1 s here, with the collector off), is then not
part of it. #24's goals are ratios to the floor without that flag, as the issue measured it; the benchmark prints the
ratios to this stricter floor beside them.

Usage:
    python scripts/transformers_alone.py [--no-teardown] fixtures/deepseek-v3.snapshot.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys


def main(path: str) -> int:
    import gc

    gc.disable()  # no collection at all: looser than any setting a tool could choose (tpaudit raises the threshold)
    import torch
    import transformers
    import transformers.distributed.tensor_parallel  # noqa: F401 - every check imports the TP code
    import transformers.modeling_utils  # noqa: F401 - and the loading machinery
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    with gzip.open(path, "rt", encoding="utf-8") as f:
        head = f.read(1 << 20)
    start = head.index('"config":') + len('"config":')
    config_dict, _ = json.JSONDecoder().raw_decode(head, start + len(head[start:]) - len(head[start:].lstrip()))
    config_dict = dict(config_dict)
    config_dict.pop("quantization_config", None)  # no quantizer: less work, still a lower bound
    config = AutoConfig.for_model(**config_dict)
    architecture = (config_dict.get("architectures") or [None])[0]
    cls = getattr(transformers, architecture, None) if architecture else None
    for auto in (AutoModelForImageTextToText, AutoModelForCausalLM):
        if cls is None:
            cls = auto._model_mapping.get(type(config), None)
    with torch.device("meta"):
        model = cls._from_config(config)
    print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters on the meta device")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    at_once = args[:1] == ["--no-teardown"]
    args = args[1:] if at_once else args
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if args in (["-h"], ["--help"]) else 2)
    code = main(args[0])
    if at_once:
        import os

        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)
