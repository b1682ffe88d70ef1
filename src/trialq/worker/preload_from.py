"""What a worker preloads for an entrypoint module: the modules it imports at its top.

A trial's start is its imports: scikit-learn took 1.4-2.2 s of a no-op trial's start, 0.018 s
preloaded. `trialq worker --preload-from MODULE|FILE` (`TRIALQ_PRELOAD_FROM`; set by
`submit-study --local` to the spec's entrypoint) names an entrypoint module; its source is
read by AST, never imported, and the modules its top-level statements import are preloaded
in the worker's parent, behind the same fork guard as a framework (`prewarm.preload`).

Deciding only, here: which modules, and which are left out and why. Left out: what is not
installed here, and the user's own modules (found in the entrypoint's folder or the import
paths: their code is not run in the worker's parent). The standard library and trialq are
left aside silently (already cheap); a framework's import becomes its preload
(`wire.frameworks.PRELOAD`: `torch` brings `torch._dynamo`).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trialq.wire.entrypoint_uses import top_level_imports
from trialq.wire.frameworks import PRELOAD, framework_of


@dataclass(frozen=True)
class PreloadFrom:
    """The modules to preload for an entrypoint module, and those left out, each with why."""

    modules: tuple[str, ...] = ()
    left_out: tuple[str, ...] = field(default_factory=tuple)
    """`name (why)`, one each."""


def preload_from(target: str, import_paths: tuple[str, ...] = ()) -> PreloadFrom:
    """What to preload for `target`, a module's file or dotted name (looked up in
    `import_paths`, this folder, then `sys.path`, without importing anything)."""
    folders = [Path(p) for p in (*import_paths, ".")]
    source_file = _source_file(target, [*folders, *(Path(p) for p in sys.path if p)])
    if source_file is None:
        return PreloadFrom(left_out=(f"{target} (its source was not found here)",))
    try:
        imported = top_level_imports(source_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        return PreloadFrom(left_out=(f"{target} (unreadable: {type(exc).__name__})",))
    return _sorted_out(imported, [source_file.parent, *folders])


def _sorted_out(imported: list[str], own_folders: list[Path]) -> PreloadFrom:
    modules: list[str] = []
    left_out: list[str] = []
    for name in imported:
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top == "trialq":
            continue
        if any(_holds_module(folder, top) for folder in own_folders):
            left_out.append(f"{name} (your own module: not run in the worker's parent)")
        elif importlib.util.find_spec(top) is None:
            left_out.append(f"{name} (not installed here)")
        else:
            framework = framework_of(name)
            modules += [*PRELOAD.get(framework or "", ()), name]
    return PreloadFrom(tuple(dict.fromkeys(modules)), tuple(left_out))


def _source_file(target: str, folders: list[Path]) -> Path | None:
    if target.endswith(".py"):
        path = Path(target)
        return path if path.is_file() else None
    relative = Path(*target.split("."))
    for folder in folders:
        for candidate in (folder / f"{relative}.py", folder / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _holds_module(folder: Path, top: str) -> bool:
    return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()
