"""The names of JAX that trialq leans on are still there, with the meaning it gives them
(docs/design.md, "Private hooks we lean on").

`jax._src.xla_bridge.backends_are_initialized()` (private) is how the fork guard tells an
imported JAX from one whose backends started, and how the JAX adapter knows its fraction came
in time. `jaxlib.xla_client.generate_pjrt_gpu_plugin_options()` is where jaxlib reads the
memory variables trialq sets (its cap): their names, and its refusal of both fraction names.
JAX runs in a process of its own: the test process holds no backend.
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

from trialq.trial.frameworks.jax import (
    BACKENDS_STARTED,
    BRIDGE_MODULE,
    FRACTION,
    FRACTION_OLD,
    PREALLOCATE,
    jax_guard_gap,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="no JAX")

ADAPTER = "src/trialq/trial/frameworks/jax.py"
BACKENDS = Hook(
    f"{BRIDGE_MODULE}.{BACKENDS_STARTED}()",
    f"{ADAPTER} (started; prewarm.device_in_use)",
    "the fork guard cannot tell an imported JAX from a started one: a worker preloads "
    "nothing where JAX is installed, and a parent holding JAX refuses to fork",
)
OPTIONS = Hook(
    "jaxlib.xla_client.generate_pjrt_gpu_plugin_options()",
    f"{ADAPTER} (environment, fraction_names)",
    "JAX trials are not held to their budget (or fail at their first op on a GPU)",
)

PROBE = """
import json, os, sys
import jax
import jaxlib.xla_client as xc
bridge = sys.modules.get(BRIDGE)
seen = {"bridge": bridge is not None, "callable": callable(getattr(bridge, NAME, None))}
seen["before"] = getattr(bridge, NAME)() if seen["callable"] else None
jax.numpy.ones(2).sum().block_until_ready()
seen["after"] = getattr(bridge, NAME)() if seen["callable"] else None
options = {}
for name in (NEW, OLD):
    os.environ.pop(NEW, None); os.environ.pop(OLD, None)
    os.environ[PREALLOCATE] = "false"; os.environ[name] = "0.25"
    got = xc.generate_pjrt_gpu_plugin_options()
    options[name] = [got.get("memory_fraction"), got.get("preallocate")]
os.environ[NEW] = "0.25"
try:
    xc.generate_pjrt_gpu_plugin_options()
    options["both"] = "accepted"
except ValueError:
    options["both"] = "ValueError"
seen["options"] = options
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    names = f"BRIDGE = {BRIDGE_MODULE!r}\nNAME = {BACKENDS_STARTED!r}\nNEW = {FRACTION!r}\n"
    names += f"OLD = {FRACTION_OLD!r}\nPREALLOCATE = {PREALLOCATE!r}\n"
    env = {k: v for k, v in os.environ.items() if k not in (FRACTION, FRACTION_OLD)}
    probe = subprocess.run(
        [sys.executable, "-c", names + textwrap.dedent(PROBE)],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    observed: dict[str, Any] = json.loads(probe.stdout.strip().splitlines()[-1])
    return observed


@pytest.mark.slow
def test_backends_are_initialized_is_false_until_an_op_runs(seen: dict[str, Any]) -> None:
    assert seen["bridge"], BACKENDS.gone("`import jax` does not load the module")
    assert seen["callable"], BACKENDS.gone("the module has no such function")
    assert seen["before"] is False, BACKENDS.gone("it says True before any op ran")
    assert seen["after"] is True, BACKENDS.gone("it says False after an op ran")


def test_the_preload_check_finds_the_name_in_jaxs_source() -> None:
    gap = jax_guard_gap()
    assert gap is None, BACKENDS.gone(gap)


@pytest.mark.slow
def test_jaxlib_reads_both_fraction_names_and_refuses_both_at_once(seen: dict[str, Any]) -> None:
    """Why trialq sets one name and removes the other (docs/frameworks.md, JAX)."""
    options = seen["options"]
    assert options[FRACTION] == [0.25, False], OPTIONS.gone(f"{FRACTION} is not read")
    assert options[FRACTION_OLD] == [0.25, False], OPTIONS.gone(f"{FRACTION_OLD} is not read")
    assert options["both"] == "ValueError", OPTIONS.gone(
        "both names at once are accepted now: trialq could set both"
    )
