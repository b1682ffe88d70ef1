"""The one settings object: every value trialq reads from the environment, read once.

The CLI builds a `Settings` and passes it on; nothing else calls `os.getenv`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


class Settings(BaseSettings):
    """trialq's environment, under the `TRIALQ_` prefix."""

    model_config = SettingsConfigDict(env_prefix="TRIALQ_", frozen=True, extra="ignore")

    broker_url: str = DEFAULT_BROKER_URL
    """Celery broker (Redis). `rediss://` works; put the password in the URL."""

    result_backend: str | None = None
    """Where trial results go; defaults to the broker."""

    storage: str | None = None
    """Optuna storage URL; the spec's `storage` and `--storage` take precedence order below."""

    allowed_modules: Annotated[tuple[str, ...], NoDecode] = ("trialq.examples",)
    """Module prefixes a worker may import entrypoints from (comma separated in the env).
    A task naming any other module ends with outcome `error` and nothing is imported."""

    visibility_timeout_s: int = Field(default=12 * 3600, gt=0)
    """Redis redelivers an unacknowledged task older than this, even one still running,
    so it must outlast the longest trial plus its grace period (checked before submitting)."""

    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    """How often a worker writes its heartbeat key."""

    heartbeat_ttl_s: float = Field(default=20.0, gt=0)
    """A worker whose key is older than this is taken as gone; its trial is lost."""

    max_result_bytes: int = Field(default=1_000_000, gt=0)
    """A trial result larger than this (as JSON) is refused, not stored."""

    gpu_baseline_tolerance_mb: int = Field(default=256, ge=0)
    """A trial is refused when its device holds more than this above the memory in use when
    the worker started: a process of an earlier trial may still hold it."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None
    """trialq's log lines on `submit-study`'s stderr from this level up; unset: none (as
    without `-v`), so the progress bar and the summary stay the whole output."""

    preload: str = "auto"
    """Modules a worker's parent imports before it forks trial processes, so that trials start
    with them loaded: `auto` (TensorFlow when installed), `none`, or comma-separated names.
    Importing is all the parent does with them: a module that runs a TensorFlow op or touches
    CUDA at import is refused (the forked trials would hang)."""

    spare_processes: int = Field(default=1, ge=0)
    """Idle, already forked processes a worker keeps beyond its trial slots, so that the next
    trial starts without waiting for a fork; 0 leaves Celery's own replacement."""

    @field_validator("allowed_modules", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def backend_url(self) -> str:
        """The result backend actually used."""
        return self.result_backend or self.broker_url
