"""The GPU figures the docs state, held to the records they cite.

A figure cites its record as a markdown link whose target is the record file and whose
title is the key it reads, e.g. `[4,008](benchmarks/gpu_h200_2026-11-28.json
"throughput/2/trials_per_hour_per_gpu")`. The title is a small expression:

    TERM [(/ | -) TERM] [in MiB]      TERM: a/b/0/c  or  FN(a/b/c), FN of first, last, each, len

`each` is the one value every item of a list has (a list of several values fails). A number
shown with d decimals must equal the value rounded to d; a text must be the list's items
joined by ", ", or lie within a string value. Pure: text and records in, mismatches out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
CITATION = re.compile(r"\[([^\]]+)\]\(([\w./-]*gpu_[\w.-]+\.json) \"([^\"]+)\"\)")
TERM = r"(?:(first|last|each|len)\(([\w/.-]+)\)|([\w/.-]+))"
EXPRESSION = re.compile(rf"^{TERM}(?:\s*([/-])\s*{TERM})?(?:\s+in\s+(MiB))?$")
NUMBER = re.compile(r"^-?[\d,]*\d(?:\.(\d+))?$")
ALLOWED_DIGITS = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\bH[12]00\b")
"""Digits a section may show uncited: dates and the machines' names."""


@dataclass(frozen=True)
class Citation:
    shown: str
    record: str
    key: str


def section(markdown: str, heading: str) -> str:
    """The text under `## heading` (or `### heading`) up to the next heading of its level."""
    lines = markdown.splitlines()
    level_and_title = re.compile(r"^(#+)\s+(.*?)\s*$")
    for start, line in enumerate(lines):
        match = level_and_title.match(line)
        if match and match.group(2) == heading:
            level = len(match.group(1))
            body = []
            for later in lines[start + 1 :]:
                found = level_and_title.match(later)
                if found and len(found.group(1)) <= level:
                    break
                body.append(later)
            return "\n".join(body)
    raise ValueError(f"no heading {heading!r}")


def citations(text: str) -> list[Citation]:
    return [Citation(m.group(1), m.group(2), m.group(3)) for m in CITATION.finditer(text)]


def uncited_numbers(text: str) -> list[str]:
    """Words with digits outside citations, dates and machine names: figures with no record."""
    bare = CITATION.sub(" ", text)
    bare = re.sub(r"\]\([^)]*\)", "] ", bare)  # other links: their targets
    bare = ALLOWED_DIGITS.sub(" ", bare)
    return [word for word in re.findall(r"\S*\d\S*", bare)]


def mismatches(text: str, base: Path, load: Callable[[Path], Any] | None = None) -> list[str]:
    """Every citation in `text` whose shown figure differs from its record (paths from `base`)."""
    read = load or (lambda path: json.loads(path.read_text(encoding="utf-8")))
    wrong = []
    for citation in citations(text):
        try:
            value = evaluate(citation.key, read(base / citation.record))
        except (KeyError, IndexError, ValueError, TypeError, OSError) as error:
            wrong.append(f"{citation.record} {citation.key!r}: {error}")
            continue
        if not agrees(citation.shown, value):
            wrong.append(
                f"{citation.record} {citation.key!r}: shown {citation.shown!r}, record {value!r}"
            )
    return wrong


def evaluate(expression: str, record: Any) -> Any:
    match = EXPRESSION.match(expression.strip())
    if match is None:
        raise ValueError(f"not a citation key: {expression!r}")
    fn_a, path_a, bare_a, operator, fn_b, path_b, bare_b, unit = match.groups()
    value = _term(record, fn_a, path_a or bare_a)
    if operator is not None:
        other = _term(record, fn_b, path_b or bare_b)
        value = value / other if operator == "/" else value - other
    return value / MiB if unit == "MiB" else value


def _term(record: Any, function: str | None, path: str) -> Any:
    value = record
    for part in path.split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    if function == "first":
        return value[0]
    if function == "last":
        return value[-1]
    if function == "len":
        return len(value)
    if function == "each":
        if len(set(value)) != 1:
            raise ValueError(f"{path} holds {len(set(value))} different values, not one")
        return value[0]
    return value


def agrees(shown: str, value: Any) -> bool:
    number = NUMBER.match(shown.strip())
    if number and isinstance(value, int | float) and not isinstance(value, bool):
        decimals = len(number.group(1) or "")
        return round(float(value), decimals) == float(shown.replace(",", ""))
    if isinstance(value, list):
        return shown == ", ".join(str(item) for item in value)
    if isinstance(value, str):
        return shown in value
    return shown == str(value)
