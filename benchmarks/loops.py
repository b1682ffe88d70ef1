"""The two approaches without a queue, each run in a process of its own by the benchmark.

- `inprocess`: an Optuna ask/tell loop that calls every trial in its own process (the
  failure trialq replaces: TensorFlow never hands memory back, so the process swells);
- `seed`: the same loop starting a `multiprocessing.Process` per trial (fork, Linux's default
  start method), as trialq's seed did.

    python -m benchmarks.loops MODE WORKLOAD PARAMS.json OUT.json

writes, for every trial, when it ended, how long the call took, which process ran it and the
loop process's resident memory after it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import optuna
import psutil

from benchmarks.params import SPACE
from benchmarks.trials import WORKLOADS


def run_inprocess(workload: str, params: dict[str, Any]) -> dict[str, Any]:
    """Call the trial here."""
    started = time.perf_counter()
    value = WORKLOADS[workload](params)
    return {"value": value, "duration": time.perf_counter() - started, "pid": os.getpid()}


def run_seed(workload: str, params: dict[str, Any]) -> dict[str, Any]:
    """Call the trial in a child process of its own and wait for it to exit."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=_child, args=(workload, params, sender))
    child.start()
    sender.close()
    answer: dict[str, Any] = receiver.recv()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"trial process exited with {child.exitcode}")
    return answer


def _child(workload: str, params: dict[str, Any], sender: Connection) -> None:
    sender.send(run_inprocess(workload, params))


def main(mode: str, workload: str, params_path: Path, out_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    all_params = json.loads(params_path.read_text())
    run = {"inprocess": run_inprocess, "seed": run_seed}[mode]
    study = optuna.create_study()
    for params in all_params:
        study.enqueue_trial(params)
    me = psutil.Process()
    records = []
    started = time.time()
    for number in range(len(all_params)):
        trial = study.ask(SPACE)
        answer = run(workload, trial.params)
        study.tell(trial, 0.0)
        records.append(
            {
                "number": number,
                "end": time.time(),
                "duration": answer["duration"],
                "pid": answer["pid"],
                "rss": me.memory_info().rss,
            }
        )
    out = {"started": started, "loop_pid": os.getpid(), "records": records}
    out_path.write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
