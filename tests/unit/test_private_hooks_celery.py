"""The private names of Celery, billiard and kombu that trialq's Celery edge leans on are still
there, with the shape it uses (docs/design.md, "Private hooks we lean on").

The pool's overrides are checked on the classes (signatures, and that the library still calls
them) and on a real `TrialAsynPool` with one forked process; kombu's Redis layout is observed
by sending a real trial to the test Redis and reading the keys the dispatcher reads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import billiard.pool
import billiard.util
import kombu
import pytest
import redis
from celery.concurrency import asynpool, base, prefork
from celery.worker.consumer import consumer
from conftest import no_framework_started_here
from private_hooks import Hook, parameters, refers_to
from trial_requests import trial_request

from trialq._celery.app import create_app
from trialq._celery.dispatcher import RESERVED_UNSTARTED_S, CeleryDispatcher
from trialq._celery.pool import PRCTL_DECLARATION, TrialAsynPool, TrialProcess
from trialq.settings import Settings

POOL = "src/trialq/_celery/pool.py"
DISPATCHER = "src/trialq/_celery/dispatcher.py"

ENSURE_MESSAGES_CONSUMED = Hook(
    "billiard.pool.Worker._ensure_messages_consumed(self, completed)",
    f"{POOL} (TrialProcess)",
    "a trial's process lingers up to 0.1 s after its result is read and never hands its slot "
    "over early, so with a spare the next trial waits on it",
)
ON_READY_COUNTER = Hook(
    "billiard.pool.Worker.on_ready_counter",
    f"{POOL} (TrialProcess._ensure_messages_consumed)",
    "TrialProcess cannot tell its result was read: it exits at once, maybe before",
)
WORKER_CLASS = Hook(
    "billiard.pool.Pool.Worker (the class the pool builds its processes' workers from)",
    f"{POOL} (TrialAsynPool.Worker = TrialProcess)",
    "TrialProcess is never used: every trial's process lingers after its result",
)
EVENT_PROCESS_EXIT = Hook(
    "celery.concurrency.asynpool.AsynPool._event_process_exit(self, hub, proc)",
    f"{POOL} (TrialAsynPool)",
    "an exited trial process is left for the pool's 5 s maintenance timer (a third of all "
    "trials, measured) instead of being replaced at once",
)
PROCESS_FLUSH_QUEUES = Hook(
    "celery.concurrency.asynpool.AsynPool.process_flush_queues(self, proc)",
    f"{POOL} (TrialAsynPool)",
    "Celery waits 10 ms on the pipe of every reaped trial process, on the event loop that "
    "hands out trials",
)
OUTQ_READER = Hook(
    "billiard process .outq._reader (a Connection with poll, recv, closed)",
    f"{POOL} (TrialAsynPool.process_flush_queues)",
    "a reaped trial process's last messages (its result) cannot be read",
)
RESULT_HANDLER = Hook(
    "billiard.pool.Pool._result_handler.on_state_change",
    f"{POOL} (TrialAsynPool.process_flush_queues)",
    "a reaped trial process's last messages (its result) cannot be handed to Celery",
)
POOL_PROCESSES = Hook(
    "billiard.pool.Pool._pool (the list of the pool's processes)",
    f"{POOL} (TrialAsynPool._event_process_exit, _reap_again)",
    "an exited trial process is not replaced promptly (the event loop's callback fails)",
)
POOL_STATE = Hook(
    "billiard.pool.Pool._state and billiard.pool.RUN",
    f"{POOL} (TrialAsynPool._reap_again)",
    "an exited trial process is not replaced promptly (the event loop's callback fails)",
)
MAINTAIN_POOL = Hook(
    "billiard.pool.Pool.maintain_pool(self)",
    f"{POOL} (TrialAsynPool._reap_again)",
    "an exited trial process is not replaced promptly",
)
TASK_POOL_LIMIT = Hook(
    "celery.concurrency.prefork.TaskPool.on_start sizing its Pool from self.limit",
    f"{POOL} (TrialPool.on_start)",
    "no spare process: every trial waits for its process to be forked",
)
NUM_PROCESSES = Hook(
    "celery.concurrency.base.BasePool.num_processes, read by the consumer for its prefetch",
    f"{POOL} (TrialPool.num_processes)",
    "the worker reserves a message for its spare processes too: more trials held than run",
)
QUEUE_LIST = Hook(
    "kombu's Redis transport: a waiting message is JSON in the list named as its queue, "
    "Celery's task id in headers.id",
    f"{DISPATCHER} (pending_ids, withdraw) and k8s/base/autoscaling.yaml (trigger queued)",
    "waiting trials look lost to the driver (it sends them again), withdrawn ones stay "
    "queued, and the autoscaler counts no queued trial",
)
UNACKED_HASH = Hook(
    "kombu's Redis transport: a reserved message is in the hash `unacked` as JSON "
    "[message, exchange, routing_key]",
    f"{DISPATCHER} (pending_ids) and k8s/base/autoscaling.yaml (trigger running)",
    "a reserved or running trial looks lost to the driver (it sends it again while it runs), "
    "and the autoscaler scales down workers that run trials",
)
PRIORITY_LISTS = Hook(
    "kombu's Redis transport: a message sent with a priority goes to the list "
    "queue + '\\x06\\x16' + step, not to the queue's list",
    f"{DISPATCHER} (pending_ids, withdraw), which read only the queue's own list",
    "a trial sent with a priority would look lost to the driver; trialq sends none",
)


POOL_INITARGS = Hook(
    "billiard.pool.Worker.initargs, which Celery's Pool bootstep fills with (app, hostname) "
    "(celery.worker.components.Pool.create)",
    f"{POOL} (TrialProcess._ensure_messages_consumed)",
    "a trial's process cannot find the worker's slots: it never hands its slot over early, "
    "so with a spare the next trial waits for it to exit",
)


def test_celery_starts_each_pool_process_with_its_app_first_among_initargs() -> None:
    from celery.worker import components

    hook = POOL_INITARGS
    assert "initargs" in parameters(billiard.pool.Worker.__init__), hook.gone("no such argument")
    source = inspect.getsource(components.Pool.create)
    assert "initargs=(w.app, w.hostname)" in source, hook.gone("the pool gets other initargs")


# --- the pool's overrides, on the classes -----------------------------------------------------


def test_billiard_worker_still_calls_ensure_messages_consumed() -> None:
    hook = ENSURE_MESSAGES_CONSUMED
    assert hasattr(billiard.pool.Worker, "_ensure_messages_consumed"), hook.gone("no such method")
    signature = parameters(billiard.pool.Worker._ensure_messages_consumed)
    assert signature == ["self", "completed"], hook.gone(f"its parameters are {signature}")
    assert parameters(TrialProcess._ensure_messages_consumed) == signature
    called = refers_to(billiard.pool.Worker, "_ensure_messages_consumed")
    assert called, hook.gone("billiard's Worker no longer calls it")


def test_the_asynpool_still_calls_event_process_exit() -> None:
    hook = EVENT_PROCESS_EXIT
    assert hasattr(asynpool.AsynPool, "_event_process_exit"), hook.gone("no such method")
    signature = parameters(asynpool.AsynPool._event_process_exit)
    assert signature == ["self", "hub", "proc"], hook.gone(f"its parameters are {signature}")
    called = refers_to(asynpool.AsynPool, "_event_process_exit")
    assert called, hook.gone("AsynPool no longer registers it for a process's exit")


def test_the_asynpool_still_calls_process_flush_queues() -> None:
    hook = PROCESS_FLUSH_QUEUES
    assert hasattr(asynpool.AsynPool, "process_flush_queues"), hook.gone("no such method")
    signature = parameters(asynpool.AsynPool.process_flush_queues)
    assert signature == ["self", "proc"], hook.gone(f"its parameters are {signature}")
    called = refers_to(asynpool.AsynPool, "process_flush_queues")
    assert called, hook.gone("AsynPool no longer calls it for a reaped process")


def test_the_task_pool_sizes_its_pool_from_limit() -> None:
    hook = TASK_POOL_LIMIT
    assert prefork.TaskPool.Pool is asynpool.AsynPool, hook.gone("TaskPool.Pool is not AsynPool")
    on_start = prefork.TaskPool.on_start
    assert refers_to(on_start, "limit") and refers_to(on_start, "Pool"), hook.gone(
        "TaskPool.on_start no longer builds self.Pool from self.limit"
    )


def test_the_consumer_prefetches_for_num_processes() -> None:
    hook = NUM_PROCESSES
    assert isinstance(vars(base.BasePool).get("num_processes"), property), hook.gone(
        "BasePool.num_processes is no property"
    )
    assert refers_to(consumer.Consumer, "num_processes"), hook.gone(
        "Celery's consumer no longer reads it for its prefetch"
    )


# --- the pool's overrides, on a real pool ----------------------------------------------------


_BUILT: list[TrialProcess] = []


class _RecordingProcess(TrialProcess):
    """TrialProcess noting each worker the pool builds (in the parent, before the fork)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _BUILT.append(self)


class _RecordingPool(TrialAsynPool):
    Worker = _RecordingProcess


@pytest.fixture(scope="module")
def real_pool() -> Iterator[_RecordingPool]:
    """A real pool of trialq's, with one forked process (idle: it gets no task)."""
    with no_framework_started_here():
        pool = _RecordingPool(processes=1, threads=False)
        try:
            yield pool
        finally:
            pool.terminate()
            pool.join()


def test_the_pool_builds_its_workers_from_its_worker_class(real_pool: _RecordingPool) -> None:
    hook = WORKER_CLASS
    assert billiard.pool.Pool.Worker is billiard.pool.Worker, hook.gone("no Pool.Worker")
    assert asynpool.AsynPool.Worker is asynpool.Worker, hook.gone("AsynPool.Worker is not its own")
    assert _BUILT, hook.gone("the pool built no worker from Pool.Worker")


def test_each_worker_has_an_on_ready_counter(real_pool: _RecordingPool) -> None:
    hook = ON_READY_COUNTER
    worker = _BUILT[0]
    counter = getattr(worker, "on_ready_counter", None)
    assert counter is not None, hook.gone("the pool's worker has none (or it is None)")
    assert isinstance(counter.value, int), hook.gone(f"its value is {counter.value!r}")


def test_a_pool_process_has_an_outq_reader(real_pool: _RecordingPool) -> None:
    hook = OUTQ_READER
    proc = real_pool._pool[0]
    reader = getattr(getattr(proc, "outq", None), "_reader", None)
    assert reader is not None, hook.gone("the process has no outq._reader")
    for name in ("poll", "recv"):
        assert callable(getattr(reader, name, None)), hook.gone(f"the reader has no {name}()")
    assert reader.closed is False, hook.gone("the reader has no `closed`, or it is not False")
    assert isinstance(reader.poll(0), bool), hook.gone("poll(0) does not answer at once")
    assert proc.exitcode is None, hook.gone("a live process's exitcode is not None")


def test_the_pool_has_a_result_handler_with_on_state_change(real_pool: _RecordingPool) -> None:
    hook = RESULT_HANDLER
    handler = getattr(real_pool, "_result_handler", None)
    assert handler is not None, hook.gone("the pool has no _result_handler")
    on_state_change = getattr(handler, "on_state_change", None)
    assert callable(on_state_change), hook.gone("the result handler has no on_state_change")
    assert parameters(on_state_change) == ["task"], hook.gone(
        f"on_state_change takes {parameters(on_state_change)}, not one message"
    )


def test_the_pool_lists_its_processes_in_pool(real_pool: _RecordingPool) -> None:
    hook = POOL_PROCESSES
    processes = getattr(real_pool, "_pool", None)
    assert isinstance(processes, list), hook.gone(f"_pool is {processes!r}, not a list")
    assert len(processes) == 1 and hasattr(processes[0], "exitcode"), hook.gone(
        f"_pool holds {processes!r}, not the pool's one process"
    )


def test_the_pool_says_it_runs_in_state(real_pool: _RecordingPool) -> None:
    hook = POOL_STATE
    assert hasattr(billiard.pool, "RUN"), hook.gone("billiard.pool has no RUN")
    state = getattr(real_pool, "_state", None)
    assert state == billiard.pool.RUN, hook.gone(f"a running pool's _state is {state!r}")


def test_the_pool_can_be_maintained(real_pool: _RecordingPool) -> None:
    hook = MAINTAIN_POOL
    assert parameters(billiard.pool.Pool.maintain_pool) == ["self"], hook.gone(
        f"its parameters are {parameters(billiard.pool.Pool.maintain_pool)}"
    )
    real_pool.maintain_pool()  # nothing exited: nothing to do, and no error
    assert len(real_pool._pool) == 1, hook.gone("it changed a pool with nothing to replace")


PDEATHSIG_BY_CFFI = Hook(
    "billiard.util.set_pdeathsig declaring prctl with cffi (where cffi is imported), and "
    "cffi.cparser._parser_cache",
    f"{POOL} (warm_child_start)",
    "every trial's process imports pycparser and builds its parser again: 70 ms of CPU a trial",
)

_CHILD_STATE = """
import os, sys, signal, json
import billiard.util
from trialq._celery.pool import warm_child_start
if sys.argv[1] == "warm":
    warm_child_start()
read, write = os.pipe()
if os.fork() == 0:
    import cffi.cparser
    before = cffi.cparser._parser_cache is not None
    billiard.util.set_pdeathsig(signal.SIGKILL)
    after = cffi.cparser._parser_cache is not None
    os.write(write, json.dumps([before, after]).encode())
    os._exit(0)
os.wait()
print(os.read(read, 100).decode())
"""


@pytest.mark.skipif(
    importlib.util.find_spec("cffi") is None, reason="no cffi: billiard uses ctypes"
)
def test_a_forked_pool_process_inherits_the_parser_billiard_declares_prctl_with() -> None:
    hook = PDEATHSIG_BY_CFFI
    assert PRCTL_DECLARATION in inspect.getsource(billiard.util.set_pdeathsig), hook.gone(
        "set_pdeathsig no longer declares prctl as trialq warms it"
    )

    def child(mode: str) -> list[bool]:
        ran = subprocess.run([sys.executable, "-c", _CHILD_STATE, mode], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
        return json.loads(ran.stdout)  # type: ignore[no-any-return]

    cold, warm = child("cold"), child("warm")

    assert cold == [False, True], hook.gone(f"a cold child's parser: {cold}")  # the control
    assert warm == [True, True], hook.gone(f"the warmed parent's child: {warm}")


# --- kombu's Redis layout, observed on the test Redis -----------------------------------------


def _dispatcher(redis_url: str) -> CeleryDispatcher:
    return CeleryDispatcher(Settings(broker_url=redis_url))


def _send(dispatcher: CeleryDispatcher) -> str:
    request = trial_request(study="hooks", timeout_s=60, hard_limit_s=120)
    return dispatcher.submit(request, "gpu")


def test_a_waiting_trial_is_in_the_queues_list(redis_url: str) -> None:
    hook = QUEUE_LIST
    dispatcher = _dispatcher(redis_url)
    task_id = _send(dispatcher)
    client = redis.Redis.from_url(redis_url)
    waiting = client.lrange("gpu", 0, -1)
    assert len(waiting) == 1, hook.gone(f"the list 'gpu' holds {waiting!r}")
    message = json.loads(waiting[0])
    assert message.get("headers", {}).get("id") == task_id, hook.gone(
        f"the message's headers.id is not the task id: {message.get('headers')!r}"
    )
    assert dispatcher.pending_ids("gpu") == {task_id}, hook.gone("pending_ids missed it")
    dispatcher.withdraw([task_id], "gpu")
    assert client.llen("gpu") == 0, hook.gone("withdraw did not remove it from the list")


ON_TASK_CALL = Hook(
    "celery.backends.redis.RedisBackend.on_task_call(producer, task_id), called by send_task",
    f"{DISPATCHER} (CeleryDispatcher.__init__)",
    "every trial sent subscribes to its meta channel and unsubscribes later: two round trips "
    "a trial for a driver that reads results itself (issue 26, a driver far from its Redis)",
)


def test_sending_a_trial_subscribes_to_nothing(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = ON_TASK_CALL
    app = create_app(Settings(broker_url=redis_url))
    assert parameters(type(app.backend).on_task_call) == ["self", "producer", "task_id"], hook.gone(
        f"its parameters are {parameters(type(app.backend).on_task_call)}"
    )
    subscribed: list[str] = []
    subscribe = redis.client.PubSub.subscribe

    def recording(self: redis.client.PubSub, *channels: Any, **handlers: Any) -> Any:
        subscribed.extend(str(c) for c in channels)  # and subscribe for real
        return subscribe(self, *channels, **handlers)

    monkeypatch.setattr(redis.client.PubSub, "subscribe", recording)
    task_id = _send(CeleryDispatcher(Settings(broker_url=redis_url), app))

    meta = [c for c in subscribed if "celery-task-meta" in c]
    assert not meta, hook.gone(f"sending {task_id} subscribed to {meta}")


def test_a_reserved_trial_is_in_the_unacked_hash(redis_url: str) -> None:
    hook = UNACKED_HASH
    dispatcher = _dispatcher(redis_url)
    task_id = _send(dispatcher)
    client = redis.Redis.from_url(redis_url)
    app = create_app(Settings(broker_url=redis_url))
    with app.connection_for_read() as connection, connection.SimpleQueue("gpu") as queue:
        reserved = queue.get(timeout=10)  # as a worker takes it: not acknowledged
        assert client.llen("gpu") == 0, hook.gone("a reserved message stayed in the list")
        held = client.hvals("unacked")
        assert len(held) == 1, hook.gone(f"the hash 'unacked' holds {held!r}")
        entry = json.loads(held[0])
        assert isinstance(entry, list) and len(entry) == 3, hook.gone(
            f"an entry is {entry!r}, not [message, exchange, routing_key]"
        )
        assert entry[0].get("headers", {}).get("id") == task_id, hook.gone(
            f"the entry's message has headers {entry[0].get('headers')!r}"
        )
        assert dispatcher.pending_ids("gpu") == {task_id}, hook.gone("pending_ids missed it")
        reserved.ack()


@pytest.fixture
def no_scripts_url(redis_url: str) -> Iterator[str]:
    """The test Redis as a user without the scripting commands, as some managed Redis are: a
    real ACL user, made for the test and removed after it."""
    client = redis.Redis.from_url(redis_url)
    user = f"trialq-no-scripts-{uuid.uuid4().hex[:8]}"
    client.acl_setuser(user, enabled=True, nopass=True, keys="*", channels="*",
                       commands=["+@all", "-@scripting"])  # fmt: skip
    try:
        yield redis_url.replace("redis://", f"redis://{user}@", 1)
    finally:
        client.acl_deluser(user)


@pytest.mark.parametrize("scripts", [True, False], ids=["scripted", "no-scripts"])
def test_a_reservation_its_worker_lost_is_not_pending(
    redis_url: str, no_scripts_url: str, scripts: bool
) -> None:
    """A message reserved `RESERVED_UNSTARTED_S` ago with no start stored (its worker's
    connection dropped with a Redis restart: seen in CI, two trials waited for the
    visibility timeout) is not pending, so the driver sends its trial again; a fresh one is."""
    hook = UNACKED_HASH
    client = redis.Redis.from_url(redis_url)
    dispatcher = _dispatcher(redis_url if scripts else no_scripts_url)
    task_id = _send(dispatcher)
    app = create_app(Settings(broker_url=redis_url))
    with app.connection_for_read() as connection, connection.SimpleQueue("gpu") as queue:
        reserved = queue.get(timeout=10)
        index = client.zrange("unacked_index", 0, -1, withscores=True)
        assert len(index) == 1 and abs(index[0][1] - time.time()) < 60, hook.gone(
            f"unacked_index holds {index!r}, not the delivery tag and when it was reserved"
        )
        assert dispatcher.pending_ids("gpu") == {task_id}

        client.zadd("unacked_index", {index[0][0]: time.time() - RESERVED_UNSTARTED_S - 1})
        assert dispatcher.pending_ids("gpu") == set()
        reserved.ack()


def test_pending_ids_where_the_server_refuses_scripts(no_scripts_url: str) -> None:
    """Some managed Redis refuse EVAL: `pending_ids` reads the messages itself there."""
    dispatcher = _dispatcher(no_scripts_url)
    task_id = _send(dispatcher)
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(no_scripts_url).eval("return 1", 0)
    assert dispatcher.pending_ids("gpu") == {task_id}


def test_trialq_sends_no_priority_and_kombu_keeps_priorities_apart(redis_url: str) -> None:
    """A message with a priority lives in another list, which the dispatcher does not read;
    trialq's own messages carry none, so they are all in the queue's list."""
    hook = PRIORITY_LISTS
    dispatcher = _dispatcher(redis_url)
    task_id = _send(dispatcher)
    client = redis.Redis.from_url(redis_url)
    sent = json.loads(client.lrange("gpu", 0, -1)[0])
    assert sent["properties"].get("priority") in (None, 0), hook.gone(
        f"trialq sent a trial with priority {sent['properties'].get('priority')!r}"
    )

    app = create_app(Settings(broker_url=redis_url))
    with app.connection_for_write() as connection:
        exchange = kombu.Exchange("gpu", type="direct")
        producer = connection.Producer()
        producer.publish(
            {"x": 1}, exchange=exchange, routing_key="gpu", priority=9,
            declare=[kombu.Queue("gpu", exchange, routing_key="gpu")],
            headers={"id": "with-priority"},
        )  # fmt: skip
    priority_list = "gpu\x06\x169"
    assert client.llen(priority_list) == 1, hook.gone(
        f"kombu put a priority-9 message elsewhere: keys {sorted(client.keys('gpu*'))!r}"
    )
    assert client.llen("gpu") == 1, hook.gone("the priority message went to the queue's list")
    assert dispatcher.pending_ids("gpu") == {task_id}


ACTIVE_REQUESTS = Hook(
    "celery.worker.state.active_requests (a set of celery.worker.request.Request, with "
    "name, args and worker_pid)",
    "src/trialq/_celery/lifecycle.py (_running_requests)",
    "a worker given SIGTERM cannot find its running trials: none is told to stop "
    "(trial.should_stop() stays false) and none is killed after TRIALQ_STOP_GRACE_S",
)


def test_the_worker_state_lists_the_running_requests_with_their_process() -> None:
    from celery.worker import request, state

    running = state.active_requests  # a WeakSet in Celery 5
    assert hasattr(running, "add") and hasattr(running, "__iter__"), ACTIVE_REQUESTS.gone(
        "not a set"
    )
    for name in ("name", "args", "worker_pid"):
        assert hasattr(request.Request, name), ACTIVE_REQUESTS.gone(f"Request.{name} is gone")

    class Accepted:  # a fake request: what task_accepted and task_ready read of one
        id = "hook-check"
        name = "trialq.run_trial"

    accepted = Accepted()
    state.task_accepted(accepted)
    try:
        assert accepted in running, ACTIVE_REQUESTS.gone("task_accepted no longer adds to it")
    finally:
        state.task_ready(accepted)
    assert accepted not in running, ACTIVE_REQUESTS.gone("task_ready no longer removes from it")


# --- kombu's Redis read, where trialq sets a malformed queue entry aside ---------------------

TRANSPORT = "src/trialq/_celery/transport.py"
BRPOP_READ = Hook(
    "kombu.transport.redis.Channel._brpop_read(self, **options): the BRPOP handler, which "
    "rotates the queue cycle to the popped queue, decodes the entry with kombu's JSON loads "
    "(a ValueError carrying it as .doc) and delivers it through Channel.Message",
    f"{TRANSPORT} (TrialRedisChannel, TrialMessage, QueueCycle)",
    "one malformed entry on a queue's list ends the worker (Unrecoverable error) and its "
    "running trial with it",
)


def test_kombus_redis_read_still_has_the_seam_trialq_overrides() -> None:
    from kombu.transport import redis as kombu_redis
    from kombu.transport import virtual

    channel = kombu_redis.Channel
    assert parameters(channel._brpop_read) == ["self", "options"], BRPOP_READ.gone(
        f"its parameters are {parameters(channel._brpop_read)}"
    )
    assert refers_to(channel.__init__, "_brpop_read"), BRPOP_READ.gone("no longer the handler")
    for name in ("rotate", "loads", "_deliver"):
        assert refers_to(channel._brpop_read, name), BRPOP_READ.gone(f"it no longer calls {name}")
    assert refers_to(virtual.Channel.basic_consume, "Message"), BRPOP_READ.gone(
        "basic_consume no longer builds self.Message from the entry"
    )


def test_a_malformed_entry_is_set_aside_by_a_real_kombu_channel(redis_url: str) -> None:
    hook = BRPOP_READ
    from trialq._celery.transport import QueueCycle, TrialRedisTransport

    client = redis.Redis.from_url(redis_url)
    received: list[Any] = []
    queue = kombu.Queue("hooks", kombu.Exchange("hooks"), routing_key="hooks")
    with kombu.Connection(redis_url, transport=TrialRedisTransport) as connection:
        channel = connection.default_channel
        assert isinstance(channel._queue_cycle, QueueCycle), hook.gone("queue_order_strategy")
        with connection.Consumer(queue, callbacks=[lambda body, m: received.append(body)]):
            client.lpush("hooks", b"not json", b"[1]")
            connection.Producer().publish({"ok": 1}, exchange=queue.exchange, routing_key="hooks")
            for _ in range(10):
                with contextlib.suppress(TimeoutError, OSError):
                    connection.drain_events(timeout=1)
                if received:
                    break
    assert received == [{"ok": 1}], hook.gone(f"the real message after them: {received!r}")
    aside = client.lrange("trialq:poison:hooks", 0, -1)
    assert sorted(aside) == [b"[1]", b"not json"], hook.gone(f"set aside: {aside!r}")


APP_OPTION = Hook(
    "celery.bin.celery.celery's `--app` option (name 'app', type click.UNPROCESSED), whose "
    "default may be a Celery app object, as Celery's own `app.start` sets it",
    "src/trialq/_celery/launch.py (run_celery)",
    "`trialq worker` cannot hand Celery's command the app built from its settings: it stops "
    "at its start",
)


def test_celery_s_command_takes_an_app_object_as_its_app_option_s_default() -> None:
    import click
    from celery import Celery
    from celery.bin.celery import celery as celery_command

    from trialq._celery.launch import run_celery

    options = [param for param in celery_command.params if param.name == "app"]
    assert len(options) == 1, APP_OPTION.gone("no single option named 'app'")
    app = Celery("hook-check", broker="memory://", set_as_current=False)
    # Celery 5.5+ leaves the option unprocessed; 5.4's `App` type finds an app object as
    # itself (`find_app` passes a non-string through): either way the object survives.
    option = options[0]
    assert option.type is click.UNPROCESSED or option.type.convert(app, option, None) is app, (
        APP_OPTION.gone(f"its type is {option.type!r}: an app object would not survive it")
    )
    assert run_celery(app, ["inspect", "--help"]) == 0, APP_OPTION.gone("the command failed")
    assert options[0].default is None, "the default is put back"


# --- the worker's remote control, limited to what trialq needs -------------------------------

REMOTE_CONTROL = Hook(
    "celery.worker.consumer.control.Control (a consumer step named "
    "'celery.worker.consumer.control.Control') whose box.node.handlers kombu's Node reads by "
    "name; celery.worker.control.Panel.data and control.revoke(state, task_id, terminate, signal)",
    "src/trialq/_celery/remote_control.py (LimitedRemoteControl)",
    "a broker writer can shut every worker down, restart its pool, stop it consuming the queue "
    "or change the trials' time limits (`celery control shutdown`)",
)


def test_the_remote_control_step_reads_its_handlers_from_its_node() -> None:
    from celery.worker import control
    from celery.worker.consumer.control import Control
    from kombu import pidbox

    from trialq._celery.remote_control import CONTROL_STEP, READ_ONLY

    assert f"{Control.__module__}.{Control.__name__}" == CONTROL_STEP, REMOTE_CONTROL.gone(
        "the step was renamed"
    )
    assert refers_to(Control.__init__, "box"), REMOTE_CONTROL.gone("the step keeps no box")
    assert refers_to(pidbox.Node.handle, "handlers"), REMOTE_CONTROL.gone(
        "kombu's Node no longer dispatches through handlers"
    )
    assert set(READ_ONLY) <= set(control.Panel.data), REMOTE_CONTROL.gone("a question is gone")
    assert parameters(control.revoke)[:4] == ["state", "task_id", "terminate", "signal"], (
        REMOTE_CONTROL.gone("revoke's signature changed")
    )
