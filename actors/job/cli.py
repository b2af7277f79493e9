"""The ``tooldispatch`` command line (click).

``tooldispatch run PLAY --input FILE`` runs a play over rows; ``receipts`` and
``salvage`` inspect and maintain the receipt store. Exit codes of ``run``: see
:data:`EXIT_CODES`. ``-h`` and ``--help`` work on every command.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from typing import Any, NoReturn

import click
import orjson
from rich.console import Console
from rich.table import Table

DEFAULT_DB = os.path.join(".tooldispatch", "receipts.db")
EXIT_CODES = """\b
Exit codes:
  0    every row succeeded
  1    some rows failed (each is in the output with its error; the report groups them)
  2    usage or configuration error, or the input or output cannot be read or written
       on (one line, no traceback)
  130  interrupted (Ctrl-C or SIGTERM): rows in flight finished and were stored; run
       the same command again to resume (finished calls are not paid again). A second
       signal aborts at once, after releasing every receipt not yet sent."""
CONTEXT = {"help_option_names": ["-h", "--help"]}
DB_HELP = "Receipt store: a SQLite file, or a postgresql:// URL (env TOOLDISPATCH_DB)."


def _is_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def _salvage_default(db: str) -> str:
    """Where a run on ``db`` salvages by default (as actors.system does for its store)."""
    return os.path.abspath("tooldispatch-salvage.jsonl") if _is_url(db) else f"{db}.salvage.jsonl"


class ConfigError(click.ClickException):
    """A usage or configuration error: one line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"tooldispatch: error: {self.format_message()}", err=True)


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="tooldispatch")
def main() -> None:
    """tooldispatch: durable, batched, rate-aware dispatch of paid tool calls."""


def _reexec_under_gevent() -> NoReturn:
    os.environ["TOOLDISPATCH_REEXEC"] = "1"
    os.execv(
        sys.executable, [sys.executable, "-m", "gevent.monkey", "--module", "actors.job.cli", *sys.argv[1:]]
    )


def _count_rows(path: str) -> int | None:
    try:
        with open(path, "rb") as fh:
            lines = sum(1 for line in fh if line.strip())
    except OSError:
        return None
    return lines - 1 if path.lower().endswith(".csv") else lines


@main.command(short_help="Run a play over every row of an input file.", epilog=EXIT_CODES)
@click.argument("play_spec", metavar="PLAY")
@click.option("--input", "input_path", required=True, help="Rows: .csv, .jsonl, or one value per line.")
@click.option("--output", "output_path", default=None, help="JSONL results in input order (default: none).")
@click.option("--db", default=DEFAULT_DB, show_default=True, envvar="TOOLDISPATCH_DB", help=DB_HELP)
@click.option("--run-id", default=None, help="This run's id (default: a new one).")
@click.option("--org", default="default", show_default=True, help="Org id that scopes receipts.")
@click.option("--scope", default=None, help="Receipt scope (default: the play's name).")
@click.option("--force-refresh", is_flag=True, help="Re-run calls even when a receipt is completed.")
@click.option("--retry-failed", is_flag=True, help="Re-run calls whose receipt failed.")
@click.option("--runtime", type=click.Choice(["threads", "gevent"]), default="threads", show_default=True)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Rows at once (default 256; 1000 under gevent).",
)
@click.option(
    "--pacer",
    default=None,
    envvar="TOOLDISPATCH_PACER",
    help="Pacing shared by every worker: redis://host:port/db[?prefix=NAME] (env TOOLDISPATCH_PACER; "
    "default: this process paces alone).",
)
@click.option(
    "--shard",
    default=None,
    metavar="I/N",
    help="Worker I of N (0 <= I < N): run only the rows whose 0-based index % N == I.",
)
def run(
    play_spec: str, input_path: str, output_path: str | None, db: str, run_id: str | None, org: str,
    scope: str | None, force_refresh: bool, retry_failed: bool, runtime: str, concurrency: int | None,
    pacer: str | None, shard: str | None,
) -> None:  # fmt: skip
    """Run PLAY (a .py file, a module, module:attr or file.py:attr) over every row of --input.

    Receipts are scoped by the play's name (the file or module name, or the attr): the
    same play under another name, or --scope, starts a new cache.
    """
    from .._runtime import runtime_name

    if runtime == "gevent" and runtime_name() != "gevent":
        if os.environ.get("TOOLDISPATCH_REEXEC"):
            raise ConfigError("--runtime gevent: gevent could not monkey-patch this process")
        _reexec_under_gevent()
    if force_refresh and retry_failed:
        raise ConfigError("--force-refresh and --retry-failed exclude each other")
    if os.path.isdir(input_path):
        raise ConfigError(f"--input {input_path} is a directory: give a .csv, .jsonl or text file")
    if not os.path.exists(input_path):
        raise ConfigError(f"input file not found: {input_path}")
    if not os.path.isfile(input_path):
        raise ConfigError(f"--input {input_path} is not a regular file")
    if not org.strip() or (scope is not None and not scope.strip()):
        raise ConfigError("--org and --scope must not be empty")
    if output_path is not None:
        taken = {os.path.realpath(p): name for p, name in ((input_path, "--input"), (db, "--db"))}
        taken[os.path.realpath(_salvage_default(db))] = "the salvage file"
        clash = taken.get(os.path.realpath(output_path))
        if clash:
            raise ConfigError(f"--output {output_path} is also {clash}: writing it would destroy it")
    code = _run(
        play_spec, input_path, output_path, db, run_id, org, scope, force_refresh, retry_failed, concurrency,
        pacer, _parse_shard(shard),
    )  # fmt: skip
    sys.exit(code)


def _run(
    play_spec: str, input_path: str, output_path: str | None, db: str, run_id: str | None, org: str,
    scope: str | None, force_refresh: bool, retry_failed: bool, concurrency: int | None,
    pacer_url: str | None = None, shard: tuple[int, int] | None = None,
) -> int:  # fmt: skip
    from stores import StoreError, open_store

    from .. import DispatchSystem, RunInfo
    from .._runtime import runtime_name
    from ..shared_pacer import InvalidPacerURLError, open_pacer
    from ._signals import Interrupts
    from ._tally import CallTally
    from .play import PlayContext, PlayLoadError, load_play
    from .report import ProgressDisplay, output_line, report_table, tools_table
    from .runner import run_rows

    try:
        play = load_play(play_spec)
    except PlayLoadError as exc:
        raise ConfigError(str(exc)) from None
    rows = _first_rows(input_path)
    if shard is not None:
        rows = _shard_rows(rows, *shard)
    try:
        pacer = open_pacer(pacer_url) if pacer_url else None
    except InvalidPacerURLError as exc:
        raise ConfigError(str(exc)) from None
    try:
        if db == DEFAULT_DB:  # the default's folder is ours to make; a given path's folder must exist
            os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
        store = open_store(db)
    except (OSError, StoreError) as exc:
        if pacer is not None:
            pacer.close()
        raise ConfigError(str(exc)) from None
    width = concurrency or (1000 if runtime_name() == "gevent" else 256)
    console = Console(stderr=True)
    run_info = RunInfo(run_id=run_id or uuid.uuid4().hex[:12], org_id=org, scope=scope or play.name)
    stop = threading.Event()
    tally = CallTally(play.tools)
    try:
        out = open(output_path, "wb") if output_path else None  # noqa: SIM115 - closed below
    except OSError as exc:
        store.close()
        raise ConfigError(f"cannot write the output {output_path}: {exc.strerror or exc}") from None
    interrupts = Interrupts(stop, lambda line: console.print(line, highlight=False, soft_wrap=True), out)
    interrupts.install()
    try:
        with DispatchSystem.start(tools=play.tools, store=store, run=run_info, pacer=pacer) as system:
            interrupts.system = system
            ctx = PlayContext(
                system.proxy(), force_refresh=force_refresh, retry_failed=retry_failed, tally=tally
            )
            total = _count_rows(input_path)
            if total is not None and shard is not None:
                total = len(range(shard[0], total, shard[1]))
            progress = ProgressDisplay(console, total, system.stats, tally=tally).start()
            summary = None
            try:
                summary = run_rows(
                    play, rows, ctx, concurrency=width, out=out, stop=stop,
                    on_row=lambda _: progress.advance(),
                )  # fmt: skip
            finally:
                progress.close(final=summary is not None and summary.config_error is None)
                interrupts.wait_for_abort()  # a second signal stopped the rows: it exits 130
            stats = system.stats()
    finally:
        interrupts.restore()
        close_error = _close_quietly(out)
        store.close()
        if pacer is not None:
            pacer.close()
    if summary.config_error:
        raise ConfigError(summary.config_error)
    if close_error:
        raise ConfigError(f"cannot write the output {output_path}: {close_error}")
    if not console.is_terminal:  # a log, CI: rich would fit tables to 80 columns and cut names
        console = Console(stderr=True, width=max(console.width, 200))
    console.print(report_table(stats, summary, tally, play.tools, output_path))
    console.print(tools_table(stats, tally))
    if summary.interrupted:
        if output_path is not None:
            console.print(
                f"interrupted: {output_line(summary, output_path)}", highlight=False, soft_wrap=True
            )
        else:
            console.print(
                f"interrupted: {summary.rows} rows done; run the same command again to resume "
                "(finished calls are reused, not paid again)",
                highlight=False,
                soft_wrap=True,
            )
        return 130
    return 1 if summary.failed else 0


def _parse_shard(shard: str | None) -> tuple[int, int] | None:
    """``"I/N"`` -> (I, N); a usage error unless 0 <= I < N."""
    if shard is None:
        return None
    try:
        i, n = (int(part) for part in shard.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {shard!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard {shard!r}: needs 0 <= I < N")
    return i, n


def _shard_rows(rows: Any, index: int, count: int) -> Any:
    """The rows whose 0-based position in the input is ``index`` modulo ``count``."""
    return (row for at, row in enumerate(rows) if at % count == index)


def _first_rows(path: str) -> Any:
    """The rows of ``path``, after checking that it has one (a usage error otherwise)."""
    import itertools

    from .play import InputError, read_rows

    rows = read_rows(path)
    try:
        first = next(rows)
    except StopIteration:
        raise ConfigError(f"input has no rows: {path}") from None
    except InputError as exc:
        raise ConfigError(f"cannot read the input: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the input {path}: {exc}") from None
    return itertools.chain([first], rows)


def _close_quietly(out: Any) -> str | None:
    """Close ``out`` (None is fine); the error text if closing failed."""
    if out is None:
        return None
    try:
        out.close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


# -- receipts -----------------------------------------------------------------------


def _db_option(fn: Any) -> Any:
    return click.option(
        "--db", default=DEFAULT_DB, show_default=True, envvar="TOOLDISPATCH_DB", help=DB_HELP
    )(fn)


def _open(db: str) -> Any:
    from stores import StoreError, open_store

    if not _is_url(db) and not os.path.exists(db):
        raise ConfigError(f"no receipt store at {db}")
    try:
        return open_store(db)
    except StoreError as exc:
        raise ConfigError(str(exc)) from None


def _statuses(ctx: Any, param: Any, values: Any) -> Any:
    """Check ``--status`` values against the receipt statuses (one line, exit 2)."""
    from stores import ReceiptStatus

    known = [s.value for s in ReceiptStatus]
    for value in values if isinstance(values, tuple) else [values] if values else []:
        if value not in known:
            raise ConfigError(f"--status {value!r} is not a receipt status (one of {', '.join(known)})")
    return values


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _query(db: str, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """Rows of a read-only query (``?`` placeholders) on the receipts table of ``db``."""
    store = _open(db)
    try:
        if _is_url(db):
            return store.query(sql.replace("?", "%s"), params)  # type: ignore[no-any-return]
    finally:
        store.close()
    import sqlite_utils

    return list(sqlite_utils.Database(db).query(sql, params))


@main.group(short_help="Inspect and maintain the receipt store.")
def receipts() -> None:
    """Inspect and maintain the receipt store."""


@receipts.command("stats", short_help="Receipts per tool and status.")
@_db_option
def receipts_stats(db: str) -> None:
    """Receipts per tool and status."""
    rows = _query(
        db, "select tool_id, status, count(*) as n from receipts group by tool_id, status order by 1, 2", []
    )
    table = Table("tool", "status", "receipts")
    for row in rows:
        table.add_row(row["tool_id"], row["status"], str(row["n"]))
    Console().print(table)


@receipts.command("ls", short_help="The most recently updated receipts.")
@_db_option
@click.option("--status", default=None, callback=_statuses, help="Only this status.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1))
def receipts_ls(db: str, status: str | None, limit: int) -> None:
    """The most recently updated receipts."""
    where, params = ("where status = ?", [status]) if status else ("", [])
    rows = _query(
        db,
        f"select key, org_id, tool_id, status, attempts, updated_at from receipts {where} "
        "order by updated_at desc limit ?",
        [*params, limit],
    )
    table = Table("key", "org", "tool", "status", "attempts")
    for row in rows:
        table.add_row(row["key"][:16], row["org_id"], row["tool_id"], row["status"], str(row["attempts"]))
    Console().print(table)


@receipts.command("show", short_help="One receipt as JSON.")
@click.argument("key")
@_db_option
def receipts_show(key: str, db: str) -> None:
    """One receipt (KEY may be a unique prefix), as JSON."""
    rows = _query(db, "select * from receipts where key like ? limit 2", [f"{key}%"])
    if len(rows) != 1:
        raise ConfigError(f"{'no' if not rows else 'more than one'} receipt matches {key!r}")
    from stores._codec import decode_output

    row = dict(rows[0])
    row["output"] = decode_output(row["output"]) if row["output"] else None
    try:
        click.echo(orjson.dumps(row, option=orjson.OPT_INDENT_2).decode())
    except TypeError:  # an exact-form output orjson cannot write (NaN, a lone surrogate...)
        import json

        click.echo(json.dumps(row, indent=2))


@receipts.command("resolve", short_help="Decide an uncertain receipt: --rerun or --fail.")
@click.argument("key")
@_db_option
@click.option("--rerun", is_flag=True, help="Claimable again (same idempotency key).")
@click.option("--fail", "fail_", is_flag=True, help="Record it failed (later calls are refused).")
@click.option("--note", default="", help="Text kept with the decision.")
def receipts_resolve(key: str, db: str, rerun: bool, fail_: bool, note: str) -> None:
    """Decide a receipt whose outcome is uncertain (KEY may be a unique prefix).

    A call to a tool that is not retry-safe whose request may have reached the provider
    (it timed out or lost its connection after sending, or its process died while it
    ran) is recorded uncertain and never re-run silently. Check with the provider (the
    call sent the receipt's idempotency key), then --rerun (the next run calls it again,
    with the same Idempotency-Key, so a provider that honours it answers from its records)
    or --fail (later calls are refused with the recorded error).
    """
    from stores.types import ResolveAction

    if rerun == fail_:
        raise ConfigError("say what to do: --rerun or --fail (one of them)")
    action = "rerun" if rerun else "fail"
    rows = _query(db, "select org_id, key, status from receipts where key like ? limit 2", [f"{key}%"])
    if len(rows) != 1:
        raise ConfigError(f"{'no' if not rows else 'more than one'} receipt matches {key!r}")
    row = rows[0]
    if row["status"] != "uncertain":
        raise ConfigError(f"receipt {row['key'][:16]} is {row['status']}, not uncertain: nothing to resolve")
    store = _open(db)
    try:
        store.resolve(
            row["org_id"], row["key"], ResolveAction(action), note=note or "resolved by an operator"
        )
    finally:
        store.close()
    click.echo(f"receipt {row['key'][:16]}: {'claimable again' if action == 'rerun' else 'failed'}")


@receipts.command("purge", short_help="Delete receipts (asks first).")
@_db_option
@click.option("--older-than-days", type=click.FloatRange(min=0.0), default=0.0, show_default=True)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    callback=_statuses,
    help="Statuses to purge (default completed, failed, pending, skipped).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def receipts_purge(db: str, older_than_days: float, statuses: tuple[str, ...], yes: bool) -> None:
    """Delete receipts (and their outputs); never those under a live lease.

    Completed receipts are what makes a rerun free: purging them means paying again.
    """
    from stores import ReceiptStatus

    store = _open(db)
    chosen = [ReceiptStatus(s) for s in statuses] or None
    wanted = [s.value for s in chosen] if chosen else ["completed", "failed", "pending", "skipped"]
    older_than_s = older_than_days * 86400.0
    count = _purgeable(db, wanted, older_than_s)
    what = ", ".join(wanted[:-1]) + f" or {wanted[-1]}" if len(wanted) > 1 else wanted[0]
    age = f" older than {older_than_days:g} days" if older_than_days else ""
    if count == 0:
        store.close()
        click.echo(f"no {what} receipts{age} in {db} (outside a live lease): nothing to purge")
        return
    question = (
        f"delete {_plural(count, 'receipt')} ({what}{age}) from {db}? (calls they cached will be paid again)"
    )
    try:
        agreed = yes or click.confirm(question)
    except click.Abort:  # no answer (stdin closed): the same as no
        agreed = False
    if not agreed:
        store.close()
        click.echo("nothing deleted")
        return
    removed = store.purge(older_than_s=older_than_s, statuses=chosen)
    store.close()
    click.echo(f"purged {_plural(removed, 'receipt')}")


def _purgeable(db: str, statuses: list[str], older_than_s: float) -> int:
    """How many receipts ``purge`` would delete now (same rule: old enough, one of
    ``statuses``, not under a live lease)."""
    import time

    now = time.time()
    rows = _query(
        db,
        "select count(*) as n from receipts where updated_at <= ? and status in "
        f"({', '.join('?' for _ in statuses)}) and not coalesce(lease_expires_at > ?, false)",
        [now - older_than_s, *statuses, now],
    )
    return int(rows[0]["n"])


# -- salvage ------------------------------------------------------------------------


@main.group(short_help="Outputs paid for but not yet stored.")
def salvage() -> None:
    """Outputs that were paid for but could not be stored."""


def _salvage_option(fn: Any) -> Any:
    return click.option(
        "--salvage", "salvage_path", default=None, help="Salvage file (default: DB.salvage.jsonl)."
    )(fn)


@salvage.command("ls", short_help="List salvaged outputs.")
@_db_option
@_salvage_option
def salvage_ls(db: str, salvage_path: str | None) -> None:
    """List salvaged outputs."""
    from ..salvage import SalvageLog

    path = salvage_path or _salvage_default(db)
    if not os.path.exists(path):
        if salvage_path is not None:
            raise ConfigError(f"no salvage file at {salvage_path}")
        if not _is_url(db) and not os.path.exists(db):
            raise ConfigError(f"no receipt store at {db} (and no salvage file at {path})")
    log = SalvageLog(path)
    try:
        entries = log.entries()
        unreadable = log.unreadable()
    except OSError as exc:
        raise ConfigError(f"cannot read the salvage file {path}: {exc.strerror or exc}") from None
    table = Table("key", "org", "tool", "attempts", "error")
    for e in entries:
        table.add_row(e.receipt_key[:16], e.org_id, e.tool_id, str(e.completion_attempts), e.error[:60])
    Console().print(table)
    click.echo(
        f"{len(entries)} salvaged" + (f"; {unreadable} unreadable lines left in {path}" if unreadable else "")
    )


@salvage.command("replay", short_help="Write salvaged outputs into the store.")
@_db_option
@_salvage_option
def salvage_replay(db: str, salvage_path: str | None) -> None:
    """Write salvaged outputs into the receipt store; keep what cannot be replayed yet."""
    from ..salvage import NotASalvageFileError, SalvageLog

    store = _open(db)
    path = salvage_path or _salvage_default(db)
    if not os.path.exists(path):  # a healthy store: nothing to replay, nothing to create
        store.close()
        if salvage_path is not None:
            raise ConfigError(f"no salvage file at {salvage_path}")
        click.echo(f"no salvage file at {path}: nothing to replay")
        return
    try:
        report = SalvageLog(path).replay(store)
    except NotASalvageFileError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"cannot replay the salvage file {path}: {exc.strerror or exc}") from None
    finally:
        store.close()
    click.echo(
        f"completed {report.completed}, already completed {report.already_completed}, kept {report.kept}"
        + (f", {report.unreadable} unreadable lines left in the file" if report.unreadable else "")
    )


if __name__ == "__main__":
    main(prog_name="tooldispatch")
