"""`trial.save_artifact`: a file into the study's Optuna artifact store, from the trial process.

The trial process writes the file (workers never touch the study's storage); the meta goes
back with the result, and the driver links it to the trial with the system attr that
`optuna.artifacts.upload_artifact` writes, so `optuna.artifacts.get_all_artifact_meta` and
optuna-dashboard find it.

The file is written in the layout of Optuna's `FileSystemArtifactStore` (one file named by its
artifact id under the root) or, under an `s3://BUCKET` root, of its `Boto3ArtifactStore(BUCKET)`
(one object keyed by the artifact id at the bucket's top), without importing Optuna: the trial
side never loads Optuna's storage layer (docs/design.md, "Packages and their import rules").
The integration tests read both back through `optuna.artifacts.download_artifact`.
"""

from __future__ import annotations

import mimetypes
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trialq.wire.messages import ArtifactMeta

DEFAULT_MIME_TYPE = "application/octet-stream"


S3_SCHEME = "s3://"

Saver = Callable[[Path], ArtifactMeta]
"""Stores one file and returns its meta (what `TrialContext.save_artifact` calls)."""


def artifact_saver(root: Path | str) -> Saver:
    """The saver of `TRIALQ_ARTIFACT_ROOT`: a folder, or `s3://BUCKET` (settings checked it)."""
    if isinstance(root, str) and root.startswith(S3_SCHEME):
        return S3ArtifactSaver(root.removeprefix(S3_SCHEME).rstrip("/"))
    return ArtifactSaver(Path(root))


def _meta(artifact_id: str, path: Path) -> ArtifactMeta:
    """`path`'s meta under `artifact_id`, as `upload_artifact` makes it."""
    mimetype, encoding = mimetypes.guess_type(path.name)
    return ArtifactMeta(
        artifact_id=artifact_id,
        filename=path.name,
        mimetype=mimetype or DEFAULT_MIME_TYPE,
        encoding=encoding,
    )


class ArtifactSaver:
    """Stores files as a `FileSystemArtifactStore` at `root` would and describes each one."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, path: Path) -> ArtifactMeta:
        """Store `path`; its meta, as `upload_artifact` makes it."""
        self.root.mkdir(parents=True, exist_ok=True)
        artifact_id = str(uuid.uuid4())
        partial = self.root / f".{artifact_id}.partial"
        shutil.copyfile(path, partial)
        os.replace(partial, self.root / artifact_id)  # never half a file under its id
        return _meta(artifact_id, path)


class S3ArtifactSaver:
    """Stores files as a `Boto3ArtifactStore(bucket)` would: one object per file, keyed by its
    artifact id at the bucket's top. boto3 (the `s3` extra) is imported at the first save and
    finds its endpoint and credentials as it always does (`AWS_ENDPOINT_URL`,
    `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `~/.aws`, an instance or
    pod role), so S3-compatible stores (MinIO, ...) work through `AWS_ENDPOINT_URL`."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._client: Any = None

    def __call__(self, path: Path) -> ArtifactMeta:
        """Upload `path` (an S3 put is whole or nothing); its meta, as `upload_artifact` makes
        it."""
        artifact_id = str(uuid.uuid4())
        self._s3().upload_file(str(path), self.bucket, artifact_id)
        return _meta(artifact_id, path)

    def _s3(self) -> Any:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise RuntimeError(
                    "TRIALQ_ARTIFACT_ROOT is s3://: install boto3 (pip install 'trialq[s3]')"
                ) from None
            self._client = boto3.client("s3")
        return self._client
