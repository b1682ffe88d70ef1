"""The preload choice and the device guard, without a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trialq.errors import PreloadError
from trialq.trial.prewarm import device_in_use, preload_modules


def test_preload_choice_names_modules_or_auto_or_nothing() -> None:
    assert preload_modules("none") == ()
    assert preload_modules("") == ()
    assert preload_modules(" tensorflow , mylib.models ") == ("tensorflow", "mylib.models")
    assert preload_modules("auto") in {("tensorflow",), ()}
    with pytest.raises(PreloadError, match="stand alone"):
        preload_modules("auto,numpy")


def test_an_open_cuda_driver_file_means_the_device_is_in_use(tmp_path: Path) -> None:
    (tmp_path / "3").symlink_to("/dev/null")
    assert device_in_use(tmp_path) is None
    (tmp_path / "9").symlink_to("/dev/nvidia-uvm")
    reason = device_in_use(tmp_path)
    assert reason is not None and "CUDA" in reason


GUARD_PROBE = """
import json
from trialq.trial.prewarm import device_in_use
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
