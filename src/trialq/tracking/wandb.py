"""Weights & Biases: one W&B run per trial, grouped by the study's name (`group`), its params
the run's config, its reports logged by step (`reports/<objective>`), its final values,
metrics and how it ran in the run's summary.

A trial's run id is made from the study's name and the trial's number, so W&B itself keeps
one run for it; a run this machine already wrote (its folder under `<dir>/wandb/` ends with
the id) is not written again, so a restarted driver does not log a trial's history twice.
`mode = "offline"` (or `WANDB_MODE=offline`) needs no network: `wandb sync` uploads later.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import wandb

from trialq.tracking.base import StudyInfo, ToldTrial
from trialq.tracking.config import WandbTracking


class WandbTracker:
    """W&B runs grouped by study (docs/tracking.md)."""

    name = "wandb"

    def __init__(self, config: WandbTracking) -> None:
        self._config = config
        self._study: StudyInfo | None = None
        self.dir = Path()

    def start(self, study: StudyInfo) -> None:
        self._study = study
        self.dir = study.spec_folder / (self._config.dir or ".")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.dir, os.W_OK | os.R_OK):  # W&B's own test, before it falls back
            raise PermissionError(
                f"dir {self.dir} cannot be written (W&B would write the runs into a temporary "
                "folder instead): give [tracking.wandb] dir a folder this user can write"
            )

    def record(self, trial: ToldTrial) -> None:
        assert self._study is not None
        run_id = run_id_of(self._study.name, trial.number)
        if self._written(run_id):
            return
        study, config = self._study, self._config
        run = wandb.init(
            project=config.project or study.name, entity=config.entity, mode=config.mode,
            dir=str(self.dir), id=run_id, resume="allow", group=study.name, job_type="trial",
            name=f"trial-{trial.number}", config=dict(trial.params), reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )  # fmt: skip
        try:
            objective = study.metric_names[0]
            for step, value in sorted(trial.intermediate.items()):
                run.log({f"reports/{objective}": value}, step=step)
            run.summary.update(_summary(trial, study))
        finally:
            run.finish(exit_code=0 if trial.state != "FAIL" else 1)

    def close(self) -> None:
        """Every trial's run was finished as it was written."""

    def _written(self, run_id: str) -> bool:
        return any((self.dir / "wandb").glob(f"*run-*-{run_id}"))


def run_id_of(study: str, number: int) -> str:
    """A W&B run id for the trial: letters, digits, `-` and `_`, unique per study."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", study)[:40]
    digest = hashlib.sha1(study.encode()).hexdigest()[:8]
    return f"{safe}-{digest}-{number}"


def _summary(trial: ToldTrial, study: StudyInfo) -> dict[str, Any]:
    finals: dict[str, Any] = {**trial.final_metrics, **trial.objective_values(study)}
    finals |= {f"trialq/{key}": value for key, value in trial.summary_attrs.items()}
    return finals


def tracker(config: WandbTracking) -> WandbTracker:
    """The registry's entry (`trialq.tracking.registry`)."""
    return WandbTracker(config)
