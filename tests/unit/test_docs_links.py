"""The docs hold together: every relative link in them resolves, to a file and, where it names
one, to a heading; the code map in docs/design.md names every module under src/trialq/ in its
package's paragraph; and
the README stays something a newcomer reads in five minutes."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "benchmarks" / "README.md",
        ROOT / "docker" / "README.md",
        ROOT / "k8s" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "docs" / "frameworks").glob("*.md"),
    ]
)
README_MAX_LINES = 120

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)(?:[^\n]|\n(?!\n)))+?\1")  # within a paragraph
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `#` in a code block is no heading, and a
    `[x](y)` there no link)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, lower case, spaces
    to hyphens (letters, digits, `_` and `-` kept)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The targets of the inline links and images in a markdown file's prose."""
    prose = "\n".join(prose_lines(path.read_text(encoding="utf-8")))
    return LINK.findall(CODE_SPAN.sub("", prose))  # a link's text may span lines


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` that names a missing file or a missing heading."""
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert doc.exists()
    assert broken_links(doc) == []


def test_the_check_catches_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A section (`with_code`)\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n"
        "[fine](other.md#a-section-with_code), [also fine](#doc), [web](https://example.org)\n"
        "[gone](missing.md), [no anchor](other.md#no-such-section), [a link over\ntwo lines](#nowhere)\n"
        "`[in code](ignored.md)`\n\n"
        "```\n[in a block](ignored-too.md)\n# not a heading\n```\n"
    )
    assert broken_links(doc) == [
        "missing.md: no such file",
        "other.md#no-such-section: no heading with anchor #no-such-section in other.md",
        "#nowhere: no heading with anchor #nowhere in doc.md",
    ]


def test_slugs_follow_github() -> None:
    assert slug("The driver's time per trial") == "the-drivers-time-per-trial"
    assert slug("OOM-aware search (`oom_as_constraint`)") == "oom-aware-search-oom_as_constraint"
    assert slug("One GPU host: Docker Compose") == "one-gpu-host-docker-compose"


def code_map_paragraphs() -> dict[str, set[str]]:
    """The files each paragraph of the code map in docs/design.md names, by the package it is
    about (`driver/sampling/`: a paragraph opening with it; "" for the top-level modules)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    match = re.search(r"^## Code map\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "docs/design.md has no '## Code map' section"
    named: dict[str, set[str]] = {}
    for paragraph in match.group(1).split("\n\n"):
        opening = re.match(r"`((?:\w+/)+)`:|Top-level modules:", paragraph.strip())
        if opening:
            package = opening.group(1) or ""
            assert package not in named, f"two paragraphs for {package or 'the top level'}"
            named[package] = set(re.findall(r"`(\w+\.py|py\.typed)`", paragraph))
    return named


def test_the_code_map_names_every_module_in_its_package_paragraph() -> None:
    package = ROOT / "src" / "trialq"
    files: dict[str, set[str]] = {}
    for path in package.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            folder = path.parent.relative_to(package).as_posix()
            files.setdefault("" if folder == "." else folder + "/", set()).add(path.name)
    named = code_map_paragraphs()
    assert sorted(set(files) - set(named)) == [], "a package with no paragraph in the code map"
    assert sorted(set(named) - set(files)) == [], "a paragraph of a package that is gone"
    for folder, found in files.items():
        where = folder or "the top level"
        assert sorted(found - named[folder]) == [], f"{where}: name these in its paragraph"
        assert sorted(named[folder] - found) == [], f"{where}: these are gone from it"


def test_every_module_says_what_it_is_for() -> None:
    """The code map names modules; each module's docstring says the rest."""
    silent = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "src" / "trialq").rglob("*.py")
        if ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is None
    ]
    assert silent == []


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, "move the detail to a page under docs/"


def test_the_readme_fresh_machine_commands_name_what_exists() -> None:
    """The two commands for a fresh machine install extras that exist and run a spec that
    exists (CI runs the test command itself: .ci/run)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    commands = re.findall(r"^python3 -m venv \.venv && .*$", readme, flags=re.M)
    assert len(commands) == 2
    for command in commands:
        for extra in re.search(r"pip install -e '\.\[([^\]]+)\]'", command).group(1).split(","):
            assert extra in extras
    run, test = commands
    spec = re.search(r"submit-study (\S+) --local", run)
    assert spec and (ROOT / spec.group(1)).is_file()
    test_command = test.rsplit(" && ", 1)[-1]
    assert test_command.startswith(".venv/bin/python -m pytest"), test
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines, "CI runs the README's test command, exactly"


@pytest.mark.parametrize("doc", ["README.md", "docs/spec.md"])
def test_the_spec_examples_in_the_docs_load(doc: str, tmp_path: Path) -> None:
    from trialq.spec import load_spec

    example = re.search(r"```toml\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)
    assert example, f"{doc} has no TOML spec example"
    path = tmp_path / "study.toml"
    path.write_text(example.group(1))
    assert load_spec(path).study.name == "digits-cnn"


PASSWORD_ON_A_COMMAND_LINE = re.compile(
    r"--requirepass\s+\S|\b(?:redis|rediss|postgresql[+\w]*)://[^:/\s@]*:(?!\*\*\*@)[^@\s/]+@"
)
"""A password as a process's argument (`--requirepass s3cret`, a URL carrying one), which
`ps` shows every user of the host; `***` is how trialq prints a hidden one."""


def code_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks: what a reader copies into a shell."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif in_fence:
            lines.append(line)
    return lines


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_command_the_docs_give_shows_a_password_in_ps(doc: Path) -> None:
    """Issue 38, row 11: the by-hand Redis was started with `--requirepass s3cret`, which
    docker/README.md itself says shows the password in `ps`."""
    shown = [
        line for line in code_lines(doc.read_text()) if PASSWORD_ON_A_COMMAND_LINE.search(line)
    ]
    assert not shown, shown
