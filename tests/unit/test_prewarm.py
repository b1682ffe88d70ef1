"""The preload choice and the device guard, without a worker."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from trialq.errors import PreloadError
from trialq.trial.frameworks.jax import BRIDGE_MODULE
from trialq.worker import prewarm
from trialq.worker.prewarm import TF_CONTEXT_MODULE, device_in_use, preload_modules


@pytest.fixture(autouse=True)
def _no_jax_started_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """These checks read this test process's own state: a JAX another test ran in the same
    process (xdist runs many files in one) would read as a device in use. The JAX guard's
    own tests run in processes of their own."""
    monkeypatch.delitem(sys.modules, BRIDGE_MODULE, raising=False)


def test_preload_choice_names_modules_or_auto_or_nothing() -> None:
    assert preload_modules("none") == ()
    assert preload_modules("") == ()
    assert preload_modules(" tensorflow , mylib.models ") == ("tensorflow", "mylib.models")
    assert set(preload_modules("auto")) <= {"tensorflow", "torch", "torch._dynamo", "jax"}
    with pytest.raises(PreloadError, match="stand alone"):
        preload_modules("auto,numpy")


def test_an_open_cuda_driver_file_means_the_device_is_in_use(tmp_path: Path) -> None:
    (tmp_path / "3").symlink_to("/dev/null")
    assert device_in_use(tmp_path) is None
    (tmp_path / "9").symlink_to("/dev/nvidia-uvm")
    reason = device_in_use(tmp_path)
    assert reason is not None and "CUDA" in reason


GUARD_PROBE = """
import importlib.util
import json
from trialq.worker.prewarm import device_in_use
seen = {"before": device_in_use()}
import tensorflow as tf
seen["imported"] = device_in_use()
tf.random.set_seed(0)
seen["seeded"] = device_in_use()
tf.config.list_physical_devices("GPU")
seen["listed"] = device_in_use()
tf.constant(1.0) + 1.0
seen["op"] = device_in_use()
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_the_guard_tells_an_imported_tensorflow_from_an_initialised_one() -> None:
    pytest.importorskip("tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    probe = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GUARD_PROBE)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["before"] is None
    assert seen["imported"] is None, "importing TensorFlow must stay allowed"
    assert seen["seeded"] is None, "a seed makes the context object, not the runtime"
    assert "listed the physical devices" in seen["listed"]
    assert "runtime was initialised" in seen["op"]


class FakeContextWithoutAttributes:
    """A fake TensorFlow eager context whose private attributes were renamed (`_handle`,
    `_devices`), as an upgrade could: the guard must not read that as "nothing initialised"."""

    def __init__(self) -> None:
        self._handle = object()  # an op ran; the guard cannot see it
        self._devices = ["/physical_device:GPU:0"]


class FakeContextThatRaises:
    """A fake TensorFlow eager context whose attributes raise when read."""

    @property
    def _context_handle(self) -> object:
        raise RuntimeError("the fake context refuses to be read")

    _physical_devices = None


def _fake_context_module(context: object) -> SimpleNamespace:
    """A fake `tensorflow.python.eager.context` whose `context_safe()` returns `context`."""
    return SimpleNamespace(context_safe=lambda: context)


@pytest.mark.parametrize(
    "context", [FakeContextWithoutAttributes(), FakeContextThatRaises()], ids=type
)
def test_a_tensorflow_context_the_guard_cannot_read_counts_as_initialised(
    context: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, TF_CONTEXT_MODULE, _fake_context_module(context))
    reason = device_in_use(tmp_path)
    assert reason is not None and "cannot be checked" in reason, reason


def test_a_fake_context_with_the_attributes_unset_is_nothing_initialised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same fakes' counterpart: the attributes there, and None, read as nothing yet."""
    context = SimpleNamespace(_context_handle=None, _physical_devices=None)
    monkeypatch.setitem(sys.modules, TF_CONTEXT_MODULE, _fake_context_module(context))
    assert device_in_use(tmp_path) is None
    monkeypatch.setitem(sys.modules, TF_CONTEXT_MODULE, _fake_context_module(None))
    assert device_in_use(tmp_path) is None


def test_a_tensorflow_without_the_context_module_counts_as_initialised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", ModuleType("tensorflow"))  # a fake
    monkeypatch.delitem(sys.modules, TF_CONTEXT_MODULE, raising=False)
    reason = device_in_use(tmp_path)
    assert reason is not None and "cannot be checked" in reason, reason
    monkeypatch.setitem(sys.modules, TF_CONTEXT_MODULE, SimpleNamespace())  # no context_safe
    reason = device_in_use(tmp_path)
    assert reason is not None and "cannot be checked" in reason, reason


FAKE_CONTEXT_SOURCE = '''
"""A fake tensorflow/python/eager/context.py: TensorFlow's eager context with its private
attributes renamed, as an upgrade could rename them."""


class Context:
    def __init__(self):
        self._handle = None
        self._devices = None


def context_safe():
    return None
'''

PRELOAD_PROBE = """
import sys
from trialq.worker.prewarm import preload
preload(("tensorflow",))
preload(("tensorflow",))  # `trialq worker` preloads, then Celery's worker_init again
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


def test_the_worker_preloads_nothing_where_it_cannot_check_tensorflow(tmp_path: Path) -> None:
    """A fake TensorFlow package whose context lacks the attributes the guard reads: preload
    imports nothing, says so in one line, and the worker goes on."""
    package = tmp_path / "tensorflow"
    (package / "python" / "eager").mkdir(parents=True)
    (package / "__init__.py").write_text("raise AssertionError('the fake TensorFlow was imported')")
    (package / "python" / "eager" / "context.py").write_text(FAKE_CONTEXT_SOURCE)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    probe = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRELOAD_PROBE)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "tensorflow imported: False"
    warning = probe.stderr.strip().splitlines()
    assert len(warning) == 1, probe.stderr
    assert "not preloading tensorflow" in warning[0]
    assert "Context._context_handle" in warning[0] and "Context._physical_devices" in warning[0]


def test_auto_preloads_the_one_framework_installed_and_torch_and_jax_among_several(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never TensorFlow for a PyTorch study because TensorFlow happens to be installed."""
    import importlib.util as util

    from trialq.worker import prewarm

    installed = {"torch"}
    monkeypatch.setattr(util, "find_spec", lambda name: object() if name in installed else None)
    assert preload_modules("auto") == ("torch", "torch._dynamo")
    assert prewarm.auto_left_out() == ()
    installed = {"torch", "tensorflow"}
    assert preload_modules("auto") == ("torch", "torch._dynamo")
    installed = {"torch", "jax", "tensorflow"}
    assert preload_modules("auto") == ("torch", "torch._dynamo", "jax")
    (left_out,) = prewarm.auto_left_out()
    assert left_out.startswith("tensorflow (not beside another framework")
    installed = {"tensorflow", "jax"}
    assert preload_modules("auto") == ("jax",)
    installed = set()
    assert preload_modules("auto") == ()
    assert prewarm.PRELOAD["jax"] == ("jax",)


JAX_PARENT = """
import jax
from trialq.worker.prewarm import device_in_use
print("imported:", device_in_use())
jax.numpy.ones(2).block_until_ready()
print("ran:", device_in_use())
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="no JAX")
def test_the_guard_tells_an_imported_jax_from_one_whose_backends_started() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", JAX_PARENT], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    imported, ran = probe.stdout.strip().splitlines()[-2:]
    assert imported == "imported: None"
    assert ran == "ran: JAX initialised its backends (an op ran)"


def test_the_guard_asks_pytorch_whether_cuda_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fake torch whose CUDA started (no GPU here to start a real one)."""
    fake = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert device_in_use(tmp_path) == "PyTorch initialised CUDA"


@pytest.mark.parametrize(
    ("framework", "source", "preload"),
    [
        ("auto", "import torch\ndef train(params):\n    return torch.ones(1)\n",
         "torch,torch._dynamo"),
        ("auto", "import jax.numpy as jnp\ndef train(params):\n    return jnp.ones(1)\n", "jax"),
        ("auto", "import math\ndef train(params):\n    return math.pi\n", None),
        ("auto", "import torch\ndef train(params):\n    return 1.0\ndef f():\n    torch\n", None),
        ("tensorflow", "import torch\ndef train(params):\n    return torch.ones(1)\n",
         "tensorflow"),
    ],
)  # fmt: skip
def test_local_workers_preload_the_specs_framework(
    framework: str, source: str, preload: str | None, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`--local` knows the study: its workers preload its framework, read from the spec or
    from what the entrypoint function uses (never imported in the driver): a framework only
    another function of its module uses is not the study's."""
    from trialq.local import local_preload
    from trialq.settings import Settings
    from trialq.spec import load_spec

    if preload is not None and importlib.util.find_spec(preload.split(".")[0]) is None:
        pytest.skip(f"{preload.split('.')[0]} is not installed: it is never preloaded then")
    monkeypatch.delenv("TRIALQ_PRELOAD", raising=False)
    (tmp_path / "model.py").write_text(source)
    (tmp_path / "spec.toml").write_text(
        '[study]\nname = "s"\nn_trials = 1\n[trial]\nentrypoint = "model.py:train"\n'
        f'framework = "{framework}"\n[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n'
    )
    expected = {
        "TRIALQ_PRELOAD": preload or "none",
        "TRIALQ_PRELOAD_FROM": str(tmp_path.resolve() / "model.py"),
    }
    assert local_preload(load_spec(tmp_path / "spec.toml"), Settings()) == expected
    monkeypatch.setenv("TRIALQ_PRELOAD", "none")
    assert local_preload(load_spec(tmp_path / "spec.toml"), Settings()) == {}
    monkeypatch.setenv("TRIALQ_PRELOAD", "auto")  # said, even as the default: the workers'
    assert local_preload(load_spec(tmp_path / "spec.toml"), Settings()) == {}


FAKEFLOW = "fakeflow_not_installed"
"""A framework named in a fake registry entry, whose package is installed nowhere."""


def _fake_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    from trialq.wire import frameworks

    monkeypatch.setitem(frameworks.REVEALED_BY, FAKEFLOW, FAKEFLOW)  # type: ignore[index]
    monkeypatch.setitem(frameworks.PRELOAD, FAKEFLOW, (FAKEFLOW,))  # type: ignore[index]


def test_local_workers_never_preload_a_framework_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trialq.local import local_preload
    from trialq.settings import Settings
    from trialq.spec import load_spec

    _fake_framework(monkeypatch)
    monkeypatch.delenv("TRIALQ_PRELOAD", raising=False)
    (tmp_path / "model.py").write_text(f"def train(params):\n    import {FAKEFLOW}\n")
    (tmp_path / "spec.toml").write_text(
        '[study]\nname = "s"\nn_trials = 1\n[trial]\nentrypoint = "model.py:train"\n'
        '[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n'
    )
    assert local_preload(load_spec(tmp_path / "spec.toml"), Settings())["TRIALQ_PRELOAD"] == "none"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and FAKEFLOW in lines[0] and "not installed" in lines[0]


def test_a_worker_preloads_no_framework_that_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One warning line; the rest preloads (a framework's module that is there)."""
    monkeypatch.setattr(prewarm, "NAMES", (*prewarm.NAMES, FAKEFLOW))
    with caplog.at_level("WARNING", logger="trialq.prewarm"):
        kept = prewarm._installed_only((FAKEFLOW, f"{FAKEFLOW}.sub", "json"))
    assert kept == ("json",)
    assert [r.getMessage() for r in caplog.records] == [
        f"--preload: {FAKEFLOW}, {FAKEFLOW}.sub not installed here, so not preloaded"
    ]


ENTRYPOINT_MODULE = """
from __future__ import annotations
import os
import json as jsonlib
from typing import TYPE_CHECKING
import sklearn.ensemble
from sklearn.model_selection import cross_val_score
import helpers
import not_installed_anywhere_xyz
try:
    import torch.nn as nn
except ImportError:
    nn = None
if TYPE_CHECKING:
    import pandas
import trialq

def train(params, trial):
    import jax  # inside the function: imported by the trial, not preloaded
    return 1.0
"""


def test_an_entrypoints_top_level_imports_are_preloaded_and_what_is_left_out_says_why(
    tmp_path: Path,
) -> None:
    from trialq.wire.entrypoint_uses import top_level_imports
    from trialq.worker.preload_from import preload_from

    (tmp_path / "model.py").write_text(ENTRYPOINT_MODULE)
    (tmp_path / "helpers.py").write_text("import torch\n")

    assert top_level_imports(ENTRYPOINT_MODULE) == [
        "__future__", "os", "json", "typing", "sklearn.ensemble", "sklearn.model_selection",
        "helpers", "not_installed_anywhere_xyz", "torch.nn", "trialq",
    ]  # fmt: skip
    found = preload_from(str(tmp_path / "model.py"))
    expected = ["sklearn.ensemble", "sklearn.model_selection", "torch", "torch._dynamo", "torch.nn"]
    installed = [m for m in expected if importlib.util.find_spec(m.split(".")[0]) is not None]
    assert list(found.modules) == installed
    assert found.left_out[:2] == (
        "helpers (your own module: not run in the worker's parent)",
        "not_installed_anywhere_xyz (not installed here)",
    )
    assert preload_from("no_such_module_here_xyz").left_out == (
        "no_such_module_here_xyz (its source was not found here)",
    )


OPTIONAL_PROBE = """
import sys
from trialq.worker.prewarm import preload
done = preload(("json",), ("csv", "no_such_module_xyz"), ("helpers (your own module)",))
print(done.line())
print("csv" in sys.modules)
"""


def test_an_optional_module_that_fails_to_import_is_left_out_not_fatal() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", OPTIONAL_PROBE], capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    line, imported = probe.stdout.strip().splitlines()[-2:]
    assert line == (
        "json, csv; left out: helpers (your own module), no_such_module_xyz (import failed: "
        "ModuleNotFoundError: No module named 'no_such_module_xyz')"
    )
    assert imported == "True"
