"""`trial.save_artifact`: the worker stores the file, the driver links it to the trial, and
Optuna's own `get_all_artifact_meta` / `download_artifact` find it (optuna-dashboard too)."""

from __future__ import annotations

import io
import json
import wsgiref.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration

ARTIFACT_STUDY = """
    [study]
    name = "artifacts"
    n_trials = 2
    max_in_flight = 1
    sampler = "grid"
    [trial]
    entrypoint = "trials:saves_an_artifact"
    timeout_s = 60
    [space.x]
    type = "categorical"
    choices = [1.5, 2.5]
    """


def _run_artifact_study(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    root: Path | str,
    env: dict[str, str] | None = None,
) -> optuna.Study:
    """Two trials on a real worker, each storing one CSV with `trial.save_artifact`."""
    start_workers(1, extra_env={"TRIALQ_ARTIFACT_ROOT": str(root), **(env or {})})
    spec = write_spec(ARTIFACT_STUDY)
    submit_study(spec, Settings(broker_url=redis_url), None, None, None, show_progress=False)
    storage = f"sqlite:///{spec.parent / 'artifacts.db'}"
    return optuna.load_study(study_name="artifacts", storage=storage)


def test_an_artifact_saved_by_a_trial_is_listed_for_that_trial(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    tmp_path: Path,
) -> None:
    root = tmp_path / "artifacts"
    study = _run_artifact_study(write_spec, start_workers, redis_url, root)
    store = FileSystemArtifactStore(str(root))
    for trial in study.trials:
        (meta,) = get_all_artifact_meta(trial, storage=study._storage)
        assert meta.filename == f"curve-{trial.number}.csv" and meta.mimetype == "text/csv"
        target = tmp_path / f"downloaded-{trial.number}.csv"
        download_artifact(artifact_store=store, artifact_id=meta.artifact_id, file_path=str(target))
        assert target.read_text() == f"step,value\n0,{trial.params['x']}\n"


def _get(app: Callable[..., Any], path: str) -> tuple[str, dict[str, str], bytes]:
    """One GET through a WSGI app, as a browser would send it: status, headers, body."""
    environ: dict[str, Any] = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    wsgiref.util.setup_testing_defaults(environ)
    environ["wsgi.input"] = io.BytesIO()
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=status, headers=dict(headers))

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return started["status"], started["headers"], body


def test_optuna_dashboard_lists_and_serves_a_trials_artifact(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    tmp_path: Path,
) -> None:
    """What the dashboard's trial page does: list the trial's artifacts from the study's
    detail, then download one from `/artifacts/<study_id>/<trial_id>/<artifact_id>`."""
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    root = tmp_path / "artifacts"
    study = _run_artifact_study(write_spec, start_workers, redis_url, root)
    app = optuna_dashboard.wsgi(study._storage, artifact_store=FileSystemArtifactStore(str(root)))
    status, _, body = _get(app, f"/api/studies/{study._study_id}")
    assert status.startswith("200"), body
    listed = {t["number"]: t for t in json.loads(body)["trials"]}
    assert sorted(listed) == [0, 1]
    for trial in study.trials:
        (artifact,) = listed[trial.number]["artifacts"]
        assert artifact["filename"] == f"curve-{trial.number}.csv"
        url = f"/artifacts/{study._study_id}/{trial._trial_id}/{artifact['artifact_id']}"
        status, headers, body = _get(app, url)
        assert status.startswith("200"), body
        assert headers["Content-Type"] == "text/csv"
        assert body == f"step,value\n0,{trial.params['x']}\n".encode()


S3_BUCKET = "trialq-artifacts"
S3_ENV = {  # what a worker reaching an S3-compatible store (MinIO, ...) is given
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server, in a thread of this process on a free port, with the bucket made:
    the workers (subprocesses) reach it over HTTP as they would reach MinIO."""
    pytest.importorskip("boto3")
    server_module = pytest.importorskip("moto.server")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for name, value in S3_ENV.items():  # for this process's own boto3 clients
            monkeypatch.setenv(name, value)
        _s3_client(endpoint).create_bucket(Bucket=S3_BUCKET)
        yield endpoint
    finally:
        server.stop()


def _s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def test_an_artifact_saved_to_an_s3_bucket_is_read_back_by_optuna(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    """`TRIALQ_ARTIFACT_ROOT=s3://BUCKET`: the trial process uploads with boto3, to moto's S3
    server (the S3 stand-in, found through `AWS_ENDPOINT_URL` and dummy credentials as MinIO
    would be); Optuna's own `get_all_artifact_meta` lists the file and `download_artifact`
    through a `Boto3ArtifactStore` of the bucket returns its bytes."""
    from optuna.artifacts import Boto3ArtifactStore

    env = {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}
    study = _run_artifact_study(write_spec, start_workers, redis_url, f"s3://{S3_BUCKET}", env=env)
    client = _s3_client(s3_endpoint)
    store = Boto3ArtifactStore(S3_BUCKET, client=client)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    keys = set()
    for trial in study.trials:
        (meta,) = get_all_artifact_meta(trial, storage=study._storage)
        assert meta.filename == f"curve-{trial.number}.csv" and meta.mimetype == "text/csv"
        target = tmp_path / f"downloaded-{trial.number}.csv"
        download_artifact(artifact_store=store, artifact_id=meta.artifact_id, file_path=str(target))
        assert target.read_text() == f"step,value\n0,{trial.params['x']}\n"
        keys.add(meta.artifact_id)
    listed = client.list_objects_v2(Bucket=S3_BUCKET)["Contents"]
    assert {item["Key"] for item in listed} == keys  # at the bucket's top, as Optuna keeps them
