"""The Redis keys are part of the wire: workers, drivers and `trialq status` of different
versions, and the deployments' autoscaler, read them in one Redis. These are their strings."""

from __future__ import annotations

from trialq.wire import keys
from trialq.wire.channel import TrialAddress
from trialq.wire.heartbeat import RunningTrial


def test_trialqs_own_keys_keep_their_strings() -> None:
    assert keys.worker_key("trialq-1-ab12@host") == "trialq:worker:trialq-1-ab12@host"
    assert keys.running_key("w@h", 42) == "trialq:running:w@h:42"
    assert keys.withdrawn_key("t-1") == "trialq:withdrawn:t-1"
    assert keys.result_key("t-1") == "trialq:result:t-1"
    assert keys.poison_key("gpu") == "trialq:poison:gpu"
    assert keys.results_channel("s") == "trialq:results:s"
    address = TrialAddress("s", 3, 2)
    assert address.key(keys.REPORTS) == "trialq:trial:s:3:2:reports"
    assert address.key(keys.PRUNE) == "trialq:trial:s:3:2:prune"
    assert address.key(keys.MEMORY_EXCEEDED) == "trialq:trial:s:3:2:memory_exceeded"
    keyed = TrialAddress("s", 3, 2, study_key="0123456789abcdef")
    assert keyed.key(keys.REPORTS) == "trialq:trial:0123456789abcdef:3:2:reports"
    running = RunningTrial("w@h", "s", 3, 2, "t-1", 42, 0.0)
    assert running.key == "trialq:running:w@h:42"


def test_the_keys_read_from_kombu_are_kombus() -> None:
    from kombu.transport.redis import Channel

    assert keys.KOMBU_UNACKED == Channel.unacked_key == "unacked"
    assert keys.kombu_queue_key("gpu") == "gpu" == keys.DEFAULT_QUEUE
