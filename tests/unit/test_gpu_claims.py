"""The README's GPU figures, and benchmarks/README.md's "On a GPU", say what their records
hold: each figure cites its record file and key, and a number changed in either place fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import gpu_claims

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "benchmarks"


def readme_figures() -> str:
    return gpu_claims.section(README.read_text(encoding="utf-8"), "GPU figures")


def benchmark_figures() -> str:
    return gpu_claims.section((BENCHMARKS / "README.md").read_text(encoding="utf-8"), "On a GPU")


def test_every_gpu_figure_in_the_readme_is_its_records() -> None:
    text = readme_figures()
    assert len(gpu_claims.citations(text)) >= 10
    assert gpu_claims.mismatches(text, ROOT) == []


def test_the_readme_shows_no_gpu_number_without_its_record() -> None:
    assert gpu_claims.uncited_numbers(readme_figures()) == []


def test_every_cited_figure_in_the_benchmarks_readme_is_its_records() -> None:
    text = benchmark_figures()
    assert len(gpu_claims.citations(text)) >= 40
    assert gpu_claims.mismatches(text, BENCHMARKS) == []


def test_a_number_changed_in_the_readme_fails() -> None:
    text = readme_figures()
    assert "[4,008](" in text
    changed = text.replace("[4,008](", "[4,108](")
    assert any("shown '4,108'" in line for line in gpu_claims.mismatches(changed, ROOT))


def test_a_number_changed_in_a_record_fails(tmp_path: Path) -> None:
    shutil.copytree(BENCHMARKS, tmp_path / "benchmarks", ignore=_not_gpu_records)
    record = tmp_path / "benchmarks" / "gpu_h200_2026-11-28.json"
    data = json.loads(record.read_text(encoding="utf-8"))
    data["throughput"][0]["trials_per_hour_per_gpu"] = 1500.0
    record.write_text(json.dumps(data), encoding="utf-8")
    wrong = gpu_claims.mismatches(readme_figures(), tmp_path)
    assert any("record 1500.0" in line for line in wrong)  # the figure itself
    assert any("throughput/2/trials_per_hour_per_gpu / throughput/0" in line for line in wrong)


def test_an_uncited_number_and_a_missing_key_are_caught() -> None:
    assert gpu_claims.uncited_numbers("it ran 4,008 trials/h on one H200, 2026-11-28") == ["4,008"]
    wrong = gpu_claims.mismatches('[1](benchmarks/gpu_h200_2026-11-28.json "no/such")', ROOT)
    assert wrong and "no" in wrong[0]


@pytest.mark.parametrize(
    ("shown", "key", "agrees"),
    [
        ("615", "each(a) in MiB", True),
        ("615", "each(b) in MiB", False),  # two different values: no one figure
        ("3", "len(b)", True),
        ("1.5", "last(b) - first(b) in MiB", False),
        ("2.0", "first(c) / last(c)", True),
    ],
)
def test_the_key_expressions(shown: str, key: str, agrees: bool) -> None:
    mib = 1024 * 1024
    record = {"a": [615 * mib, 615 * mib], "b": [615 * mib, 616 * mib, 617 * mib], "c": [4, 2]}
    try:
        value = gpu_claims.evaluate(key, record)
    except ValueError:
        assert not agrees
        return
    assert gpu_claims.agrees(shown, value) is agrees


def _not_gpu_records(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if not name.startswith("gpu_") or not name.endswith(".json")]
