"""`TRIALQ_CHECKPOINT_ROOT` as an fsspec URL: each attempt works in a fresh local folder,
filled from `<root>/<key>/` at its start and put back on a `should_stop()` yes and at its end;
a final outcome removes the stored folder (docs/preemption.md, "Object storage")."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from trial_requests import trial_request

from trialq.gpu.device import FakeDevice
from trialq.settings import Settings
from trialq.trial import checkpoints
from trialq.trial.runner import run_trial
from trialq.wire.channel import TrialAddress
from trialq.wire.messages import Outcome, TrialResult, checkpoint_key


class _StopOnAttempt:
    """A channel whose stop flag is up for the attempts named, and nothing else."""

    def __init__(self, *attempts: int) -> None:
        self.attempts = attempts

    def stop_requested(self, address: TrialAddress) -> bool:
        return address.attempt in self.attempts

    def report(self, address: TrialAddress, step: int, value: float) -> None:
        pass


def _run(root: str, key: str, attempt: int, stop: bool, **request: Any) -> TrialResult:
    channel: Any = _StopOnAttempt(attempt) if stop else _StopOnAttempt()
    trial = trial_request(
        number=3, attempt=attempt, params={"store": f"{root}/{key}"},
        entrypoint="trials:saves_and_checks_the_store",
        timeout_s=10, checkpoint_key=key, **request,
    )  # fmt: skip
    return run_trial(
        trial,
        channel=channel,
        device=FakeDevice(),
        allowed_modules=("trials",),
        checkpoint_root=root,
    )


@pytest.fixture(params=["memory", "file"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://trialq-test-{uuid.uuid4().hex}/checkpoints"
    return f"file://{tmp_path}/store"


def test_a_preempted_attempt_is_found_by_the_next_and_a_final_one_removes_it(root: str) -> None:
    key = checkpoint_key("s", 3)
    fs, path = fsspec.core.url_to_fs(f"{root}/{key}")
    first = _run(root, key, attempt=1, stop=True)
    assert first.outcome is Outcome.PREEMPTED
    assert first.metrics["in_store_at_yes"] == 1.0  # the step, put there by the yes itself
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find(path)) == ["after-stop", "step"]
    second = _run(root, key, attempt=2, stop=False)  # a fresh local folder, filled from the store
    assert second.outcome is Outcome.OK
    assert second.metrics == {"value": 1.0, "after_stop_found": 1.0}
    assert second.checkpoint_removed is True and not fs.exists(path)


def test_keep_checkpoints_puts_a_final_attempt_back(root: str) -> None:
    key = checkpoint_key("s", 3)
    _run(root, key, attempt=1, stop=False, keep_checkpoints=True)
    fs, path = fsspec.core.url_to_fs(f"{root}/{key}")
    assert [p.rsplit("/", 1)[-1] for p in fs.find(path)] == ["step"]
    assert checkpoints.remove(root, key) and not fs.exists(path)  # as an orphan is removed


def test_an_upload_mirrors_the_local_folder(tmp_path: Path) -> None:
    root, key = f"memory://trialq-test-{uuid.uuid4().hex}", checkpoint_key("s", 1)
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "old").write_text("1")
    (local / "sub" / "new").write_text("2")
    remote = checkpoints.RemoteFolder(root, key, local)
    assert remote.upload() == 2
    (local / "old").unlink()
    assert remote.upload() == 1  # and `old` is gone from the store too
    fresh = tmp_path / "fresh"
    assert checkpoints.RemoteFolder(root, key, fresh).download() == 1
    assert (fresh / "sub" / "new").read_text() == "2" and not (fresh / "old").exists()


def test_a_key_that_leaves_the_root_is_refused() -> None:
    with pytest.raises(ValueError, match="not a checkpoint key"):
        checkpoints.RemoteFolder("memory://x", "../other/1-abcdef")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("s3://bucket/ckpt", "s3://bucket/ckpt"),
        ("file:///srv/ckpt", "file:///srv/ckpt"),
        ("/var/lib/trialq/checkpoints", Path("/var/lib/trialq/checkpoints")),
    ],
)
def test_settings_keep_a_url_as_text_and_a_folder_as_a_path(value: str, expected: object) -> None:
    settings = Settings(checkpoint_root=value)  # type: ignore[arg-type]
    assert settings.checkpoint_root == expected
    assert type(settings.checkpoint_root) is type(expected)


@pytest.mark.parametrize("kind", ["mounted", "url"])
def test_what_an_attempt_saved_is_in_the_next_attempts_folder_until_removed(
    kind: str, tmp_path: Path
) -> None:
    """One folder type for the runner, whatever the root is."""
    root: Path | str = tmp_path / "mount"
    if kind == "url":
        root = f"memory://trialq-test-{uuid.uuid4().hex}/checkpoints"
    key = checkpoint_key("s", 5)
    first = checkpoints.for_trial(root, key)
    with first.attach() as folder:
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "step").write_text("7")
        first.save()
    with checkpoints.for_trial(root, key).attach() as folder:
        assert folder is not None and (folder / "step").read_text() == "7"
    assert checkpoints.for_trial(root, key).remove()
    with checkpoints.for_trial(root, key).attach() as folder:
        assert folder is not None and not (folder / "step").exists()
