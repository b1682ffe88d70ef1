"""`OncePerWorker`: a warning said once by a worker, not once by each of its trial processes.

A worker's trial processes are many and short-lived, so a warning about the host (NVML that
cannot answer, a GPU left unguarded) would repeat with every trial. The first process to say
it leaves a mark in a folder the worker owns for its life (its trial slots' folder, removed
when it stops); the others find the mark and stay silent.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path


class OncePerWorker:
    """Says each warning once per worker (per `directory`); without one, every time."""

    def __init__(self, logger: logging.Logger, directory: Path | None = None) -> None:
        self._logger = logger
        self._directory = directory

    def warn(self, key: str, message: str) -> None:
        """Log `message` unless a trial process of this worker logged it under `key`."""
        if self._first(key):
            self._logger.warning("%s", message)

    def _first(self, key: str) -> bool:
        if self._directory is None:
            return True
        mark = self._directory / f"warned-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}"
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        except OSError:
            return True  # the folder is gone (the worker stops): say it rather than lose it
        return True
