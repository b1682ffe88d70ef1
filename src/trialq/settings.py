"""The one settings object: every value trialq reads from the environment, read once.

The CLI builds a `Settings` and passes it on; nothing else calls `os.getenv`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trialq.wire.keys import DEFAULT_KEY_TTL_S
from trialq.wire.signing import MIN_SECRET_CHARS, Seal, seal_of

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""What redis-py connects to: the broker's and the result backend's URLs."""


class Settings(BaseSettings):
    """trialq's environment, under the `TRIALQ_` prefix."""

    model_config = SettingsConfigDict(env_prefix="TRIALQ_", frozen=True, extra="ignore")

    broker_url: str = DEFAULT_BROKER_URL
    """Celery broker (Redis). `rediss://` works; put the password in the URL."""

    result_backend: str | None = None
    """Where trial results go; defaults to the broker."""

    storage: str | None = None
    """Optuna storage URL; the spec's `storage` and `--storage` take precedence order below."""

    broker_password_file: Path | None = None
    """A file holding the broker's password (a Compose or Kubernetes secret), put into the
    broker and result backend URLs: no password sits in an environment variable, where
    `docker inspect` and /proc/PID/environ show it."""

    storage_password_file: Path | None = None
    """Likewise, the password put into the `storage` URL."""

    result_secret_file: Path | None = None
    """A file holding the secret that trial processes sign their results and reports with
    and the driver checks them against (`trialq.wire.signing`): the same on the driver and
    every worker (Compose and Kubernetes mount one). With it, the driver sets aside a result
    that does not verify (anyone who can write to the broker could have written it); without
    it, results are taken as they are, and the driver says so at its start."""

    result_secret: SecretStr | None = None
    """The secret itself, where no file can be mounted (`--local` hands its own workers one
    this way); the file, when given, wins."""

    allowed_modules: Annotated[tuple[str, ...], NoDecode] = ("trialq.examples",)
    """Module prefixes a worker may import entrypoints from (comma separated in the env).
    A task naming any other module ends with outcome `error` and nothing is imported."""

    accept_code: bool = False
    """Whether this worker runs trial functions carried as code (`TRIALQ_ACCEPT_CODE`: a
    function defined in `__main__` or a notebook, cloudpickled by the driver), each only
    when signed with the cluster's secret (`trialq.wire.carried_code`). `--local`'s workers
    do; a cluster's worker only when asked, since unpickling runs the code."""

    import_paths: Annotated[tuple[str, ...], NoDecode] = ()
    """Folders a worker puts first on `sys.path` to import entrypoints (`TRIALQ_IMPORT_PATHS`,
    separated by the OS path separator); `--local` sets the spec's folder and the current
    one for the workers it starts. Never taken from a message."""

    trial_output_max_bytes: int = Field(default=10 * 2**20, ge=0)
    """What one trial may print (stdout and stderr together, as Celery logs them) into its
    worker's log; past it the rest is dropped, said once (`trial/output_cap.py`). 0: no cap."""

    trial_cpus: int | None = Field(default=None, ge=1)
    """CPU threads a trial's libraries use on this worker, unless its spec says (`[trial]
    cpus`); unset: the worker's cores divided among its slots (`worker/threads.py`).
    `--local` sets it to the cores divided among its workers."""

    trial_log_dir: Path | None = None
    """Where each trial attempt's own log goes (`<study>/trial-<n>-attempt-<a>.log`: its
    prints and trialq's lines about it, `worker/attempt_log.py`); none without it. `--local`
    sets it to the run's logs folder."""

    visibility_timeout_s: int = Field(default=12 * 3600, gt=0)
    """Redis redelivers an unacknowledged task older than this, even one still running,
    so it must outlast the longest trial plus its grace period (checked before submitting)."""

    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    """How often a worker writes its heartbeat key."""

    heartbeat_ttl_s: float = Field(default=20.0, gt=0)
    """A worker whose key is older than this is taken as gone; its trial is lost."""

    key_ttl_s: int = Field(default=DEFAULT_KEY_TTL_S, gt=0)
    """How long Redis keeps the keys each trial leaves behind once written: its result
    (trialq's `trialq:result:<task id>` and Celery's result meta) and the driver's
    `trialq:withdrawn:<task id>` and `trialq:kill:<task id>` marks. A week by default: a
    driver re-run after longer finds the results of the trials it had in flight gone, and
    sends those trials again. Give the driver and the workers the same value."""

    heartbeat_file: Path | None = None
    """A file the worker touches after each heartbeat that reached Redis: the container
    images' health check reads its age (a shell `stat`, cheap enough to run every few
    seconds, so `docker compose up --wait` returns as soon as the worker beats)."""

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
    with them loaded: `auto` (the framework installed; of several, PyTorch and JAX, never
    TensorFlow beside another), `none`, or comma-separated names. Importing is all the parent
    does with them: a module that runs a TensorFlow op or touches CUDA at import is refused
    (the forked trials would hang)."""

    preload_from: str | None = None
    """An entrypoint module (a `.py` file or a dotted name) whose top-level imports the
    worker's parent preloads too (`worker/preload_from.py`), read without importing it;
    `submit-study --local` sets it to the spec's entrypoint."""

    spare_processes: int = Field(default=1, ge=0)
    """Idle, already forked processes a worker keeps beyond its trial slots, so that the next
    trial starts without waiting for a fork; 0 leaves Celery's own replacement."""

    checkpoint_root: Path | str | None = None
    """Where trials' `checkpoint_dir` folders live, on a worker: a volume every worker mounts
    (Compose: one named volume; Kubernetes: a ReadWriteMany claim), so that an attempt on
    another node finds what the last one saved. Or an fsspec URL (`s3://bucket/prefix`,
    `gs://...`; needs the `objectstore` extra and the store's fsspec package), kept as a `str`:
    each attempt works in a local folder synced with it (docs/preemption.md). Unset: a folder
    in the system's temporary directory, which only attempts on the same machine share."""

    stop_grace_s: float | None = Field(default=None, ge=0)
    """After a worker gets SIGTERM (a spot node reclaimed, a pod deleted), its running trial
    is told at once (`trial.should_stop()`); with this set, it has this long to save and
    return, then its process is killed and the attempt ends `preempted`. Unset, the worker
    waits for the trial as Celery's warm shutdown does, until the platform kills it (the
    driver counts that as a preemption too). Set it a few seconds below the platform's own
    grace (Kubernetes' `terminationGracePeriodSeconds`), so the worker reports the kill."""

    artifact_root: Path | str | None = None
    """Where `trial.save_artifact` stores files: an Optuna `FileSystemArtifactStore` on a
    volume the workers and whoever reads the artifacts (optuna-dashboard) both mount. Or
    `s3://BUCKET`, kept as a `str`: Optuna's `Boto3ArtifactStore(BUCKET)`, written with boto3
    (the `s3` extra), which keeps each file at the bucket's top, so no prefix is taken."""

    cuda_visible_devices: str | None = Field(
        default=None, validation_alias=AliasChoices("cuda_visible_devices", "CUDA_VISIBLE_DEVICES")
    )
    """`CUDA_VISIBLE_DEVICES` (no `TRIALQ_` prefix: CUDA reads it too), the GPUs a worker's
    trials see (`trialq worker --gpu` sets it); its heartbeat names them. Unset: all of them."""

    gpus: str | None = None
    """The GPUs a worker owns and cuts into trial slots (`trialq worker --gpus`): `all`,
    indices (`0,1`), or `GPU-<uuid>`/`MIG-<uuid>` names. Unset: no slots of GPUs; the worker's
    trials see `CUDA_VISIBLE_DEVICES` as it is (one worker per GPU)."""

    trials_per_gpu: int = Field(default=1, ge=1)
    """Trials run at once on each GPU (each group of `gpus_per_trial` GPUs) of `gpus`."""

    gpus_per_trial: int = Field(default=1, ge=1)
    """GPUs each of the worker's slots spans: it takes trials of `[trial] gpus` = this."""

    gpu_memory_mb: int = Field(default=0, ge=0)
    """Each trial's memory budget on each of its GPUs; 0: the card, less a CUDA context per
    trial (`gpu_context_reserve_mb`), shared evenly among the trials on it."""

    gpu_context_reserve_mb: int = Field(default=768, ge=0)
    """What one trial process's CUDA context is taken to hold beside its framework's
    allocations: set aside per trial from the card, and allowed over the budget by the GPU
    memory guard."""

    mps_pinned_device_mem_limit: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "mps_pinned_device_mem_limit", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
        ),
    )
    """`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (no `TRIALQ_` prefix: MPS reads it), the memory an
    MPS client may hold on each device ordinal (`0=4G,1=4G`): a worker with `--gpus` plans
    its slots within it, not the whole card (`trialq.gpu.mps`)."""

    gpu_unattributed_wait_s: float = Field(default=30.0, ge=0)
    """How long a trial waits at its start while memory that no process of this worker can
    be named for holds part of its share (another pod's, or any where NVML names none of the
    worker's processes); then it runs, and its result says so (docs/oom.md)."""

    gpu_interposer: str | None = None
    """`TRIALQ_GPU_INTERPOSER`: the allocation interposer's library (HAMi-core's
    `libvgpu.so`), preloaded into the worker (`LD_PRELOAD`: docker/worker-cmd.sh sets it from
    this): where no MPS daemon serves the GPUs, each trial is held to its budget by it
    (`trialq.gpu.interposer`). A worker started without it preloaded is refused (exit 2)."""

    gpu_busy_wait_s: float = Field(default=300.0, ge=0)
    """How long a worker with `--gpus` waits at its start for room where its budgets fit the
    card but not beside what others hold on it now; then it starts with the card's room
    (`trialq.gpu.busy_card`). A budget that fits no card is refused at once (exit 2)."""

    nvml_module: str = "pynvml"
    """The NVML binding imported to read GPUs (nvidia-ml-py's `pynvml`). Tests on machines
    without a GPU name a fake here; its readings are a fake's, never a GPU's."""

    @model_validator(mode="before")
    @classmethod
    def _passwords_from_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("broker_password_file"):
            password = _secret(data["broker_password_file"], "TRIALQ_BROKER_PASSWORD_FILE")
            data["broker_url"] = with_password(data.get("broker_url", DEFAULT_BROKER_URL), password)
            if data.get("result_backend"):
                data["result_backend"] = with_password(data["result_backend"], password)
        if data.get("result_secret_file"):
            data["result_secret"] = _secret(data["result_secret_file"], "TRIALQ_RESULT_SECRET_FILE")
        if data.get("storage_password_file") and data.get("storage"):
            password = _secret(data["storage_password_file"], "TRIALQ_STORAGE_PASSWORD_FILE")
            data["storage"] = with_password(data["storage"], password)
        return data

    @field_validator("result_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(
                f"the result secret has {len(value.get_secret_value())} characters; it needs "
                f"at least {MIN_SECRET_CHARS} (e.g. `openssl rand -hex 32`)"
            )
        return value

    @field_validator("broker_url", "result_backend")
    @classmethod
    def _a_redis_url(cls, value: str | None) -> str | None:
        """A Redis URL, as the broker and the result backend are (one line for a typo, not
        redis-py's traceback at the first connection)."""
        if value is not None and not value.startswith(REDIS_SCHEMES):
            shown = redacted_url(value) if _URL.match(value) else repr(value)
            raise ValueError(f"{shown} is not a Redis URL ({', '.join(REDIS_SCHEMES)})")
        return value

    @field_validator("checkpoint_root", mode="before")
    @classmethod
    def _url_or_folder(cls, value: object) -> object:
        if isinstance(value, str | Path) and not _URL.match(str(value)):
            return Path(value)
        return value

    @field_validator("artifact_root", mode="before")
    @classmethod
    def _bucket_or_folder(cls, value: object) -> object:
        if not isinstance(value, str | Path):
            return value
        text = str(value)
        if not _URL.match(text):
            return Path(text)
        parts = urlsplit(text)
        if parts.scheme != "s3":
            raise ValueError(
                f"TRIALQ_ARTIFACT_ROOT: {text!r}: a folder or s3://BUCKET, not {parts.scheme}://"
            )
        if not parts.netloc:
            raise ValueError(f"TRIALQ_ARTIFACT_ROOT: {text!r}: no bucket (s3://BUCKET)")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(
                f"TRIALQ_ARTIFACT_ROOT: {text!r}: only a bucket, s3://BUCKET (Optuna's "
                "Boto3ArtifactStore keeps each artifact at the bucket's top, so no prefix)"
            )
        return f"s3://{parts.netloc}"

    @field_validator("allowed_modules", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("import_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part for part in value.split(os.pathsep) if part.strip())
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def backend_url(self) -> str:
        """The result backend actually used."""
        return self.result_backend or self.broker_url

    @property
    def seal(self) -> Seal | None:
        """What signs and checks results and reports; None without a secret."""
        secret = self.result_secret
        return seal_of(secret.get_secret_value() if secret is not None else None)


def redacted_url(url: str) -> str:
    """A service URL fit for a message: its password replaced by `***`, and none shown
    where it has none (kombu's `redis://:**@host` invents one)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user, _, password = credentials.partition(":")
    if not password:
        return f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"
    return f"{scheme}://{user}:***@{host}"


def settings_with_broker(broker: str | None) -> Settings:
    """The environment's settings, with a broker URL given on the command line or to the
    API over `TRIALQ_BROKER_URL`, checked as the environment's are: the password of
    `TRIALQ_BROKER_PASSWORD_FILE` goes into that URL too (a copy of the settings with the
    URL swapped in left it out)."""
    return Settings(broker_url=broker) if broker else Settings()


def with_password(url: str, password: str) -> str:
    """`url` with `password` in it (quoted for a URL), its user and host kept."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    user = quote(parts.username or "", safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


def _secret(path: object, variable: str) -> str:
    try:
        return Path(str(path)).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {path}: {exc.strerror or exc}") from None
