"""`trialq report`: a study as PNG plots and one HTML page that needs no network to open.

The plots are Optuna's own, drawn with matplotlib (optimisation history, parameter
importances, parallel coordinates, intermediate values, or the Pareto front for several
objectives), plus one of ours: each trial's peak memory, coloured by how it ended. A plot
the study cannot support yet (no complete trial, one trial, no reports) is listed with the
reason instead of failing the report. The page embeds the same PNGs as data URIs and
links the files, and its Content-Security-Policy forbids every other source: it opens
from a laptop offline, from a CI artifact, or from a mail attachment alike.
"""

from __future__ import annotations

import base64
import html
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from trialq.errors import UsageError
from trialq.oom_stand_ins import has_stand_in_values
from trialq.views.rows import (
    TrialRow,
    best_line,
    human_bytes,
    outcome_text,
    trial_rows,
    value_text,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
OUTCOME_COLOURS = {"ok": "#2e7d32", "pruned": "#f9a825", "running": "#0288d1"}
"""Colours of the memory plot's bars; every failure outcome is red."""


class Skipped(Exception):
    """Raised by a plot that the study cannot support yet; the message says why."""


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its file when drawn, else why it was skipped."""

    title: str
    file: str
    skipped: str | None = None
    notes: tuple[str, ...] = ()
    """Warnings Optuna gave while drawing it (few trials, say): shown under the plot."""


def write_report(study: optuna.Study, out_dir: Path) -> Path:
    """Draw every plot into `out_dir` and write `index.html` there; return the page's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(study)
    plotted = _without_stand_ins(study)
    plots = [
        _draw(plotted, title, name, draw, out_dir) for title, name, draw in _plot_list(study, rows)
    ]
    page = out_dir / "index.html"
    page.write_text(render_page(study, rows, plots, out_dir), encoding="utf-8")
    return page


def _without_stand_ins(study: optuna.Study) -> optuna.Study:
    """The study as Optuna's plots should see it: an OOM trial told COMPLETE with stand-in
    values (for NSGA-II, see trialq.oom_stand_ins) is shown as the failure it was."""
    trials = study.get_trials(deepcopy=False)
    if not any(has_stand_in_values(t) for t in trials):
        return study
    view = optuna.create_study(directions=study.directions, study_name=study.study_name)
    if study.metric_names:
        view.set_metric_names(study.metric_names)
    for trial in trials:
        if has_stand_in_values(trial):
            trial = optuna.trial.create_trial(
                state=TrialState.FAIL,
                params=trial.params,
                distributions=trial.distributions,
                user_attrs=trial.user_attrs,
                system_attrs=trial.system_attrs,
                intermediate_values=trial.intermediate_values,
            )
        view.add_trial(trial)
    return view


Drawing = Callable[[optuna.Study], "Figure"]


def _plot_list(study: optuna.Study, rows: list[TrialRow]) -> list[tuple[str, str, Drawing]]:
    """(title, name, drawing) of each plot, in page order; the name is also the file's."""
    first = [("Pareto front", "pareto_front", _pareto_front)] if len(study.directions) > 1 else []
    return [
        *first,
        ("Optimization history", "history", _history),
        ("Parameter importances", "importances", _importances),
        ("Parallel coordinates", "parallel_coordinate", _parallel_coordinate),
        ("Intermediate values", "intermediate_values", _intermediate_values),
        ("Peak memory by trial and outcome", "memory", lambda _: _memory(rows)),
    ]


def _draw(study: optuna.Study, title: str, name: str, draw: Drawing, out: Path) -> Plot:
    """Draw one plot to `<name>.png`, or record why it was skipped."""
    plt = _pyplot()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            figure = draw(study)
    except Skipped as why:
        return Plot(title, f"{name}.png", skipped=str(why))
    except (ValueError, RuntimeError) as exc:  # Optuna refusing this study's shape
        return Plot(title, f"{name}.png", skipped=f"Optuna could not draw it: {exc}")
    figure.savefig(out / f"{name}.png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    notes = tuple(dict.fromkeys(str(warning.message) for warning in caught))
    return Plot(title, f"{name}.png", notes=notes)


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, unless someone chose one already."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "trialq report needs matplotlib: pip install -e '.[report]' in trialq's checkout"
        ) from None
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- the plots ------------------------------------------------------------------------------


def _complete(study: optuna.Study, at_least: int) -> None:
    n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if n < at_least:
        raise Skipped(f"needs {at_least} complete trial{'s' * (at_least > 1)}; the study has {n}")


def _single_objective(study: optuna.Study) -> None:
    if len(study.directions) > 1:
        raise Skipped("a plot of one objective; this study has several (see the Pareto front)")


def _target_name(study: optuna.Study) -> str:
    names = study.metric_names
    return names[0] if names else "Objective value"


def _history(study: optuna.Study) -> Figure:
    return _one_objective_plot(study, "plot_optimization_history", at_least=1)


def _importances(study: optuna.Study) -> Figure:
    """Optuna's default evaluator (PED-ANOVA) needs no scikit-learn, but two trials at least."""
    return _one_objective_plot(study, "plot_param_importances", at_least=2)


def _parallel_coordinate(study: optuna.Study) -> Figure:
    """One line per trial: lines only compare once there are two. Redrawn for reading: on
    Optuna's grey ground its pale end of "Blues" hid the low values, and the axis names ran
    into each other."""
    figure = _one_objective_plot(study, "plot_parallel_coordinate", at_least=2)
    ax = figure.axes[0]
    ax.set_facecolor("white")
    for lines in ax.collections:
        lines.set_cmap(PARALLEL_COLORMAP)
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")
    figure.set_size_inches(max(7.0, 1.2 * len(ax.get_xticks())), 4.5)
    figure.subplots_adjust(left=0.18, bottom=0.25)  # room for the slanted names
    return figure


PARALLEL_COLORMAP = "viridis"
"""Dark at both ends of the scale, so no trial's line fades into the ground."""


def _one_objective_plot(study: optuna.Study, plot: str, at_least: int) -> Figure:
    """One of Optuna's plots of a single objective, named after the study's metric."""
    _single_objective(study)
    _complete(study, at_least)
    draw = getattr(_optuna_matplotlib(), plot)
    return _figure(draw(study, target_name=_target_name(study)))


def _intermediate_values(study: optuna.Study) -> Figure:
    """Learning curves: what the pruner saw, pruned trials' short curves included."""
    if not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        raise Skipped("no trial reported intermediate values (trial.report)")
    return _figure(_optuna_matplotlib().plot_intermediate_values(study))


def _pareto_front(study: optuna.Study) -> Figure:
    if len(study.directions) > 3:
        raise Skipped("Optuna draws Pareto fronts of two or three objectives only")
    _complete(study, 1)
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    return _figure(_optuna_matplotlib().plot_pareto_front(study, target_names=names))


def _memory(rows: list[TrialRow]) -> Figure:
    """Host peak (RSS) per trial, and GPU peak where any trial has one, bars by outcome."""
    measured = [row for row in rows if row.record.peak_rss_bytes is not None]
    if not measured:
        raise Skipped("no trial has recorded its memory yet")
    panels = [("peak RSS, MiB", "peak_rss_bytes")]
    if any(row.record.gpu_peak is not None for row in measured):
        panels.append(("peak GPU memory, MiB", "gpu_peak"))
    figure, axes = _pyplot().subplots(
        len(panels), 1, squeeze=False, figsize=(7, 2.8 * len(panels)), layout="constrained"
    )
    for ax, (label, field) in zip(axes[:, 0], panels, strict=True):
        _memory_bars(ax, measured, label, field)
    axes[0, 0].set_title("Peak memory by trial and outcome")
    return figure  # type: ignore[no-any-return]


def _memory_bars(ax: Any, rows: list[TrialRow], label: str, field: str) -> None:
    for outcome in sorted({row.label for row in rows}):
        mine = [row for row in rows if row.label == outcome]
        heights = [(getattr(row.record, field) or 0) / 2**20 for row in mine]
        colour = OUTCOME_COLOURS.get(outcome, "#c62828")
        ax.bar([row.number for row in mine], heights, color=colour, label=outcome)
    ax.set_xlabel("trial")
    ax.set_ylabel(label)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _optuna_matplotlib() -> Any:
    """Optuna's matplotlib plots, imported only once pyplot is on the Agg backend."""
    _pyplot()
    import optuna.visualization.matplotlib as vis

    return vis


def _figure(drawn: Any) -> Figure:
    """The figure behind what Optuna returns (Axes, or an array of them)."""
    axes = drawn if hasattr(drawn, "figure") else drawn.flat[0]
    return axes.figure  # type: ignore[no-any-return]


# --- the page -------------------------------------------------------------------------------

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
td.text, th.text { text-align: left; }
tr.ok td.outcome { color: #2e7d32; } tr.pruned td.outcome { color: #a67c00; }
tr.failed td.outcome { color: #c62828; }
figure { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
img { max-width: 760px; border: 1px solid #eee; }
"""
_COLUMNS = ("#", "state", "outcome", "value", "params", "attempts", "worker host",
            "duration s", "peak RSS", "peak GPU", "GPU util %", "error")  # fmt: skip
_TEXT_COLUMNS = {"params", "worker host", "error", "outcome", "state"}


def render_page(study: optuna.Study, rows: list[TrialRow], plots: list[Plot], out: Path) -> str:
    """The report page: summary, plots (embedded, linked to their files), then the trials."""
    name = html.escape(study.study_name)
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            f"<title>trialq report: {name}</title><style>{_STYLE}</style></head><body>",
            f"<h1>Study {name}</h1>",
            _summary_html(study, rows),
            '<h2>Plots</h2><section id="plots">',
            *(_plot_html(plot, out) for plot in plots),
            '</section><h2>Trials</h2><table id="trials">',
            _header_html(),
            *(_row_html(row) for row in rows),
            "</table></body></html>",
        ]
    )


def _summary_html(study: optuna.Study, rows: list[TrialRow]) -> str:
    counts = outcome_text(rows, "no trials")
    directions = ", ".join(d.name.lower() for d in study.directions)
    return (
        f'<p id="summary">{len(rows)} trials ({html.escape(counts)}); '
        f"direction {directions}.<br>{html.escape(best_line(study))}</p>"
    )


def _plot_html(plot: Plot, out: Path) -> str:
    title = html.escape(plot.title)
    if plot.skipped is not None:
        return f'<p class="skipped"><b>{title}</b>: not drawn: {html.escape(plot.skipped)}</p>'
    data = base64.b64encode((out / plot.file).read_bytes()).decode("ascii")
    notes = "".join(f"<br><small>{html.escape(note)}</small>" for note in plot.notes)
    return (
        f'<figure><a href="{html.escape(plot.file)}"><img alt="{title}" '
        f'src="data:image/png;base64,{data}"></a><figcaption>{title}{notes}</figcaption></figure>'
    )


def _header_html() -> str:
    cells = "".join(f"<th{_class(column)}>{html.escape(column)}</th>" for column in _COLUMNS)
    return f"<tr>{cells}</tr>"


def _row_html(row: TrialRow) -> str:
    record = row.record
    util = record.gpu_utilization_mean
    cells = [
        str(row.number), row.state, row.outcome or "-", value_text(row.values),
        ", ".join(f"{k}={v}" for k, v in row.params.items()),
        "-" if record.attempts is None else str(record.attempts), record.worker_host or "-",
        "-" if record.duration_s is None else f"{record.duration_s:.2f}",
        human_bytes(record.peak_rss_bytes), human_bytes(record.gpu_peak),
        "-" if util is None else f"{util:.0f}", row.error or "",
    ]  # fmt: skip
    tds = "".join(
        f"<td{_class(column)}>{html.escape(cell)}</td>"
        for column, cell in zip(_COLUMNS, cells, strict=True)
    )
    kind = "failed" if row.failed else row.label
    return f'<tr class="{kind}">{tds}</tr>'


def _class(column: str) -> str:
    names = ["text"] if column in _TEXT_COLUMNS else []
    if column == "outcome":
        names.append("outcome")
    return f' class="{" ".join(names)}"' if names else ""
