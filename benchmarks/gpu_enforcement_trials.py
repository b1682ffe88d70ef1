"""The trials `python -m benchmarks.gpu_enforcement` runs on a real GPU (entrypoints
`benchmarks.gpu_enforcement_trials:*`). Each runs in a worker's trial process, under its
budget (`TRIALQ_GPU_BUDGET_BYTES`), and returns what it saw of its own memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from typing import Any

MiB = 2**20
CHUNK = 64 * MiB


def _own_nvml_bytes() -> int | None:
    """NVML's figure of this process on its first GPU (None: NVML names it not)."""
    import pynvml

    pynvml.nvmlInit()
    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    with_mps: list[Any] = []
    with contextlib.suppress(pynvml.NVMLError):
        with_mps = list(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
    found = [p.usedGpuMemory for p in [*listed, *with_mps] if p.pid == os.getpid()]
    return int(found[0]) if found and found[0] is not None else None


def outside_allocator() -> dict[str, float]:
    """What this trial holds outside PyTorch's caching allocator now, where NVML names it."""
    import torch

    reserved = torch.cuda.memory_reserved(0)
    own = _own_nvml_bytes()
    figures = {"reserved_mib": reserved / MiB}
    if own is not None:
        figures["nvml_own_mib"] = own / MiB
        figures["outside_allocator_mib"] = (own - reserved) / MiB
    return figures


def bystander(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """Holds `hold_mb` through PyTorch for `sleep_s`: a well-behaved neighbour."""
    import torch

    block = torch.empty(int(params.get("hold_mb", 512)) * MiB, dtype=torch.uint8, device="cuda")
    time.sleep(float(params.get("sleep_s", 10.0)))
    figures = outside_allocator()
    del block
    return {"value": 1.0, **figures}


def bypass(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """PyTorch holds a quarter of its budget; then a second library (CuPy where installed,
    else CUDA's driver API by ctypes) allocates beside it, chunk by chunk, up to twice the
    budget. Enforced where memory is taken, an allocation fails (the error PyTorch's and
    CuPy's OOM name); else the guard kills it; else it returns how far it got."""
    import torch

    budget = int(os.environ["TRIALQ_GPU_BUDGET_BYTES"])
    held = torch.empty(budget // 4, dtype=torch.uint8, device="cuda")
    allocate = _cupy_allocator() or _driver_allocator()
    blocks: list[Any] = []
    for _ in range(2 * budget // CHUNK):
        blocks.append(allocate(CHUNK))
    time.sleep(float(params.get("sleep_s", 3.0)))  # the guard samples every 0.05 s
    del held
    return {"value": 1.0, "bypassed_mib": len(blocks) * CHUNK / MiB}


def _cupy_allocator() -> Any:
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        return None
    return lambda n: cupy.cuda.alloc(n)  # raises cupy's OutOfMemoryError


def _driver_allocator() -> Any:
    """cuMemAlloc in PyTorch's (primary) context: CUDA_ERROR_OUT_OF_MEMORY becomes the
    message PyTorch's own OOM carries, so trialq reads it as one."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    libcuda.cuCtxGetCurrent(ctypes.byref(context))
    if not context.value:
        device = ctypes.c_int()
        libcuda.cuDeviceGet(ctypes.byref(device), 0)
        libcuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
        libcuda.cuCtxSetCurrent(context)

    def allocate(n_bytes: int) -> int:
        pointer = ctypes.c_uint64()
        status = libcuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(n_bytes))
        if status == 2:  # CUDA_ERROR_OUT_OF_MEMORY
            raise RuntimeError(f"CUDA out of memory. cuMemAlloc of {n_bytes // MiB} MiB refused")
        if status != 0:
            raise RuntimeError(f"cuMemAlloc failed with CUresult {status}")
        return pointer.value

    return allocate


def crowded(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """Allocates its budget through PyTorch, chunk by chunk, while a neighbour outside its
    worker holds most of the card: its OOM comes within its share (told neighbour-caused)."""
    import torch

    budget = int(os.environ["TRIALQ_GPU_BUDGET_BYTES"])
    blocks = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(budget // CHUNK)]
    return {"value": 1.0, "held_mib": len(blocks) * CHUNK / MiB}


def resnet(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """ResNet-50 in bf16 with `cudnn.benchmark` and one `torch.compile`d block, its batch
    size fitted to the trial's budget (`fit_batch_size`: PyTorch's OOMs, halving); then what
    it holds outside the allocator, against the guard's allowance."""
    import torch

    torch.backends.cudnn.benchmark = True
    model = _resnet50().to("cuda", dtype=torch.bfloat16)
    model.layer4 = torch.compile(model.layer4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: int) -> None:
        images = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        labels = torch.randint(0, 1000, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    size = trial.fit_batch_size(step, start=int(params.get("start", 32)), max=1024)
    for _ in range(int(params.get("steps", 5))):
        step(size)
    return {"value": float(size), "batch": float(size), **outside_allocator()}


def _resnet50() -> Any:
    """torchvision's ResNet-50 where installed, else the same bottleneck stack built here."""
    try:
        from torchvision.models import resnet50

        return resnet50()
    except ImportError:
        return _bottleneck_resnet50()


def _bottleneck_resnet50() -> Any:
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inner: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(inner, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(), nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out),
            )  # fmt: skip
            self.skip = (
                nn.Identity()
                if stride == 1 and inner == out
                else nn.Sequential(
                    nn.Conv2d(inner, out, 1, stride, bias=False), nn.BatchNorm2d(out)
                )
            )

        def forward(self, x: Any) -> Any:
            return nn.functional.relu(self.body(x) + self.skip(x))

    def layer(inner: int, width: int, blocks: int, stride: int) -> Any:
        parts = [Bottleneck(inner, width, stride)]
        parts += [Bottleneck(width * 4, width, 1) for _ in range(blocks - 1)]
        return nn.Sequential(*parts)

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )  # fmt: skip
            self.layer1 = layer(64, 64, 3, 1)
            self.layer2 = layer(256, 128, 4, 2)
            self.layer3 = layer(512, 256, 6, 2)
            self.layer4 = layer(1024, 512, 3, 2)
            self.fc = nn.Linear(2048, 1000)

        def forward(self, x: Any) -> Any:
            x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
            return self.fc(x.mean((2, 3)))

    return ResNet50()
