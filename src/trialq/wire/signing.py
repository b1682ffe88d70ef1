"""Results and reports the driver trusts only from workers that hold the deployment's secret.

Anyone who can write to the broker can write trialq's keys: a `trialq:result:<task id>`
telling a queued trial COMPLETE with a value of their choosing, a report that steers the
pruner. With a secret (`TRIALQ_RESULT_SECRET_FILE`, the same on the driver
and every worker), a trial process signs what it writes: HMAC-SHA256 over a canonical JSON of
the result and the task id it answers (the result names its study, trial and attempt), so a
signed result copied onto another task fails as surely as a forged one; a report is signed
with its attempt's address, step and value. The driver sets aside what does not verify.

A result carries its signature as one more field (`SIGNATURE_FIELD`): a reader without a
secret (an older driver) ignores it, as it ignores any field it does not know.

The driver signs each task the same way (`sign_task`): the whole request as sent (params,
entrypoint, study, number, attempt and every other field) with its task id, so a worker runs
nothing a broker writer rewrote, moved onto another task id or made up (`task_refusal`).
`sign` and `refusal` sign any canonical JSON payload under a kind of its own, for what else
crosses the broker and must come from the driver or a worker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

SIGNATURE_FIELD = "signature"
"""The field of a stored result that holds its signature."""

REPORT_SIGNATURE_FIELD = "sig"
"""The field of a report's stream entry that holds its signature."""

MIN_SECRET_CHARS = 16
"""A shorter secret is refused: it could be guessed from one signed result."""

UNSIGNED = "unsigned: its worker holds no result secret, or someone else wrote it"
MISMATCH = "its signature does not verify: its worker holds another secret, or it was forged"


TASK_UNSIGNED = "unsigned: its driver holds no result secret, or someone else wrote it"
TASK_MISMATCH = (
    "its signature does not verify: rewritten on the broker, moved onto another task, "
    "or its driver holds another secret"
)


class Seal:
    """Signs tasks, results and reports with the deployment's secret, and checks them."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    def sign(self, kind: str, payload: Any) -> str:
        """The signature of a JSON `payload` (keys sorted, no NaN) of one `kind`: a kind of
        its own keeps a payload signed as one thing from verifying as another."""
        return self._digest([kind, payload])

    def refusal(self, kind: str, payload: Any, signature: object) -> str | None:
        """Why `signature` is not `payload`'s of `kind` under this secret, or None."""
        if signature is None:
            return UNSIGNED
        try:
            expected = self.sign(kind, payload)
        except ValueError:  # NaN or infinity: never what trialq signs
            return MISMATCH
        return None if _same(signature, expected) else MISMATCH

    def sign_task(self, task_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """The request JSON `request` as sent for `task_id`: its fields and the signature of
        all of them but the signature itself."""
        body = {k: v for k, v in request.items() if k != SIGNATURE_FIELD}
        return {**body, SIGNATURE_FIELD: self.sign("task", [task_id, body])}

    def task_refusal(self, task_id: str, request: dict[str, Any]) -> str | None:
        """Why the request JSON a worker took for `task_id` is not to be run, or None: it is
        unsigned, or its signature is not its driver's for this task and these fields."""
        body = {k: v for k, v in request.items() if k != SIGNATURE_FIELD}
        refusal = self.refusal("task", [task_id, body], request.get(SIGNATURE_FIELD))
        return {UNSIGNED: TASK_UNSIGNED, MISMATCH: TASK_MISMATCH}.get(refusal or "", refusal)

    def signed(self, task_id: str, message: str) -> str:
        """The result JSON `message`, signed for `task_id`."""
        body = json.loads(message)
        body.pop(SIGNATURE_FIELD, None)
        body[SIGNATURE_FIELD] = self._result_digest(task_id, body)
        return json.dumps(body, separators=(",", ":"))

    def result_refusal(self, task_id: str, body: dict[str, Any]) -> str | None:
        """Why the result `body` read for `task_id` is not to be trusted, or None."""
        signature = body.get(SIGNATURE_FIELD)
        if signature is None:
            return UNSIGNED
        unsigned = {k: v for k, v in body.items() if k != SIGNATURE_FIELD}
        try:
            expected = self._result_digest(task_id, unsigned)
        except ValueError:  # NaN or infinity as a JSON number: never what a worker writes
            return MISMATCH
        return None if _same(signature, expected) else MISMATCH

    def report_signature(self, address: tuple[str, int, int], step: int, value: str) -> str:
        """The signature of one report: the attempt's (study, number, attempt), its step and
        its value as written (`repr` of the float)."""
        return self._digest(["report", *address, step, value])

    def report_refusal(
        self, address: tuple[str, int, int], step: int, value: str, signature: str | None
    ) -> str | None:
        """Why a report read back is not to be trusted, or None."""
        if signature is None:
            return UNSIGNED
        return None if _same(signature, self.report_signature(address, step, value)) else MISMATCH

    def _result_digest(self, task_id: str, body: dict[str, Any]) -> str:
        return self._digest(["result", task_id, body])

    def _digest(self, parts: list[Any]) -> str:
        """HMAC-SHA256 of the parts as canonical JSON (keys sorted, no spaces, no NaN)."""
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()


def _same(given: object, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def seal_of(secret: str | None) -> Seal | None:
    """The seal of a configured secret; None without one (results are not authenticated)."""
    return Seal(secret) if secret else None


def stored_result_refusal(seal: Seal | None, task_id: str, stored: object) -> str | None:
    """Why a result read back for `task_id` (JSON text, or the object Celery decoded) is not
    to be trusted, or None; without a seal only its shape is checked."""
    body = _json_object(stored)
    if body is None:
        return "not a JSON object"
    return None if seal is None else seal.result_refusal(task_id, body)


def _json_object(stored: object) -> dict[str, Any] | None:
    if isinstance(stored, bytes | str):
        try:
            stored = json.loads(stored)
        except ValueError:
            return None
    return stored if isinstance(stored, dict) else None
