"""The fault battery: every row of docs/reliability.md's fault tables, run against real
processes, printed as one table with each row's result; what to run before a release.

    python -m tests.faults.battery                  # every row
    python -m tests.faults.battery --rows redis     # the rows whose test names match (-k)
    python -m tests.faults.battery -- -x            # after `--`: pytest's own options

It runs pytest in a subprocess on `tests/faults` and on every other test file the docs'
tables name (their `where` column), with this module loaded as a pytest plugin: each test's
outcome and the rows it recorded (`tests/ledger.py`) are written to a file, read back here.
A test that recorded no row is a row of its own, named after the test. The exit status is 1
when any row failed (0 else; 2 for a usage mistake, or when nothing was selected).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).parents[1]
ROOT = TESTS_DIR.parent
DOCS = ROOT / "docs" / "reliability.md"
OUT_ENV = "TRIALQ_BATTERY_OUT"
"""Where the plugin (in the pytest process) writes what each test did, one JSON a line."""
SKIPPED_DIRS = ("tests/compose/", "tests/hosts/")
"""Files the tables name that need a Docker engine or network namespaces of their own: run
them on their own (`pytest tests/compose`, `tests/hosts`), as their docs say."""


def row_files(docs: Path = DOCS) -> list[str]:
    """`tests/faults`, then every other test file the docs' fault tables name, in order."""
    named = re.findall(r"\|\s*(tests/[\w/]+\.py)\s*\|", docs.read_text())
    others = [
        f for f in dict.fromkeys(named)
        if not f.startswith(("tests/faults/", *SKIPPED_DIRS)) and (ROOT / f).is_file()
    ]  # fmt: skip
    return ["tests/faults", *others]


@dataclass
class TestRun:
    """One test as the pytest process saw it: its outcome and the rows it recorded."""

    nodeid: str
    outcome: str = "passed"
    """passed, failed, skipped, xfailed or xpassed; a failure in any phase is a failure."""
    rows: list[dict[str, Any]] = field(default_factory=list)

    def take(self, report: dict[str, Any]) -> None:
        if report["when"] == "teardown":  # its properties hold every row the test recorded
            self.rows = list(report["rows"])
        outcome = report["outcome"]
        if report.get("wasxfail") is not None:
            outcome = "xfailed" if outcome == "skipped" else "xpassed"
        if outcome == "failed" or (outcome != "passed" and self.outcome == "passed"):
            self.outcome = outcome

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"


def read_runs(lines: Iterable[str]) -> list[TestRun]:
    """The tests in the order they ran, from the plugin's lines."""
    runs: dict[str, TestRun] = {}
    for line in lines:
        if line.strip():
            report = json.loads(line)
            runs.setdefault(report["nodeid"], TestRun(report["nodeid"])).take(report)
    return list(runs.values())


HEADER = (
    "fault                                    | n_trials | finished | lost | told twice "
    "| left RUNNING | outcomes                 | result | test"
)


def table(runs: Sequence[TestRun]) -> list[str]:
    """One line a row: the ledger's figures where the test recorded any, the result, the
    test (its file and name)."""
    lines = [HEADER, re.sub(r"[^|]", "-", HEADER)]
    for run in runs:
        result = "FAIL" if run.failed else run.outcome.replace("passed", "pass")
        for row in run.rows or [None]:
            lines.append(_line(row, run, result))
    return lines


def _line(row: dict[str, Any] | None, run: TestRun, result: str) -> str:
    test = run.nodeid.removeprefix("tests/")
    if row is None:
        name = run.nodeid.rsplit("::", 1)[-1].removeprefix("test_").replace("_", " ")
        figures = f"{name[:40]:<40} | {'':>8} | {'':>8} | {'':>4} | {'':>10} | {'':>12} | {'':<24}"
    else:
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(row.get("outcomes", {}).items()))
        figures = (
            f"{row['fault'][:40]:<40} | {row['n_trials']:>8} | {row['finished']:>8} | "
            f"{row['lost']:>4} | {row['told_twice']:>10} | {row['left_running']:>12} | "
            f"{outcomes[:24]:<24}"
        )
    return f"{figures} | {result:<6} | {test}"


def command_line(files: Sequence[str], rows: str | None, extra: Sequence[str]) -> list[str]:
    """The pytest run: this module as its plugin, one process (`-n 0`: the fault tests
    start their own workers and servers), `-k` where rows were selected."""
    command = [sys.executable, "-m", "pytest", "-p", "faults.battery", "-n", "0", "-q", *files]
    if rows:
        command += ["-k", rows]
    return [*command, *extra]


def run_battery(files: Sequence[str], rows: str | None, extra: Sequence[str]) -> int:
    """Run the rows, print the table; 1 when any row failed, 2 when none was selected."""
    with tempfile.TemporaryDirectory(prefix="trialq-battery-") as folder:
        out = Path(folder) / "runs.jsonl"
        out.touch()
        # run from a pytest-xdist worker (the suite under -n N), the child must not take
        # itself for one: its plugin writes only where no worker's controller does
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        env = {
            **inherited,
            OUT_ENV: str(out),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])
            ),
        }
        pytest = subprocess.run(command_line(files, rows, extra), cwd=ROOT, env=env)
        runs = read_runs(out.read_text().splitlines())
    if not runs:
        print(f"no row selected (pytest exit {pytest.returncode})", file=sys.stderr)
        return 2
    print("\n".join(["", *table(runs)]))
    failed = sum(run.failed for run in runs)
    print(f"\n{len(runs)} tests, {failed} failed")
    return 1 if failed or pytest.returncode not in (0, 5) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra = args[args.index("--") + 1 :] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.battery", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", help="a pytest -k expression over the tests' names")
    parser.add_argument("--list", action="store_true", help="print the files the battery runs")
    options = parser.parse_args(own)
    files = row_files()
    if options.list:
        print("\n".join(files))
        return 0
    return run_battery(files, options.rows, extra)


# --- the plugin: loaded into the pytest process with `-p faults.battery` ----------------


def pytest_runtest_logreport(report: Any) -> None:
    """Write what each phase of each test did, with the ledger's rows attached to it."""
    out = os.environ.get(OUT_ENV)
    if not out or os.environ.get("PYTEST_XDIST_WORKER"):  # under -n N, the controller writes
        return
    rows = [
        value[1]
        for name, value in report.user_properties
        if name == "trialq_ledger" and value[0] == "faults"
    ]
    line = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "wasxfail": getattr(report, "wasxfail", None),
        "rows": rows,
    }
    with open(out, "a") as file:
        file.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    sys.exit(main())
