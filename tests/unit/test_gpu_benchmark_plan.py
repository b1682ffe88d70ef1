"""What `python -m benchmarks.gpu` and `benchmarks/gpu_machine.sh` do before a GPU is needed:
the interleaved schedule, the summaries, the record written whole as each part ends, bad
arguments, the one line where no GPU is found, and the Keras trial on Keras' torch backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import gpu, gpu_cluster, gpu_packing, gpu_plan, gpu_report, gpu_sharing
from trialq.spec import load_spec
from trialq.wire.frameworks import framework_in_source

ROOT = Path(__file__).resolve().parents[2]


def test_packings_interleave_in_alternating_rounds() -> None:
    order = gpu_plan.interleaved((1, 4, 8), 3)
    assert order == [1, 4, 8, 8, 4, 1, 1, 4, 8]
    assert all(order.count(p) == 3 for p in (1, 4, 8))
    with pytest.raises(ValueError):
        gpu_plan.interleaved((1, 4), 0)


def test_a_run_has_sixteen_trials_and_three_full_waves_at_eight() -> None:
    assert gpu_plan.trials_for(1) == 16
    assert gpu_plan.trials_for(8) == 24
    assert gpu_plan.waves(24, 8) == 3
    assert gpu_plan.waves(16, 4) == 4


def _run(per_gpu: int, rate: float, outcome: str = "ok", peak: int = 10) -> dict[str, object]:
    return {
        "per_gpu": per_gpu, "waves": gpu_plan.waves(gpu_plan.trials_for(per_gpu), per_gpu),
        "trials_per_hour_per_gpu": rate, "outcomes": {outcome: 16},
        "peaks_within_budget": peak <= 100, "device_never_at_total": True, "notes": [],
    }  # fmt: skip


def test_the_summary_is_medians_with_their_spread_and_the_ratio_of_medians() -> None:
    runs = [_run(1, 1000.0), _run(4, 3300.0), _run(4, 2900.0), _run(1, 1100.0), _run(4, 3600)]
    summary = gpu_packing.summary(runs)
    at_four = summary["trials_per_hour_per_gpu"]["4"]
    assert (at_four["runs"], at_four["median"], at_four["min"], at_four["max"]) == (
        3, 3300.0, 2900.0, 3600.0,
    )  # fmt: skip
    assert summary["ratio_of_medians"]["4/1"] == round(3300 / 1050, 2)
    assert summary["all_ok"] and summary["all_within_budget"]
    held_badly = gpu_packing.summary([*runs, _run(4, 3000.0, outcome="refused", peak=200)])
    assert not held_badly["all_ok"] and not held_badly["all_within_budget"]


def test_a_trial_note_is_kept_with_the_trial_it_came_from() -> None:
    attrs = [
        {"outcome": "ok", "gpu_peaks_bytes": [5], "gpu_budget_bytes": 10},
        {"outcome": "ok", "gpu_peaks_bytes": [12], "gpu_budget_bytes": 10,
         "gpu_cap_note": "the framework started before its cap"},
    ]  # fmt: skip
    facts = gpu_packing.trial_facts(attrs)
    assert facts["notes"] == [
        {"trial": 1, "key": "gpu_cap_note", "value": "the framework started before its cap"}
    ]
    assert facts["peak_max_bytes"] == 12 and not facts["peaks_within_budget"]


def test_the_record_is_whole_on_disk_after_each_part(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    record = gpu_report.Record({"date": "2026-12-06"}, path)
    assert json.loads(path.read_text())["complete"] is False
    record.put("throughput", {"small": {"runs": [1]}})
    assert json.loads(path.read_text())["throughput"] == {"small": {"runs": [1]}}
    record.not_run("keras", "the call's time ran out")
    record.done("b")
    on_disk = json.loads(path.read_text())
    assert on_disk["sections_done"] == ["b"] and on_disk["not_run"][0]["what"] == "keras"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]


def test_a_deadline_past_stops_every_section_and_says_so(tmp_path: Path) -> None:
    record = gpu_report.Record({}, tmp_path / "gpu.json")
    gone = gpu_plan.Deadline(seconds=0.0)
    gpu.measure(record, True, ("w", "b"), gpu.Choices(), gone)
    on_disk = json.loads((tmp_path / "gpu.json").read_text())
    assert [n["what"] for n in on_disk["not_run"]] == ["warmup", "throughput"]
    assert on_disk["sections_done"] == [] and on_disk["complete"] is True


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        (["--sections", "b,x"], "sections are w,b,a,f,g,c,d,e"),
        (["--packings", "1,0"], "packings are whole numbers"),
        (["--repeats", "0"], "a whole number of 1 or more"),
        (["--models", "vgg"], "models are small,mid,resnet"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(
    argument: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        gpu.parser().parse_args(argument)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def _without_a_gpu(tmp_path: Path) -> dict[str, str]:
    """PATH led by a fake nvidia-smi that answers as the real one does on a host whose
    driver finds no GPU (its message, exit 9)."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn't communicate with the "
        "NVIDIA driver.'\nexit 9\n"
    )
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path)}


def test_the_machine_command_stops_with_one_line_where_no_gpu_is_found(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "benchmarks/gpu_machine.sh", "figures"], cwd=ROOT, capture_output=True,
        text=True, env=_without_a_gpu(tmp_path), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu_machine: no NVIDIA GPU here (nvidia-smi found none): run it on a lent GPU "
        "machine; nothing measured"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake-bin"]


def test_the_benchmark_measures_nothing_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--out", str(out)], cwd=ROOT,
        capture_output=True, text=True, env=_without_a_gpu(tmp_path), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == gpu.NO_GPU
    assert not out.exists()


KERAS_TRIALS = textwrap.dedent("""
    import json, sys
    from trial_requests import trial_request

    class StandInChannel:  # the driver in miniature: asks to prune after `prune_after` reports
        def __init__(self, prune_after=None):
            self.reports, self.prune_after = [], prune_after
        def report(self, address, step, value):
            self.reports.append((step, value))
        def prune_requested(self, address):
            return self.prune_after is not None and len(self.reports) >= self.prune_after
        def stop_requested(self, address):
            return False
    from trialq.gpu.device import FakeDevice
    from trialq.trial.runner import run_trial

    def run(channel, number):
        request = trial_request(
            entrypoint="benchmarks.gpu_trials:keras_digits", number=number,
            params={"learning_rate": 3e-3}, framework="torch", checkpoint_key=f"s/{number}-abcdef",
        )
        return run_trial(request, channel=channel, device=FakeDevice(),
                         allowed_modules=("benchmarks",), checkpoint_root=sys.argv[1])

    pruned, channel = StandInChannel(prune_after=2), StandInChannel()
    a, b = run(pruned, 0), run(channel, 1)
    print(json.dumps([a.outcome.value, len(pruned.reports), b.outcome.value,
                      len(channel.reports), b.metrics.get("val_accuracy", 0.0), b.error,
                      "tensorflow" in sys.modules]))
    """)
"""Two trials of the benchmark's Keras trial, in a process of their own (KERAS_BACKEND is read
once, at Keras' import): one the stand-in driver prunes after two reports, one it lets run."""


@pytest.mark.slow
def test_the_keras_trial_learns_and_is_pruned_on_keras_torch_backend(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    if shutil.which("nvidia-smi"):
        pytest.skip("this is the CPU rehearsal")
    path = os.pathsep.join(str(p) for p in (ROOT / "src", ROOT, ROOT / "tests"))
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", KERAS_TRIALS, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    pruned, reports_before, ok, epochs, accuracy, error, tensorflow = found
    assert (pruned, reports_before) == ("pruned", 2)
    assert (ok, epochs) == ("ok", 6), error
    assert accuracy > 0.5, "ten classes: chance is 0.1"
    assert not tensorflow, "Keras on torch: TensorFlow never imported"


class FakeGpuWorker:
    """What a benchmark study's spec reads of its worker, on a host with no GPU to start one."""

    per_gpu, gpu_count = 8, 1

    def __init__(self, folder: Path) -> None:
        self.folder = folder


@pytest.mark.parametrize(
    ("entry", "shape", "in_flight", "framework", "pruner"),
    [
        (
            "keras_digits",
            gpu_cluster.StudyShape(framework="jax", pruner="median", pruner_startup=4),
            8,
            "jax",
            "median",
        ),
        ("resnet", gpu_cluster.StudyShape(in_flight=4), 4, "auto", "none"),
    ],
)
def test_a_benchmark_study_spec_loads_as_trialq_reads_it(
    tmp_path: Path, entry: str, shape: gpu_cluster.StudyShape, in_flight: int, framework: str,
    pruner: str,
) -> None:  # fmt: skip
    worker = FakeGpuWorker(tmp_path)
    path = tmp_path / "study.toml"
    space = {"learning_rate": (1e-4, 3e-2)}
    path.write_text(gpu_cluster._spec(worker, entry, 16, space, "s", shape))  # type: ignore[arg-type]
    spec = load_spec(path)
    assert spec.study.max_in_flight == in_flight and spec.study.pruner == pruner
    assert spec.trial.framework == framework
    assert str(spec.trial.entrypoint).endswith(f"gpu_trials:{entry}")
    startup = shape.pruner_startup
    assert spec.study.pruner_args == ({} if startup is None else {"n_startup_trials": startup})


def test_the_resnet_trial_is_found_torchs_and_the_keras_trial_must_name_its_framework() -> None:
    """`auto` finds the ResNet trial's framework; it reads the Keras trial's import of
    `trialq.keras` as TensorFlow's, which is why (g)'s spec names the backend."""
    source = (ROOT / "benchmarks" / "gpu_trials.py").read_text(encoding="utf-8")
    assert framework_in_source(source, function="resnet") == "torch"
    assert framework_in_source(source, function="keras_digits") == "tensorflow"
    assert gpu_sharing.keras_shape("jax").framework == "jax"
