"""Trial seconds lost to preemptions, with and without checkpoints, in one run.

    python -m benchmarks.preemption [--trials 4] [--steps 20] [--step-s 0.1] [--preemptions 3]

Two studies of the same trials (`benchmarks.trials.stepper`: `steps` steps of `step_s`
seconds) on two real local workers (embedded Redis), one saving its step in
`trial.checkpoint_dir` and resuming from it, one starting over. A preemptor raises the stop
notice of each running attempt once it has run `--after` of a trial's length, up to
`--preemptions` times per trial: the same flag a worker sets on SIGTERM, without restarting
the worker. Every step any attempt runs is logged, so the seconds lost are the step-seconds run
beyond one uninterrupted run of every trial. Prints a table; writes
benchmarks/last_preemption.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from benchmarks.overhead import ROOT, environment, tree_path
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.submit import submit_study
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.heartbeat import running_trials

OUT = ROOT / "benchmarks" / "last_preemption.json"


class Preemptor(threading.Thread):
    """Stops each running attempt after `after_s`, up to `per_trial` times per trial."""

    def __init__(self, broker_url: str, study: str, after_s: float, per_trial: int) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(broker_url)
        self.study, self.after_s, self.per_trial = study, after_s, per_trial
        self.done = threading.Event()
        self.stopped: set[tuple[int, int]] = set()

    def run(self) -> None:
        channel = ReportChannel(self.client)
        while not self.done.is_set():
            per_trial = Counter(number for number, _ in self.stopped)
            for running in running_trials(self.client):
                attempt = (running.number, running.attempt)
                if (
                    running.study == self.study
                    and attempt not in self.stopped
                    and per_trial[running.number] < self.per_trial
                    and time.time() - running.started_at >= self.after_s
                ):
                    channel.request_stop(TrialAddress(self.study, *attempt))
                    self.stopped.add(attempt)
            time.sleep(0.02)


def run_arm(
    cluster: LocalCluster, folder: Path, checkpoint: bool, args: argparse.Namespace
) -> dict[str, Any]:
    name = f"preemption-{'with' if checkpoint else 'without'}"
    log = folder / f"{name}.steps"
    log.touch()
    spec = folder / f"{name}.toml"
    spec.write_text(
        textwrap.dedent(f"""
        [study]
        name = "{name}"
        n_trials = {args.trials}
        max_in_flight = 2
        sampler = "random"
        pruner = "none"
        storage = "sqlite:///{folder / name}.db"
        [trial]
        entrypoint = "benchmarks.trials:stepper"
        timeout_s = 600
        max_preemptions = {args.preemptions + 1}
        [space.x]
        type = "float"
        low = 0
        high = 1
        """)
        + "".join(
            f'[space.{key}]\ntype = "categorical"\nchoices = [{value}]\n'
            for key, value in {
                "checkpoint": int(checkpoint),
                "steps": args.steps,
                "step_s": args.step_s,
                "log": json.dumps(str(log)),
            }.items()
        )
    )
    trial_s = args.steps * args.step_s
    preemptor = Preemptor(cluster.broker_url, name, args.after * trial_s, args.preemptions)
    preemptor.start()
    started = time.monotonic()
    summary = submit_study(spec, Settings(broker_url=cluster.broker_url), None, None, None, False)
    wall_s = time.monotonic() - started
    preemptor.done.set()
    steps_run = len(log.read_text().splitlines())
    needed = args.trials * args.steps
    return {
        "checkpoints": checkpoint,
        "trials": args.trials,
        "complete": summary["n_complete"],
        "preemptions": sum(t["user_attrs"].get("preemptions", 0) for t in summary["trials"]),
        "trial_s_needed": round(needed * args.step_s, 3),
        "trial_s_run": round(steps_run * args.step_s, 3),
        "trial_s_lost": round((steps_run - needed) * args.step_s, 3),
        "wall_s": round(wall_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.preemption", description=__doc__)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--preemptions", type=int, default=3, help="per trial")
    parser.add_argument("--after", type=float, default=0.4, help="of a trial's length")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trialq-preemption-") as tmp:
        folder = Path(tmp)
        env = {
            "TRIALQ_CHECKPOINT_ROOT": str(folder / "checkpoints"),
            "PYTHONPATH": tree_path(os.environ.get("PYTHONPATH")),
        }
        with LocalCluster(2, "gpu", ("benchmarks",), extra_env=env) as cluster:
            arms = [run_arm(cluster, folder, checkpoint, args) for checkpoint in (True, False)]
    print("checkpoints | trials | preemptions | trial s needed | trial s run | lost | wall s")
    print("------------|--------|-------------|----------------|-------------|------|-------")
    for arm in arms:
        print(
            f"{'yes' if arm['checkpoints'] else 'no':<12}| {arm['trials']:>6} | "
            f"{arm['preemptions']:>11} | {arm['trial_s_needed']:>14.1f} | "
            f"{arm['trial_s_run']:>11.1f} | {arm['trial_s_lost']:>4.1f} | {arm['wall_s']:>6.1f}"
        )
    OUT.write_text(json.dumps({"args": vars(args), "arms": arms, **environment()}, indent=1))
    print(f"written: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
