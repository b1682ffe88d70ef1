"""Every Redis key trialq names, in one place.

The strings are part of the wire: workers, drivers and `trialq status` of different versions
read each other's keys in one Redis, and deployments watch some of them (Kubernetes'
autoscaler reads each queue's `QUEUE_RUNNING_PREFIX` set), so none of them ever changes.
Celery's and kombu's own keys are theirs (a result's meta is reached through Celery's result
backend); the few of kombu's that trialq reads itself are named at the end, marked as kombu's.
"""

from __future__ import annotations

DEFAULT_KEY_TTL_S = 7 * 24 * 3600
"""The default of `TRIALQ_KEY_TTL_S` (`trialq.settings`): how long Redis keeps what each
trial leaves behind, a week."""

# --- trialq's own keys --------------------------------------------------------------------

WORKER_PREFIX = "trialq:worker:"
"""+ a worker's Celery node name: its heartbeat (a JSON `WorkerBeat`), with a TTL."""

WORKER_GPUS_PREFIX = "trialq:worker-gpus:"
"""+ a worker's Celery node name: its GPUs and trial slots (a JSON `GpuBeat`), written with
its heartbeat and with the same TTL; a key apart, so that older readers of the heartbeat never
meet a field they do not know."""

RUNNING_PREFIX = "trialq:running:"
"""+ `WORKER:PID`: the trial a trial process runs (a JSON `RunningTrial`), with a TTL. A
prefix apart from the workers', so that a reader of those never meets another kind of value."""

TRIAL_PREFIX = "trialq:trial:"
"""+ `STUDY:NUMBER:ATTEMPT:PART`: the report channel of one attempt of one trial. STUDY is the
study's key (`TrialRequest.study_key`: its storage and id, hashed), its name in a request of
an older driver."""

REPORTS = "reports"
"""Channel part: the stream of intermediate values, written by the trial."""

PRUNE = "prune"
"""Channel part: the flag the driver raises when the pruner says stop."""

MEMORY_EXCEEDED = "memory_exceeded"
"""Channel part: the RSS at which the attempt killed itself for its memory limit."""

STOP = "stop"
"""Channel part: the stop notice (a preemption: the worker got SIGTERM), which
`trial.should_stop()` reads and the driver counts as a preemption."""

ORPHANED_CHECKPOINTS = "trialq:checkpoints:orphaned"
"""A list of checkpoint keys whose trial ended without a process to remove its folder; a
later trial process removes them."""

WITHDRAWN_PREFIX = "trialq:withdrawn:"
"""+ a task id: the driver withdrew the task, or told its trial while kombu still held its
message reserved, and a worker must not run it (revokes are not durable; a reserved message
is handed out again after the visibility timeout)."""

ATTEMPT_PREFIX = "trialq:attempt:"
"""+ a task id: present while the trial process running that attempt beats (its beacon, with
the heartbeat's TTL), whatever its worker's parent does: the driver's word that an attempt
lives when its worker's heartbeat is gone (a stalled parent)."""

KILL_PREFIX = "trialq:kill:"
"""+ a task id: the driver gave up on the attempt (re-sent it, or told it lost) while its
process may still run (a host cut off past the heartbeat's TTL, then back). The trial
process's own beacon reads it at each renewal and ends its process group, whatever its
worker's parent does (Celery's revoke reaches only a parent that is alive and connected).
Apart from `WITHDRAWN_PREFIX`: a task withdrawn before it ran is sent again, never killed."""

POISON_PREFIX = "trialq:poison:"
"""+ a queue's name: entries popped from that queue that were no message (not JSON, or JSON
of another shape), set aside by a worker instead of ending it; the newest 1000 are kept."""

RESULT_PREFIX = "trialq:result:"
"""+ a task id: the trial's own result, written once when it ended (Celery's meta can be
overwritten by a redelivery, which writes STARTED again)."""

QUEUE_RUNNING_PREFIX = "trialq:queue-running:"
"""+ a spec's queue (`gpu`, never a class queue `gpu@1x16g`): a sorted set of the task ids
whose trial processes run on the workers of that queue, each scored by the time its claim
lapses (`trialq.wire.queue_running`); what an autoscaler (KEDA) counts as the queue's running
trials. A prefix apart from `RUNNING_PREFIX`, whose readers expect one trial a key."""

RESULTS_CHANNEL_PREFIX = "trialq:results:"
"""+ a study's name: a pub/sub channel on which a trial process publishes its task id once it
has stored its result (`RESULT_PREFIX`), so a driver waiting for results wakes at once."""

SUGGEST_PREFIX = "trialq:suggest:"
"""+ a study's name: a list of the questions its trials ask the driver (a param's value the
task did not carry, a verdict on the step just reported), answered on the asking attempt's
own key (`trial_key(..., ANSWER + seq)`); `trialq.wire.suggest`."""

ANSWER = "answer:"
"""Channel part, + the question's number in its attempt: the driver's answer to it."""


def suggest_key(study: str) -> str:
    """The list on which the trials of `study` ask the driver (`SUGGEST_PREFIX`)."""
    return f"{SUGGEST_PREFIX}{study}"


def worker_key(worker: str) -> str:
    """The heartbeat key of the worker named `worker` (Celery's node name)."""
    return f"{WORKER_PREFIX}{worker}"


def worker_gpus_key(worker: str) -> str:
    """The key of the named worker's GPUs and slots, beside its heartbeat."""
    return f"{WORKER_GPUS_PREFIX}{worker}"


def running_key(worker: str, pid: int) -> str:
    """The key of the trial that process `pid` of `worker` runs: one per trial process."""
    return f"{RUNNING_PREFIX}{worker}:{pid}"


def trial_key(study: str, number: int, attempt: int, part: str) -> str:
    """A key of one attempt's report channel (`study`: the study's key, or its name); `part`
    is `REPORTS`, `PRUNE` or
    `MEMORY_EXCEEDED`. The attempt is in it, so a retry's reports never mix with the last's."""
    return f"{TRIAL_PREFIX}{study}:{number}:{attempt}:{part}"


def withdrawn_key(task_id: str) -> str:
    """The key that tells a worker not to run a task after all."""
    return f"{WITHDRAWN_PREFIX}{task_id}"


def attempt_key(task_id: str) -> str:
    """The key the trial process of attempt `task_id` renews while it runs."""
    return f"{ATTEMPT_PREFIX}{task_id}"


def kill_key(task_id: str) -> str:
    """The key that tells attempt `task_id`'s trial process to end its process group."""
    return f"{KILL_PREFIX}{task_id}"


def poison_key(queue: str) -> str:
    """Where malformed entries of `queue` are set aside."""
    return f"{POISON_PREFIX}{queue}"


def queue_running_key(queue: str) -> str:
    """The sorted set of the trials running on the workers of spec queue `queue`."""
    return f"{QUEUE_RUNNING_PREFIX}{queue}"


def result_key(task_id: str) -> str:
    """Where a trial's own result is kept."""
    return f"{RESULT_PREFIX}{task_id}"


def results_channel(study: str) -> str:
    """The channel on which the trials of `study` announce their stored results."""
    return f"{RESULTS_CHANNEL_PREFIX}{study}"


# --- kombu's keys that trialq reads (kombu's Redis transport owns them) -------------------

DEFAULT_QUEUE = "gpu"
"""The queue trials go to and workers consume unless told otherwise; kombu keeps a queue's
waiting messages in a Redis list of the queue's name (see `kombu_queue_key`)."""

KOMBU_UNACKED = "unacked"
"""kombu's: the hash of every reserved, not yet acknowledged message (delivery tag to
`[message, exchange, routing key]`), on all queues."""

KOMBU_UNACKED_INDEX = "unacked_index"
"""kombu's: when each reserved message was reserved (delivery tag to the reserving worker's
`time.time()`), a sorted set."""


def kombu_queue_key(queue: str) -> str:
    """kombu's: the list of a queue's waiting messages is named after the queue (trialq sends
    no task priorities, so kombu's priority suffixes never appear)."""
    return queue
