"""MPS's per-client memory limit: what a GPU holds for a worker that is an MPS client.

Under MPS (the device plugin's `sharing.mps`, or an MPS daemon on the host) a client may
allocate only its pinned device memory limit on each GPU, whatever NVML says of the card:
NVML reports the physical card. The limit reaches a client through the control daemon
(`set_default_device_pinned_mem_limit`, which CUDA's own memory info shows and NVML does not)
or through the client's environment, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (NVIDIA's MPS
documentation, "Environment Variables"): `<device ordinal>=<amount>` pairs separated by
commas, an amount in bytes or with a unit (`0=1G,1=512M`), which can only lower the
daemon's. Where the variable is set, a GPU's memory for trialq's plan is its limit on that
GPU (`limited`), so budgets, caps and the `GpuBeat` routing reads are what a slot really has.

An ordinal is CUDA's, among the devices the client sees; trialq takes it as NVML's index of
the card (`Gpu.index`), which it is in a pod (its GPUs are 0..n-1 to both) and wherever
`CUDA_DEVICE_ORDER=PCI_BUS_ID` (trialq's images set it). Each trial process sees its own
devices from ordinal 0 (`CUDA_VISIBLE_DEVICES` names them), so its share carries the
variable again, counted from 0, at its own budget plus one context, never the worker's whole
limit (`GpuShare.mps_limit_bytes`): NVIDIA's per-client cap, which the driver enforces on
every allocation of the trial's process, by any library, as CUDA's out-of-memory error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from trialq.errors import UsageError
from trialq.gpu.inventory import Gpu

PINNED_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
"""Where an MPS client finds its control daemon (the device plugin's `sharing.mps` sets it in
the pod; a host's daemon defaults to /tmp/nvidia-mps, unset)."""

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_PAIR = re.compile(r"\s*(\d+)\s*=\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", re.IGNORECASE)


def pinned_limits(text: str | None) -> dict[int, int]:
    """The limit on each device ordinal, in bytes; empty where the variable is unset."""
    limits: dict[int, int] = {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        found = _PAIR.fullmatch(pair)
        if found is None:
            raise UsageError(f"{PINNED_LIMIT}={text!r}: {pair.strip()!r} is not ORDINAL=AMOUNT")
        ordinal, amount, unit = found.groups()
        limits[int(ordinal)] = int(float(amount) * _UNITS[unit.upper()])
    return limits


def limited(gpus: tuple[Gpu, ...], text: str | None) -> tuple[Gpu, ...]:
    """The GPUs with each one's memory no more than its pinned limit, where one is set."""
    limits = pinned_limits(text)
    return tuple(
        dataclasses.replace(gpu, total_bytes=min(gpu.total_bytes, limits[gpu.index]))
        if gpu.index in limits
        else gpu
        for gpu in gpus
    )


def served(env: Mapping[str, str]) -> bool:
    """Whether the environment says an MPS daemon serves this process's GPUs: a pinned limit
    or a pipe directory of its own. A host's daemon on its default pipe leaves neither (its
    default limit still shows in CUDA's total, which a measured plan plans within)."""
    return bool(env.get(PINNED_LIMIT, "").strip() or env.get(PIPE_DIRECTORY, "").strip())


def limit_text(limit_bytes: int, devices: int) -> str:
    """The variable's value for a client seeing `devices` devices, each under the limit."""
    return ",".join(f"{ordinal}={limit_bytes // _UNITS['M']}M" for ordinal in range(devices))
