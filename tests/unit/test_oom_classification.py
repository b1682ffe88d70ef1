"""Out of memory told from any other failure, against the frameworks' real exception classes
and real messages, raised alone and re-raised inside other exceptions (`raise ... from`,
raised while handling one), as Lightning, Keras and DataLoaders do."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from trialq.wire.failures import chain, classify
from trialq.wire.messages import Outcome

JAX_OOM = (
    "RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0"
)
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 6.81 MiB is free."
)


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


def _raised_while_handling(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer from None  # hides it from the traceback, not from __context__
    except BaseException as caught:
        return caught


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")
def test_pytorch_out_of_memory_alone_and_wrapped() -> None:
    import torch

    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    oom = torch.OutOfMemoryError(TORCH_OOM)
    assert classify(oom) is Outcome.OOM
    wrapped = _raised_from(oom, RuntimeError("Caught an error in DataLoader worker process 0"))
    assert classify(wrapped) is Outcome.OOM
    assert classify(RuntimeError("CUDA error: out of memory")) is Outcome.OOM
    assert classify(RuntimeError("Expected all tensors to be on the same device")) is Outcome.ERROR


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="no jax")
def test_jax_resource_exhausted_is_oom_and_other_runtime_errors_are_not() -> None:
    import jax
    import jaxlib.xla_client as xc

    oom = jax.errors.JaxRuntimeError(JAX_OOM)
    assert classify(oom) is Outcome.OOM
    assert classify(xc.XlaRuntimeError(JAX_OOM)) is Outcome.OOM  # the older name, same class
    hidden = _raised_while_handling(oom, ValueError("fit failed"))
    assert classify(hidden) is Outcome.OOM
    other = jax.errors.JaxRuntimeError("INVALID_ARGUMENT: Executable expected shape f32[3]")
    assert classify(other) is Outcome.ERROR


TENSORFLOW = """
import json
import tensorflow as tf
from trialq.wire.failures import classify
oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[8192,8192]")
try:
    try:
        raise oom
    except tf.errors.ResourceExhaustedError as exc:
        raise RuntimeError("keras fit failed") from exc
except RuntimeError as wrapped:
    outer = wrapped
other = tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [2] vs. [3]")
print(json.dumps([classify(oom), classify(outer), classify(other)]))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="no TensorFlow")
def test_tensorflow_resource_exhausted_alone_and_wrapped() -> None:
    """In a process of its own: the test process must not hold TensorFlow."""
    probe = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TENSORFLOW)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == ["oom", "oom", "error"]


def test_host_memory_and_exception_groups() -> None:
    assert classify(_raised_from(MemoryError(), KeyError("x"))) is Outcome.OOM
    group = ExceptionGroup("workers", [ValueError("a"), MemoryError()])
    assert classify(group) is Outcome.OOM
    assert classify(ExceptionGroup("workers", [ValueError("a")])) is Outcome.ERROR


def test_a_chain_that_loops_ends() -> None:
    first, second = ValueError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    assert [str(e) for e in chain(first)] == ["first", "second"]
    assert classify(first) is Outcome.ERROR
