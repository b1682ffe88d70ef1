"""Reads back a W&B offline run's `.wandb` file: the records W&B writes in LevelDB's log
format (a 7-byte header, then 32 KiB blocks of records, each a CRC, a length, a type and a
slice of one protobuf `Record`). wandb 0.31 ships no Python reader of its own."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = b":W&B\xe1\xbe\x00"
BLOCK = 32768
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What a test reads of one run: its id, group and config, its history, its summary."""

    run_id: str = ""
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    """The run's exit record, the last W&B writes; None until it is written."""


def read_offline_run(path: Path, timeout_s: float = 60) -> OfflineRun:
    """The run in `path`, once W&B's service wrote it: `run.finish()` returns before the
    service has flushed the file (seen: the header alone right after it)."""
    from waiting import wait_until

    wait_until(lambda: _read(path).exit_code is not None, timeout_s,
               f"W&B to write {path.name}", 0.1)  # fmt: skip
    return _read(path)


def _read(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2

    run = OfflineRun()
    for data in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.group = record.run.run_id, record.run.run_group
            run.config |= _items(record.run.config.update)
        elif kind == "config":
            run.config |= _items(record.config.update)
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary |= _items(record.summary.update)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _items(items: Any) -> dict[str, Any]:
    """Items keyed by `key`, or by `nested_key` joined with `/` (what W&B's core writes)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _records(raw: bytes) -> list[bytes]:
    assert raw.startswith(HEADER), "not a W&B datastore file"
    records, pending, offset = [], b"", len(HEADER)
    while offset + RECORD_HEADER <= len(raw):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < RECORD_HEADER:  # the block's tail is padding
            offset += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", raw[offset : offset + RECORD_HEADER])
        data = raw[offset + RECORD_HEADER : offset + RECORD_HEADER + length]
        offset += RECORD_HEADER + length
        if kind == FULL:
            records.append(data)
        elif kind in (FIRST, MIDDLE):
            pending = (pending if kind == MIDDLE else b"") + data
        elif kind == LAST:
            records.append(pending + data)
            pending = b""
        else:
            break
    return records
