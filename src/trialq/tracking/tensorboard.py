"""TensorBoard: one log folder per trial, `trial-<number>`, under the study's folder. Its
reports are scalars by step under `reports/<objective>`, its final values and metrics
scalars at its last step, its params the HParams dashboard's, with its state as the
session's status.

Written with TensorBoard's own protobufs and record writer, never `tensorboard.compat.tf`
(which loads TensorFlow where it is installed: the driver never does). A trial's events are
one file, replaced whole: a trial recorded again (a restarted driver) is rewritten, never
doubled.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
from tensorboard.summary.writer.record_writer import RecordWriter

from trialq.tracking.base import StudyInfo, ToldTrial
from trialq.tracking.config import TensorboardTracking

EVENTS_FILE = "events.out.tfevents.trialq"
"""A trial's one events file (TensorBoard reads any file whose name holds `tfevents`)."""

_STATUS = {
    "COMPLETE": api_pb2.STATUS_SUCCESS,
    "PRUNED": api_pb2.STATUS_UNKNOWN,  # stopped early: neither a success nor a failure
    "FAIL": api_pb2.STATUS_FAILURE,
}


class TensorboardTracker:
    """Event files under `log_dir` (docs/tracking.md)."""

    name = "tensorboard"

    def __init__(self, config: TensorboardTracking) -> None:
        self._config = config
        self._study: StudyInfo | None = None
        self.root: Path | None = None

    def start(self, study: StudyInfo) -> None:
        self._study = study
        self.root = log_dir(self._config, study)
        self.root.mkdir(parents=True, exist_ok=True)

    def record(self, trial: ToldTrial) -> None:
        assert self._study is not None and self.root is not None
        folder = self.root / f"trial-{trial.number:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        events = _events(trial, self._study)
        partial = folder / f".{EVENTS_FILE}.partial"
        with partial.open("wb") as file:
            writer = RecordWriter(file)
            for event in events:
                writer.write(event.SerializeToString())
            writer.flush()
        os.replace(partial, folder / EVENTS_FILE)

    def close(self) -> None:
        """Every trial's file was closed as it was written."""


def log_dir(config: TensorboardTracking, study: StudyInfo) -> Path:
    """The study's TensorBoard folder: the configured one, else under its artifact root,
    else beside the spec."""
    if config.log_dir is not None:
        return study.spec_folder / config.log_dir
    if study.artifact_root is not None:
        return study.artifact_root / "tensorboard" / study.name
    return study.spec_folder / f"{study.name}-tensorboard"


def _events(trial: ToldTrial, study: StudyInfo) -> list[event_pb2.Event]:
    start = trial.started.timestamp() if trial.started else time.time()
    end = trial.ended.timestamp() if trial.ended else time.time()
    events = [event_pb2.Event(wall_time=start, file_version="brain.Event:2")]
    params = {k: v for k, v in trial.params.items() if isinstance(v, bool | int | float | str)}
    hparams = summary_v2.hparams_pb(params, trial_id=f"{study.name}/{trial.number}",
                                    start_time_secs=start)  # fmt: skip
    events.append(event_pb2.Event(wall_time=start, step=0, summary=hparams))
    objective = study.metric_names[0]
    for step, value in sorted(trial.intermediate.items()):
        events.append(_scalar(f"reports/{objective}", value, step, end))
    last = max(trial.intermediate, default=0)
    finals = {**trial.final_metrics, **trial.objective_values(study)}
    finals |= {f"trialq/{k}": float(v) for k, v in trial.summary_attrs.items() if _is_number(v)}
    events.extend(_scalar(tag, value, last, end) for tag, value in finals.items())
    events.append(event_pb2.Event(wall_time=end, step=last, summary=_session_end(trial, end)))
    return events


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _scalar(tag: str, value: float, step: int, wall_time: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _session_end(trial: ToldTrial, end: float) -> summary_pb2.Summary:
    info = plugin_data_pb2.SessionEndInfo(status=_STATUS.get(trial.state), end_time_secs=end)
    data = plugin_data_pb2.HParamsPluginData(session_end_info=info)
    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                      metadata=metadata.create_summary_metadata(data))  # fmt: skip
    return summary


def tracker(config: TensorboardTracking) -> TensorboardTracker:
    """The registry's entry (`trialq.tracking.registry`)."""
    return TensorboardTracker(config)
