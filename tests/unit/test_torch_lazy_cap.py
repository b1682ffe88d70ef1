"""PyTorch's cap waits for CUDA's own start (docs/frameworks.md, PyTorch).

Run on a CPU build of PyTorch with a fake CUDA, named as one: `torch.backends.cuda.is_built`
says yes, and `device_count`, `get_device_properties` and `set_per_process_memory_fraction`
answer as two 12 GiB GPUs would (the last records its calls). The checks are that after the
adapter's setup nothing was set and `torch.cuda.is_initialized()` is still False, that the
cap sits in PyTorch's own queue, and that when the queue runs, as PyTorch's lazy
initialisation runs it, the fraction is set on every device, in the process and in a child
it forked before CUDA started. Whether the fraction then holds on a GPU is tests/gpu's.
Each check runs in a fresh Python, so the test process never queues anything in its torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from trialq.trial.frameworks.pytorch import NOT_STARTED

FRACTION = (3 * 2**30 - 22 * 2**20) / (12 * 2**30)
"""A 3 GiB budget on a 12 GiB card, less a 20 MiB and a 2 MiB page of expandable segments: the
reserved peak may pass the fraction by those pages, and must not pass the budget."""

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")

FAKE_CUDA = """
import json, os, types
import torch
from trialq.trial.frameworks.pytorch import LazyCap, cap_this_process
from trialq.trial.frameworks.session import FrameworkSession
from trialq.gpu.share import GpuShare

SET = []  # the fake's record of set_per_process_memory_fraction(fraction, device)
torch.backends.cuda.is_built = lambda: True
torch.cuda.device_count = lambda: 2
torch.cuda.get_device_properties = lambda index: types.SimpleNamespace(total_memory=12 * 2**30)
torch.cuda.set_per_process_memory_fraction = lambda fraction, index: SET.append([fraction, index])
SHARE = GpuShare(("0", "1"), budget_bytes=3 * 2**30, model="FakeGPU", total_bytes=12 * 2**30)


def queued():
    return [call for call, _ in torch.cuda._queued_calls if isinstance(call, LazyCap)]


def run_queue():
    # What torch.cuda._lazy_init does once CUDA's driver is up: every queued call, with a
    # re-entrant _lazy_init returning at once. torch's own queued checks need a real GPU.
    torch.cuda._tls.is_initializing = True
    try:
        for call in queued():
            call()
    finally:
        del torch.cuda._tls.is_initializing


def record(session):
    got = session.record()
    return [got.cap_applied, got.cap_note]
"""


def _probe(code: str, env: dict[str, str] | None = None) -> Any:
    """Run the fake CUDA and `code` in a fresh Python; the JSON it printed last."""
    source = textwrap.dedent(FAKE_CUDA) + textwrap.dedent(code)
    environment = {**os.environ, **(env or {})}
    probe = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=240, env=environment
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


SETUP = """
session = FrameworkSession("torch", SHARE)
session.before_import(None, "train")
session.after_import(set())
seen = {"queued": len(queued()), "set": list(SET), "initialized": torch.cuda.is_initialized()}
seen["before"] = record(session)
"""


def test_the_cap_is_queued_not_applied_and_cuda_stays_unstarted() -> None:
    seen = _probe(SETUP + "print(json.dumps(seen))")
    assert seen["queued"] == 1 and seen["set"] == []
    assert seen["initialized"] is False
    assert seen["before"] == [True, NOT_STARTED]


def test_at_cudas_start_the_fraction_is_set_on_every_device() -> None:
    seen = _probe(SETUP + "run_queue()\nseen['set'] = SET\nseen['after'] = record(session)\n"
                  "print(json.dumps(seen))")  # fmt: skip
    assert seen["set"] == [[FRACTION, 0], [FRACTION, 1]]
    assert seen["after"] == [True, None]


FORKED = """
reader, writer = os.pipe()
child = os.fork()
if child == 0:
    run_queue()  # the child's own CUDA start: the queue it inherited
    os.write(writer, json.dumps(SET).encode())
    os._exit(0)
os.waitpid(child, 0)
seen["child"] = json.loads(os.read(reader, 4096))
seen["parent"] = SET
print(json.dumps(seen))
"""


def test_a_child_forked_before_cuda_started_caps_itself_at_its_own_start() -> None:
    """Lightning's ddp_fork, fork-based torch.multiprocessing, DataLoader workers."""
    seen = _probe(SETUP + FORKED)
    assert seen["child"] == [[FRACTION, 0], [FRACTION, 1]]
    assert seen["parent"] == []


FAILING = """
def refuse(fraction, index):
    raise RuntimeError("a fake driver's refusal")
torch.cuda.set_per_process_memory_fraction = refuse
run_queue()  # raises nothing: an error here would be the trial's first CUDA call's
seen["after"] = record(session)
print(json.dumps(seen))
"""


def test_a_cap_that_fails_at_cudas_start_is_said_and_never_raised() -> None:
    seen = _probe(SETUP + FAILING)
    applied, note = seen["after"]
    assert applied is False and "a fake driver's refusal" in note


RANK = """
cap = cap_this_process()
seen = {"queued": len(queued()), "set": list(SET), "applied": cap.applied}
run_queue()
seen["after"] = SET
print(json.dumps(seen))
"""


def test_a_rank_started_afresh_caps_itself_from_the_share_it_inherits() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "TRIALQ_GPU_BUDGET_BYTES": str(6 * 2**30)}
    seen = _probe(RANK, env=env)
    assert seen["queued"] == 1 and seen["set"] == [] and seen["applied"] is True
    six_gib = (6 * 2**30 - 22 * 2**20) / (12 * 2**30)
    assert seen["after"] == [[six_gib, 0], [six_gib, 1]]
