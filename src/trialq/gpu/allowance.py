"""How much a trial may hold on a GPU outside its framework's allocator: the GPU memory
guard's allowance, per framework, in one table.

A trial process holds, besides what its framework's allocator reserved, its CUDA context and
what libraries load into it lazily, none of it through the allocator: cuDNN's and cuBLASLt's
handles and engines (more under `cudnn.benchmark`), Triton and `torch.compile` kernels, XLA's
compiled modules, NCCL's buffers. The guard (`trialq.trial.gpu_guard`) kills a trial only where
NVML names its processes and what they hold outside the allocator passes the context the
plan set aside (`GpuShare.context_bytes`, or the assumed reserve) plus this table's figure for
its framework (docs/oom.md, "The GPU memory guard").

The figures are READ FROM SOURCES, NOT MEASURED: PyTorch's context measured 621 MiB on an H100
(driver 580, 2026-11-27) before any convolution or GEMM, against a bare context of 526 MiB;
JAX's 561 MiB; the rest is each library's documented workspaces and lazily loaded kernels,
given room to spare, since a kill here is of a trial its framework's cap is holding. The
device command (benchmarks/gpu_enforcement.sh) records each trial's real memory outside the
allocator against these figures; they are to be replaced by its measurements.
"""

from __future__ import annotations

from collections.abc import Mapping

MIB = 2**20

OUTSIDE_ALLOCATOR_MB: Mapping[str, int] = {
    "torch": 1024,
    "jax": 512,
    "tensorflow": 1024,
}
"""Per framework (`trialq.wire.frameworks` names), beyond the context the plan sets aside:
PyTorch's cuDNN engines, cuBLASLt, Triton/`torch.compile` kernels and NCCL; XLA's modules
and cuDNN/cuBLAS handles (its autotuning scratch goes through its allocator); TensorFlow's
cuDNN/cuBLAS handles and its own kernels."""

NO_FRAMEWORK_MB = 256
"""For a trial with no framework (CuPy alone, a CUDA extension): its library handles."""


def allowance_bytes(framework: str | None, context_bytes: int) -> int:
    """What a trial of `framework` (None: none) may hold outside its allocator on a GPU
    where one context is `context_bytes`."""
    extra = OUTSIDE_ALLOCATOR_MB.get(framework or "", NO_FRAMEWORK_MB)
    return context_bytes + extra * MIB
