"""Which modules an entrypoint function uses, read from its module's source without running it.

`[trial] framework = "auto"` wants the framework of the function a trial runs, not of every
function its module holds: a benchmark module with a PyTorch trial and a JAX trial, or a
module that names a framework this worker lacks in a function the trial never calls. So the
reading starts at the entrypoint function and follows, within its module, what it uses:
the names in its body (decorators and defaults included), the module-level functions,
classes and assignments those name (and what they use in turn), and the modules its own
imports name. A name bound by a module-level import is the module it names. Nothing is
imported; other modules are not followed (an entrypoint that reaches its framework only
through one is found from what its import loaded, in the trial process).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def modules_used(source: str, function: str) -> Iterator[str]:
    """The modules `function` of the module `source` uses, in the order met; nothing where
    the module defines no such name. Raises SyntaxError for source that is not Python."""
    tree = ast.parse(source)
    bound = _module_imports(tree)
    defined = _module_definitions(tree)
    if function not in defined:
        return
    seen, queue = {function}, [defined[function]]
    while queue:
        node = queue.pop(0)
        for kind, name in _uses(node):
            if kind == "import":
                yield name
            elif name in bound:
                yield bound[name]
            elif name in defined and name not in seen:
                seen.add(name)
                queue.append(defined[name])


def _module_imports(tree: ast.Module) -> dict[str, str]:
    """Each name a module-level import binds (conditional ones included), and its module."""
    bound: dict[str, str] = {}
    for node in _outside_scopes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _module_definitions(tree: ast.Module) -> dict[str, Definition]:
    """Each module-level function, class and assigned name, and the node that defines it."""
    defined: dict[str, Definition] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                defined.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
    return defined


def _uses(node: ast.AST) -> Iterator[tuple[str, str]]:
    """("import", module) for each import inside `node`, ("name", name) for each name it
    reads, in source order."""
    found: list[tuple[tuple[int, int], str, str]] = []
    for part in ast.walk(node):
        at = (getattr(part, "lineno", 0), getattr(part, "col_offset", 0))
        if isinstance(part, ast.Import):
            found += [(at, "import", alias.name) for alias in part.names]
        elif isinstance(part, ast.ImportFrom) and part.level == 0 and part.module:
            found += [(at, "import", f"{part.module}.{a.name}") for a in part.names]
        elif isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load):
            found.append((at, "name", part.id))
    for _, kind, name in sorted(found, key=lambda item: item[0]):
        yield kind, name


def _outside_scopes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of the module that no function or class encloses."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop(0)
        yield node
        if not isinstance(node, _SCOPES):
            pending.extend(ast.iter_child_nodes(node))


def top_level_imports(source: str) -> list[str]:
    """The absolute imports a module runs as it is imported, in source order: its top-level
    statements, and those in its top-level `try`, `with` and `if` blocks, less an
    `if TYPE_CHECKING:` block (never run). `import a.b` gives `a.b`; `from a.b import c`
    gives `a.b` (`c` may be a name, not a module). Raises SyntaxError for source that is not
    Python."""
    found: list[str] = []
    pending: list[ast.stmt] = list(ast.parse(source).body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, ast.If) and not _type_checking(node.test):
            pending[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending[:0] = [*node.body, *node.orelse, *node.finalbody]
        elif isinstance(node, ast.With):
            pending[:0] = node.body
    return list(dict.fromkeys(found))


def _type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"
