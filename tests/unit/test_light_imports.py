"""`import trialq` and `submit-study --help` stay light: no TensorFlow, no Celery, no GPU."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import trialq
from trialq.cli import submit_study_main
try:
    submit_study_main(["--help"])
except SystemExit:
    pass
heavy = [m for m in ("tensorflow", "keras", "celery", "optuna") if m in sys.modules]
print("heavy=" + ",".join(heavy))
"""


def test_import_and_help_load_no_heavy_framework() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "heavy="
