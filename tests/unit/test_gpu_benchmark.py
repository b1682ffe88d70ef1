"""`python -m benchmarks.gpu` without a GPU: one line, a non-zero status, nothing written; and
its writer and table, fed MADE-UP figures (labelled as such below, never shipped as results:
the real ones come only from a run on a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu, gpu_report
from benchmarks.gpu_plan import Deadline

MADE_UP = 999  # every figure below is invented for the writer's test; none was measured


def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "last_gpu.json"
    monkeypatch.setattr(gpu, "OUT", out)
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)  # no nvidia-smi: no GPU
    assert gpu.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == gpu.NO_GPU + "\n"
    assert not out.exists()


def _made_up_record() -> dict[str, object]:
    """A record shaped as `gpu.measure` returns it; the numbers are MADE UP."""
    mib = 1024 * 1024
    return {
        "date": "2000-01-01",
        "device": {"name": "MADE-UP GPU", "driver": "0.0", "memory_mib": MADE_UP, "count": 1},
        "versions": {"torch": "0.0-made-up", "jax": None},
        "quick": True,
        "memory_over_trials": {
            "in_process": {
                "used_at_start": [1 * mib, 5 * mib, 9 * mib],
                "allocated_after": [0, 0, 2 * mib],
                "reserved_after": [4 * mib, 8 * mib, 8 * mib],
            },
            "trialq": [1 * mib] * 3,
        },
        "throughput": {
            "not_run": [],
            "small": {
                "summary": {
                    "trials_per_hour_per_gpu": {
                        "4": {"runs": 3, "median": 1234.5, "min": 1100.0, "max": 1300.0}
                    },
                    "ratio_of_medians": {"4/1": 3.5},
                    "all_ok": True,
                    "all_within_budget": True,
                    "device_never_at_total": False,
                    "notes": 0,
                }
            },
        },
        "overrun": {"hog": "oom", "others": ["ok", "ok", "ok"]},
        "contexts": {
            "cost": {"torch": 500 * mib, "jax": None},
            "jax_cap": {"held": True, "peak": 90 * mib, "budget": 100 * mib},
        },
        "start_cost": {"torch preloaded": 0.0641, "nothing preloaded": 1.9},
    }


def test_the_writer_keeps_the_record_and_the_table_names_every_figure(tmp_path: Path) -> None:
    record = _made_up_record()
    path = tmp_path / "made_up.json"
    gpu_report.write_json(record, path)
    assert json.loads(path.read_text()) == record
    text = gpu_report.table(record)
    assert text.startswith("2000-01-01, 1 x MADE-UP GPU (999 MiB), driver 0.0, torch 0.0-made-up\n")
    for expected in [
        "| (a) memory at each start, 3 trials in one process, no empty_cache | 1 MiB -> 9 MiB"
        " (last 9 MiB); after the last: allocated 2 MiB, reserved 8 MiB |",
        "| (a) the same, trialq | 1 MiB -> 1 MiB (last 1 MiB) |",
        "| (b) small, 4 a GPU, trials/h per GPU | median 1,234 of 3 runs (1,100-1,300) |",
        "| (b) small, ratios of medians | 4/1: 3.5x; all ok; within budget; DEVICE AT TOTAL;"
        " 0 notes |",
        "| (c) one trial at 2x its budget beside 3 | it: oom; the 3: ok, ok, ok |",
        "| (d) CUDA context, torch | 500 MiB |",
        "| (d) CUDA context, jax | n/a |",
        "| (d) JAX's cap | held: peak 90 MiB of 100 MiB |",
        "| (e) trial start, torch preloaded | 0.064 s (median) |",
    ]:
        assert expected in text.splitlines(), expected


def test_each_section_is_written_as_it_ends_so_a_cut_run_keeps_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sections replaced by stand-ins returning MADE-UP figures; the third one is cut short."""
    out = tmp_path / "last_gpu.json"
    monkeypatch.setattr(gpu, "versions", lambda: {"torch": "0.0-made-up"})
    monkeypatch.setattr(gpu, "memory_over_trials", lambda trials, on_part: {"made_up": MADE_UP})

    def throughput(models: object, repeats: int, deadline: object, on_part: object, *rest: object):  # type: ignore[no-untyped-def]
        on_part({"small": {"runs": [{"made_up_run": 1}]}})  # type: ignore[operator]
        raise TimeoutError("cut at the limit, in (b)'s second run")

    monkeypatch.setattr(gpu.gpu_packing, "throughput", throughput)
    with pytest.raises(TimeoutError):
        gpu.measure(_record(out), True, ("a", "b", "c"), gpu.Choices(), Deadline(600.0))
    kept = json.loads(out.read_text())
    assert kept["sections_done"] == ["a"] and kept["complete"] is False
    assert kept["memory_over_trials"] == {"made_up": MADE_UP}
    assert kept["throughput"] == {"small": {"runs": [{"made_up_run": 1}]}}, "(b)'s run is kept"
    assert "overrun" not in kept


def test_a_memory_section_cut_in_trialqs_half_keeps_the_in_process_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(a) runs one process's trials first, then trialq's: a step's limit that cuts the
    second (the H200 lease, 25 of 30) must not lose the first."""
    out = tmp_path / "last_gpu.json"
    monkeypatch.setattr(gpu, "versions", lambda: {"torch": "0.0-made-up"})

    def memory_over_trials(trials: int, on_part: object) -> dict[str, list[int]]:
        on_part({"in_process": [MADE_UP] * trials})  # type: ignore[operator]
        raise TimeoutError("cut at the limit, in trialq's half")

    monkeypatch.setattr(gpu, "memory_over_trials", memory_over_trials)
    with pytest.raises(TimeoutError):
        gpu.measure(_record(out), True, ("a",), gpu.Choices(), Deadline(600.0))
    kept = json.loads(out.read_text())
    assert kept["memory_over_trials"] == {"in_process": [MADE_UP] * 8}
    assert kept["sections_done"] == [] and kept["complete"] is False


def _record(out: Path) -> gpu_report.Record:
    device = {"name": "MADE-UP GPU", "driver": "0.0", "memory_mib": MADE_UP}
    return gpu_report.Record(gpu.head([device], True, gpu.Choices()), out)


def test_the_jax_context_probe_asks_jax_not_to_preallocate(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX takes 75 % of the card at its first op by default: that is no context's cost."""
    import benchmarks.gpu_trials

    seen: dict[str, str] = {}

    def run(command: list[str], **kwargs: object) -> object:
        seen.update(kwargs["env"])  # type: ignore[arg-type]
        return type("Done", (), {"returncode": 0, "stdout": f"{MADE_UP}\n"})()

    monkeypatch.setattr(benchmarks.gpu_trials, "device_used_bytes", lambda: 0)
    monkeypatch.setattr(gpu.subprocess, "run", run)
    assert gpu._context_cost("import jax", gpu.JAX_NO_PREALLOCATION) == MADE_UP
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_a_record_of_some_sections_shows_those_and_says_it_was_cut() -> None:
    record = _made_up_record()
    del record["throughput"], record["start_cost"]
    record["complete"] = False
    text = gpu_report.table(record)
    assert "(cut short: only the sections done)" in text.splitlines()[0]
    assert "(b)" not in text and "(a)" in text
