"""Settings read from the environment, with passwords from files (Compose and Kubernetes
secrets) instead of environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import sqlalchemy

from trialq.cli import trialq_main
from trialq.settings import Settings


def test_passwords_from_files_go_into_the_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cr/t@x:y\n")  # characters a URL must quote; the newline a file has
    monkeypatch.setenv("TRIALQ_BROKER_URL", "redis://redis:6379/0")
    monkeypatch.setenv("TRIALQ_BROKER_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("TRIALQ_STORAGE", "postgresql+psycopg2://trialq@postgres:5432/optuna")
    monkeypatch.setenv("TRIALQ_STORAGE_PASSWORD_FILE", str(secret))
    settings = Settings()
    assert redis.connection.parse_url(settings.broker_url)["password"] == "s3cr/t@x:y"
    assert redis.connection.parse_url(settings.backend_url)["password"] == "s3cr/t@x:y"
    storage = sqlalchemy.make_url(settings.storage or "")
    assert (storage.username, storage.password, storage.host) == (
        "trialq",
        "s3cr/t@x:y",
        "postgres",
    )


def test_an_unreadable_password_file_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRIALQ_BROKER_PASSWORD_FILE", "/nonexistent/password")
    assert trialq_main(["health"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: environment: settings: TRIALQ_BROKER_PASSWORD_FILE: cannot read "
        "/nonexistent/password: No such file or directory"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [("s3://trials", "s3://trials"), ("s3://trials/", "s3://trials"), ("/mnt/a", Path("/mnt/a"))],
)
def test_the_artifact_root_is_a_folder_or_a_bucket(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: object
) -> None:
    monkeypatch.setenv("TRIALQ_ARTIFACT_ROOT", value)
    assert Settings().artifact_root == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (
            "s3://trials/runs",
            "only a bucket, s3://BUCKET (Optuna's Boto3ArtifactStore keeps each artifact at the bucket's top, so no prefix)",
        ),
        ("s3://", "no bucket (s3://BUCKET)"),
        ("gs://trials", "a folder or s3://BUCKET, not gs://"),
    ],
)
def test_an_artifact_root_with_a_prefix_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, why: str
) -> None:
    monkeypatch.setenv("TRIALQ_ARTIFACT_ROOT", value)
    assert trialq_main(["health"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: environment: artifact_root: TRIALQ_ARTIFACT_ROOT: {value!r}: {why}"


def test_a_broker_flag_gets_the_password_of_the_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--broker URL` with TRIALQ_BROKER_PASSWORD_FILE set: the password goes into the flag's
    URL as into TRIALQ_BROKER_URL's (it was left out: AuthenticationError)."""
    import subprocess

    from waiting import wait_for_redis

    from trialq.local import free_port, redis_server_binary

    password = "fl4g-pa55word"
    port = free_port()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--requirepass", password],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_redis(redis.Redis.from_url(f"redis://:{password}@127.0.0.1:{port}/0"))
        secret = tmp_path / "password"
        secret.write_text(password + "\n")
        monkeypatch.setenv("TRIALQ_BROKER_PASSWORD_FILE", str(secret))

        code = trialq_main(["health", "--broker", f"redis://127.0.0.1:{port}/0"])

        err = capsys.readouterr().err
        assert code == 1 and "no worker heartbeat on this host" in err, err
        assert password not in err
    finally:
        server.terminate()
        server.wait()


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["health", "--broker", "notaurl"], {}),
        (["health", "--broker", "http://user:pa55@host/0"], {}),
        (["health"], {"TRIALQ_BROKER_URL": "localhost:6379"}),
    ],
)
def test_a_broker_url_that_is_not_redis_is_one_line_and_exit_2(
    argv: list[str],
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    code = trialq_main(argv)

    err = capsys.readouterr().err
    assert code == 2 and "is not a Redis URL" in err, err
    assert len(err.strip().splitlines()) == 1 and "pa55" not in err, err
