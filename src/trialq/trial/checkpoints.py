"""A trial's checkpoint folder on the worker: where it is, and when it goes.

`trial.checkpoint_dir` is `<root>/<key>`: the root a worker's setting names (a volume every
worker mounts), the key the driver made once for the trial (`wire.messages.checkpoint_key`)
and sends with every attempt. What an attempt writes there is what the next one finds.

Nobody but a trial process sees these files, so removal is theirs: the attempt whose outcome
is final (not `preempted`, and not refused by its device) removes its own folder after its
trial returned. A trial whose last process could not (killed, or given up after too many
preemptions) is named by the driver on a Redis list, and the next trial process of any
worker removes it once its own result is stored (`remove_orphans`).

A root may also be an fsspec URL (`s3://bucket/checkpoints`): `checkpoint_dir` is then a
local folder of the attempt, filled from the store before the trial starts and put back
(`RemoteFolder`) on each `should_stop()` that says yes and when the attempt ends.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from trialq.wire.channel import ReportChannel
from trialq.wire.messages import CHECKPOINT_KEY_PATTERN

_log = logging.getLogger("trialq.checkpoints")

ORPHANS_PER_TRIAL = 20
"""How many orphaned folders one trial process removes, at most, after its trial."""


def default_root() -> Path:
    """Without `TRIALQ_CHECKPOINT_ROOT`: a folder only this machine's attempts share."""
    return Path(tempfile.gettempdir()) / "trialq-checkpoints"


def folder(root: Path, key: str) -> Path:
    """`root/key`, refusing a key that would leave the root (it came over the network)."""
    if not re.fullmatch(CHECKPOINT_KEY_PATTERN, key):
        raise ValueError(f"not a checkpoint key: {key!r}")
    return root / key


class CheckpointFolder(Protocol):
    """A trial's checkpoint folder as one attempt sees it, wherever the root is."""

    def attach(self) -> AbstractContextManager[Path | None]:
        """The folder the attempt writes in (`trial.checkpoint_dir`), for the attempt's
        length; None when it cannot be had (the trial then runs without one, rather than
        start from nothing and put that over what is kept)."""
        ...

    def save(self) -> None:
        """Keep what the attempt wrote for the next attempt (on a mount it already is)."""
        ...

    def remove(self) -> bool:
        """Remove the folder; True if none is left."""
        ...


def for_trial(root: Path | str, key: str) -> CheckpointFolder:
    """The trial's folder under a mounted root (a `Path`) or an fsspec URL (a `str`)."""
    return RemoteFolder(root, key) if isinstance(root, str) else MountedFolder(root, key)


def remove(root: Path | str, key: str) -> bool:
    """Remove a trial's folder; True if none is left."""
    return for_trial(root, key).remove()


def remove_orphans(channel: ReportChannel, root: Path | str, limit: int = ORPHANS_PER_TRIAL) -> int:
    """Remove folders the driver named as left behind; how many were taken off the list."""
    keys = channel.take_orphaned_checkpoints(limit)
    for key in keys:
        try:
            remove(root, key)
        except ValueError:
            _log.warning("ignored a malformed orphaned checkpoint key %r", key)
    return len(keys)


class MountedFolder:
    """`<root>/<key>` on a volume every worker mounts: attempts write where the next reads."""

    def __init__(self, root: Path, key: str) -> None:
        self.path = folder(root, key)

    @contextlib.contextmanager
    def attach(self) -> Iterator[Path | None]:
        yield self.path

    def save(self) -> None:
        pass

    def remove(self) -> bool:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # the study's folder, once no other trial has one there
        return not self.path.exists()


class RemoteFolder:
    """A trial's checkpoint folder in an fsspec store, `<url>/<key>/`, mirrored to and from a
    local folder (the trial's `checkpoint_dir`; docs/preemption.md, "Object storage").

    `attach` fills a fresh local folder from the store and removes it after the attempt.

    fsspec is imported only here, when a root is a URL: a mounted root never needs it.
    """

    def __init__(self, url: str, key: str, local: Path | None = None) -> None:
        from fsspec.core import url_to_fs

        if not re.fullmatch(CHECKPOINT_KEY_PATTERN, key):
            raise ValueError(f"not a checkpoint key: {key!r}")
        self.fs, base = url_to_fs(url)
        self.remote = f"{str(base).rstrip('/')}/{key}"
        self.local = local

    def _remote_files(self) -> list[str]:
        """The folder's files, as paths relative to it."""
        if not self.fs.exists(self.remote):
            return []
        prefix = self.remote + "/"
        found = (str(self.fs._strip_protocol(p)) for p in self.fs.find(self.remote))
        return sorted(p[len(prefix) :] for p in found if p.startswith(prefix))

    @contextlib.contextmanager
    def attach(self) -> Iterator[Path | None]:
        self.local = Path(tempfile.mkdtemp(prefix="trialq-checkpoint-"))
        try:
            try:
                count = self.download()
            except Exception as exc:  # any store's error: fsspec backends raise their own
                _log.warning("checkpoint folder not downloaded, not synced: %s", exc)
                yield None
            else:
                _log.info("checkpoint folder downloaded files=%d", count)
                yield self.local
        finally:
            shutil.rmtree(self.local, ignore_errors=True)
            self.local = None

    def save(self) -> None:
        self.upload()

    def _local(self) -> Path:
        if self.local is None:
            raise RuntimeError("this remote folder has no local copy")
        return self.local

    def download(self) -> int:
        """Fill the local folder with the store's files; how many there were."""
        local = self._local()
        files = self._remote_files()
        for relative in files:
            target = local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(f"{self.remote}/{relative}", str(target))
        return len(files)

    def upload(self) -> int:
        """Make the store's folder what the local one holds: every file put (overwritten),
        then the store's files the local folder no longer has removed; how many were put.
        An upload cut short leaves extra files, never fewer than the last upload put."""
        local = self._local()
        files = {
            path.relative_to(local).as_posix(): path
            for path in sorted(local.rglob("*"))
            if path.is_file()
        }
        for relative, path in files.items():
            target = f"{self.remote}/{relative}"
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(path), target)
        for relative in self._remote_files():
            if relative not in files:
                self.fs.rm_file(f"{self.remote}/{relative}")
        return len(files)

    def remove(self) -> bool:
        """Remove the folder from the store; True if none is left."""
        if self.fs.exists(self.remote):
            self.fs.rm(self.remote, recursive=True)
        return not self.fs.exists(self.remote)
