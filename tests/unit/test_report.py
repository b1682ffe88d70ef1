"""`trialq report` on studies built in SQLite: valid PNGs, and a page that loads offline.

The study from real workers is reported in tests/integration/test_observe.py.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from chromium import load
from report_checks import ALL_PLOTS, assert_page_loads_offline, assert_valid_png
from studies import finished_study

from trialq.cli import trialq_main
from trialq.views.report import write_report

pytestmark = pytest.mark.slow  # real plots, and a real browser loading the page


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'report.db'}"


def test_a_finished_study_gets_every_plot_and_a_page_that_loads_offline(
    storage: str, tmp_path: Path
) -> None:
    study = finished_study(storage)
    page = write_report(study, tmp_path / "out")

    for name in ALL_PLOTS:
        assert_valid_png(tmp_path / "out" / f"{name}.png")
    text = page.read_text()
    assert "not drawn" not in text
    assert "&lt;b&gt;trial 3&lt;/b&gt; failed" in text and "<b>trial 3</b>" not in text
    assert_page_loads_offline(page, n_trials=len(study.trials), n_plots=len(ALL_PLOTS))


def test_plots_a_young_study_cannot_support_are_listed_with_the_reason(
    storage: str, tmp_path: Path
) -> None:
    study = finished_study(storage, outcomes="ok error")
    page = write_report(study, tmp_path / "out")

    text = page.read_text()
    assert "Parameter importances</b>: not drawn: needs 2 complete trials; the study has 1" in text
    assert not (tmp_path / "out" / "importances.png").exists()
    assert_valid_png(tmp_path / "out" / "history.png")
    assert_page_loads_offline(page, n_trials=2, n_plots=3)


def test_an_empty_study_still_gets_a_page(storage: str, tmp_path: Path) -> None:
    study = optuna.create_study(study_name="empty", storage=storage)
    page = write_report(study, tmp_path / "out")
    assert page.read_text().count("not drawn") == len(ALL_PLOTS)
    assert list((tmp_path / "out").glob("*.png")) == []


def test_several_objectives_get_a_pareto_front_instead_of_a_history(
    storage: str, tmp_path: Path
) -> None:
    study = optuna.create_study(
        study_name="two", storage=storage, directions=["maximize", "minimize"]
    )
    for x in (1.0, 2.0, 3.0):
        study.enqueue_trial({"x": x})
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 5)})
        study.tell(trial, [x, x**2])
    page = write_report(study, tmp_path / "out")

    assert_valid_png(tmp_path / "out" / "pareto_front.png")
    assert "Optimization history</b>: not drawn: a plot of one objective" in page.read_text()


def test_the_offline_check_does_catch_a_page_that_reaches_out(tmp_path: Path) -> None:
    """The check above is only worth something if it can fail."""
    page = tmp_path / "reaches-out.html"
    page.write_text(
        '<!doctype html><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; img-src data:\">"
        '<img src="https://example.com/plot.png"><img src="missing.png">'
    )
    console = load(page).console
    assert len(console) == 2 and all("Content Security Policy" in line for line in console)


def test_the_command_writes_the_report_and_prints_the_page(
    storage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finished_study(storage)
    out = tmp_path / "cli"
    assert trialq_main(["report", "built", "--out", str(out), "--storage", storage]) == 0
    assert capsys.readouterr().out == f"{out / 'index.html'}\n"
    assert trialq_main(["report", "built", "--out", str(out)]) == 2
    assert "give --storage or set TRIALQ_STORAGE" in capsys.readouterr().err


def test_an_oom_trial_told_complete_for_nsga2_is_drawn_as_the_failure_it_was(
    storage: str, tmp_path: Path
) -> None:
    study = finished_study(storage, outcomes="ok ok ok ok")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("outcome", "oom")
    trial.set_constraint("oom", 1.0)
    study.tell(trial, float("-inf"))  # the stand-in value trialq.driver.sampling.oom_constraint gives NSGA-II

    page = write_report(study, tmp_path / "out")

    text = page.read_text()
    assert "not drawn" not in text
    for name in ("history", "importances", "parallel_coordinate"):
        assert_valid_png(tmp_path / "out" / f"{name}.png")
    assert "-inf" not in text and "Infinity" not in text
    assert "oom 1" in text


def test_the_parallel_coordinates_keep_every_line_visible_and_the_names_apart(
    storage: str,
) -> None:
    from matplotlib.colors import to_rgb

    from trialq.views.report import _parallel_coordinate

    figure = _parallel_coordinate(finished_study(storage))
    ax = figure.axes[0]
    assert to_rgb(ax.get_facecolor()) == (1.0, 1.0, 1.0)
    (lines,) = ax.collections
    for end in (0.0, 1.0):  # neither end of the scale fades into a white ground
        red, green, blue = to_rgb(lines.get_cmap()(end))
        assert 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.9
    assert {label.get_rotation() for label in ax.get_xticklabels()} == {30.0}
