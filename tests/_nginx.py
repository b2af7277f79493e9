"""A real rate limiter for tests and benches: nginx's ``limit_req`` on 127.0.0.1.

nginx from the distribution's packages (Debian: ``apt-get install nginx-light``; the
package's own service is never used or needed). :class:`NginxLimiter` writes a config
into a directory of its own and runs ``nginx -p <dir> -c <conf> -g 'daemon off;'`` as a
child process on a free port:

* ``POST /call``: ``limit_req zone=... rate=Rr/s burst=B nodelay`` (rate per minute when
  R < 1/s; nginx accounts in milliseconds), ``limit_req_status 429``; a 429 carries
  ``Retry-After: 1`` (whole seconds, as most APIs send it). An accepted request is
  proxied to a second server block of the same nginx on a unix socket, which answers
  ``200 {"ok": true}``. Why not ``return 200`` in the limited location: ``return`` runs
  in nginx's rewrite phase, before ``limit_req`` (preaccess phase) is consulted, so it
  would never be limited; and static locations answer POST with 405.
* the zone's key is the server port, so every client shares one limit.

Counts of accepted and limited requests are read from the access log (``status`` per
line), so tests assert on what the provider saw. Loaded by path (tests are not a
package): see ``load()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["NGINX_HOWTO", "NginxLimiter", "find_nginx"]

NGINX_HOWTO = (
    "nginx is not installed: `apt-get install nginx-light` (Debian/Ubuntu; .ci/run does it), "
    "or put an nginx binary on PATH / in TOOLDISPATCH_NGINX"
)


def find_nginx() -> str | None:
    """The nginx binary: ``TOOLDISPATCH_NGINX``, else PATH, else ``/usr/sbin/nginx``."""
    explicit = os.environ.get("TOOLDISPATCH_NGINX")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rate(rps: float) -> str:
    if rps >= 1 and float(rps).is_integer():
        return f"{int(rps)}r/s"
    per_minute = rps * 60.0
    if not per_minute.is_integer() or per_minute < 1:
        raise ValueError(f"nginx takes whole requests per second or per minute, not {rps}/s")
    return f"{int(per_minute)}r/m"


def _burst(burst: int) -> str:
    """``limit_req``'s arguments: nginx refuses ``burst=0``; without ``burst`` (its default,
    0) a request arriving less than 1/R after the last accepted one is refused."""
    return f" burst={burst} nodelay" if burst > 0 else ""


CONFIG = """\
{user}
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format status '$status';
    access_log {dir}/access.log status;
    keepalive_requests 1000000;
    map $status $retry_after {{ 429 1; default ""; }}
    limit_req_zone $server_port zone=provider:1m rate={rate};
    upstream answer {{ server unix:{dir}/answer.sock; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location = /call {{
            limit_req zone=provider{burst};
            limit_req_status 429;
            limit_req_log_level info;
            add_header Retry-After $retry_after always;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://answer/ok;
        }}
    }}
    server {{
        listen unix:{dir}/answer.sock;
        access_log off;
        location = /ok {{
            default_type application/json;
            return 200 '{{"ok": true}}';
        }}
    }}
}}
"""


class NginxLimiter:
    """One nginx child process limiting ``POST /call`` to ``rps`` with ``burst``.

    Args:
        rps: the limit, requests per second (whole per second, or whole per minute).
        burst: nginx's ``burst`` (requests over the rate it lets through at once, nodelay;
            0: no burst, nginx's default).
        directory: where config, logs and sockets go (default: a new temporary one).

    Use as a context manager, or :meth:`start` / :meth:`stop`.

    Raises:
        RuntimeError: nginx is missing or did not start within 10 s (its error log is in
            the message).
    """

    def __init__(self, rps: float, burst: int = 0, directory: str | Path | None = None) -> None:
        self.rps = rps
        self.burst = burst
        self._own_dir = directory is None
        # a short path: unix socket paths are limited to about 100 bytes
        self.dir = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="tdngx"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The limited endpoint, ``http://127.0.0.1:<port>/call``."""
        return f"http://127.0.0.1:{self.port}/call"

    def start(self) -> NginxLimiter:
        """Write the config and start nginx; returns once it accepts connections."""
        binary = find_nginx()
        if binary is None:
            raise RuntimeError(NGINX_HOWTO)
        self.dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.dir / "answer.sock")) > 100:
            raise RuntimeError(f"{self.dir} is too long a path for a unix socket")
        self.port = _free_port()
        conf = self.dir / "nginx.conf"
        # as root, nginx's worker would drop to `nobody`, which cannot use this directory
        user = "user root root;" if os.geteuid() == 0 else ""
        conf.write_text(
            CONFIG.format(
                user=user, dir=self.dir, port=self.port, rate=_rate(self.rps), burst=_burst(self.burst)
            )
        )
        self.process = subprocess.Popen(
            [binary, "-p", str(self.dir), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.02)  # polling a child's listen socket: nothing to wait on instead
        error = self.log("error.log")
        if self.process.poll() is not None and self.process.stderr is not None:
            error += self.process.stderr.read().decode(errors="replace")  # nginx -c's own complaints
        self.stop()
        raise RuntimeError(f"nginx did not start on 127.0.0.1:{self.port}: {error[-2000:]}")

    def log(self, name: str) -> str:
        """The text of a log file in the directory ("" when missing)."""
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def statuses(self) -> dict[int, int]:
        """Status code -> how many requests to ``/call`` got it (from the access log)."""
        counts: dict[int, int] = {}
        for line in self.log("access.log").split():
            counts[int(line)] = counts.get(int(line), 0) + 1
        return counts

    def reset_counts(self) -> None:
        """Empty the access log (nginx keeps appending to the same file)."""
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.dir / "access.log", 0)

    def stop(self) -> None:
        """Stop nginx (SIGQUIT: graceful, then SIGKILL after 5 s) and remove its directory
        if this limiter made it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGQUIT)
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5.0)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NginxLimiter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load() -> None:
    """Nothing: importing this file by path is how tests and benches use it."""
