"""Whose memory is on a shared GPU: the rule that attributes it, apart from reading NVML.

NVML lists a GPU's processes by pid, but which pids depends on the driver and the container
(docs/oom.md, "What NVML can be trusted for"): outside a container, or with the host's PID
namespace, it names this worker's trial processes with their memory; in a container, drivers
that do not translate pids name processes by the host's pids (none is the worker's), those that
do leave out other namespaces' processes, and some report no per-process memory (0, or
NVML_VALUE_NOT_AVAILABLE, which pynvml reads as None); a query may also fail. The worker finds
out which at start (`ProcessView`, `trialq.gpu.nvml_probe`), and every decision here takes it.

Pure: the GPU memory guard, the start check and the own-or-neighbour OOM rule read NVML and
the framework, then ask these functions; the tests ask them as a table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from enum import StrEnum

MIB = 2**20


class ProcessView(StrEnum):
    """What NVML's process list can be trusted for on this host."""

    PIDS = "pids"
    """It names this worker's processes by their pids, with their memory."""
    PIDS_WITHOUT_MEMORY = "pids-without-memory"
    """It names them, without their memory (0, or unavailable)."""
    OTHER_PIDS = "other-pids"
    """It names none of this worker's processes (the host's pids, or none at all)."""
    NO_PROCESSES = "no-process-list"
    """Its process queries fail."""
    UNKNOWN = "unknown"
    """Not found out (no probe could run): a trial's own pid is used where NVML names it."""

    @property
    def names_own(self) -> bool:
        """Whether a pid NVML lists is this namespace's, to be judged as such."""
        return self in (ProcessView.PIDS, ProcessView.PIDS_WITHOUT_MEMORY)

    def said(self) -> str:
        """`pids (NVML names ...)`: the worker's ready line's words."""
        return f"{self.value} ({self.describe()})"

    def describe(self) -> str:
        """What the view means, in words."""
        return {
            ProcessView.PIDS: "NVML names this worker's processes and their memory",
            ProcessView.PIDS_WITHOUT_MEMORY: "NVML names this worker's processes, not their "
            "memory: the trials' own figures come from their frameworks",
            ProcessView.OTHER_PIDS: "NVML names none of this worker's processes (host pids): "
            "the trials' own figures come from their frameworks",
            ProcessView.NO_PROCESSES: "NVML lists no processes here: the trials' own figures "
            "come from their frameworks",
            ProcessView.UNKNOWN: "not probed: a trial's memory is read by pid where NVML "
            "names it, else from its framework",
        }[self]


def classify(listed: Mapping[int, int | None] | None, probe_pid: int, held: int) -> ProcessView:
    """What the start probe found: NVML's process list (None: the query failed) while a probe
    process, `probe_pid` in this namespace, held at least `held` bytes on the GPU."""
    if listed is None:
        return ProcessView.NO_PROCESSES
    if probe_pid not in listed:
        return ProcessView.OTHER_PIDS
    used = listed[probe_pid]
    if used is None or used < held:
        return ProcessView.PIDS_WITHOUT_MEMORY
    return ProcessView.PIDS


class Source(StrEnum):
    """Where a trial's own figure on a GPU came from (`TrialResult.gpu_accounting`)."""

    NVML_PIDS = "nvml-pids"
    FRAMEWORK = "framework"
    NONE = "unguarded"


@dataclass(frozen=True)
class Reading:
    """One look at one GPU from a trial process: NVML's processes (None: the query failed),
    the device's memory in use (None: likewise), and what the trial's framework allocator
    has reserved now (its current figure, never its peak, and without its CUDA context;
    None: no framework has one)."""

    listed: Mapping[int, int | None] | None
    used: int | None
    reserved: int | None = None


@dataclass(frozen=True)
class Own:
    """A trial's own memory on a GPU, and where the figure came from (None: not known)."""

    bytes: int | None
    source: Source


def own_memory(view: ProcessView, reading: Reading, tree: Set[int], context_bytes: int) -> Own:
    """The trial's own memory on the GPU: NVML's figures for its process tree where NVML names
    its processes with their memory, else its framework's current reserved bytes plus one
    CUDA context (an estimate: what is loaded outside the allocator is not in it)."""
    by_pid = _by_pid(view, reading.listed, tree)
    if by_pid is not None:
        return Own(by_pid, Source.NVML_PIDS)
    if reading.reserved is not None:
        return Own(reading.reserved + context_bytes, Source.FRAMEWORK)
    return Own(None, Source.NONE)


@dataclass(frozen=True)
class Overrun:
    """Growth the guard can name: NVML's figure of the trial's processes (`own`) past its
    budget plus the allowance, with more than the allowance outside its framework's
    allocator (`reserved` now; None: no framework holds any)."""

    own: int
    reserved: int | None
    allowance: int
    budget: int

    @property
    def outside(self) -> int:
        return self.own - (self.reserved or 0)


def overrun(
    own: Own, reading: Reading, budget: int | None, allowance: int, framework: str | None
) -> Overrun | None:
    """Whether the guard kills: only on NVML's own figure (never on a framework's estimate,
    which its cap already bounds), only where the framework's reserved bytes are known or no
    framework runs, and only for memory outside the allocator past `allowance` that takes
    the trial past its budget plus the allowance. A framework past its budget with its cap
    failed is not this rule's: its result says the cap failed (`gpu_cap_note`)."""
    if own.source is not Source.NVML_PIDS or own.bytes is None or budget is None:
        return None
    if reading.reserved is None and framework is not None:
        return None  # its allocator cannot be read: no growth outside it can be named
    found = Overrun(own.bytes, reading.reserved, allowance, budget)
    if found.own > budget + allowance and found.outside > allowance:
        return found
    return None


def _by_pid(
    view: ProcessView, listed: Mapping[int, int | None] | None, tree: Set[int]
) -> int | None:
    if listed is None or view not in (ProcessView.PIDS, ProcessView.UNKNOWN):
        return None
    figures = [listed[pid] for pid in tree if pid in listed]
    if view is ProcessView.UNKNOWN and not figures:
        return None  # not named: maybe NVML cannot name it, so no figure rather than 0
    if any(figure is None for figure in figures):
        return None
    return sum(figure or 0 for figure in figures)


def others_memory(reading: Reading, own: Own) -> int | None:
    """What everything else holds on the GPU: the device's memory in use less the trial's own
    (so a process NVML leaves out or cannot name still counts)."""
    if reading.used is None or own.bytes is None:
        return None
    return max(0, reading.used - own.bytes)


def crowded(others: int | None, total: int | None, limit: int | None) -> bool:
    """Whether the others hold part of this trial's share (more than the card less it)."""
    return None not in (others, total, limit) and others > total - limit  # type: ignore[operator]


@dataclass(frozen=True)
class Stranger:
    """A process on the trial's GPU that is none of the worker's live trials but carries the
    worker's mark (a process an earlier trial left behind): the start check refuses for it."""

    gpu: str
    pid: int
    used: int | None

    def text(self) -> str:
        held = "an unknown amount" if self.used is None else f"{self.used / MIB:.0f} MiB"
        return f"pid {self.pid} holds {held} on GPU {self.gpu}"


def strangers(
    view: ProcessView,
    gpu: str,
    listed: Mapping[int, int | None] | None,
    tree: Set[int],
    tolerance: int,
    is_marked: Callable[[int], bool],
) -> list[Stranger]:
    """The processes on the GPU the start check refuses for: only where NVML names this
    namespace's processes, one that is not the worker's live tree, carries the worker's mark
    (`is_marked`: evidence, never a guess from a shared cgroup), and holds more than
    `tolerance` (or an unknown amount, NVML not saying)."""
    if listed is None or not view.names_own:
        return []
    found = []
    for pid, used in sorted(listed.items()):
        known = used if view is ProcessView.PIDS else None
        if pid in tree or (known is not None and known <= tolerance):
            continue
        if is_marked(pid):
            found.append(Stranger(gpu, pid, known))
    return found


def shortfall(reading: Reading, total: int | None, limit: int | None, tolerance: int) -> int:
    """How much of the trial's share (`limit`) others hold now, beyond `tolerance`: memory no
    rule attributes to anyone, waited on (bounded) and noted, never refused; 0 when free."""
    if reading.used is None or total is None or limit is None:
        return 0
    return max(0, limit - tolerance - (total - reading.used))
