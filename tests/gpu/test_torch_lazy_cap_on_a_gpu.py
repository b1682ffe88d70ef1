"""PyTorch's cap waits for CUDA's own start, on a REAL GPU (never a fake; issue 36.6).

After trialq's setup of a trial process CUDA is not started; a child forked then (what
`ddp_fork`, fork-based `torch.multiprocessing` and DataLoader workers do) uses CUDA and is
capped at the trial's budget; the trial's own first CUDA op starts CUDA capped, and an
allocation past the budget is PyTorch's `OutOfMemoryError`, not the card's. Run in a fresh
process: this one never starts CUDA. Skipped where PyTorch here sees no CUDA GPU. Written
in a session without a GPU: not yet run on one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

BUDGET_MB = 1024

PROBE = """
import json, os
import torch
import torch.multiprocessing as mp
from trialq.trial.frameworks.pytorch import fraction
from trialq.trial.frameworks.session import FrameworkSession
from trialq.gpu.share import GpuShare

share = GpuShare(("0",), budget_bytes=BUDGET_MB * 2**20)
session = FrameworkSession("torch", share)
session.before_import(None, "train")
session.after_import(set())
seen = {"started_after_setup": torch.cuda.is_initialized()}

def child(queue):
    torch.ones(1, device="cuda")
    queue.put(torch.cuda.get_per_process_memory_fraction(0))

context = mp.get_context("fork")
queue = context.Queue()
process = context.Process(target=child, args=(queue,))
process.start()
seen["child_fraction"] = queue.get(timeout=120)
process.join(60)
seen["child_exit"] = process.exitcode
torch.ones(1, device="cuda")
seen["fraction"] = torch.cuda.get_per_process_memory_fraction(0)
seen["expected"] = fraction(share.budget_bytes, torch.cuda.get_device_properties(0).total_memory)
try:
    torch.empty(2 * share.budget_bytes, dtype=torch.uint8, device="cuda")
    seen["over_budget"] = "allocated"
except torch.OutOfMemoryError:
    seen["over_budget"] = "OutOfMemoryError"
record = session.record()
seen["record"] = [record.cap_applied, record.cap_note]
print(json.dumps(seen))
"""


def test_the_cap_waits_for_cuda_and_holds_in_the_trial_and_its_forked_child() -> None:
    check = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    if subprocess.run([sys.executable, "-c", check], capture_output=True).returncode != 0:
        pytest.skip("PyTorch here sees no CUDA GPU (not installed, or not a CUDA build)")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    code = f"BUDGET_MB = {BUDGET_MB}\n" + textwrap.dedent(PROBE)
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["started_after_setup"] is False
    assert seen["child_exit"] == 0 and seen["child_fraction"] == pytest.approx(seen["expected"])
    assert seen["fraction"] == pytest.approx(seen["expected"])
    assert seen["over_budget"] == "OutOfMemoryError"
    assert seen["record"] == [True, None]
