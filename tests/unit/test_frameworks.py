"""The framework adapters on CPU with the real PyTorch and JAX: the environment set before
the import, caps skipped and said so, peaks None, frameworks found from the entrypoint, and
whole trials through `run_trial` recording their framework.

No GPU here: nothing below claims a cap held on one (tests/gpu does, on a GPU). Each check
that imports a framework runs in a process of its own, so the test process holds none and
keeps its environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trialq.gpu.share import GpuShare
from trialq.trial.frameworks import adapter, detect
from trialq.trial.frameworks.jax import FRACTION, FRACTION_OLD, fraction_names
from trialq.trial.frameworks.session import NO_SHARE, FrameworkSession
from trialq.wire.frameworks import PRELOAD, framework_in_source

TESTS = Path(__file__).resolve().parents[1]
GIB = 2**30
SHARE = GpuShare(("0",), budget_bytes=3 * GIB, model="FakeGPU (a fake)", total_bytes=12 * GIB)
"""A share as a worker's slot would give it: a fake GPU (named as one), a quarter of it."""

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="no jax")
CLEARED = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
CLEARED += ("XLA_PYTHON_CLIENT_PREALLOCATE", FRACTION, FRACTION_OLD, "TF_FORCE_GPU_ALLOW_GROWTH")


def _probe(code: str, env: dict[str, str] | None = None) -> Any:
    """Run `code` in a fresh Python with tests/ on its path; the JSON it printed last."""
    environment = {k: v for k, v in os.environ.items() if k not in CLEARED}
    environment["PYTHONPATH"] = f"{TESTS}:{os.environ.get('PYTHONPATH', '')}"
    probe = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=240, env={**environment, **(env or {})},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


BEFORE_IMPORT = """
import json, os, sys
from trialq.trial.frameworks.session import FrameworkSession
from trialq.gpu.share import GpuShare
share = GpuShare(("0",), budget_bytes=3 * 2**30, model="FakeGPU", total_bytes=12 * 2**30)
session = FrameworkSession("auto", share)
session.before_import(open(SOURCE).read(), "step")
seen = {"framework": session.framework, "imported_before": NAME in sys.modules}
seen["env"] = {k: os.environ.get(k) for k in KEYS}
"""


def _before_import(trial_module: str, name: str, keys: list[str]) -> str:
    source = str(TESTS / f"{trial_module}.py")
    return f"SOURCE = {source!r}\nNAME = {name!r}\nKEYS = {keys!r}\n" + BEFORE_IMPORT


JAX_AFTER = """
import jax, jaxlib.xla_client as xc
options = xc.generate_pjrt_gpu_plugin_options()
seen["options"] = {k: options.get(k) for k in ("preallocate", "memory_fraction")}
session.after_import(set())
jax.numpy.ones(3).sum().block_until_ready()
record = session.record()
seen["record"] = [record.framework, record.cap_applied, record.cap_note, record.peaks]
print(json.dumps(seen))
"""


@pytest.mark.slow
@needs_jax
def test_jax_gets_no_preallocation_and_its_fraction_before_the_import() -> None:
    """The fraction under the name this jaxlib reads (a stale old one removed: both at once
    is jaxlib's ValueError), read back by jaxlib's own option builder after the import; the
    cap then skipped, said so, and no peaks (JAX runs on the CPU here)."""
    code = _before_import("tiny_jax_trial", "jax", list(CLEARED[3:6])) + JAX_AFTER
    seen = _probe(code, env={FRACTION_OLD: "0.9"})
    name, other = fraction_names()
    assert seen["framework"] == "jax" and not seen["imported_before"]
    assert seen["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert seen["env"][name] == "0.2500" and seen["env"][other] is None
    assert seen["options"] == {"preallocate": False, "memory_fraction": 0.25}
    framework, applied, note, peaks = seen["record"]
    assert (framework, applied, peaks) == ("jax", False, None) and "CUDA plugin" in note


TORCH_AFTER = """
import torch
session.after_import(set())
torch.ones(3).sum()
record = session.record()
seen["record"] = [record.framework, record.cap_applied, record.cap_note, record.peaks]
seen["cuda"] = torch.cuda.is_initialized()
print(json.dumps(seen))
"""


@pytest.mark.slow
@needs_torch
def test_torch_gets_expandable_segments_before_the_import_and_no_cap_on_cpu() -> None:
    code = _before_import("tiny_torch_trial", "torch", list(CLEARED[1:3])) + TORCH_AFTER
    seen = _probe(code)
    assert seen["framework"] == "torch" and not seen["imported_before"]
    assert seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert seen["record"] == ["torch", False, "PyTorch is built without CUDA", None]
    assert seen["cuda"] is False


def test_an_allocator_setting_of_the_users_is_left_alone() -> None:
    env = {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync", "XLA_PYTHON_CLIENT_PREALLOCATE": "1"}
    assert adapter("torch").environment(SHARE, env) == {}
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in adapter("jax").environment(SHARE, env)
    assert adapter("tensorflow").environment(None, {"TF_FORCE_GPU_ALLOW_GROWTH": "false"}) == {
        "TF_CPP_MIN_LOG_LEVEL": "2"
    }


def test_tensorflow_grows_its_memory_and_the_fraction_never_exceeds_the_budget() -> None:
    assert adapter("tensorflow").environment(SHARE, {})["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    third = GpuShare(("0",), budget_bytes=GIB, total_bytes=3 * GIB)
    assert adapter("jax").environment(third, {})[fraction_names()[0]] == "0.3333"
    assert fraction_names()[1] not in {
        k for k, v in adapter("jax").environment(third, {}).items() if v
    }


def test_without_a_share_the_environment_is_set_and_nothing_is_capped() -> None:
    environ: dict[str, str] = {}
    session = FrameworkSession("jax", None, environ)
    session.before_import(None, "train")
    session.after_import(set())
    record = session.record()
    assert environ == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert (record.framework, record.cap_applied, record.cap_note) == ("jax", False, NO_SHARE)
    assert record.budget_bytes is None and record.peaks is None


@pytest.mark.parametrize(
    ("source", "framework"),
    [
        ("import torch\nimport numpy", "torch"),
        ("import numpy as np\nfrom jax import numpy as jnp", "jax"),
        ("import lightning.pytorch as pl", "torch"),
        ("from trialq import keras\nimport tensorflow", "tensorflow"),
        ("import flax.linen as nn", "jax"),
        ("def train(p):\n    import torch\n    return 1.0", "torch"),
        ("import numpy\nimport sklearn", None),
        ("import torch_helpers_of_mine", None),
        ("this is not python", None),
    ],
)
def test_auto_finds_the_framework_in_the_entrypoints_source(
    source: str, framework: str | None
) -> None:
    assert framework_in_source(source) == framework


def test_keras_means_the_backend_keras_runs_on() -> None:
    assert framework_in_source("import keras") == "tensorflow"
    assert framework_in_source("import keras", keras_backend="jax") == "jax"
    assert framework_in_source("from keras import layers", keras_backend="torch") == "torch"


def test_auto_falls_back_to_what_the_import_loaded() -> None:
    """Only frameworks count, and only one: two frameworks loaded are no answer."""
    modules = set(sys.modules)
    assert detect.loaded(modules, {}) is None or detect.loaded(modules, {}) in PRELOAD
    assert detect._only({"numpy", "torch", "torch.nn", "sklearn"}, {}) == "torch"
    assert detect._only({"jax", "torch"}, {}) is None
    assert detect._only({"trialq.keras"}, {}) == "tensorflow"


RUN_TRIAL = """
import json, sys
from trial_requests import trial_request
from trialq.gpu.device import FakeDevice
from trialq.trial.runner import run_trial
request = trial_request(entrypoint=ENTRY, params=PARAMS, framework=CHOICE, timeout_s=120)
allowed = ("tiny_torch_trial", "tiny_jax_trial", "tiny_helper_trial")
result = run_trial(request, channel=None, device=FakeDevice(), allowed_modules=allowed)
print(json.dumps(result.model_dump(mode="json")))
"""


def _run_trial(entry: str, choice: str = "auto", **params: Any) -> dict[str, Any]:
    names = f"ENTRY = {entry!r}\nPARAMS = {params!r}\nCHOICE = {choice!r}\n"
    result: dict[str, Any] = _probe(names + RUN_TRIAL)
    return result


@pytest.mark.slow
@needs_torch
def test_a_tiny_torch_trial_records_torch_and_no_gpu_figures() -> None:
    result = _run_trial("tiny_torch_trial:step")
    assert result["outcome"] == "ok", result["error"]
    assert result["framework"] == "torch" and result["metrics"]["alloc_conf_set"] == 1.0
    assert result["gpu_peaks_bytes"] is None and result["gpu_peak_bytes"] is None
    assert result["gpu_cap_applied"] is False and result["gpu_budget_bytes"] is None


@pytest.mark.slow
@needs_jax
def test_a_tiny_jax_trial_records_jax() -> None:
    result = _run_trial("tiny_jax_trial:step")
    assert result["outcome"] == "ok", result["error"]
    assert result["framework"] == "jax" and result["metrics"]["preallocate_off"] == 1.0
    assert result["gpu_peaks_bytes"] is None and result["gpu_cap_applied"] is False


@pytest.mark.slow
@needs_torch
def test_a_framework_reached_through_another_module_is_found_after_the_import() -> None:
    result = _run_trial("tiny_helper_trial:step")
    assert result["outcome"] == "ok", result["error"]
    assert result["framework"] == "torch"


@pytest.mark.slow
@needs_torch
@needs_jax
@pytest.mark.parametrize("entry", ["tiny_torch_trial:step", "tiny_jax_trial:step"])
def test_an_oom_reraised_as_another_error_ends_the_trial_as_oom(entry: str) -> None:
    result = _run_trial(entry, oom=True)
    assert result["outcome"] == "oom", result["error"]


@pytest.mark.slow
@needs_torch
def test_the_spec_names_the_framework_over_what_the_source_imports() -> None:
    result = _run_trial("tiny_torch_trial:step", choice="jax")
    assert result["outcome"] == "ok" and result["framework"] == "jax"
