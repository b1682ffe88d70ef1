"""Loading a page in headless Chromium: its DOM after load and its console messages.

The browser is a system package (`apt-get install -y chromium`), never installed by a
test: without it a test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
)  # fmt: skip
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)$")


@dataclass(frozen=True)
class LoadedPage:
    """The DOM Chromium built and every message the page wrote to its console."""

    dom: str
    console: list[str]


def chromium_or_skip() -> str:
    """The browser's path; skips the test where it is missing (fails it in CI)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must provide it")
        pytest.skip(reason)
    return found


def load(page: Path) -> LoadedPage:
    """Open the file in a fresh profile, with no network features, and dump the DOM."""
    browser = chromium_or_skip()
    with tempfile.TemporaryDirectory(prefix="trialq-chromium-") as profile:
        done = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    console = [m.group(1) for line in done.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return LoadedPage(done.stdout, console)
