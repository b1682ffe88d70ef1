"""References to user code (`module:function` or `path/to/file.py:function`).

The driver checks a reference without running the module (it may import TensorFlow, which
the driver must never load); only the trial's own process imports and calls it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator

from trialq.errors import EntrypointError

_FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Entrypoint:
    """A function in a module or in a Python file, named as `target:function`."""

    target: str
    function: str

    @classmethod
    def parse(cls, text: object) -> Entrypoint:
        """Parse `module:function` or `path/to/file.py:function`."""
        if isinstance(text, Entrypoint):
            return text
        if not isinstance(text, str) or text.count(":") != 1:
            raise ValueError("expected 'module:function' or 'path/to/file.py:function'")
        target, function = text.split(":")
        ref = cls(target.strip(), function.strip())
        if not _FUNCTION_NAME.match(ref.function):
            raise ValueError(f"{ref.function!r} is not a function name")
        if not ref.is_file and not _MODULE_NAME.match(ref.target):
            raise ValueError(f"{ref.target!r} is neither a module name nor a .py file")
        return ref

    def __str__(self) -> str:
        return f"{self.target}:{self.function}"

    @property
    def is_file(self) -> bool:
        """Whether the target is a path to a Python file rather than a module name."""
        return self.target.endswith(".py") or "/" in self.target

    @property
    def module_name(self) -> str:
        """The name the code is imported under (a file's stem for file targets)."""
        return Path(self.target).stem if self.is_file else self.target

    def resolved(self, base: Path) -> Entrypoint:
        """The same reference with a file target made absolute against `base`."""
        if not self.is_file:
            return self
        return Entrypoint(str((base / self.target).resolve()), self.function)

    def is_allowed(self, prefixes: tuple[str, ...]) -> bool:
        """Whether an allow-list of module prefixes (or folders, for files) admits it."""
        if self.is_file:
            path = Path(self.target).resolve()
            return any(
                "/" in prefix and path.is_relative_to(Path(prefix).resolve()) for prefix in prefixes
            )
        return any(
            self.target == prefix or self.target.startswith(prefix + ".")
            for prefix in prefixes
            if "/" not in prefix
        )

    def check_importable(self, base: Path, where: str) -> None:
        """Raise `EntrypointError` unless the function is found in its source (not run)."""
        source_path = self._source_path(base, where)
        if source_path is None:
            return  # a compiled or namespace module: nothing to read, trust the worker
        try:
            tree = ast.parse(source_path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError) as exc:
            raise EntrypointError(f"{where}: cannot read {source_path}: {exc}") from None
        kind = _top_level_binding(tree, self.function)
        if kind is None:
            raise EntrypointError(f"{where}: {self.target} has no function {self.function!r}")
        if kind == "value":
            raise EntrypointError(f"{where}: {self} is not callable")

    def source(self, base: Path) -> str | None:
        """The target's source text, read without running it; None where there is none to
        read (a compiled module, a missing file): what `[trial] framework = "auto"` scans."""
        try:
            path = self._source_path(base, "entrypoint")
            return path.read_text(encoding="utf-8") if path is not None else None
        except (EntrypointError, OSError, UnicodeDecodeError):
            return None

    def module_folder(self, base: Path) -> Path | None:
        """The `sys.path` folder this process imports a module target's top package from;
        None for a file target, or one not found."""
        if self.is_file:
            return None
        top = self.target.split(".")[0]
        with importable_from(base):
            try:
                found = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                return None
        if found is None or not found.origin or not found.has_location:
            return None
        origin = Path(found.origin)
        return origin.parent.parent if origin.name == "__init__.py" else origin.parent

    def _source_path(self, base: Path, where: str) -> Path | None:
        if self.is_file:
            path = (base / self.target).resolve()
            if not path.is_file():
                raise EntrypointError(f"{where}: file {path} does not exist")
            return path
        with importable_from(base):
            try:
                found = importlib.util.find_spec(self.target)
            except (ImportError, ValueError) as exc:
                raise EntrypointError(f"{where}: cannot import {self.target}: {exc}") from None
        if found is None:
            raise EntrypointError(f"{where}: no module named {self.target!r}")
        origin = found.origin
        return Path(origin) if origin and origin.endswith(".py") else None

    def load(self) -> Callable[..., Any]:
        """Import the target and return the function (runs the module's code)."""
        if self.is_file:
            module = _import_file(Path(self.target))
        else:
            module = importlib.import_module(self.target)
        function = getattr(module, self.function, None)
        if function is None:
            raise EntrypointError(f"{self.target} has no function {self.function!r}")
        if not callable(function):
            raise EntrypointError(f"{self} is not callable")
        return function  # type: ignore[no-any-return]


EntrypointRef = Annotated[
    Entrypoint, PlainValidator(Entrypoint.parse), PlainSerializer(str, return_type=str)
]
"""An `Entrypoint` as a field of a pydantic model: a string on the wire and in files."""


@contextmanager
def importable_from(*folders: Path) -> Iterator[None]:
    """Put folders (and the current directory) first on `sys.path` for the duration."""
    added = [str(folder.resolve()) for folder in (*folders, Path.cwd())]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            sys.path.remove(entry)


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise EntrypointError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _top_level_binding(tree: ast.Module, name: str) -> str | None:
    """'function' for a def, 'value' for a literal assignment, 'other' for any other binding."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return "function"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return "value" if isinstance(node.value, ast.Constant) else "other"
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return "other"
    return None
