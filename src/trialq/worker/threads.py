"""How many CPU threads a trial's libraries use: the worker's cores shared by its slots.

PyTorch, OpenMP, MKL, OpenBLAS, TensorFlow and XLA each start a thread per core of the host
by default; with two trials in flight on two cores, each ran two threads a library and they
took turns on the cores. A trial process gets `cores // slots` threads (at least 1; the
worker's `TRIALQ_TRIAL_CPUS` or the spec's `[trial] cpus` say otherwise), set in its
environment before its framework is imported, and through `torch.set_num_threads` where the
worker's parent preloaded PyTorch (imported, not initialised: its pool reads the variables
once, at its first parallel op, and a preloaded one may have read them already).
"""

from __future__ import annotations

import os
import sys

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)
"""The environment variables that cap a library's threads, read as the library starts."""

_XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
"""XLA's CPU flags for one thread (XLA has no flag for N > 1 but its own pool's size)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's cpuset counts)."""
    return len(os.sched_getaffinity(0))


def threads_per_trial(cores: int, slots: int) -> int:
    """A trial's share of the worker's cores: `cores // slots`, at least 1."""
    return max(1, cores // max(1, slots))


def hold_threads(threads: int) -> None:
    """Cap this trial process's library threads at `threads`, before its framework starts."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    if threads == 1 and "intra_op_parallelism_threads" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_ONE_THREAD}".strip()
    torch = sys.modules.get("torch")
    if torch is not None:  # preloaded by the parent: its variables may be read already
        torch.set_num_threads(threads)
