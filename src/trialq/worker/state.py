"""`WorkerState`: one worker's parent process, its state and its steps, built from the
`Settings` it is handed (never read from the environment at import).

What it holds: the settings, the GPU shares its slots give their trials, the device baseline,
its trial slots and its heartbeat. Its steps, in the order a worker runs them: `prepare`
(before the pool forks: the framework imported, the GPUs cut into shares, the clean device
measured), `open_slots` (as the pool starts), `start_heartbeat` (once it consumes),
`preempt` (SIGTERM), `close_slots` and `stop_heartbeat` (stopping). Each trial process the
pool forks gets a `WorkerChild` of it (`child`). The Celery edge (`trialq._celery.lifecycle`)
calls these steps and nothing else.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import redis

from trialq.errors import TrialqError, UsageError
from trialq.gpu import interposer, mps
from trialq.gpu.attribution import ProcessView
from trialq.gpu.busy_card import shares_with_room
from trialq.gpu.context_probe import ContextMeasure, Measures, measure_all
from trialq.gpu.device import TensorFlowDevice
from trialq.gpu.inventory import Gpu, Nvml
from trialq.gpu.nvml_probe import ProbeResult, probe
from trialq.gpu.plan import GpuPlan, held_by
from trialq.gpu.share import VISIBLE, GpuShare
from trialq.gpu.telemetry import MIB, WORKER_MARK, DeviceBaseline
from trialq.settings import Settings, redacted_url
from trialq.wire.eviction import eviction_warning
from trialq.wire.heartbeat import GpuBeat, Heartbeat, WorkerBeat
from trialq.wire.messages import TrialRequest
from trialq.worker import preemption
from trialq.worker.child import WorkerChild
from trialq.worker.prewarm import Preloaded, device_in_use, preload_for
from trialq.worker.slots import TrialSlots
from trialq.worker.threads import threads_per_trial, usable_cores

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved
pool_logger = logging.getLogger("trialq.pool")


class WorkerState:
    """One worker's parent: its state, and the steps that start, run and stop it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.baseline: DeviceBaseline | None = None
        self.gpu_shares: tuple[GpuShare, ...] | None = None
        """The shares of the worker's GPUs its slots give their trials; None before
        `plan_gpus`, empty for a worker without `--gpus`."""
        self.probe: ProbeResult | None = None
        """What NVML's process list can be trusted for here (`probe_gpus`); None before, or
        without `--gpus`."""
        self.gpu_measures: Measures | None = None
        """Its GPUs' CUDA context and usable memory, measured at its start (`--gpus`)."""
        self.slots: TrialSlots | None = None
        """Created by `open_slots` in the parent before the pool forks: every child
        inherits them."""
        self.heartbeat: Heartbeat | None = None
        self.concurrency = 1
        """Trials at once (the pool's processes, the slots with `--gpus`): set by the Celery
        edge as it builds the pool; what the host's cores are shared among."""
        self.preloaded = Preloaded()
        """What `preload` imported and left out, for the worker's ready line."""

    # Starting, before the pool forks.

    def prepare(self) -> None:
        """Import the framework (a refused import stops the worker before anything reads the
        device), then cut the GPUs into slots, find out what NVML's processes are worth here,
        then measure the memory a clean device holds."""
        self._show_gpu_to_trials()
        self.preload()
        self.plan_gpus()
        self.probe_gpus()
        self.measure_device_baseline()

    def _show_gpu_to_trials(self) -> None:
        """`--gpu`: the GPU every trial process sees, through the environment they inherit
        (read by CUDA in the trial's process only; this process never initialises it)."""
        visible = self.settings.cuda_visible_devices
        if visible is not None and not self.settings.gpus:
            os.environ[VISIBLE] = visible

    def preload(self) -> None:
        """Import the framework in the parent, before the pool forks (`trialq worker` did
        already)."""
        settings = self.settings
        try:
            self.preloaded = preload_for(
                settings.preload, settings.preload_from, settings.import_paths
            )
        except TrialqError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None

    def plan_gpus(self) -> tuple[GpuShare, ...]:
        """The worker's GPUs cut into its slots' shares (read from NVML once, in the parent
        before the pool forks, and let go)."""
        if self.gpu_shares is None:
            self.gpu_shares = self._read_gpu_shares()
        return self.gpu_shares

    def _read_gpu_shares(self) -> tuple[GpuShare, ...]:
        settings = self.settings
        if not settings.gpus:
            return ()
        nvml = Nvml.open(settings.nvml_module)
        if nvml is None:
            raise UsageError(f"--gpus {settings.gpus}: {Nvml.absence(settings.nvml_module)}")
        plan = GpuPlan(
            settings.trials_per_gpu, settings.gpus_per_trial, settings.gpu_memory_mb,
            settings.gpu_context_reserve_mb,
            mps_pinned_limits=settings.mps_pinned_device_mem_limit,
            mps_served=mps.served(os.environ),
            interposer=self._interposer_preloaded(),
        )  # fmt: skip
        with nvml:
            gpus = nvml.gpus(settings.gpus)
        # Everything this worker starts inherits its mark: the start check's evidence.
        os.environ[WORKER_MARK] = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        return shares_with_room(
            plan, gpus, lambda: self._measure(gpus), settings.gpu_busy_wait_s, logger.warning
        )

    def _interposer_preloaded(self) -> bool:
        """Whether the allocation interposer is in this process (so in every trial it forks);
        a setting that names one not preloaded is the user's mistake."""
        library = self.settings.gpu_interposer
        if not library:
            return False
        maps = Path("/proc/self/maps").read_text()
        if not interposer.preloaded(library, maps):
            raise UsageError(
                f"{interposer.SETTING}={library}: not preloaded in the worker; start it with "
                f"LD_PRELOAD={library} (docker/worker-cmd.sh does)"
            )
        return True

    def _measure(self, gpus: tuple[Gpu, ...]) -> Mapping[str, ContextMeasure]:
        """Each GPU's CUDA context and usable memory, by a short-lived process per GPU
        (never in this one); kept for the ready line."""
        ids = (gpu.id for gpu in gpus)
        self.gpu_measures = measure_all(ids, nvml_module=self.settings.nvml_module)
        return self.gpu_measures.found

    def probe_gpus(self) -> None:
        """Find out once, before the pool forks, what NVML's process list can be trusted for
        on this host (`trialq.gpu.nvml_probe`: a short-lived process holds memory on the
        first GPU; this one opens no context)."""
        shares = self.plan_gpus()
        if not shares or self.probe is not None:
            return
        nvml = Nvml.open(self.settings.nvml_module)
        if nvml is None:
            return
        with nvml:
            self.probe = probe(nvml, shares[0].devices[0], self.settings.nvml_module)
        if self.probe.detail:
            logger.warning("GPU process probe: %s", self.probe.detail)

    @property
    def view(self) -> ProcessView:
        """The probe's verdict; unknown without one."""
        return self.probe.view if self.probe is not None else ProcessView.UNKNOWN

    def measure_device_baseline(self) -> None:
        """Before the pool forks any trial process: the memory a clean device holds. Not for
        a worker that packs trials onto its GPUs: its neighbours' memory is there by right,
        and each trial checks its GPUs' processes instead (`NeighbourCheck`)."""
        if self.plan_gpus():
            return
        tolerance = self.settings.gpu_baseline_tolerance_mb * MIB
        self.baseline = DeviceBaseline.measure(TensorFlowDevice(), tolerance)

    # The trial slots, as the pool starts and stops.

    def open_slots(self, count: int) -> TrialSlots:
        """The worker's `count` trial slots, one GPU share each (made before the pool forks)."""
        shares = self.gpu_shares or ()
        if shares and len(shares) != count:
            pool_logger.warning(
                "%d trial slots for %d GPU shares: run `trialq worker --gpus`, which sets the "
                "concurrency from them", count, len(shares),
            )  # fmt: skip
        self.slots = TrialSlots.create(count, shares)
        return self.slots

    def hand_over_slot(self) -> None:
        """In a trial process whose result was read: let the next trial start now, unless
        this process holds device state, which only its exit frees."""
        if self.slots is not None and device_in_use() is None:
            self.slots.hand_over()

    def close_slots(self) -> None:
        """Remove the slots' lock files (the worker is stopping)."""
        if self.slots is not None:
            self.slots.remove()
            self.slots = None

    def child(self, backend: Callable[[], redis.Redis]) -> WorkerChild:
        """The steps of a trial process forked from this parent, with what it inherits."""
        cpus = self.settings.trial_cpus or threads_per_trial(usable_cores(), self.concurrency)
        return WorkerChild(self.settings, backend, self.slots, self.baseline, self.view, cpus)

    # Running.

    def gpu_beat(self) -> GpuBeat | None:
        """What the heartbeat says of the worker's GPUs and slots; None without `--gpus`."""
        shares = self.plan_gpus()
        if not shares:
            return None
        devices = tuple(dict.fromkeys(d for share in shares for d in share.devices))
        first = shares[0]
        return GpuBeat(
            devices=devices, model=first.model or "unknown", total_bytes=first.total_bytes or 0,
            slots=len(shares), gpus_per_slot=len(first.devices),
            slot_budget_bytes=first.budget_bytes,
            processes=self.probe.view.value if self.probe is not None else None,
        )  # fmt: skip

    def start_heartbeat(self, name: str, queues: tuple[str, ...], concurrency: int) -> None:
        """Beat for this worker in Redis (and its heartbeat file) until it shuts down."""
        beat = WorkerBeat(
            name=name,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=queues,
            gpu=self.settings.cuda_visible_devices,
            beat_at=0.0,
            gpus=self.gpu_beat(),
        )
        client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=5)
        interval, ttl = self.settings.heartbeat_interval_s, self.settings.heartbeat_ttl_s
        self.heartbeat = Heartbeat(client, beat, interval, ttl, mark=self.settings.heartbeat_file)
        self.heartbeat.start()
        warning = eviction_warning(client)
        if warning is not None:
            logger.warning("%s", warning)
        found = "" if self.probe is None else f"; GPU processes: {self.probe.view.said()}"
        if self.gpu_shares:
            view = self.probe.view if self.probe is not None else None
            found += f"; {held_by(self.gpu_shares, view)}"
        measured = f"; {self.gpu_measures.line()}" if self.gpu_measures is not None else ""
        logger.info(
            "worker %s ready: broker %s, queues %s, %d trial(s) at a time%s%s; preloaded for "
            "trials: %s", name, redacted_url(self.settings.broker_url), ",".join(queues),
            concurrency, found, measured, self.preloaded.line(),
        )  # fmt: skip

    # Stopping.

    def preempt(self, running: Sequence[tuple[TrialRequest, int]]) -> None:
        """SIGTERM (warm shutdown): tell each running trial to save and return, at once, and
        with `stop_grace_s` set, kill what still runs that much later (`preemption`)."""
        preemption.preempt(
            self.settings.broker_url, running, self.settings.stop_grace_s, self.settings.key_ttl_s
        )

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
