"""A trial function carried to the workers as code: one defined in `__main__` (a script, a
notebook cell), which no worker can import by name.

The driver serializes it with cloudpickle (made for functions: a notebook function is
pickled by value, with the globals it uses), and the dispatcher signs it with the cluster's
secret (`trialq.wire.signing`). A worker runs it only where it holds that secret and accepts
code (`TRIALQ_ACCEPT_CODE`: on for `--local`'s workers, opt-in for a cluster's), and only
when the signature verifies: unpickling runs code, so an unsigned or wrongly signed function
is refused in one line and nothing of it is loaded. The rest of the message stays JSON; the
code is one base64 field of it.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

from trialq.errors import EntrypointRefused
from trialq.wire.signing import Seal

CARRIED_MODULE = "__main__"
"""The entrypoint's module for a carried function (`__main__:objective`): named, not
imported."""


def packed(function: Callable[..., Any]) -> str:
    """The function as cloudpickle's bytes, in base64."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(function)).decode()


def source_hash(function: Callable[..., Any]) -> str:
    """The first 12 hex digits of the SHA-256 of the function's source (of its bytecode
    where its source cannot be read): what tells one notebook `objective` from another."""
    try:
        text = inspect.getsource(function).encode()
    except (OSError, TypeError):
        text = getattr(getattr(function, "__code__", None), "co_code", repr(function).encode())
    return hashlib.sha256(text).hexdigest()[:12]


def digest(payload: str) -> str:
    """What identifies the carried code (its bytes' SHA-256), and what its signature binds."""
    return hashlib.sha256(payload.encode()).hexdigest()


def signature(seal: Seal, payload: str) -> str:
    """The signature a worker checks before it unpickles `payload`."""
    return seal.sign("code", digest(payload))


def loaded(
    payload: str, signed: str | None, seal: Seal | None, accepts: bool
) -> Callable[..., Any]:
    """The carried function, unpickled only once it is known to be the driver's:
    `EntrypointRefused` (one line) where this worker takes no code, holds no secret, or the
    signature is missing or wrong."""
    if not accepts:
        raise EntrypointRefused(
            "the trial function is carried as code (defined in __main__ or a notebook) and "
            "this worker does not accept code: start it with TRIALQ_ACCEPT_CODE=1"
        )
    if seal is None:
        raise EntrypointRefused(
            "the trial function is carried as code and this worker holds no secret to check "
            "its signature: set TRIALQ_RESULT_SECRET_FILE"
        )
    refusal = seal.refusal("code", digest(payload), signed)
    if refusal is not None:
        raise EntrypointRefused(f"the carried trial function was refused, not run: {refusal}")
    import cloudpickle

    function = cloudpickle.loads(base64.b64decode(payload))
    if not callable(function):
        raise EntrypointRefused("the carried trial function is not callable")
    return function  # type: ignore[no-any-return]
