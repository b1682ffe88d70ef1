"""A FAKE of the allocation interposer (HAMi-core's libvgpu.so) for fake trials: never the
real library, which hooks libcuda and needs a GPU.

It answers as HAMi-core does (its `multiprocess_memory_limit.c`, read, not run): a process
whose environment carries `CUDA_DEVICE_MEMORY_LIMIT_<i>` for its visible device i may hold no
more than that there, counted over every allocation it makes, through any library; one past
it is refused with CUDA_ERROR_OUT_OF_MEMORY, which a framework raises as its own OOM (the
text below is PyTorch's). Within the limit, the memory is held on the fake GPU
(`fake_nvml.hold`)."""

from __future__ import annotations

import os

import fake_nvml

_held: dict[str, int] = {"allocator": 0, "outside": 0}


def allocate(allocator_bytes: int = 0, outside_bytes: int = 0) -> None:
    """Take `allocator_bytes` more through the fake framework and `outside_bytes` beside it,
    unless the interposer's limit on device 0 refuses it."""
    limit = os.environ.get("CUDA_DEVICE_MEMORY_LIMIT_0")
    total = _held["allocator"] + _held["outside"] + allocator_bytes + outside_bytes
    if limit is not None and total > int(limit):
        raise RuntimeError(
            f"CUDA out of memory. Tried to allocate {(allocator_bytes + outside_bytes) >> 20} "
            "MiB (FAKE interposer: CUDA_ERROR_OUT_OF_MEMORY)"
        )
    _held["allocator"] += allocator_bytes
    _held["outside"] += outside_bytes
    fake_nvml.hold(_held["allocator"], outside=_held["outside"])
