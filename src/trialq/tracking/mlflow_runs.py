"""How a study's MLflow runs are named and found: their tags, the experiment, and a trial's
nested run found by tags before one is made. The one copy both sides use: the driver's
tracker (`tracking/mlflow.py`) and a trial process's `trial.mlflow_run_id`
(`trial/mlflow_run.py`), so that whichever comes first makes the run and the other finds it.

MLflow is never imported here: each caller hands in the `MlflowClient` it made.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trialq.tracking.config import MlflowTracking

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

STUDY_TAG = "trialq.study"
TRIAL_TAG = "trialq.trial_number"
ROLE_TAG = "trialq.role"
RECORDED_TAG = "trialq.recorded"
"""Set once a trial's run holds everything: a run without it is written again."""
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"

_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"


def tracking_uri(config: MlflowTracking, spec_folder: Path) -> str | None:
    """The configured tracking URI with a relative file or SQLite path made the spec
    folder's; None: MLflow's own default."""
    uri = config.tracking_uri
    if uri is None:
        return None
    for prefix in ("sqlite:///", "file:"):
        rest = uri.removeprefix(prefix)
        if uri.startswith(prefix) and not rest.startswith("/"):
            return f"{prefix}{(spec_folder / rest).resolve()}"
    return uri


@contextmanager
def first_use(uri: str) -> Iterator[None]:
    """Held around a process's first use of the store at `uri`. MLflow makes a new SQLite
    store's tables (or migrates an old one's) on its first use in each process, and two
    processes doing it at once break each other (`table ... already exists`): the driver
    and a study's first trials come at once. An exclusive `flock` on the database's folder
    (no file of its own to leave behind) lets one do it while the others wait; nothing for a
    server or a file store."""
    folder = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else None
    if folder is None or not folder.is_dir():
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, made if absent. Made at once by another process (the driver
    and a trial, two trials): the one it made."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception as exc:
        if getattr(exc, "error_code", None) != _ALREADY_EXISTS:
            raise
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def find_run(client: MlflowClient, experiment: str, study: str, tags: dict[str, str]) -> str | None:
    """The study's run with these tags, if one was made; of two made at once, the first
    made, so that both makers settle on the same one."""
    wanted = {STUDY_TAG: study, **tags}
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in wanted.items())
    runs = client.search_runs(
        [experiment], filter_string=query, max_results=1, order_by=["attributes.start_time ASC"]
    )
    return str(runs[0].info.run_id) if runs else None


def trial_tags(number: int) -> dict[str, str]:
    """What finds a trial's nested run."""
    return {ROLE_TAG: "trial", TRIAL_TAG: str(number)}


def trial_run(
    client: MlflowClient,
    experiment: str,
    study: str,
    number: int,
    parent: str | None,
    start_time: int | None = None,
) -> str:
    """The trial's nested run, found by its tags or made (under `parent`, where the study's
    run is known). Made at once by two processes (two attempts of one trial running), the
    first made is kept and the other deleted: a trial has one run."""
    tags = trial_tags(number)
    found = find_run(client, experiment, study, tags)
    if found is not None:
        return found
    made = {STUDY_TAG: study, **tags, RUN_NAME_TAG: f"trial-{number}"}
    if parent:
        made[PARENT_TAG] = parent
    run_id = str(client.create_run(experiment, start_time=start_time, tags=made).info.run_id)
    first = find_run(client, experiment, study, tags)
    if first is not None and first != run_id:
        client.delete_run(run_id)
        return first
    return run_id
