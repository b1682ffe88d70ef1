"""The name of PyTorch that trialq leans on is still there, with the meaning it gives it
(docs/design.md, "Private hooks we lean on").

`torch.cuda._lazy_call(callable)` (private) is how PyTorch's adapter sets the trial's memory
fraction at CUDA's own start instead of starting CUDA itself: before CUDA started, the call
is queued in `torch.cuda._queued_calls` and CUDA stays unstarted; `torch.cuda._lazy_init`
runs that queue. Checked in a fresh Python, so the test process's torch queues nothing.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from private_hooks import Hook

from trialq.trial.frameworks.pytorch import LAZY_CALL

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")

LAZY = Hook(
    f"torch.cuda.{LAZY_CALL}(callable), torch.cuda._queued_calls",
    "src/trialq/trial/frameworks/pytorch.py (PyTorch.cap)",
    "the cap starts CUDA in the trial's process before its code runs: ddp_fork, fork-based "
    "multiprocessing and DataLoader workers that touch CUDA fail only under trialq",
)

PROBE = """
import json
import torch
calls = []
lazy_call = getattr(torch.cuda, NAME, None)
seen = {"there": callable(lazy_call)}
if seen["there"]:
    before = len(torch.cuda._queued_calls)
    lazy_call(lambda: calls.append(1))
    seen["queued"] = len(torch.cuda._queued_calls) - before
    seen["ran"] = len(calls)
    seen["initialized"] = torch.cuda.is_initialized()
seen["init_runs_queue"] = "_queued_calls" in torch.cuda._lazy_init.__code__.co_names
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    code = f"NAME = {LAZY_CALL!r}\n" + textwrap.dedent(PROBE)
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    observed: dict[str, Any] = json.loads(probe.stdout.strip().splitlines()[-1])
    return observed


def test_lazy_call_queues_before_cuda_starts_and_starts_nothing(seen: dict[str, Any]) -> None:
    assert seen["there"], LAZY.gone("torch.cuda has no such function")
    assert seen["queued"] == 1, LAZY.gone("the call is not queued in torch.cuda._queued_calls")
    assert seen["ran"] == 0, LAZY.gone("the call ran before CUDA started")
    assert seen["initialized"] is False, LAZY.gone("queuing a call started CUDA")


def test_cudas_lazy_initialisation_runs_the_queue(seen: dict[str, Any]) -> None:
    assert seen["init_runs_queue"], LAZY.gone(
        "torch.cuda._lazy_init no longer reads _queued_calls: the cap would never be set"
    )
