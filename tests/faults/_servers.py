"""Servers a fault test starts and stops itself: its own PostgreSQL and Redis, the example
provider, and ``tooldispatch run`` worker processes. Never the machine's shared servers.

* :class:`OwnPostgres`: ``initdb`` + ``pg_ctl`` (PostgreSQL's own binaries, found by
  :func:`find_postgres`) into a fresh directory, on a free port of 127.0.0.1, with
  durability off (a test's data dies with it). ``initdb`` refuses to run as root, so as
  root the cluster belongs to the ``postgres`` user (``runuser -u postgres --``) and lives
  in a directory it owns. :meth:`OwnPostgres.stop` and :meth:`OwnPostgres.start` make the
  outage: a fast stop terminates every session (``AdminShutdown``), as a restart does.
* :class:`OwnRedis`: ``redis-server --port P --save ''`` (nothing on disk).
* :class:`Provider`: ``examples/provider.py`` (its ``/stats`` tell what was billed).
* :class:`WindowProvider`: ``_window_provider.py``, a provider bounding the requests of
  every time window (its ``/stats`` tell the most that arrived within one).
* :class:`TcpProxy`: a TCP forwarder on 127.0.0.1 that the test can cut (one worker's
  way to a server unreachable while the others' is not).
* :func:`start_worker`: ``python -m actors.job.cli run ...`` with the installed package.

Loaded by path (tests are not a package): see ``tests/faults/conftest.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "OwnPostgres",
    "OwnRedis",
    "Provider",
    "TcpProxy",
    "WindowProvider",
    "find_postgres",
    "find_redis",
    "finish",
    "free_port",
    "read_jsonl",
    "start_worker",
]

REPO_ROOT = Path(os.path.abspath(__file__)).parents[2]
PG_HOWTO = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not here: `apt-get install postgresql` "
    "(Debian), or name their folder in TOOLDISPATCH_PG_BIN"
)
REDIS_HOWTO = (
    "redis-server is not here: `apt-get install redis-server`, or name it in TOOLDISPATCH_REDIS_SERVER"
)
START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_postgres() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: ``TOOLDISPATCH_PG_BIN``, else the newest
    ``/usr/lib/postgresql/*/bin``, else PATH."""
    explicit = os.environ.get("TOOLDISPATCH_PG_BIN")
    candidates = [Path(explicit)] if explicit else []
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _version(p.parent.name))
    candidates += reversed(versions)
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def find_redis() -> str | None:
    """``redis-server``: ``TOOLDISPATCH_REDIS_SERVER``, else PATH, else ``/usr/bin/redis-server``."""
    explicit = os.environ.get("TOOLDISPATCH_REDIS_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )


class OwnPostgres:
    """A PostgreSQL cluster of one test's own (see the module doc).

    Args:
        bin_dir: the folder of ``initdb``, ``pg_ctl`` and ``postgres``.

    Attributes:
        url: ``postgresql://postgres@127.0.0.1:PORT/postgres``.
        port: its TCP port (kept across restarts).
    """

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="td-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: the cluster is the postgres user's
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "postgres", "--"]
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self.port = 0
        self.url = ""
        for _ in range(3):  # a port taken between free_port() and the server's bind: another
            self.port = free_port()
            self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
            try:
                self.start()
                return
            except subprocess.CalledProcessError:
                continue
        raise RuntimeError(f"PostgreSQL did not start; its log:\n{self.tail()}")

    def _pg(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as, str(self.bin_dir / tool), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S * 2,
            check=check,
        )

    def start(self) -> None:
        """Start the server and wait until it takes connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=60"
        )
        self._pg(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t",
            str(int(START_TIMEOUT_S)), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` ends every session at once (AdminShutdown), ``immediate``
        as a crash."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(int(START_TIMEOUT_S)), "stop")

    def running(self) -> bool:
        return self._pg("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Stop it (if running) and delete its files."""
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class OwnRedis:
    """A ``redis-server`` of one test's own on a free port, keeping nothing on disk.

    Attributes:
        url: ``redis://127.0.0.1:PORT/0``.
    """

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="td-faults-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        for _ in range(3):
            self.port = free_port()
            if self.start():
                break
        else:
            raise RuntimeError(f"redis-server did not start: {self.tail()}")
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> bool:
        """Start the server (same port); True once it answers PING."""
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - the child keeps its copy
        try:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.root)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        finally:
            log.close()
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return True
            time.sleep(0.05)
        self.stop()
        return False

    def stop(self) -> None:
        """Stop the server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def tail(self) -> str:
        try:
            return (self.root / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Provider:
    """``examples/provider.py`` in a subprocess (``args``: its options, e.g. ``--rate 40``)."""

    script = REPO_ROOT / "examples" / "provider.py"
    port_args: tuple[str, ...] = ("--port", "0")

    def __init__(self, log_path: Path, *args: str) -> None:
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script), *self.port_args, *args],
            stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT_S * 2)
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)", lines[0].strip() if lines else "")
        if match is None:
            self.stop()
            raise RuntimeError(f"the provider did not start: {log_path.read_text(errors='replace')}")
        self.url = match.group(1)

    def stats(self) -> dict[str, Any]:
        """Its counters: ``requests``, ``unique_items`` (items billed), ``repeated_items``
        (items billed more than once), ``rate_limited`` ..."""
        with urllib.request.urlopen(f"{self.url}/stats", timeout=30) as response:
            return dict(json.load(response))

    def stop(self) -> None:
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


class WindowProvider(Provider):
    """``tests/faults/_window_provider.py`` in a subprocess (``args``: ``--rate R --window W
    --burst B``): at most ``R * W + B`` requests answered within any ``W`` seconds, 429
    beyond; ``stats()`` has ``max_in_window`` and ``rate_limited``."""

    script = Path(__file__).parent / "_window_provider.py"
    port_args = ()


class TcpProxy:
    """Forwards connections from a free port of 127.0.0.1 to ``port`` (threads in this
    process). :meth:`cut` closes every connection and refuses new ones (accepted, then
    closed at once) until :meth:`mend`.

    Attributes:
        port: where it listens.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for conn in doomed:
            _close(conn)

    def mend(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                if self._cut:
                    raise OSError("cut")
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def _package_parent() -> str:
    spec = importlib.util.find_spec("actors")
    assert spec is not None and spec.origin is not None, "actors is not importable"
    return str(Path(spec.origin).resolve().parents[1])


def start_worker(cwd: Path, name: str, *args: str | os.PathLike[str], env: dict[str, str]) -> Any:
    """``python -m actors.job.cli run *args`` from ``cwd`` (output to ``cwd/name.log``), in
    the runtime this suite runs on. Returns the Popen (``.log_path`` added)."""
    argv = list(map(str, args))
    if os.environ.get("TOOLDISPATCH_RUNTIME") == "gevent" and "--runtime" not in argv:
        argv += ["--runtime", "gevent"]
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLDISPATCH_REEXEC", "FORCE_COLOR"))}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), os.environ.get("PYTHONPATH")) if p)
    full["COLUMNS"] = "200"
    full.update(env)
    log_path = cwd / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.job.cli", "run", *argv],
            cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def finish(proc: Any, timeout_s: float) -> tuple[int, str]:
    """Wait for a worker (killed past ``timeout_s``); its exit code and its output."""
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        code = -signal.SIGKILL
    return code, Path(proc.log_path).read_text(errors="replace")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, in file order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
