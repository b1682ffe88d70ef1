"""Every framework in the registry says all it must, and the registry imports none of them.

A framework is one adapter module under `trialq/trial/frameworks/` and one entry of
`trialq.wire.frameworks.REGISTRY`: what is checked here is everything the driver, the wire
and the trial side read of it, so a framework added with a part left out fails here, not as
OOMs filed as `error` or a fork guard that cannot read it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pydantic import TypeAdapter, ValidationError

from trialq.gpu.allowance import OUTSIDE_ALLOCATOR_MB
from trialq.trial.frameworks import Adapter, adapter, adapters
from trialq.wire.failures import classify
from trialq.wire.frameworks import NAMES, REGISTRY, REVEALED_BY, Framework, FrameworkChoice
from trialq.wire.messages import Outcome

ADAPTER_MEMBERS = (
    "environment", "started", "cap", "peaks", "reserved", "free_memory", "guard_gap",
)  # fmt: skip


def test_the_adapter_protocol_is_what_is_checked() -> None:
    declared = {name for name in vars(Adapter) if not name.startswith("_")} - {"name"}
    assert declared == set(ADAPTER_MEMBERS)


@pytest.mark.parametrize("framework", REGISTRY, ids=NAMES)
def test_each_framework_says_all_it_must(framework: Framework) -> None:
    assert framework.name in framework.revealed_by, "its own module reveals it"
    assert all(REVEALED_BY[module] == framework.name for module in framework.revealed_by)
    assert framework.preload and framework.preload[0] == framework.name, "it preloads itself"
    oom = framework.oom
    assert oom.types or oom.messages or oom.status, "its OOM errors must be known"
    assert bool(oom.status) == bool(oom.status_types), "a status needs its types, and back"
    assert all(message == message.lower() for message in (*oom.messages, oom.status))
    found = adapter(framework.name)
    assert found.name == framework.name
    missing = [name for name in ADAPTER_MEMBERS if not callable(getattr(found, name, None))]
    assert not missing, f"{framework.adapter_module} lacks {missing}"


@pytest.mark.parametrize("framework", REGISTRY, ids=NAMES)
def test_each_frameworks_oom_errors_are_classified_oom(framework: Framework) -> None:
    for name in framework.oom.types:
        assert classify(type(name, (RuntimeError,), {})("no words of memory")) is Outcome.OOM
    for message in framework.oom.messages:
        assert classify(RuntimeError(f"Boom: {message.upper()} here")) is Outcome.OOM
    for name in framework.oom.status_types:
        runtime_error = type(name, (RuntimeError,), {})
        assert classify(runtime_error(f"{framework.oom.status.upper()}: no room")) is Outcome.OOM
        assert classify(runtime_error("INVALID_ARGUMENT: resource_exhausted")) is Outcome.ERROR


def test_each_framework_has_an_allowance_outside_its_allocator() -> None:
    assert set(OUTSIDE_ALLOCATOR_MB) == set(NAMES)


def test_the_registry_is_the_tables_the_driver_reads() -> None:
    assert tuple(adapter.name for adapter in adapters()) == NAMES
    assert len(set(NAMES)) == len(NAMES)


def test_the_spec_may_name_auto_or_a_registered_framework_only() -> None:
    choice = TypeAdapter(FrameworkChoice)
    assert [choice.validate_python(name) for name in ("auto", *NAMES)] == ["auto", *NAMES]
    with pytest.raises(ValidationError) as info:
        choice.validate_python("mxnet")
    message = info.value.errors()[0]["msg"]
    assert (
        message
        == "Value error, Input should be 'auto', 'torch', 'tensorflow' or 'jax' (got 'mxnet')"
    )


def test_asking_every_adapter_imports_no_framework() -> None:
    """The fork guard, `fit_batch_size`'s freeing and the registry itself ask every adapter in
    every worker parent and trial: none may import its framework to answer."""
    code = textwrap.dedent(
        """
        import json, sys
        from trialq.trial import batch_size
        from trialq.worker import prewarm
        from trialq.trial.frameworks import adapters
        from trialq.wire.frameworks import NAMES
        [framework.started() for framework in adapters()]
        print(json.dumps([framework.reserved() for framework in adapters()]))
        batch_size.free_memory(after_oom=True)
        prewarm.guard_gap()
        print(json.dumps([name for name in NAMES if name in sys.modules]))
        """
    )
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout.splitlines()[-1]) == []
    # Nothing started, nothing reserved: the guard reads 0, never "cannot say".
    assert json.loads(probe.stdout.splitlines()[-2]) == [[], [], []]
