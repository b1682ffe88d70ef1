"""GPU identity, MIG and MPS on the FAKE NVML (`tests/fake_nvml.py`, loaded in this process):
NVML's answers as nvidia-ml-py gives them, never a GPU's figures.

The hosts below are answers in the shape NVML gives them: UUIDs, names as `nvidia-smi -L`
prints them, each device's memory total, MIG mode, MIG devices at their slots, and the errors
NVML answers (Not Supported for a card without MIG; Not Found for an empty MIG slot; No
Permission for another container's MIG device and, unprivileged, for a MIG-mode card's own
memory and processes).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fake_nvml
import pytest

from trialq.errors import UsageError
from trialq.gpu import mps
from trialq.gpu.attribution import ProcessView
from trialq.gpu.context_probe import ContextMeasure
from trialq.gpu.inventory import Gpu, Nvml
from trialq.gpu.mps import PINNED_LIMIT, PIPE_DIRECTORY, limited, pinned_limits
from trialq.gpu.plan import CONTEXT_RESERVE_MB, GpuPlan
from trialq.gpu.share import VISIBLE, GpuShare
from trialq.gpu.telemetry import WORKER_MARK, NeighbourCheck, TrialMarks

MIB = 2**20
GIB = 2**30
A100 = "NVIDIA A100-SXM4-40GB"
PARENT = "GPU-5f2a1b9e-3c4d-4e6f-8a7b-9c0d1e2f3a4b"
# An A100 40GB in MIG mode, unprivileged: 3g.20gb at slot 0, 2g.10gb at 1, nothing at 2,
# 1g.5gb at 3, and a 1g.5gb at 4 that is another container's.
MIG_HOST: list[dict[str, Any]] = [
    {
        "uuid": PARENT, "name": A100, "total": 40960 * MIB, "mig_mode": 1, "mig_slots": 7,
        "privileged": False,
        "mig": [
            {"slot": 0, "uuid": "MIG-0a1b2c3d-0000-5000-8000-000000000000",
             "name": f"{A100} MIG 3g.20gb", "total": 19968 * MIB},
            {"slot": 1, "uuid": "MIG-0a1b2c3d-1111-5000-8000-000000000000",
             "name": f"{A100} MIG 2g.10gb", "total": 9856 * MIB},
            {"slot": 3, "uuid": "MIG-0a1b2c3d-3333-5000-8000-000000000000",
             "name": f"{A100} MIG 1g.5gb", "total": 4864 * MIB},
            {"slot": 4, "uuid": "MIG-0a1b2c3d-4444-5000-8000-000000000000",
             "name": f"{A100} MIG 1g.5gb", "total": 4864 * MIB, "visible": False},
        ],
    },
    # A card that cannot do MIG (NVML: Not Supported), and a MIG-capable one with MIG off.
    {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA L4",
     "total": 23034 * MIB},
    {"uuid": "GPU-66666666-7777-8888-9999-000000000000", "name": "NVIDIA H100 80GB HBM3",
     "total": 81559 * MIB, "mig_mode": 0},
]  # fmt: skip
MIG_UUIDS = [m["uuid"] for m in MIG_HOST[0]["mig"][:3]]


Host = Callable[[list[Any]], Nvml]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """NVML, as the fake answers for the host described."""
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    (tmp_path / "used").mkdir()
    opened: list[Nvml] = []

    def describe(gpus: list[Any]) -> Nvml:
        (tmp_path / "gpus.json").write_text(json.dumps(gpus))
        nvml = Nvml.open("fake_nvml")
        assert nvml is not None
        opened.append(nvml)
        return nvml

    yield describe
    for nvml in opened:
        nvml.close()


def test_every_device_is_named_by_its_uuid_in_nvml_order(host: Host) -> None:
    nvml = host(MIG_HOST)
    gpus = nvml.gpus("all")
    assert [g.id for g in gpus] == [*MIG_UUIDS, MIG_HOST[1]["uuid"], MIG_HOST[2]["uuid"]]
    # An index is NVML's; the device it names is handed on by UUID, which CUDA cannot reorder.
    assert [g.id for g in nvml.gpus("1")] == [MIG_HOST[1]["uuid"]]
    assert [g.index for g in gpus] == [0, 0, 0, 1, 2]


def test_a_card_in_mig_mode_is_its_mig_devices_with_their_own_memory(host: Host) -> None:
    nvml = host(MIG_HOST)
    migs = nvml.gpus("0")
    assert [(g.model, g.total_bytes // MIB) for g in migs] == [
        (f"{A100} MIG 3g.20gb", 19968), (f"{A100} MIG 2g.10gb", 9856), (f"{A100} MIG 1g.5gb", 4864),
    ]  # fmt: skip
    assert nvml.gpus(PARENT) == migs  # the card's UUID names its MIG devices too
    assert nvml.gpus(MIG_UUIDS[2]) == (Gpu(MIG_UUIDS[2], f"{A100} MIG 1g.5gb", 4864 * MIB, 0),)
    with pytest.raises(UsageError, match="NVML does not know it"):
        nvml.gpus(MIG_HOST[0]["mig"][3]["uuid"])  # another container's


def test_slots_on_mig_devices_budget_from_the_instance_not_the_card(host: Host) -> None:
    nvml = host(MIG_HOST)
    shares = GpuPlan(trials_per_gpu=1).shares(nvml.gpus("0"))
    assert [s.devices for s in shares] == [(u,) for u in MIG_UUIDS]
    assert [s.budget_bytes for s in shares] == [
        (t - CONTEXT_RESERVE_MB) * MIB for t in (19968, 9856, 4864)
    ]  # each instance less one context
    assert shares[2].environment()[VISIBLE] == MIG_UUIDS[2]


def test_the_start_check_reads_a_mig_devices_processes_not_the_refusing_card(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = host(MIG_HOST)
    with pytest.raises(fake_nvml.NVMLError) as refused:
        nvml.used_bytes(PARENT)  # unprivileged: NVML refuses the card itself
    assert refused.value.value == fake_nvml.NVML_ERROR_NO_PERMISSION
    on_one, on_zero = (GpuPlan().shares(nvml.gpus(u))[0] for u in (MIG_UUIDS[1], MIG_UUIDS[0]))
    left = {**os.environ, WORKER_MARK: "w-1"}  # left behind by a trial of worker w-1
    with subprocess.Popen(["sleep", "30"], env=left) as stranger:
        monkeypatch.setenv(VISIBLE, on_one.visible)
        fake_nvml.hold(1024 * MIB, pid=stranger.pid)
        assert nvml.processes(MIG_UUIDS[1]) == {stranger.pid: 1024 * MIB}
        # the fake's default family names this namespace's pids: a stranger is refused for
        marks = TrialMarks("w-1")
        check = NeighbourCheck(64 * MIB, settle_s=0, view=ProcessView.PIDS, marks=marks)
        refusal = check.refusal(nvml, on_one, lambda: {os.getpid()})
        assert refusal is not None and MIG_UUIDS[1] in refusal
        assert check.refusal(nvml, on_zero, lambda: {os.getpid()}) is None
        stranger.kill()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0=1G,1=512M", {0: 2**30, 1: 512 * MIB}),
        ("0=4096MB", {0: 4096 * MIB}),
        ("0=1.5g", {0: 3 * 2**29}),
        (" 1 = 2048 ", {1: 2048}),  # no unit: bytes
        ("", {}),
        (None, {}),
    ],
)
def test_mps_pinned_limits_read_as_mps_writes_them(
    text: str | None, expected: dict[int, int]
) -> None:
    assert pinned_limits(text) == expected


@pytest.mark.parametrize("text", ["0", "a=1G", "0=1Q", "0=-1G"])
def test_a_malformed_mps_limit_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(UsageError, match=PINNED_LIMIT):
        pinned_limits(text)


def test_under_mps_the_budget_and_the_beat_are_the_clients_pinned_limit(host: Host) -> None:
    nvml = host(MIG_HOST[1:])  # the L4 (index 0) and the H100 (index 1)
    gpus = nvml.gpus("all")
    assert [g.total_bytes // MIB for g in limited(gpus, "1=20G")] == [23034, 20480]
    plan = GpuPlan(trials_per_gpu=2, mps_pinned_limits="0=8G,1=8G")
    shares = plan.shares(gpus)
    assert {s.total_bytes for s in shares} == {8 * 2**30}
    assert {s.budget_bytes for s in shares} == {(8192 - 2 * CONTEXT_RESERVE_MB) * MIB // 2}
    # The trial sees its own devices from ordinal 0: its own limit (its budget plus one
    # context, never the worker's whole limit) goes with it, renumbered.
    env = shares[3].environment()
    assert (env[VISIBLE], env[PINNED_LIMIT]) == (MIG_HOST[2]["uuid"], "0=4096M")
    assert GpuShare.from_environment(env) == shares[3]
    assert PINNED_LIMIT not in GpuPlan().shares(gpus)[0].environment()


def test_each_trial_of_an_mps_served_worker_gets_its_budget_plus_a_context_as_its_limit(
    host: Host,
) -> None:
    gpus = host(MIG_HOST[1:]).gpus("all")
    measured = {g.id: ContextMeasure(g.id, 500 * MIB, g.total_bytes - GIB, 20 * GIB) for g in gpus}
    shares = GpuPlan(trials_per_gpu=4, mps_served=True).shares(gpus, measured)

    for share in shares:
        assert share.total_bytes == 20 * GIB  # CUDA's total (a daemon's limit), not NVML's
        assert share.budget_bytes is not None and share.context_bytes is not None
        assert share.mps_limit_bytes == (share.budget_bytes + share.context_bytes) // MIB * MIB
    assert GpuPlan(trials_per_gpu=4).shares(gpus)[0].mps_limit_bytes is None  # no MPS: none
    assert mps.served({PIPE_DIRECTORY: "/mps/nvidia.com/gpu/pipe"}) and not mps.served({})


def test_a_selection_naming_no_device_is_one_line(host: Host) -> None:
    nvml = host(MIG_HOST)
    for selection in ("7", "GPU-nope", "first"):
        with pytest.raises(UsageError, match=selection):
            nvml.gpus(selection)
