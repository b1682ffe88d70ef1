"""GPU budgets on a real GPU: is each enforced where the memory is taken, and does the guard
never kill a healthy trial? One section a call, each added to one record as it ends.

    python -m benchmarks.gpu_enforcement SECTION --out DIR [--broker URL]

SECTION is one of:
- `facts`: MIG and compute mode, NVML's total against CUDA's (`cuMemGetInfo`, trialq's start
  probe), whether `nvidia-cuda-mps-control` and `nvcc` exist, the versions;
- `bypass`: 4 trials a GPU; one allocates past its budget through a second library beside
  PyTorch (CuPy, else CUDA's driver API), three well-behaved: it must end by the enforcement
  (`oom` where MPS or the interposer refuses the allocation, else `gpu_guard`), the three `ok`;
- `resnet`: 4 ResNet-50 trials a GPU in bf16 with `cudnn.benchmark` and one `torch.compile`d
  block, their batch fitted by `fit_batch_size`: `ok` with a size, no `gpu_guard`, and each
  one's memory outside PyTorch's allocator recorded against the allowance
  (`trialq.gpu.allowance`);
- `pidns`: the same worker in a PID namespace of its own (`unshare --pid --fork --mount-proc`:
  `other-pids` on real NVML), a neighbour outside it holding most of the card: a trial
  crowded out must be told neighbour-caused (`oom_caused_by_neighbour`), never its own `oom`;
- `mps`: where `nvidia-cuda-mps-control` exists, a daemon of this command's own (its own
  pipe folder), the `bypass` trial against each trial's pinned limit.

Without a GPU it prints one line and exits 3, writing nothing. It kills only the processes
it started (each worker in a session of its own, by its process group). The record is
`DIR/enforcement.json` (device, date, each section's figures); the workers' logs go to
`DIR/workers.log`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("facts", "bypass", "resnet", "pidns", "mps")
NO_GPU = "gpu_enforcement: no NVIDIA GPU here ({why}); nothing measured, nothing written"
TRIALS = "benchmarks.gpu_enforcement_trials"
MiB = 2**20
WAIT_S = 240.0
KILL_ROUNDS = 10
"""Rounds of `_end` at most: each kills what its session holds, then waits for it."""


def nvml_or_none() -> str | None:
    """Why there is no GPU to measure, or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, _DriverNotLoaded
        return f"NVML: {type(exc).__name__}: {exc}".strip()
    return None if count else "NVML: no device"


def facts() -> dict[str, Any]:
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    found: dict[str, Any] = {"name": _text(pynvml.nvmlDeviceGetName(handle))}
    for key, query in (
        ("mig_mode", lambda: pynvml.nvmlDeviceGetMigMode(handle)[0]),
        ("compute_mode", lambda: pynvml.nvmlDeviceGetComputeMode(handle)),
        ("driver", lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
        ("nvml_total_mib", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total / MiB),
    ):
        try:
            found[key] = query()
        except pynvml.NVMLError as exc:
            found[key] = f"NVMLError: {exc}"
    probe = subprocess.run(
        [sys.executable, "-m", "trialq.gpu.context_probe", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found["cuda_probe"] = probe.stdout.strip() or probe.stderr.strip()[-500:]
    for tool in ("nvidia-cuda-mps-control", "nvcc"):
        found[tool] = shutil.which(tool)
    found["versions"] = _versions()
    return found


def bypass(broker: str, logs: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    requests = [("bypass", {"sleep_s": 3.0})] + [
        ("bystander", {"hold_mb": 512, "sleep_s": 8.0})
    ] * 3
    with worker(broker, logs, "bypass", per_gpu=4, env=env) as queue:
        results = run(broker, queue, requests, framework="torch")
    over, *rest = results
    return {
        "over_budget": _said(over),
        "neighbours": [_said(r) for r in rest],
        "enforced": over.get("outcome") in ("oom", "gpu_guard"),
        "neighbours_ok": all(r.get("outcome") == "ok" for r in rest),
    }


def resnet(broker: str, logs: Path) -> dict[str, Any]:
    with worker(broker, logs, "resnet", per_gpu=4) as queue:
        results = run(broker, queue, [("resnet", {"start": 32, "steps": 5})] * 4, "torch")
    return {
        "trials": [_said(r) for r in results],
        "guard_kills": sum(r.get("outcome") == "gpu_guard" for r in results),
        "all_ok": all(r.get("outcome") == "ok" for r in results),
    }


def pidns(broker: str, logs: Path) -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    with worker(broker, logs, "pidns", per_gpu=4, prefix=prefix) as queue:
        alone = run(broker, queue, [("bystander", {"hold_mb": 512, "sleep_s": 2.0})], "torch")
        with neighbour(int(total * 0.85)):
            crowded = run(broker, queue, [("crowded", {})], "torch")
    ready = [line for line in (logs / "pidns.log").read_text().splitlines() if " ready: " in line]
    return {
        "ready_line": ready[-1] if ready else None,
        "alone": _said(alone[0]),
        "crowded": _said(crowded[0]),
        "told_neighbour_caused": bool(crowded[0].get("oom_caused_by_neighbour")),
    }


def mps(broker: str, logs: Path) -> dict[str, Any]:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return {"skipped": "no nvidia-cuda-mps-control on this machine"}
    folder = Path(tempfile.mkdtemp(prefix="trialq-mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder)}
    (folder / "pipe").mkdir()
    started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True)
    if started.returncode != 0:
        return {"skipped": f"the MPS daemon did not start: {started.stderr.decode()[-300:]}"}
    try:
        return {"daemon": str(folder), **bypass(broker, logs, env=env)}
    finally:
        subprocess.run([control], input=b"quit\n", env={**os.environ, **env}, timeout=30)


@contextmanager
def worker(
    broker: str,
    logs: Path,
    name: str,
    per_gpu: int,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> Iterator[str]:
    """A `trialq worker --gpus 0` of this command's own, in a session of its own; its queue.
    Ended by its process group, which holds nothing this command did not start."""
    queue = f"enforce-{name}-{os.getpid()}"
    command = [*(prefix or []), sys.executable, "-m", "trialq", "worker", "--queue", queue,
               "--hostname", f"{queue}@bench", "--gpus", "0", "--trials-per-gpu", str(per_gpu),
               "--loglevel", "INFO"]  # fmt: skip
    environment = {
        **os.environ,
        "TRIALQ_BROKER_URL": broker, "TRIALQ_RESULT_BACKEND": broker,
        "TRIALQ_ALLOWED_MODULES": "benchmarks", "TRIALQ_PRELOAD": "torch",
        "TRIALQ_GPU_UNATTRIBUTED_WAIT_S": "2",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }  # fmt: skip
    with (logs / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        _wait_for_heartbeat(broker, f"{queue}@bench", process)
        yield queue
    finally:
        _end(process)


@contextmanager
def neighbour(n_bytes: int) -> Iterator[None]:
    """A process outside every worker holding `n_bytes` of GPU 0 through PyTorch."""
    code = (
        "import sys, time, torch; x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, "
        "device='cuda'); print('held', flush=True); time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(n_bytes)], stdout=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == b"held"
        yield
    finally:
        _end(process)


def run(
    broker: str,
    queue: str,
    requests: list[tuple[str, dict[str, Any]]],
    framework: str,
    module: str = TRIALS,
) -> list[dict[str, Any]]:
    """Each request sent as a trial on `queue`; their results, in order (bounded)."""
    from trialq._celery.dispatcher import CeleryDispatcher
    from trialq.settings import Settings
    from trialq.wire.dispatch import TaskPhase
    from trialq.wire.entrypoint import Entrypoint
    from trialq.wire.messages import TrialRequest

    dispatcher = CeleryDispatcher(Settings(broker_url=broker))
    ids = [
        dispatcher.submit(TrialRequest(
            study=f"enforce-{queue}", number=number, attempt=1, params=params,
            entrypoint=Entrypoint.parse(f"{module}:{entry}"), timeout_s=180, hard_limit_s=200,
            framework=framework,  # type: ignore[arg-type]
        ), queue)
        for number, (entry, params) in enumerate(requests)
    ]  # fmt: skip
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        statuses = dispatcher.statuses(ids)
        if all(s.phase in (TaskPhase.FINISHED, TaskPhase.FAILED) for s in statuses.values()):
            return [_result(statuses[task]) for task in ids]
        time.sleep(0.5)
    return [_result(s) for s in dispatcher.statuses(ids).values()]


def _result(status: Any) -> dict[str, Any]:
    if status.result is not None:
        return dict(status.result.model_dump(mode="json"))
    return {"outcome": None, "phase": str(status.phase), "error": status.detail}


def _said(result: dict[str, Any]) -> dict[str, Any]:
    keep = ("outcome", "error", "metrics", "gpu_guard", "gpu_accounting", "gpu_accounting_note",
            "oom_caused_by_neighbour", "fitted_batch_size", "gpu_budget_bytes",
            "gpu_process_peak_bytes", "gpu_context_bytes", "gpu_cap_note")  # fmt: skip
    return {key: result.get(key) for key in keep if key in result}


def _wait_for_heartbeat(broker: str, name: str, process: subprocess.Popen[bytes]) -> None:
    import redis

    from trialq.wire import heartbeat

    client = redis.Redis.from_url(broker)
    deadline = time.monotonic() + 120
    while not heartbeat.is_alive(client, name):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker {name} did not start (exit {process.poll()})")
        time.sleep(0.2)


def _end(process: subprocess.Popen[bytes]) -> None:
    """Kill a process this command started and every process of its session (each started in
    a session of its own, which a trial's own process group stays in), by their ids: nothing
    else. Rounds until none is left: the pool forks a new child while the first are killed,
    and one killed parent's children are found by their session, not as its children."""
    import psutil

    for _ in range(KILL_ROUNDS):
        members = [p for p in psutil.process_iter() if _session_of(p.pid) == process.pid]
        if not members:
            break
        for member in members:
            with suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGKILL)
        psutil.wait_procs(members, timeout=5)
    process.wait()


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone already
        return None


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in ("torch", "torchvision", "cupy-cuda12x", "jax", "nvidia-ml-py", "celery"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def record(out: Path, section: str, figures: dict[str, Any]) -> None:
    """Add a section to `out/enforcement.json` (written whole each time: a run cut short keeps
    every section that ended)."""
    path = out / "enforcement.json"
    whole = json.loads(path.read_text()) if path.is_file() else {}
    whole.setdefault("date", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    whole.setdefault("sections", {})[section] = figures
    path.write_text(json.dumps(whole, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_enforcement")
    parser.add_argument("section", choices=SECTIONS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args(argv)
    why = nvml_or_none()
    if why is not None:
        print(NO_GPU.format(why=why), file=sys.stderr)
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="trialq-enforce-"))
    started = time.monotonic()
    try:
        if args.section == "facts":
            figures = facts()
        else:
            figures = {"bypass": bypass, "resnet": resnet, "pidns": pidns, "mps": mps}[
                args.section
            ](args.broker, logs)
    finally:
        with (args.out / "workers.log").open("a") as joined:
            for log in sorted(logs.glob("*.log")):
                joined.write(f"== {args.section}: {log.name}\n{log.read_text()[-20000:]}\n")
    figures["seconds"] = round(time.monotonic() - started, 1)
    record(args.out, args.section, figures)
    print(json.dumps({args.section: figures}, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
