"""Showing a study's progress: counts of finished trials and the best value so far."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

from optuna.trial import TrialState
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


@dataclass
class Counts:
    """Finished trials by state."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0

    @property
    def finished(self) -> int:
        """Trials that count towards `n_trials`."""
        return self.complete + self.pruned + self.failed

    def record(self, state: TrialState) -> None:
        """Count one more finished trial."""
        if state is TrialState.COMPLETE:
            self.complete += 1
        elif state is TrialState.PRUNED:
            self.pruned += 1
        else:
            self.failed += 1


class ProgressSink(Protocol):
    """Where the driver reports progress."""

    def update(self, counts: Counts, best: float | None, running: int) -> None:
        """Called after every collection pass."""

    def trial_failed(self, line: str) -> None:
        """Called once for each trial that ended failed, with one line saying why."""

    def note(self, line: str) -> None:
        """Called for what befell a trial in flight that a user should see without `-v`:
        a lost worker, a retry, a refusal, a preemption (the trial is sent again)."""


class NoProgress:
    """For --no-progress and for scripts: no bar; failures on stderr only if asked."""

    def __init__(self, show_failures: bool = False) -> None:
        self._show_failures = show_failures

    def update(self, counts: Counts, best: float | None, running: int) -> None:
        """Show nothing."""

    def trial_failed(self, line: str) -> None:
        """One line on stderr, where asked for."""
        if self._show_failures:
            print(line, file=sys.stderr)

    def note(self, line: str) -> None:
        """One line on stderr, where failures are shown."""
        self.trial_failed(line)


class RichProgress:
    """A progress bar on stderr: done / running / failed, best value, elapsed time. Where
    stderr is no terminal (a log file, CI), a plain line each time the counts change
    instead: a bar there is cut at 80 columns and redrawn into the file."""

    def __init__(self, study_name: str, n_trials: int) -> None:
        self._console = Console(file=sys.stderr)
        self._plain = not self._console.is_terminal
        self._study, self._n_trials, self._last_line = study_name, n_trials, ""
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} done"),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=self._console,
            transient=False,
            disable=self._plain,
        )
        self._task = self._progress.add_task(study_name, total=n_trials, detail="")

    def __enter__(self) -> RichProgress:
        if not self._plain:  # plain lines need no live display (older rich prints one anyway)
            self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if not self._plain:
            self._progress.stop()

    def trial_failed(self, line: str) -> None:
        """One line above the bar."""
        self._progress.console.print(line, markup=False, highlight=False)

    def note(self, line: str) -> None:
        """One line above the bar."""
        self.trial_failed(line)

    def update(self, counts: Counts, best: float | None, running: int) -> None:
        """Redraw with the latest counts."""
        best_text = "-" if best is None else f"{best:.6g}"
        detail = (
            f"running {running} | pruned {counts.pruned} | failed {counts.failed} "
            f"| best {best_text}"
        )
        self._progress.update(self._task, completed=counts.finished, detail=detail)
        line = f"{self._study}: {counts.finished}/{self._n_trials} done | {detail}"
        if self._plain and line != self._last_line:
            print(line, file=sys.stderr, flush=True)
            self._last_line = line
