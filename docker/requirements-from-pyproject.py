"""Print the requirements of pyproject.toml (core dependencies plus the named extras).

The images install these in a layer of their own, before the source is copied, so a change
under src/ does not reinstall TensorFlow. Usage: requirements-from-pyproject.py PYPROJECT [EXTRA...]
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject_path: str, extras: list[str]) -> list[str]:
    """The core dependencies followed by those of each extra, in order, without repeats."""
    with open(pyproject_path, "rb") as handle:
        project = tomllib.load(handle)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"{pyproject_path}: no extra named {', '.join(unknown)}")
    chosen = list(project.get("dependencies", []))
    for extra in extras:
        chosen.extend(optional[extra])
    return list(dict.fromkeys(chosen))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(requirements(sys.argv[1], [e for e in sys.argv[2:] if e])))
