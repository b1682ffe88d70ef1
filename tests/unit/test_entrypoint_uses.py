"""`[trial] framework = "auto"` is the entrypoint function's framework: what it uses, by
itself or through what it calls in its module (`trialq.wire.entrypoint_uses`), never a
framework another function of its module names."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialq.wire.entrypoint_uses import modules_used
from trialq.wire.frameworks import framework_in_source

GPU_TRIALS = Path(__file__).parents[2] / "benchmarks" / "gpu_trials.py"


@pytest.mark.parametrize(
    ("function", "framework"),
    [("jax_over_budget", "jax"), ("mid", "torch"), ("tiny_torch", "torch"),
     ("hog_or_train", "torch")],
)  # fmt: skip
def test_each_trial_of_the_gpu_benchmark_gets_its_own_framework(
    function: str, framework: str
) -> None:
    """The module holds PyTorch and JAX trials: its JAX trial is JAX's, not PyTorch's."""
    assert framework_in_source(GPU_TRIALS.read_text(), function=function) == framework


MODULE = """
import torch
import jax.numpy as jnp
from flax import linen
import tensorflow as tf
from helpers_of_mine import fit

SCALE = jnp.float32(2.0)

class Net(linen.Module):
    pass

def _step(x):
    return tf.constant(x)

def via_helper(params, trial):
    return _step(params["x"])

def via_class(params):
    return Net()

def via_constant(params):
    return SCALE

def direct(params):
    return torch.ones(1)

def local_import(params):
    import jax
    return jax

def nothing(params):
    return fit(params)

def recursive(params):
    return recursive(params) + direct(params)

async def asynchronous(params):
    return _step(1)

train = via_helper
"""


@pytest.mark.parametrize(
    ("function", "framework"),
    [("via_helper", "tensorflow"), ("via_class", "jax"), ("via_constant", "jax"),
     ("direct", "torch"), ("local_import", "jax"), ("nothing", None), ("recursive", "torch"),
     ("asynchronous", "tensorflow"), ("train", "tensorflow"), ("no_such_function", None)],
)  # fmt: skip
def test_what_the_function_uses_in_its_module_names_the_framework(
    function: str, framework: str | None
) -> None:
    assert framework_in_source(MODULE, function=function) == framework


def test_an_unused_import_of_the_module_is_not_the_functions() -> None:
    assert list(modules_used(MODULE, "nothing")) == ["helpers_of_mine.fit"]


def test_without_a_function_the_whole_module_is_read_as_before() -> None:
    assert framework_in_source(MODULE) == "torch"


def test_source_that_is_not_python_names_no_framework() -> None:
    assert framework_in_source("this is not python", function="train") is None


def test_the_trial_process_gives_the_jax_trial_jaxs_adapter() -> None:
    """What the runner does before importing the entrypoint (no framework imported)."""
    from trialq.trial.frameworks.session import FrameworkSession

    environ: dict[str, str] = {}
    session = FrameworkSession("auto", None, environ)
    session.before_import(GPU_TRIALS.read_text(), "jax_over_budget")
    assert session.framework == "jax"
    assert environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
