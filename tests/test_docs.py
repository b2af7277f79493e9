"""The docs stay true: every public name and every CLI command and option is documented,
README.md stays a front door (at most 120 lines, with .ci/run's test line), every
relative link and named repository path exists, and the code examples run."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

import actors
import actors.http
import stores
from actors.job.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEST_COMMAND = (
    'python3 -m venv .venv && .venv/bin/python -m pip install --quiet "tox>=4.11" "tox-uv>=1.11" '
    "&& .venv/bin/tox run-parallel --parallel auto"
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _docs_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in _pages())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


Tree = Iterator[tuple[tuple[str, ...], click.Command]]


def _commands(group: click.Command, path: tuple[str, ...] = ()) -> Tree:
    yield path, group
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from _commands(command, (*path, name))


def _long_options(command: click.Command) -> set[str]:
    ctx = click.Context(command, info_name=command.name)
    names: set[str] = set()
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return names


@pytest.mark.parametrize("module", [actors, stores, actors.http], ids=lambda m: m.__name__)
def test_docs_name_every_public_name(module: Any) -> None:
    text = _docs_text()
    missing = [name for name in module.__all__ if not re.search(rf"(?<!\w){re.escape(name)}\b", text)]
    assert not missing, f"public names of {module.__name__} in no page of docs/: {missing}"


def test_docs_cli_names_every_command_and_option() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    commands = list(_commands(main))
    assert len(commands) > 5, "the click tree was not walked"
    missing = []
    for path, command in commands:
        if path and f"tooldispatch {' '.join(path)}" not in text:
            missing.append(" ".join(path))
        for option in sorted(_long_options(command)):
            if not re.search(rf"{re.escape(option)}(?![\w-])", text):
                missing.append(f"{' '.join(path) or 'tooldispatch'} {option}")
    assert not missing, f"missing from docs/cli.md: {missing}"


def _synopsis(text: str) -> dict[str, str]:
    """The first code block of docs/cli.md: ``tooldispatch <command path>`` -> its usage
    (a line and the indented lines continuing it)."""
    block = re.search(r"```\n(.*?)```", text, flags=re.S)
    assert block is not None, "docs/cli.md has no usage block"
    usage: dict[str, str] = {}
    current = None
    for line in block.group(1).splitlines():
        if line.startswith("tooldispatch "):
            words = re.match(r"tooldispatch ((?:[a-z]+ ?)+)", line)
            current = (words.group(1) if words else "").strip()
            usage[current] = usage.get(current, "") + " " + line
        elif current is not None and line.startswith(" "):
            usage[current] += " " + line
    return usage


def test_docs_cli_usage_names_every_option_of_each_command() -> None:
    """Each command's usage line names each of its own options (``--db`` of ``receipts
    show`` is not documented by ``run``'s), and ``run``'s options each have a table row
    that also names the environment variable the option reads, if any."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    usage = _synopsis(text)
    missing = []
    for path, command in _commands(main):
        if not path or isinstance(command, click.Group):
            continue
        name = " ".join(path)
        line = usage.get(name)
        if line is None:
            missing.append(f"{name}: no usage line")
            continue
        for option in sorted(_long_options(command) - {"--help"}):
            if not re.search(rf"{re.escape(option)}(?![\w-])", line):
                missing.append(f"{name} {option}")
    ctx = click.Context(main.commands["run"], info_name="run")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(--[\w-]+)[^|]*\|.*$", text, flags=re.M)}
    for param in main.commands["run"].get_params(ctx):
        if not isinstance(param, click.Option) or "--help" in param.opts:
            continue
        option = next(o for o in param.opts if o.startswith("--"))
        row = rows.get(option)
        if row is None:
            missing.append(f"run {option}: no row in the options table")
        elif param.envvar and str(param.envvar) not in row:
            missing.append(f"run {option}: its row does not name {param.envvar}")
    assert not missing, f"docs/cli.md does not document: {missing}"


def test_docs_cli_help_explains_every_option() -> None:
    """``-h`` documents every option of every command: each has its own help text."""
    bare = []
    for path, command in _commands(main):
        ctx = click.Context(command, info_name=command.name)
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not (param.help or "").strip():
                bare.append(f"{' '.join(path) or 'tooldispatch'} {param.opts[0]}")
    assert not bare, f"options without help text: {bare}"


def test_docs_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines (at most 120)"
    assert TEST_COMMAND in lines, ".ci/run greps README.md for its test command, on a line of its own"


@pytest.mark.parametrize("page", [README, *_pages()], ids=lambda p: p.name)
def test_docs_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
            continue
        if anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_docs_readme_quickstart_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python block"
    code = compile(blocks[0], "README.md quickstart", "exec")
    monkeypatch.chdir(tmp_path)
    printed = []
    for _ in range(2):  # the second run is answered from the receipt
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, {"__name__": "__quickstart__"})
        printed.append(out.getvalue().split())
    assert (tmp_path / "receipts.db").exists()
    assert printed[0][0] == "live", printed
    assert printed[1][0] == "cached", printed


def test_docs_host_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = DOCS / "host-api.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "docs/host-api.md has no python block"
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "docs/host-api.md example", "exec"), {"__name__": "__example__"})
    assert out.getvalue().split()[0] == "live", out.getvalue()


@pytest.mark.parametrize("page", [README, *_pages()], ids=lambda p: p.name)
def test_docs_named_paths_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    named = re.findall(r"`((?:actors|stores|tests|bench|examples|docs)/[\w/.-]*)`", text)
    missing = sorted({path for path in named if not (ROOT / path).exists()})
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


CODE_REF = re.compile(r"docs/([\w-]+\.md)(?:(?:,\s*|\s*\()([A-Z][\w ]*[\w]))?")


def test_docs_pages_named_in_the_code_exist() -> None:
    """A docstring that sends a reader to ``docs/<page>.md`` (and a section of it, as
    ``docs/page.md, Section`` or ``docs/page.md (Section)``) names a page and heading that exist."""
    missing: list[str] = []
    for path in sorted([*(ROOT / "actors").rglob("*.py"), *(ROOT / "stores").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        for match in CODE_REF.finditer(re.sub(r"\s+", " ", text)):
            page, section = DOCS / match.group(1), match.group(2)
            where = f"{path.relative_to(ROOT)}: docs/{match.group(1)}"
            if not page.is_file():
                missing.append(where)
            elif section is not None and _slug(section) not in _anchors(page):
                missing.append(f"{where}, {section}")
    assert missing == []


DOTTED = re.compile(r"`((?:actors|stores)(?:\.[A-Za-z_]\w*)+)")


def _resolves(dotted: str) -> bool:
    """``dotted`` names a module, or a name (an attribute chain) inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


@pytest.mark.parametrize("page", [README, *_pages()], ids=lambda p: p.name)
def test_docs_dotted_names_resolve(page: Path) -> None:
    """Every ``actors.…`` / ``stores.…`` name a page gives in backticks imports."""
    text = page.read_text(encoding="utf-8")
    broken = sorted({m.group(1) for m in DOTTED.finditer(text) if not _resolves(m.group(1))})
    assert not broken, f"{page.name} names what does not import: {broken}"
