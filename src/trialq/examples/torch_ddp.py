"""A PyTorch DDP trial: the trial starts one rank process per GPU of its share, they train a
small MLP on scikit-learn's digits together, and rank 0 hands the metric back to the trial.

The ranks are plain subprocesses of the trial's process (`python -m trialq.examples.torch_ddp
RANK WORLD FOLDER`), so they are members of the trial's process group and end with the
trial, whether it returns, raises, runs out of time or is killed
(`trialq.trial.process_group`). What would not hold, and why this example does not use it:
`torchrun` starts each rank in a session of its own (`start_new_session`), out of the
trial's group.

`nccl` where the trial has GPUs, one rank per GPU of its share (`[trial] gpus = 2` on a
worker started with `--gpus-per-trial 2`), each rank capped at the trial's budget at its own
CUDA start (`cap_this_process`: a rank inherits the trial's `GpuShare` through its
environment); `gloo` on the CPU, with 2 ranks (or the param `world_size`). The trial's own
process never touches CUDA (it counts its GPUs from its share), so each GPU carries one CUDA
context, its rank's, as the worker's budget allows for. The ranks meet through a file in
the trial's temporary folder (no port to pick), where the trial also leaves the data and its
params and rank 0 its metrics. With the param `rank_pids_file`, each rank appends
`<rank> <pid>` to that file after its first step (the tests watch the ranks through it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trialq.examples.digits import load_digits
from trialq.gpu.share import GpuShare
from trialq.trial.context import TrialContext
from trialq.trial.frameworks.pytorch import cap_this_process, cuda_built

CPU_RANKS = 2
SEED = 0
POLL_S = 0.1
DATA, PARAMS, METRICS, STORE = "digits.npz", "params.json", "metrics.json", "store"


def train(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Train with `params` on every rank; rank 0's validation accuracy and loss."""
    world = _world_size(params)
    with tempfile.TemporaryDirectory(prefix="trialq-ddp-") as name:
        folder = Path(name)
        _write_inputs(folder, params)
        ranks = [_start_rank(rank, world, folder) for rank in range(world)]
        _wait_for(ranks)
        metrics: dict[str, float] = json.loads((folder / METRICS).read_text())
    trial.report(metrics["val_accuracy"], int(params.get("steps", 30)))
    return metrics


def _world_size(params: dict[str, Any]) -> int:
    """One rank per GPU of the trial's share, else `world_size` or 2 on the CPU; read from
    the environment, not CUDA: this process starts no context of its own."""
    share = GpuShare.from_environment(os.environ)
    if share is not None and cuda_built():
        return len(share.devices)
    return int(params.get("world_size", CPU_RANKS))


def _write_inputs(folder: Path, params: dict[str, Any]) -> None:
    """The digits (loaded here once: no rank imports scikit-learn) and the params."""
    import numpy as np

    (x_train, y_train), (x_val, y_val) = load_digits()
    np.savez(folder / DATA, x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val)
    (folder / PARAMS).write_text(json.dumps(params))


def _start_rank(rank: int, world: int, folder: Path) -> subprocess.Popen[bytes]:
    """A rank in the trial's own process group (no new session: it ends with the trial)."""
    command = [sys.executable, "-m", __name__, str(rank), str(world), str(folder)]
    return subprocess.Popen(command)


def _wait_for(ranks: list[subprocess.Popen[bytes]]) -> None:
    """Until every rank exited; the first that failed fails the trial (trialq then ends the
    others with the trial's process group)."""
    while True:
        codes = [rank.poll() for rank in ranks]
        failed = [(index, code) for index, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            raise RuntimeError(f"DDP rank {failed[0][0]} exited with {failed[0][1]}")
        if all(code == 0 for code in codes):
            return
        time.sleep(POLL_S)


def run_rank(rank: int, world: int, folder: Path) -> None:
    """One rank: join the group, train on its shard, and (rank 0) write the metrics."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    params = json.loads((folder / PARAMS).read_text())
    device = _device(rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = f"file://{folder / STORE}"
    dist.init_process_group(backend, init_method=store, rank=rank, world_size=world)
    try:
        (x_train, y_train), (x_val, y_val) = _tensors(folder / DATA, device)
        ids = [rank] if device.type == "cuda" else None
        model = DistributedDataParallel(build_model(params).to(device), device_ids=ids)
        _fit(model, params, x_train[rank::world], y_train[rank::world], rank)
        if rank == 0:
            _write_metrics(folder, _evaluate(model.module, x_val, y_val, world))
    finally:
        dist.destroy_process_group()


def _device(rank: int) -> Any:
    """`cuda:<rank>` capped at the trial's budget (set when `set_device` starts CUDA), or
    the CPU."""
    import torch

    if GpuShare.from_environment(os.environ) is None or not torch.cuda.is_available():
        torch.set_num_threads(1)  # the ranks share the CPU: one thread each
        return torch.device("cpu")
    cap_this_process()  # the share inherited from the trial's process
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def build_model(params: dict[str, Any]) -> Any:
    """64 pixels -> hidden -> 10 logits; the same initial weights on every rank."""
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    hidden = int(params.get("hidden", 32))
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _tensors(path: Path, device: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The digits the trial saved, as float32 images and int64 labels on `device`."""
    import numpy as np
    import torch

    saved = np.load(path)

    def pair(x: str, y: str) -> tuple[Any, Any]:
        images = torch.as_tensor(saved[x], dtype=torch.float32).to(device)
        return images, torch.as_tensor(saved[y], dtype=torch.int64).to(device)

    return pair("x_train", "y_train"), pair("x_val", "y_val")


def _fit(model: Any, params: dict[str, Any], x: Any, y: Any, rank: int) -> None:
    """`steps` SGD steps on this rank's shard, `batch_size` each; DDP averages gradients."""
    import torch
    from torch.nn import functional

    optimizer = torch.optim.SGD(model.parameters(), lr=float(params.get("learning_rate", 0.5)))
    batch = int(params.get("batch_size", 64))
    generator = torch.Generator().manual_seed(SEED + rank)
    for step in range(int(params.get("steps", 30))):
        chosen = torch.randint(0, len(x), (batch,), generator=generator).to(x.device)
        optimizer.zero_grad(set_to_none=True)
        loss: Any = functional.cross_entropy(model(x[chosen]), y[chosen])
        loss.backward()
        optimizer.step()
        if step == 0 and params.get("rank_pids_file"):
            _record_pid(str(params["rank_pids_file"]), rank)


def _record_pid(path: str, rank: int) -> None:
    """Append `<rank> <pid>` in one write (O_APPEND: the ranks' lines never interleave)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, f"{rank} {os.getpid()}\n".encode())
    finally:
        os.close(descriptor)


def _evaluate(model: Any, x: Any, y: Any, world: int) -> dict[str, float]:
    import torch
    from torch.nn import functional

    with torch.no_grad():
        logits = model(x)
        loss = float(functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(dim=1) == y).float().mean())
    return {"val_accuracy": accuracy, "val_loss": loss, "world_size": float(world)}


def _write_metrics(folder: Path, metrics: dict[str, float]) -> None:
    """Whole or not at all: the trial reads it once every rank has exited."""
    partial = folder / f"{METRICS}.tmp"
    partial.write_text(json.dumps(metrics))
    partial.replace(folder / METRICS)


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
