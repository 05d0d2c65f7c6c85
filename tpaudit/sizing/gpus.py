"""GPU presets for `tpaudit size --gpu NAME`: the memory a process can see, in bytes.

Values are `memory.total` as `nvidia-smi` (or `rocm-smi` for AMD) reports it for the common SKUs, in MiB, which is
below the marketing size (an "80GB" H100 shows 81,559 MiB = 79.6 GiB). Pass `--gpu-memory` for anything else.
"""

from __future__ import annotations

MIB = 1 << 20

GPU_MEMORY_MIB: dict[str, int] = {
    "H100-80GB": 81_559,
    "H100-94GB": 95_830,
    "H200": 143_771,
    "H20": 97_871,
    "B200": 183_359,
    "A100-80GB": 81_920,
    "A100-40GB": 40_960,
    "A10G": 23_028,
    "L40S": 46_068,
    "L4": 23_034,
    "V100-32GB": 32_768,
    "V100-16GB": 16_384,
    "T4": 15_360,
    "RTX4090": 24_564,
    "MI300X": 196_592,
}


def gpu_memory_bytes(name: str) -> int:
    """Bytes of the preset `name` (case-insensitive, `-`/`_` ignored).

    Raises:
        KeyError: unknown preset (the message lists the known ones).
    """
    def norm(s: str) -> str:
        return s.upper().replace("_", "").replace("-", "").replace(" ", "")

    for key, mib in GPU_MEMORY_MIB.items():
        if norm(key) == norm(name):
            return mib * MIB
    raise KeyError(name)
