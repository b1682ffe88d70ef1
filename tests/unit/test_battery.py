"""The fault battery (`python -m tests.faults.battery`): it runs the selected rows in a
pytest process of their own, prints each with its figures and result, and exits 1 when one
failed. Here on a tiny file of its own: one row that holds, one that fails."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from faults import battery

pytestmark = pytest.mark.slow

ROWS = '''
import pytest

def _row(fault, lost):
    return ("faults", {"fault": fault, "n_trials": 2, "finished": 2, "lost": lost,
                       "told_twice": 0, "left_running": 0, "outcomes": {"ok": 2}})

def test_a_row_that_holds(record_property):
    record_property("trialq_ledger", _row("a fault ridden out", 0))

def test_a_row_that_fails(record_property):
    record_property("trialq_ledger", _row("a fault that loses a trial", 1))
    assert False, "lost a trial"

def test_no_row_recorded():
    pass
'''


@pytest.fixture
def rows_file(tmp_path: Path) -> str:
    path = tmp_path / "test_rows.py"
    path.write_text(textwrap.dedent(ROWS))
    return str(path)


def _table(out: str) -> list[str]:
    return [line for line in out.splitlines() if " | " in line][1:]


def test_every_row_is_printed_with_its_result_and_a_failed_one_fails_the_battery(
    rows_file: str, capfd: pytest.CaptureFixture[str]
) -> None:
    code = battery.run_battery([rows_file], None, ["-p", "no:cacheprovider"])

    table = _table(capfd.readouterr().out)
    assert code == 1
    assert len(table) == 3, table
    held, failed, bare = table
    assert held.startswith("a fault ridden out") and "| pass   |" in held, held
    assert failed.startswith("a fault that loses a trial") and "| FAIL   |" in failed, failed
    assert "|    1 |" in failed, "its figures are printed"
    assert bare.startswith("no row recorded") and "| pass   |" in bare, bare


def test_rows_selects_by_test_name_and_a_clean_selection_passes(
    rows_file: str, capfd: pytest.CaptureFixture[str]
) -> None:
    code = battery.run_battery([rows_file], "holds", ["-p", "no:cacheprovider"])

    table = _table(capfd.readouterr().out)
    assert code == 0
    assert [line.split(" | ")[0].strip() for line in table] == ["a fault ridden out"]


def test_a_selection_of_nothing_is_exit_2(rows_file: str) -> None:
    assert battery.run_battery([rows_file], "no_such_row", ["-p", "no:cacheprovider"]) == 2


def test_the_battery_runs_the_fault_suite_and_the_files_the_docs_tables_name() -> None:
    files = battery.row_files()
    assert files[0] == "tests/faults"
    assert "tests/integration/test_trial_children.py" in files
    assert not any(f.startswith(("tests/compose", "tests/hosts")) for f in files)
    assert all((battery.ROOT / f).exists() for f in files)
