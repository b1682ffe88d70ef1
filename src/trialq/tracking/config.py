"""`[tracking]`: which trackers record the study's trials, and where (docs/tracking.md).

`tensorboard = true` (or a table of its keys) turns one on; absent or `false`, it is off.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MlflowTracking(_Frozen):
    """`[tracking.mlflow]`: one parent run per study, a nested run per trial."""

    tracking_uri: str | None = None
    """`file:./mlruns`, `sqlite:///mlflow.db`, `http://host:5000`; a relative path is the
    spec's folder's. Default: MLflow's own (`MLFLOW_TRACKING_URI`, else `./mlruns`)."""
    experiment: str | None = None
    """Default: the study's name."""


class WandbTracking(_Frozen):
    """`[tracking.wandb]`: one W&B run per trial, grouped by the study's name."""

    project: str | None = None
    """Default: the study's name."""
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] | None = None
    """Default: W&B's own (`WANDB_MODE`, else online)."""
    dir: str | None = None
    """Where W&B writes its run folders; a relative path is the spec's folder's."""


class TensorboardTracking(_Frozen):
    """`[tracking.tensorboard]`: a log folder per trial, reports as scalars, params as hparams."""

    log_dir: str | None = None
    """Default: `tensorboard/` under the study's artifact root (with `--local`, beside the
    spec), else `<study>-tensorboard/` beside the spec. A relative path is the spec's folder's."""


class TrackingSection(_Frozen):
    """`[tracking]`: every tracker is off unless named."""

    mlflow: MlflowTracking | None = None
    wandb: WandbTracking | None = None
    tensorboard: TensorboardTracking | None = None

    @field_validator("mlflow", "wandb", "tensorboard", mode="before")
    @classmethod
    def _switch(cls, value: object) -> object:
        """`true` is the tracker with its defaults, `false` no tracker."""
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @property
    def names(self) -> tuple[str, ...]:
        """The trackers turned on."""
        return tuple(name for name in ("mlflow", "wandb", "tensorboard") if getattr(self, name))


__all__ = ["MlflowTracking", "TensorboardTracking", "TrackingSection", "WandbTracking"]
