"""Routing by GPU: the queue a trial goes to, and the queues a worker's slots consume.

A trial that says what it needs (`[trial] gpus`, `[trial] gpu_memory_mb`) is sent to a queue
of its own class beside its spec's queue, `<queue>@<gpus>x<GiB>g`, its memory rounded up to a
power of two GiB (`gpu@1x16g`; `gpu@2x` for two GPUs of any size). A worker consumes its
queue and every class its slots hold: a slot of `gpus_per_slot` GPUs with a budget of B GiB
on each consumes `<queue>@<gpus_per_slot>x<c>g` for every power of two c <= B. So a slot
smaller than a trial's need never takes it: Celery never hands the worker that queue's
messages. A trial that needs one GPU of any size stays on `<queue>` itself, as before.
`@` is no character of a spec's queue name, so a class queue never collides with one.
"""

from __future__ import annotations

MIB = 2**20
GIB = 2**30
SEPARATOR = "@"


def memory_class_gib(memory_mb: int) -> int:
    """The smallest power of two GiB that holds `memory_mb` MiB (0 for no need stated)."""
    if memory_mb <= 0:
        return 0
    gib = 1
    while gib * 1024 < memory_mb:
        gib *= 2
    return gib


def trial_queue(queue: str, gpus: int = 1, gpu_memory_mb: int = 0) -> str:
    """The queue a trial of `gpus` GPUs with `gpu_memory_mb` on each is sent to."""
    size = memory_class_gib(gpu_memory_mb)
    if gpus == 1 and size == 0:
        return queue
    return f"{queue}{SEPARATOR}{gpus}x" + (f"{size}g" if size else "")


def slot_queues(queue: str, gpus_per_slot: int, budget_bytes: int | None) -> tuple[str, ...]:
    """Every queue a worker whose slots span `gpus_per_slot` GPUs, with `budget_bytes` on
    each (None: no cap, the whole device), consumes: its own and each class it fits."""
    own = trial_queue(queue, gpus_per_slot)
    classes = []
    size = 1
    while budget_bytes is not None and size * GIB <= budget_bytes:
        classes.append(f"{queue}{SEPARATOR}{gpus_per_slot}x{size}g")
        size *= 2
    return (own, *classes)


def base_queue(queue: str) -> str:
    """The spec's queue a class queue belongs to (`gpu@1x16g` -> `gpu`)."""
    return queue.split(SEPARATOR, 1)[0]


def need_text(gpus: int, gpu_memory_mb: int) -> str:
    """`1 GPU with 20000 MB`, `2 GPUs of any size`: what a trial needs, for messages."""
    count = f"{gpus} GPU" + ("s" if gpus > 1 else "")
    return f"{count} with {gpu_memory_mb} MB each" if gpu_memory_mb else f"{count} of any size"
