"""The private names of TensorFlow that the fork guard reads are still there, with the meaning
it gives them (docs/design.md, "Private hooks we lean on").

`trialq.worker.prewarm.device_in_use`, through the TensorFlow adapter's `started`, tells a
worker parent that may fork trials (TensorFlow imported, never initialised) from one that may not, by reading TensorFlow's eager context
without creating it. Where it cannot read it, the guard fails closed: the worker preloads
nothing, and a parent holding TensorFlow refuses to fork. TensorFlow is imported once, in a
process of its own (seconds; and the test process must not hold it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from private_hooks import Hook

from trialq.trial.frameworks.tensorflow import (
    TF_CONTEXT_MODULE,
    TF_DEVICE_LIST,
    TF_RUNTIME_HANDLE,
    tensorflow_guard_gap,
)

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"
    ),
    pytest.mark.slow,  # TensorFlow's import alone takes seconds
]

PREWARM = "src/trialq/trial/frameworks/tensorflow.py"
LOSS = (
    "the fork guard cannot tell an imported TensorFlow from an initialised one: the worker "
    "preloads nothing (each trial imports TensorFlow itself, seconds a trial), and a parent "
    "holding TensorFlow refuses to fork"
)

CONTEXT_MODULE = Hook(TF_CONTEXT_MODULE, f"{PREWARM} (device_in_use)", LOSS)
CONTEXT_SAFE = Hook(f"{TF_CONTEXT_MODULE}.context_safe()", f"{PREWARM} (device_in_use)", LOSS)
RUNTIME_HANDLE = Hook(
    f"{TF_CONTEXT_MODULE}.Context.{TF_RUNTIME_HANDLE}", f"{PREWARM} (device_in_use)", LOSS
)
DEVICE_LIST = Hook(
    f"{TF_CONTEXT_MODULE}.Context.{TF_DEVICE_LIST}", f"{PREWARM} (device_in_use)", LOSS
)
SOURCE = Hook(
    f"{TF_CONTEXT_MODULE} as source (context_safe, Context.{TF_RUNTIME_HANDLE}, "
    f"Context.{TF_DEVICE_LIST})",
    f"{PREWARM} (tensorflow_guard_gap, before preloading)",
    LOSS,
)

PROBE = """
import json, sys

def attribute(context, name):
    return "absent" if not hasattr(context, name) else getattr(context, name) is not None

seen = {}
import tensorflow as tf
seen["module_loaded"] = MODULE in sys.modules
context_module = sys.modules.get(MODULE)
context_safe = getattr(context_module, "context_safe", None)
seen["context_safe"] = callable(context_safe)
if callable(context_safe):
    seen["context_before"] = context_safe() is not None
    tf.random.set_seed(0)  # makes the context object, not the runtime
    context = context_safe()
    seen["context_made"] = type(context).__name__
    seen["fresh"] = {name: attribute(context, name) for name in (HANDLE, DEVICES)}
    tf.config.list_physical_devices("GPU")
    seen["listed"] = {name: attribute(context, name) for name in (HANDLE, DEVICES)}
    tf.constant(1.0) + 1.0
    seen["op"] = {name: attribute(context, name) for name in (HANDLE, DEVICES)}
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    """What TensorFlow's eager context shows as it is imported, seeded, asked for its devices
    and made to run an op."""
    names = f"MODULE = {TF_CONTEXT_MODULE!r}\nHANDLE = {TF_RUNTIME_HANDLE!r}\n"
    names += f"DEVICES = {TF_DEVICE_LIST!r}\n"
    probe = subprocess.run(
        [sys.executable, "-c", names + textwrap.dedent(PROBE)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    observed: dict[str, Any] = json.loads(probe.stdout.strip().splitlines()[-1])
    return observed


def test_importing_tensorflow_loads_its_eager_context_module(seen: dict[str, Any]) -> None:
    assert seen["module_loaded"], CONTEXT_MODULE.gone("`import tensorflow` does not load it")


def test_context_safe_reads_the_context_without_making_one(seen: dict[str, Any]) -> None:
    hook = CONTEXT_SAFE
    assert seen["context_safe"], hook.gone("the context module has no context_safe()")
    assert seen["context_before"] is False, hook.gone("it gives a context before any was made")
    assert seen["context_made"] == "Context", hook.gone(f"it gives a {seen['context_made']}")


def test_the_context_handle_is_none_until_an_op_runs(seen: dict[str, Any]) -> None:
    hook, name = RUNTIME_HANDLE, TF_RUNTIME_HANDLE
    assert seen["fresh"][name] != "absent", hook.gone("the context has no such attribute")
    assert seen["fresh"][name] is False, hook.gone("it is set before anything ran")
    assert seen["listed"][name] is False, hook.gone("listing the devices set it")
    assert seen["op"][name] is True, hook.gone("it is still None after an op ran")


def test_the_physical_devices_are_none_until_listed(seen: dict[str, Any]) -> None:
    hook, name = DEVICE_LIST, TF_DEVICE_LIST
    assert seen["fresh"][name] != "absent", hook.gone("the context has no such attribute")
    assert seen["fresh"][name] is False, hook.gone("it is set before the devices were listed")
    assert seen["listed"][name] is True, hook.gone("it is still None after listing the devices")


def test_the_preload_check_finds_the_names_in_tensorflows_source() -> None:
    """What `preload` checks before it imports TensorFlow in the worker's parent."""
    gap = tensorflow_guard_gap()
    assert gap is None, SOURCE.gone(gap)
