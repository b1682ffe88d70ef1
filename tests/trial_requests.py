"""One way for tests to build a `TrialRequest`: defaults for every field a test does not care
about, any field overridable by keyword."""

from __future__ import annotations

from typing import Any

from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import TrialRequest

DEFAULTS: dict[str, Any] = {
    "study": "s",
    "number": 0,
    "attempt": 1,
    "params": {"x": 1.0},
    "entrypoint": "trials:quadratic",
    "timeout_s": 60,
}


def trial_request(**fields: Any) -> TrialRequest:
    """`DEFAULTS` with `fields` over them; an entrypoint may be given as "module:function"."""
    values = {**DEFAULTS, **fields}
    if isinstance(values["entrypoint"], str):
        values["entrypoint"] = Entrypoint.parse(values["entrypoint"])
    return TrialRequest(**values)
