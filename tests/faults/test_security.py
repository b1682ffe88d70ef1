"""Security on a shared network: JSON only, an import allow-list, bounded results, no
secret in any output."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from bad_inputs import BAD_ARGS, BAD_SPECS, spec_text
from celery import Celery
from trial_requests import trial_request
from waiting import wait_for_redis, wait_until

from faults.harness import DriverRun, Verdict, assert_clean, fault_spec, grid, record_verdict
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.cli import submit_study_main
from trialq.local import LocalCluster, free_port, redis_server_binary
from trialq.settings import Settings
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Outcome, TrialResult
from trialq.wire.signing import Seal

pytestmark = [pytest.mark.faults, pytest.mark.integration]


class _WritesAFileWhenUnpickled:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def test_a_pickle_message_is_refused_and_nothing_runs(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1)
    marker = tmp_path / "pwned"
    sender = Celery("attacker", broker=redis_url)
    sender.send_task(
        "trialq.run_trial", args=[_WritesAFileWhenUnpickled(marker)], queue="gpu",
        serializer="pickle",
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    log_file = cluster.log_dir / "worker0.log"

    def refused() -> bool:
        log = log_file.read_text() if log_file.exists() else ""
        return "untrusted content" in log or "ContentDisallowed" in log

    # Until the worker has said it refused the message: by then it would have unpickled it.
    wait_until(lambda: client.llen("gpu") == 0 and refused(), 30, "the worker to refuse it")

    assert client.llen("gpu") == 0, "the worker should have taken (and refused) the message"
    assert not marker.exists(), "a pickle payload was deserialized on a worker"
    log = (cluster.log_dir / "worker0.log").read_text()
    assert "untrusted content" in log or "ContentDisallowed" in log, log[-2000:]


def test_an_entrypoint_outside_the_allow_list_is_refused_and_the_run_stops_keeping_the_budget(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(1)  # allowed: trials, trialq.examples
    run = DriverRun(tmp_path, redis_url)
    run.write_spec(
        """
        [study]
        name = "faults"
        n_trials = 1
        [trial]
        entrypoint = "json:dumps"
        [space.x]
        type = "int"
        low = 1
        high = 2
        """
    )
    code, err = run.run()
    assert code == 5, err  # refused 5 times in a row: stopped, not burned (issue 26.8)
    assert "5 trials in a row refused by their workers" in err
    assert "not in this worker's allowed modules" in err
    (trial,) = run.study().trials
    assert trial.state.name == "RUNNING"  # never told: the next run sends it again


def test_a_result_larger_than_the_limit_is_refused_not_stored(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(1, extra_env={"TRIALQ_MAX_RESULT_BYTES": "20000"})
    run = DriverRun(tmp_path, redis_url)
    run.write_spec(
        """
        [study]
        name = "faults"
        n_trials = 1
        metric = "metric_1"
        [trial]
        entrypoint = "trials:many_metrics"
        [space.n]
        type = "categorical"
        choices = [5000]
        """
    )
    run.run()
    (trial,) = run.study().trials
    assert trial.user_attrs["outcome"] == "error"
    assert "refused (limit 20000)" in trial.user_attrs["error"]
    assert trial.user_attrs["metrics"] == {}


def test_a_password_protected_redis_works_and_the_password_is_never_printed(
    tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    password = "s3cret-pa55word"
    port = free_port()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--requirepass", password, "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        wait_for_redis(redis.Redis.from_url(url))
        cluster = start_workers(1, broker_url=url)
        run = DriverRun(tmp_path, url)
        run.write_spec(spec_text())
        process = run.start("--json")
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        assert "not authenticated" not in err, err  # the suite's secret, on both sides
        logs = "".join(p.read_text() for p in cluster.log_dir.glob("*.log"))
        for text in (out, err, logs):
            assert password not in text
        wrong = f"redis://:{password}@127.0.0.1:1/0"
        code, err = DriverRun(tmp_path, wrong).run()
        assert code == 3 and password not in err
    finally:
        server.terminate()
        server.wait()


def test_bad_specs_and_arguments_never_enqueue(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every case of the unit tests, again, as one row of the fault table."""
    clean = 0
    for text, _ in BAD_SPECS.values():
        path = write_spec(text)
        code = submit_study_main([str(path), "--broker", redis_url, "--no-progress"])
        clean += code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    spec = write_spec(spec_text())
    for argv, _ in BAD_ARGS.values():
        code = submit_study_main([arg.replace("{spec}", str(spec)) for arg in argv])
        clean += code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    kinds = len(BAD_SPECS) + len(BAD_ARGS)
    record_verdict(
        Verdict(f"bad spec or argument ({kinds} kinds)", 0, 0, 0, 0, 0, {"exit 2, one line": clean})
    )
    assert kinds >= 20 and clean == kinds
    assert redis.Redis.from_url(redis_url).dbsize() == 0


_IMPOSTOR = """
from pathlib import Path


def quadratic(params, trial):
    Path(__file__).with_name("imported").write_text("from the sender's folder")
    return {"value": -1.0}
"""


def _run_quadratic(redis_url: str, search_paths: tuple[str, ...] = ()) -> dict[str, float]:
    """Run `trials:quadratic`; a message naming `search_paths` (a field a sender may add,
    as drivers before the wire dropped it did) is sent as a plain Celery client would."""
    settings = Settings(broker_url=redis_url)
    dispatcher = CeleryDispatcher(settings)
    request = trial_request(params={"x": 2.0})
    if search_paths:
        payload = {**request.model_dump(mode="json"), "search_paths": list(search_paths)}
        task_id = str(uuid.uuid4())
        assert settings.seal is not None, "the suite's secret (tests/conftest.py)"
        payload = settings.seal.sign_task(task_id, payload)  # signed: only the path is foreign
        app = Celery(broker=redis_url, backend=redis_url)
        app.send_task("trialq.run_trial", args=[payload], task_id=task_id, queue="gpu")
    else:
        task_id = dispatcher.submit(request, "gpu")

    def finished() -> TaskStatus | None:
        status = dispatcher.statuses([task_id])[task_id]
        return status if status.phase is TaskPhase.FINISHED else None

    result = wait_until(finished, 60, "the trial to finish").result
    assert result is not None and result.outcome == "ok", result
    return result.metrics


def test_a_message_does_not_choose_where_an_allowed_module_is_imported_from(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """A request naming a folder with its own `trials.py` (an allowed module) runs the
    worker's `trials`, not the sender's (issue 26, item 7)."""
    (tmp_path / "trials.py").write_text(_IMPOSTOR)
    start_workers(1)
    metrics = _run_quadratic(redis_url, search_paths=(str(tmp_path),))
    assert not (tmp_path / "imported").exists(), "the worker imported the sender's module"
    assert metrics != {"value": -1.0}, metrics


def test_a_worker_imports_from_its_own_import_paths(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """`TRIALQ_IMPORT_PATHS` (what `--local` sets for its workers) comes first."""
    (tmp_path / "trials.py").write_text(_IMPOSTOR)
    start_workers(1, extra_env={"TRIALQ_IMPORT_PATHS": str(tmp_path)})
    assert _run_quadratic(redis_url) == {"value": -1.0}
    assert (tmp_path / "imported").exists()


def _forged_result(raw_message: bytes | str, secret: str | None) -> tuple[str, str]:
    """The task id of a queued message and the result a broker writer would store for it:
    COMPLETE at -1e9 from host `attacker`, unsigned, or signed with a secret of their own."""
    message = json.loads(raw_message)
    task_id = message["headers"]["id"]
    args, _, _ = json.loads(base64.b64decode(message["body"]))
    request = args[0]
    result = {
        "version": 1, "study": request["study"], "number": request["number"],
        "attempt": request["attempt"], "outcome": "ok", "metrics": {"echo": -1e9},
        "worker_host": "attacker",
    }  # fmt: skip
    text = json.dumps(result)
    return task_id, Seal(secret).signed(task_id, text) if secret else text


def _forge_while(client: redis.Redis, running: Callable[[], bool]) -> set[str]:
    """Store a forged result for every queued or reserved trial until `running` says no,
    alternately unsigned and signed with the wrong secret; the task ids forged."""
    forged: set[str] = set()
    while running():
        held = [json.dumps(json.loads(entry)[0]) for entry in client.hvals("unacked")]
        for raw in client.lrange("gpu", 0, -1) + held:
            secret = "not-the-deployment-secret" if len(forged) % 2 else None
            task_id, text = _forged_result(raw, secret)
            if task_id not in forged:
                client.set(f"trialq:result:{task_id}", text)
                forged.add(task_id)
        time.sleep(0.05)
    return forged


def test_forged_results_are_set_aside_and_every_trial_is_told_its_own(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """Issue 38, row 7: `SET trialq:result:<task id>` for every queued or reserved trial
    made all of them COMPLETE at -1e9; with a secret each is set aside, said once, and every
    trial is told the result its worker signed."""
    cluster = start_workers(1)
    run = DriverRun(tmp_path, redis_url, env={"TRIALQ_RESULT_SECRET": cluster.result_secret})
    run.write_spec(fault_spec("sleeps_then_echoes", grid("sleep_s", 0.5, 1.0, 1.5, 2.0), 4, 4))
    process = run.start()
    forged = _forge_while(redis.Redis.from_url(redis_url), lambda: process.poll() is None)
    _, err = process.communicate(timeout=120)
    verdict = run.judge("forged results in Redis (secret set)", 4)
    trials = run.study().trials
    set_aside = [line for line in err.splitlines() if "is set aside, not told" in line]
    assert process.returncode == 0, err
    assert_clean(verdict)
    assert sorted(t.value for t in trials) == [50.0, 100.0, 150.0, 200.0]
    assert all(t.user_attrs.get("worker_host") != "attacker" for t in trials)
    assert len(forged) >= 3, forged  # the 3 queued behind the first, at least
    said = [next(tid for tid in forged if tid in line) for line in set_aside]
    assert 1 <= len(said) == len(set(said)), set_aside  # one line a task at most
    assert "unsigned" in err or "does not verify" in err


def test_a_result_signed_for_one_task_is_refused_on_another(redis_url: str) -> None:
    """A signed result copied onto another task's key, one signed with another secret, and an
    unsigned one: each set aside (the task reads as not finished), the real one taken."""
    secret = "the-deployment-secret-0123456789"
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url, result_secret=secret))
    client = redis.Redis.from_url(redis_url)
    request = trial_request()
    result = TrialResult.of(request, Outcome.OK).model_dump_json()
    real, copied, other, unsigned = (str(uuid.uuid4()) for _ in range(4))
    client.set(f"trialq:result:{real}", Seal(secret).signed(real, result))
    client.set(f"trialq:result:{copied}", Seal(secret).signed(real, result))
    client.set(f"trialq:result:{other}", Seal("another-secret-0123456789").signed(other, result))
    client.set(f"trialq:result:{unsigned}", result)
    statuses = dispatcher.statuses([real, copied, other, unsigned])
    assert statuses[real].phase is TaskPhase.FINISHED
    for task_id in (copied, other, unsigned):
        assert statuses[task_id].phase is TaskPhase.WAITING, task_id


def test_reports_that_do_not_verify_are_refused(redis_url: str) -> None:
    """A report a broker writer adds to a trial's stream never reaches its pruner."""
    seal = Seal("the-deployment-secret-0123456789")
    client = redis.Redis.from_url(redis_url)
    channel = ReportChannel(client, seal=seal)
    address = TrialAddress("s", 0, 1)
    channel.report(address, 1, 0.5)
    client.xadd(address.key("reports"), {"step": 2, "value": "-1000.0"})
    client.xadd(address.key("reports"), {"step": 3, "value": "-1000.0", "sig": "0" * 64})
    other = ReportChannel(client, seal=Seal("another-secret-0123456789"))
    other.report(address, 4, -1000.0)
    (reports,) = channel.read_new({address: "0"}).values()
    assert [(r.step, r.value) for r in reports] == [(1, 0.5)]


def test_remote_control_answers_only_what_trialq_needs(
    redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """`celery control shutdown` (and the pool and consumer commands) stopped any worker;
    now they are refused and the worker runs on, answering ping and the driver's revoke."""
    cluster = start_workers(1)
    app = Celery(broker=redis_url)
    # a worker beats before its consumer listens for broadcasts (fanout: one sent earlier is
    # lost): wait for its first answer, as a loaded machine can take seconds
    wait_until(lambda: app.control.ping(timeout=1), 90, "the worker to answer a ping")
    for command, arguments in [
        ("shutdown", {}), ("pool_restart", {}), ("cancel_consumer", {"queue": "gpu"}),
        ("time_limit", {"task_name": "trialq.run_trial", "hard": 1}), ("disable_events", {}),
    ]:  # fmt: skip
        app.control.broadcast(command, arguments=arguments)
    answers = app.control.broadcast("revoke", arguments={"task_id": "x"}, reply=True, timeout=10)
    assert answers and all("ok" in next(iter(a.values())) for a in answers), answers
    assert app.control.ping(timeout=5), "the worker stopped answering"
    stop = {"task_id": "x", "terminate": True, "signal": "SIGSTOP"}
    refused = app.control.broadcast("revoke", arguments=stop, reply=True, timeout=10)
    assert refused and all("error" in next(iter(a.values())) for a in refused), refused
    assert _consumes(app, "gpu")
    log = (cluster.log_dir / "worker0.log").read_text()
    assert "remote control command 'shutdown' refused" in log, log[-3000:]
    assert "Got shutdown from remote" not in log
    assert redis.Redis.from_url(redis_url).keys("trialq:worker:*"), "the worker stopped beating"


def _consumes(app: Celery, queue: str) -> bool:
    answers = app.control.inspect(timeout=5).active_queues() or {}
    return any(q["name"] == queue for queues in answers.values() for q in queues)


def test_a_forged_success_in_celerys_meta_is_no_result(redis_url: str) -> None:
    """Celery's own meta is written by whoever can write Redis too: a SUCCESS that does not
    verify leaves a beating attempt running, and one whose process is gone lost (re-sent
    within max_retries), never told as its forger said."""
    secret = "the-deployment-secret-0123456789"
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url, result_secret=secret))
    client = redis.Redis.from_url(redis_url)
    forged = TrialResult.of(trial_request(), Outcome.OK).model_dump(mode="json")
    beating, gone = str(uuid.uuid4()), str(uuid.uuid4())
    for task_id in (beating, gone):
        meta = {"status": "SUCCESS", "result": forged, "task_id": task_id}
        client.set(f"celery-task-meta-{task_id}", json.dumps(meta))
    client.set(f"trialq:attempt:{beating}", 1)
    statuses = dispatcher.statuses([beating, gone])
    assert statuses[beating].phase is TaskPhase.RUNNING
    assert statuses[gone].phase is TaskPhase.FAILED
    assert statuses[gone].failure is Outcome.WORKER_LOST
    assert "set aside (unsigned" in statuses[gone].detail
