"""Tiny trial entrypoints for the tests (rq's habit: one module of small job functions)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from trialq import TrialContext, TrialPruned


def quadratic(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Peak at x = 2; also says which process ran it."""
    return {"score": -((params["x"] - 2.0) ** 2), "pid": float(os.getpid())}


def one_argument(params: dict[str, Any]) -> float:
    """The one-argument form of an entrypoint, returning a bare number."""
    return float(params["x"]) * 10


def raises(params: dict[str, Any], trial: TrialContext) -> float:
    """Fails on a known parameter value, succeeds otherwise."""
    if params["x"] == "bad":
        raise ValueError("refusing x=bad on purpose")
    return 1.0


def sleeps_then_echoes(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Sleeps as long as its param says, then returns a value derived from it.

    Trials sent first sleep longest, so results arrive out of submission order.
    """
    time.sleep(params["sleep_s"])
    return {"echo": params["sleep_s"] * 100 + trial.number * 0.0}


def several_metrics(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Returns two metrics, so a spec without `metric` cannot pick one."""
    return {"a": 1.0, "b": 2.0}


def reports_curve(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports a learning curve; stops when pruned. A curve below x = 0.5 (one a pruner
    should stop) steps slowly, so that a loaded host's driver still decides in time."""
    for step in range(10):
        trial.report(params["x"] * (step + 1), step)
        if trial.should_prune():
            raise TrialPruned()
        time.sleep(0.25 if params["x"] >= 0.5 else 1.0)
    return params["x"] * 10.0


def prunes_as_optuna_code_does(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports two steps, then prunes with Optuna's own exception, as code written for
    Optuna (or an Optuna integration's callback) does."""
    import optuna

    for step in range(2):
        trial.report(params["x"] * step, step)
    raise optuna.TrialPruned(f"pruned at step 1 with {params['x']}")


def not_a_function() -> None:
    """Placeholder so the module has another callable."""


NOT_CALLABLE = 3


def kills_itself_on_first_attempt(params: dict[str, Any], trial: TrialContext) -> float:
    """Dies by SIGKILL on attempt 1 (as the kernel's OOM killer would do), succeeds after."""
    if trial.attempt == 1 and params["x"] == "kill":
        os.kill(os.getpid(), 9)
    return 1.0


def always_kills_itself(params: dict[str, Any], trial: TrialContext) -> float:
    """Dies by SIGKILL on every attempt for one param value: must not loop forever."""
    if params["x"] == "kill":
        os.kill(os.getpid(), 9)
    return 1.0


def sleeps(params: dict[str, Any], trial: TrialContext) -> float:
    """Sleeps `sleep_s` (reporting each half second) and returns the attempt number."""
    deadline = time.monotonic() + params["sleep_s"]
    step = 0
    while time.monotonic() < deadline:
        time.sleep(0.5)
        trial.report(float(step), step)
        step += 1
    return float(trial.attempt)


def allocates(params: dict[str, Any], trial: TrialContext) -> float:
    """Allocates `mb` megabytes in 10 MB pieces, touching every page."""
    held = []
    for _ in range(int(params["mb"]) // 10):
        held.append(bytearray(10 * 1024 * 1024))
        time.sleep(0.01)
    return float(len(held))


def raises_memory_error(params: dict[str, Any], trial: TrialContext) -> float:
    """Python's own out-of-memory error."""
    raise MemoryError("cannot allocate 1 TB")


def ignores_the_soft_limit(params: dict[str, Any], trial: TrialContext) -> float:
    """Swallows the soft time limit and goes on: only the hard limit stops it."""
    for _ in range(600):
        try:
            time.sleep(0.1)
        except Exception:
            continue
    return 0.0


def prints_then_ignores_the_soft_limit(params: dict[str, Any], trial: TrialContext) -> float:
    """Says where it is in its own log, then lives on past its soft limit to its hard kill."""
    print(f"trial {trial.number} reached its slow step", flush=True)
    return ignores_the_soft_limit(params, trial)


def many_metrics(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """A result far larger than any sane limit."""
    return {f"metric_{index}": float(index) for index in range(params["n"])}


def ignores_should_prune(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports a poor curve for a long time and never asks whether to stop."""
    for step in range(200):
        trial.report(params["x"] * (step + 1), step)
        time.sleep(0.1)
    return params["x"] * 200.0


def dies_then_reports_again(params: dict[str, Any], trial: TrialContext) -> float:
    """Attempt 1 reports 100.0 at steps 0-4 and dies; attempt 2 reports 1.0 at steps 0-9."""
    if trial.attempt == 1:
        for step in range(5):
            trial.report(100.0, step)
        time.sleep(1.0)  # let the driver read them before the process dies
        os.kill(os.getpid(), 9)
    for step in range(10):
        trial.report(1.0, step)
        time.sleep(0.1)
    return 1.0


def oom_above(params: dict[str, Any], trial: TrialContext) -> float:
    """Bigger is better, but above a threshold the 'model' does not fit in memory."""
    if params["size"] > 0.6:
        raise MemoryError(f"size {params['size']:.2f} does not fit")
    return float(params["size"])


def oom_above_area(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """A wider and deeper 'model' is more accurate and costs more, until it does not fit."""
    area = params["width"] * params["depth"]
    if area > 0.3:
        raise MemoryError(f"area {area:.2f} does not fit")
    return {"accuracy": area, "cost": params["depth"]}


def two_objectives(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Accuracy up, cost up: a trade-off."""
    return {"accuracy": params["x"], "cost": params["x"] ** 2 + 0.1}


def keras_fit(params: dict[str, Any], trial: TrialContext) -> float:
    """A small real Keras fit on the digits images with trialq's callback."""
    import keras
    from sklearn.datasets import load_digits

    from trialq.keras import TrialCallback

    keras.utils.set_random_seed(0)
    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.SGD(learning_rate=params["lr"]),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = model.fit(
        x, data.target, validation_split=0.2, epochs=15, batch_size=64, verbose=0,
        callbacks=[TrialCallback(trial, monitor="val_accuracy")],
    )  # fmt: skip
    return float(history.history["val_accuracy"][-1])


def allocates_on_gpu(params: dict[str, Any], trial: TrialContext) -> float:
    """Holds about `mib` MiB on the GPU through two seconds of matmuls (GPU tests only)."""
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        raise RuntimeError("TensorFlow sees no GPU")
    with tf.device("GPU:0"):
        block = tf.ones((int(params["mib"]) * 2**18,))  # float32: 2**18 of them in a MiB
        a = tf.random.normal((2048, 2048))
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            a = tf.linalg.matmul(a, a) / 2048.0
        return float(tf.reduce_sum(block).numpy()) + 0.0 * float(tf.reduce_sum(a).numpy())


_GPU_HOLDER = """
import sys, time
import tensorflow as tf
block = tf.ones((int(sys.argv[1]) * 2**18,))
float(block[0].numpy())
open(sys.argv[2], "w").write("ready")
time.sleep(float(sys.argv[3]))
"""


def leaks_gpu_memory_once(params: dict[str, Any], trial: TrialContext) -> float:
    """The first call leaves a process holding GPU memory after its trial; later ones return.

    The holder runs in its own session, as a data loader or server a trial forgot would,
    so it outlives the trial's process; its pid is in the `marker` file for the test to end.
    """
    marker = Path(params["marker"])
    if marker.exists():
        return 0.0
    ready = marker.with_suffix(".ready")
    command = [sys.executable, "-c", _GPU_HOLDER, "1024", str(ready), "300"]
    holder = subprocess.Popen(command, start_new_session=True)
    marker.write_text(str(holder.pid))
    deadline = time.monotonic() + 120
    while not ready.exists():
        if holder.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the GPU holder did not start")
        time.sleep(0.2)
    return 1.0


STAGED_X = (3.0, 2.0, 4.0, -1.0, 0.5, 0.2, 5.0)
"""With `curve_or_raise`, one trial at a time and a median pruner after two complete trials:
ok, ok, ok, error, pruned, pruned, ok."""


def staged_x(trial: Any) -> None:
    """A search space (run in the driver) that gives trial n the value STAGED_X[n]."""
    x = STAGED_X[trial.number % len(STAGED_X)]
    trial.suggest_float("x", x, x)


def curve_or_raise(params: dict[str, Any], trial: TrialContext) -> float:
    """Raises for a negative x, else reports x, 2x, ... slowly enough to be pruned on time
    (a curve below x = 1, one the pruner should stop, the slowest)."""
    if params["x"] < 0:
        raise ValueError(f"refusing x={params['x']} on purpose")
    for step in range(8):
        trial.report(params["x"] * (step + 1), step)
        if trial.should_prune():
            raise TrialPruned()
        # Long enough for a loaded machine's `trialq status` to see it run.
        time.sleep(0.5 if params["x"] >= 1 else 2.0)
    return params["x"] * 8.0


def records_its_process(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Notes its pid in `params["log"]`, and how many earlier trial processes still ran then.

    With `linger_s`, its process takes that long to exit once asked to (as one tearing down a
    large GPU context does); with `device`, it first runs a TensorFlow op, so it holds device
    state (on a GPU build, a CUDA context) that only its exit frees.
    """
    linger_s = float(params.get("linger_s", 0.0))
    if linger_s:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(linger_s), os._exit(0)))
    if params.get("device"):
        import tensorflow as tf

        tf.constant(1.0) + 1.0
    log = Path(str(params["log"]))
    earlier = [int(pid) for pid in log.read_text().split()] if log.exists() else []
    still_running = [pid for pid in earlier if _running(pid)]
    with log.open("a") as out:
        out.write(f"{os.getpid()}\n")
    time.sleep(float(params.get("sleep_s", 0.0)))
    return {
        "pid": float(os.getpid()),
        "earlier_still_running": float(len(still_running)),
        "tensorflow_loaded": float("tensorflow" in sys.modules),
    }


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kills_its_process(params: dict[str, Any], trial: TrialContext) -> float:
    """Dies the way an out-of-memory kill looks from outside: SIGKILL, no result."""
    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0


def starts_children(params: dict[str, Any], trial: TrialContext) -> float:
    """Starts two `sleep 600` children, writes their pids to `params["pids"]`, then ends as
    `params["then"]` says: "return", "raise", or "overrun" (past its time limit; with
    `ignore_limit`, past the soft one too, until the hard limit kills it)."""
    children = [_child(params.get("how", "subprocess")) for _ in range(2)]
    pids = Path(params["pids"])
    pids.with_suffix(".tmp").write_text("".join(f"{child.pid}\n" for child in children))
    pids.with_suffix(".tmp").replace(pids)
    if params["then"] == "raise":
        raise ValueError("a trial that fails after starting children")
    if params["then"] == "overrun":
        deadline = time.monotonic() + 60
        ignored = (BaseException,) if params.get("ignore_limit") else ()
        while time.monotonic() < deadline:
            with contextlib.suppress(*ignored):  # SoftTimeLimitExceeded, with ignore_limit
                time.sleep(0.05)
    return 1.0


class _Forked:
    """A child made with a bare `os.fork()`: a copy of the trial's whole stack."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


def _child(how: str) -> Any:
    """A child that runs 600 s unless ended, made `how`: "subprocess" (`sleep 600`),
    "fork" (a bare `os.fork()` whose child sleeps in Python, then returns into the trial's
    stack as a careless user's would) or "multiprocessing" (a fork-context Process)."""
    if how == "subprocess":
        return subprocess.Popen(["sleep", "600"])
    if how == "multiprocessing":
        import multiprocessing

        process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
        process.start()
        return process
    pid = os.fork()
    if pid == 0:
        time.sleep(600)  # a SIGTERM here raises whatever the trial's handler raises
    return _Forked(pid)


def reports_fifty(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Reports 50 values with no sleep between them, asking should_prune() each time;
    returns how long that loop took."""
    started = time.monotonic()
    for step in range(50):
        trial.report(float(step), step)
        if trial.should_prune():
            raise TrialPruned()
    return {"loop_s": time.monotonic() - started}


def ignores_the_soft_limit_for(params: dict[str, Any], trial: TrialContext) -> float:
    """Swallows SoftTimeLimitExceeded and keeps going until the hard limit kills it."""
    deadline = time.monotonic() + float(params["sleep_s"])
    while time.monotonic() < deadline:
        with contextlib.suppress(BaseException):  # SoftTimeLimitExceeded, on purpose
            time.sleep(0.05)
    return 1.0


def stalls_first(params: dict[str, Any], trial: TrialContext) -> float:
    """Trial 0 runs for two minutes (long enough to be stopped from outside); the rest take
    a moment."""
    time.sleep(120.0 if trial.number == 0 else 0.3)
    return 1.0


def _saved_step(trial: TrialContext) -> int:
    path = trial.checkpoint_dir / "step"
    return int(path.read_text()) if path.exists() else 0


def _save_step(trial: TrialContext, step: int) -> None:
    path = trial.checkpoint_dir / "step"
    path.with_suffix(".tmp").write_text(str(step))
    path.with_suffix(".tmp").replace(path)  # atomic: a kill never leaves half a number


def resumes_from_checkpoint(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Ten steps, each saved in `checkpoint_dir`; SIGKILLed after step 5 on attempt 1 and
    after step 7 on attempt 2. Returns where each attempt started."""
    start = _saved_step(trial)
    with (trial.checkpoint_dir / "starts").open("a") as starts:
        starts.write(f"{trial.attempt} {start}\n")
    for step in range(start, 10):
        time.sleep(0.05)
        _save_step(trial, step + 1)
        trial.report(float(step), step)
        if (trial.attempt, step) in {(1, 5), (2, 7)}:
            os.kill(os.getpid(), signal.SIGKILL)
    lines = (trial.checkpoint_dir / "starts").read_text().split("\n")
    return {"value": 1.0} | {
        f"start_{attempt}": float(first)
        for attempt, first in (line.split() for line in lines if line)
    }


def saves_on_stop(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """`n_steps` steps of `step_s`, saved as it goes; on should_stop() it saves and returns.
    Returns where each attempt started. `ignore_stop`: never asks (killed at the grace)."""
    start = _saved_step(trial)
    with (trial.checkpoint_dir / "starts").open("a") as starts:
        starts.write(f"{trial.attempt} {start}\n")
    for step in range(start, int(params.get("n_steps", 20))):
        time.sleep(float(params.get("step_s", 0.3)))
        _save_step(trial, step + 1)
        trial.report(float(step), step)
        if not params.get("ignore_stop") and trial.should_stop():
            return {"value": -1.0}  # cut short: the attempt is preempted
    lines = (trial.checkpoint_dir / "starts").read_text().split("\n")
    return {"value": 1.0} | {
        f"start_{attempt}": float(first)
        for attempt, first in (line.split() for line in lines if line)
    }


def stops_at_once(params: dict[str, Any], trial: TrialContext) -> float:
    """Raises its own stop notice on every attempt (study `faults`): always preempted."""
    import redis

    from trialq.wire.channel import ReportChannel

    channel = ReportChannel(redis.Redis.from_url(os.environ["TRIALQ_BROKER_URL"]))
    channel.request_stop(trial._address)  # its own attempt's, named by its study's key
    # Asked as a training loop asks, once a step: a flag is as fresh as FLAG_WAIT_S allows,
    # and a loaded host may answer one call late.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if trial.should_stop():
            return 0.0
        time.sleep(0.01)
    return 1.0


def keras_killed_after_epoch_7(params: dict[str, Any], trial: TrialContext) -> float:
    """A tiny fit of 10 epochs on generated data, SIGKILLed after its 7th epoch on attempt 1.
    Every epoch run, on any attempt, is a line in `<epochs_log>/epochs-<backup>.log`."""
    import keras
    import numpy as np

    from trialq.keras import TrialCallback

    backup = bool(params["backup"])
    log = Path(params["epochs_log"]) / f"epochs-{int(backup)}.log"

    class Count(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            with log.open("a") as out:
                out.write(f"{trial.attempt} {epoch}\n")
            if trial.attempt == 1 and epoch == 6:
                os.kill(os.getpid(), signal.SIGKILL)

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile("adam", "mse")
    history = model.fit(
        x, y, epochs=10, batch_size=64, verbose=0,
        callbacks=[TrialCallback(trial, monitor="loss", backup=backup), Count()],
    )  # fmt: skip
    return float(history.history["loss"][-1])


def saves_an_artifact(params: dict[str, Any], trial: TrialContext) -> float:
    """Writes a small CSV and stores it with `trial.save_artifact`."""
    path = trial.checkpoint_dir / f"curve-{trial.number}.csv"
    path.write_text(f"step,value\n0,{params['x']}\n")
    trial.save_artifact(path)
    return float(params["x"])


def saves_and_checks_the_store(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Saves a step in `checkpoint_dir`, asks `should_stop()`, and says how many files the
    store (`params["store"]`, an fsspec URL of the trial's folder) held right after the yes;
    then saves one more file and returns (preempted). Resumes from the saved step."""
    import fsspec

    start = _saved_step(trial)
    _save_step(trial, start + 1)
    if trial.should_stop():
        fs, path = fsspec.core.url_to_fs(params["store"])
        in_store = len(fs.find(path))
        (trial.checkpoint_dir / "after-stop").write_text("saved after the yes")
        return {"value": -1.0, "in_store_at_yes": float(in_store)}
    after_stop = (trial.checkpoint_dir / "after-stop").exists()
    return {"value": float(start), "after_stop_found": float(after_stop)}


def diverges(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """A model that diverged on x="nan": its loss is NaN; every trial's grad_norm is inf."""
    loss = math.nan if params["x"] == "nan" else 0.5
    return {"loss": loss, "grad_norm": math.inf}


def ends_its_own_process(params: dict[str, Any], trial: TrialContext) -> float:
    """Ends its process as params["how"] says, before returning; "return" returns 1.0."""
    how = params["how"]
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "exit0":
        sys.exit(0)
    elif how == "os_exit":
        os._exit(3)
    return 1.0


def fails_the_same_way(params: dict[str, Any], trial: TrialContext) -> float:
    """A bug that no params escape: every trial raises the same error."""
    raise RuntimeError("no module named 'the_users_helper' (a dependency missing everywhere)")


def chatty(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports params["n"] values as fast as it can, one step each."""
    for step in range(int(params["n"])):
        trial.report(float(step), step)
    return 1.0


def uses_multiprocessing(params: dict[str, Any], trial: TrialContext) -> float:
    """Starts a pool of 2 children with `params["method"]` (fork, spawn), as a PyTorch
    DataLoader with workers does, and returns what they computed. Closed and joined: under
    load `Pool.terminate()` (the `with` block's exit) in a trial now and then joined a worker
    it had never signalled, until the time limit (3 runs in 12; not seen outside a worker in
    300; cause not found: docs/reliability.md, "A trial's children")."""
    import multiprocessing

    pool = multiprocessing.get_context(params["method"]).Pool(2)
    try:
        return float(sum(pool.map(abs, [-1, -2, -3])))
    finally:
        pool.close()
        pool.join()


def prints_a_lot(params: dict[str, Any], trial: TrialContext) -> float:
    """Prints `params["mb"]` MB in lines of 1000 characters, half to stdout, half to stderr."""
    line = "y" * 999
    for index in range(int(params["mb"] * 1000)):
        print(line, file=sys.stderr if index % 2 else sys.stdout)
    return 1.0


def reports_past_the_storage(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports at steps 0 and 3 as trials do, and between them what the storage cannot hold:
    a step of `params["step"]` (past 32 or 64 bits), a NaN and an infinity."""
    trial.report(1.0, 0)
    trial.report(2.0, int(params["step"]))
    trial.report(math.nan, 1)
    trial.report(math.inf, 2)
    trial.report(3.0, 3)
    return 1.0


def reports_three(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Reports three steps of a curve peaking at x = 1, then returns it with a second metric
    (what the tracking tests read back)."""
    for step in range(3):
        trial.report(-((params["x"] - 1.0) ** 2) - 0.1 * (2 - step), step)
    return {"score": -((params["x"] - 1.0) ** 2), "aux": 1.5}


def sleeps_or_fails(params: dict[str, Any], trial: TrialContext) -> float:
    """`how = "slow"`: runs a minute (reporting); any other: fails at once, the same way."""
    if params["how"] != "slow":
        raise RuntimeError("this trial fails the same way every time")
    for step in range(120):
        time.sleep(0.5)
        trial.report(float(step), step)
    return 1.0


def prints_and_raises(params: dict[str, Any], trial: TrialContext) -> float:
    """Prints a line to stdout and one to stderr, then fails."""
    print("hello from the trial's print")
    print("a line on the trial's stderr", file=sys.stderr)
    raise ValueError("failed after printing")


def reports_threads(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """The library threads this trial process was given; sleeps so that trials overlap."""
    import torch

    time.sleep(params.get("sleep_s", 0.0))
    return {
        "torch_threads": float(torch.get_num_threads()),
        "omp": float(os.environ["OMP_NUM_THREADS"]),
    }


def logs_into_its_mlflow_run(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Logs a metric and an artifact into its own MLflow run (`trial.mlflow_run_id`), then
    reports and returns as `reports_three` does; trial 0's first attempt dies by SIGKILL
    after logging, so its re-sent attempt logs into the run again."""
    import tempfile

    import mlflow

    with mlflow.start_run(run_id=trial.mlflow_run_id), tempfile.TemporaryDirectory() as folder:
        mlflow.log_metric("user_loss", params["x"] ** 2, step=trial.attempt)
        note = Path(folder) / f"attempt-{trial.attempt}.txt"
        note.write_text(f"trial {trial.number}\n")
        mlflow.log_artifact(str(note))
    if trial.number == 0 and trial.attempt == 1:
        os.kill(os.getpid(), 9)
    return reports_three(params, trial)


def echoes_a_lie(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """What a broker writer would swap an allowed entrypoint for: any params, a value of its
    choosing."""
    return {"echo": -1e9}


# Optuna objectives, unchanged: each takes the trial alone and draws its own params.


def quadratic_objective(trial: Any) -> float:
    x = trial.suggest_float("x", -10, 10)
    return (x - 2) ** 2


def objective_of_optunas_whole_trial_api(trial: Any) -> float:
    """Optuna's older suggest names and user attrs, as objectives written for Optuna use them."""
    x = trial.suggest_uniform("x", -10, 10)
    lr = trial.suggest_loguniform("lr", 1e-4, 1e-1)
    q = trial.suggest_discrete_uniform("q", 0.0, 1.0, 0.25)
    trial.set_user_attr("x_squared", x * x)
    trial.set_user_attr("notes", {"lr": lr, "tags": ["a", "b"]})
    trial.set_user_attr("val_loss_at_start", float("nan"))  # a diverged first epoch, say
    return (x - 2) ** 2 + q


def objective_that_says_what_it_carried(trial: Any) -> dict[str, float]:
    """Which params came with the task (no round trip) before it suggested any."""
    carried = sorted(trial.params)
    x = trial.suggest_float("x", -10, 10)
    n = trial.suggest_int("n", 1, 4)
    return {"value": (x - 2) ** 2 + n, "carried": float(len(carried))}


def conditional_objective(trial: Any) -> float:
    kind = trial.suggest_categorical("kind", ["linear", "tree"])
    if kind == "linear":
        return trial.suggest_float("alpha", 1e-3, 1.0, log=True)
    return float(trial.suggest_int("depth", 1, 6))


def asks_x_two_ways(trial: Any) -> float:
    x = trial.suggest_float("x", 0, 1)
    trial.suggest_categorical("x", ["a", "b"])
    return x


def fast_epochs_objective(trial: Any) -> float:
    """8 epochs in about 0.25 s; a learning curve that a bad `lr` keeps low."""
    import time

    import optuna

    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    quality = 1.0 - abs(math.log10(lr) + 2) / 4
    accuracy = 0.0
    for epoch in range(8):
        time.sleep(0.03)
        accuracy = quality * (1 - 0.5 ** (epoch + 1))
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
