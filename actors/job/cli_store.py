"""The ``tooldispatch receipts`` and ``tooldispatch salvage`` command groups (click).

``receipts`` inspects and maintains the receipt store (stats, ls, show, cost, resolve, purge);
``salvage`` lists and replays outputs that were paid for but could not be stored. Both
work on a SQLite file or a ``postgresql://`` URL (``--db``, env ``TOOLDISPATCH_DB``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import click
import orjson
from rich.table import Column, Table

from actors.job.cli_common import (
    ConfigError,
    cell,
    db_option,
    is_url,
    open_db,
    plain_console,
    salvage_default,
)

__all__ = ["receipts", "salvage"]


# -- receipts -----------------------------------------------------------------------


def _salvage_option(fn: Any) -> Any:
    return click.option(
        "--salvage",
        "salvage_path",
        default=None,
        help="Salvage file (default: DB.salvage.jsonl; for a postgresql:// DB, "
        "tooldispatch-salvage.jsonl in the working directory).",
    )(fn)


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
    """Rows of a read-only query (``?`` placeholders) on the receipts table of ``db``; a
    query the store cannot answer (a table changed by hand) is a one-line error."""
    import sqlite3

    store = open_db(db)
    try:
        if is_url(db):
            try:
                return store.query(sql.replace("?", "%s"), params)  # type: ignore[no-any-return]
            except Exception as exc:  # psycopg's errors (an optional dependency)
                raise ConfigError(f"{db}: the receipts table cannot be read: {exc}") from None
    finally:
        store.close()
    import sqlite_utils

    try:
        return list(sqlite_utils.Database(db).query(sql, params))
    except sqlite3.Error as exc:
        raise ConfigError(f"{db}: the receipts table cannot be read: {exc}") from None


@click.group(short_help="Inspect and maintain the receipt store.")
def receipts() -> None:
    """Inspect and maintain the receipt store."""


@receipts.command("stats", short_help="Receipts per tool and status.")
@db_option
def receipts_stats(db: str) -> None:
    """Receipts per tool and status."""
    rows = _query(
        db, "select tool_id, status, count(*) as n from receipts group by tool_id, status order by 1, 2", []
    )
    table = Table("tool", "status", "receipts")
    for row in rows:
        table.add_row(cell(row["tool_id"]), cell(row["status"]), cell(row["n"]))
    plain_console().print(table)


@receipts.command("ls", short_help="The most recently updated receipts.")
@db_option
@click.option("--status", default=None, callback=_statuses, help="Only this status.")
@click.option(
    "--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Most receipts listed."
)
def receipts_ls(db: str, status: str | None, limit: int) -> None:
    """The most recently updated receipts."""
    where, params = ("where status = ?", [status]) if status else ("", [])
    rows = _query(
        db,
        f"select key, org_id, tool_id, input_text, status, attempts, updated_at from receipts {where} "
        "order by updated_at desc limit ?",
        [*params, limit],
    )
    console = plain_console()
    table = _ls_table(rows, compact=False)
    natural = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    if natural > console.width:  # a narrow terminal: room for the input
        table = _ls_table(rows, compact=True)
    console.print(table)


@receipts.command("cost", short_help="What the receipts cost when paid, by tool, provider, org, day or run.")
@db_option
@click.option(
    "--by", "by", type=click.Choice(["tool", "provider", "org", "day", "run"]), default="tool",
    show_default=True,
    help="Sum per tool id, per provider (needs --play), per org, per UTC day the calls were paid, or "
    "per run that stored them.",
)  # fmt: skip
@click.option(
    "--play", "play_spec", default=None, metavar="PLAY", help="The play whose tools name providers."
)
@click.option(
    "--since",
    default=None,
    help="Only calls paid since then: a duration back from now (36h, 7d, 2w) or a date (2026-12-01, UTC).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the lines as JSON (amounts as text).")
def receipts_cost(db: str, by: str, play_spec: str | None, since: str | None, as_json: bool) -> None:
    """What the receipts cost when their calls were paid (Tool.price), summed per group
    and currency. A receipt keeps its latest payment: a refresh replaces its cost, and a
    purged receipt is gone."""
    from actors.job.ledger import cost_lines, parse_since

    providers: dict[str, str] = {}
    if by == "provider":
        if play_spec is None:
            raise ConfigError("--by provider needs --play PLAY: receipts keep their tool, not its provider")
        from actors.job.play import PlayLoadError, load_play

        try:
            providers = {t.tool_id: t.provider_name for t in load_play(play_spec).tools}
        except PlayLoadError as exc:
            raise ConfigError(str(exc)) from None
    where, params = "where (cost is not null or status = 'completed')", []
    if since is not None:
        try:
            since_s = parse_since(since, time.time())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        where += " and completed_at >= ?"
        params.append(since_s)
    columns = "tool_id, org_id, status, cost, completed_at, lease_owner_run_id"
    rows = _query(db, f"select {columns} from receipts {where}", params)
    try:
        lines = cost_lines(rows, by, providers)
    except ValueError as exc:  # a sum past what Money holds
        raise ConfigError(str(exc)) from None
    if as_json:
        click.echo(
            orjson.dumps(
                [
                    {
                        by: line.group,
                        "spent": None if line.spent is None else f"{line.spent.amount:f}",
                        "currency": None if line.spent is None else line.spent.currency,
                        "paid": line.paid,
                        "unpriced": line.unpriced,
                    }
                    for line in lines
                ],
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return
    if not lines:
        click.echo(f"no paid receipts in {db}" + (f" since {since}" if since else ""))
        return
    table = Table(by, Column("spent", justify="right"), Column("paid", justify="right"),
                  Column("unpriced", justify="right"))  # fmt: skip
    for line in lines:
        spent = "-" if line.spent is None else str(line.spent)
        table.add_row(cell(line.group), spent, str(line.paid), str(line.unpriced or ""))
    plain_console().print(table)


LS_INPUT_CHARS = 48
"""Most characters of a receipt's input ``receipts ls`` shows (``show`` shows what is kept)."""

LS_KEY_CHARS, LS_NARROW_KEY_CHARS = 16, 10
"""Characters of a receipt key ``receipts ls`` shows (a prefix ``show`` and ``resolve``
take), and on a terminal too narrow for the whole table."""


def _ls_table(rows: list[dict[str, Any]], *, compact: bool) -> Table:
    """The ``receipts ls`` table. ``compact``, for a terminal too narrow for the whole of
    it (80 columns): what a receipt was for keeps the room, wrapped over lines rather than
    cut, and the rest gives way: a shorter key prefix (still whole, never cut with ``…``),
    the org in the title when every receipt listed has the same one, ``tries`` for
    ``attempts``."""
    orgs = {cell(row["org_id"]) for row in rows}
    with_org = not compact or len(orgs) != 1
    key_chars = LS_NARROW_KEY_CHARS if compact else LS_KEY_CHARS
    columns = [Column("key", no_wrap=True, min_width=key_chars)]
    if with_org:
        columns.append(Column("org", no_wrap=compact))
    columns += [
        Column("tool", no_wrap=compact),
        Column("input", overflow="fold") if compact else Column("input"),
        Column("status", no_wrap=compact),
        Column("tries" if compact else "attempts", no_wrap=compact),
    ]
    title = f"org {next(iter(orgs))}" if not with_org else None
    table = Table(*columns, title=title)
    for row in rows:
        org = [cell(row["org_id"])] if with_org else []
        shown = (cell(row[name]) for name in ("status", "attempts"))
        table.add_row(
            cell(row["key"])[:key_chars], *org, cell(row["tool_id"]), input_cell(row["input_text"]), *shown
        )
    return table


def input_cell(text: Any, width: int = LS_INPUT_CHARS) -> str:
    """What a receipt was for, in at most ``width`` characters: its kept input (cut, ending
    in ``…``), ``(not kept)`` when its tool keeps none, ``(not recorded)`` for a receipt
    written before inputs were kept (or by a salvage replay)."""
    if text is None:
        return "(not recorded)"
    shown = cell(text)
    if shown == "":
        return "(not kept)"
    shown = " ".join(shown.split())  # one line in a table
    return shown if len(shown) <= width else shown[: width - 1] + "\u2026"


@receipts.command("show", short_help="One receipt as JSON.")
@click.argument("key")
@db_option
def receipts_show(key: str, db: str) -> None:
    """One receipt (KEY may be a unique prefix), as JSON, with what it was for
    (``input_text``: its canonical input, or its tool's digest of it)."""
    rows = _query(db, "select * from receipts where key like ? limit 2", [f"{key}%"])
    if len(rows) != 1:
        raise ConfigError(f"{'no' if not rows else 'more than one'} receipt matches {key!r}")
    from stores.codec import UnreadableOutput, decode_stored
    from stores.rows import INPUT_TEXT_MAX_CHARS

    row = dict(rows[0])
    # what it was for, next to the tool: as kept (null: not recorded, "": its tool keeps none)
    kept = row.pop("input_text", None)
    if isinstance(kept, str) and len(kept) > INPUT_TEXT_MAX_CHARS:  # longer only if set by hand
        kept = kept[: INPUT_TEXT_MAX_CHARS - 1] + "\u2026"
    at = list(row).index("tool_id") + 1
    row = {**dict(list(row.items())[:at]), "input_text": kept, **dict(list(row.items())[at:])}
    output = decode_stored(row["output"]) if row["output"] else None
    if type(output) is UnreadableOutput:  # shown as stored, with why it cannot be read
        row["output_unreadable"] = output.problem
        output = output.text
    row["output"] = output
    if _last_good(db, row):
        row["note"] = (
            "a refresh of this receipt has an uncertain outcome (its request may have reached the "
            "provider): ordinary calls get the output stored at completed_at, its last good one "
            "(marked refresh_uncertain); a forced or stale re-run is refused until `tooldispatch "
            f"receipts resolve {str(row['key'])[:16]} --rerun | --fail` (either keeps that output)"
        )
    try:
        click.echo(orjson.dumps(row, option=orjson.OPT_INDENT_2, default=_shown).decode())
    except TypeError:  # an exact-form output orjson cannot write (NaN, a lone surrogate...)
        import json

        click.echo(json.dumps(row, indent=2, default=_shown))


def _last_good(db: str, row: dict[str, Any]) -> bool:
    """Whether ``row`` is an uncertain refresh that kept its last good output (as the store
    reads it: a receipt whose stored values cannot be read keeps none)."""
    if row.get("status") != "uncertain" or row.get("completed_at") is None:
        return False
    store = open_db(db)
    try:
        (receipt,) = store.get_many(str(row["org_id"]), [str(row["key"])])
    finally:
        store.close()
    return receipt is not None and receipt.completed_at is not None


def _shown(value: object) -> str:
    """A column value JSON has no form for (a BLOB written by hand): as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return repr(value)


@receipts.command("resolve", short_help="Decide an uncertain receipt: --rerun or --fail.")
@click.argument("key")
@db_option
@click.option(
    "--rerun",
    is_flag=True,
    help="Claimable again (same idempotency key; a batch member goes in a new request).",
)
@click.option("--fail", "fail_", is_flag=True, help="Record it failed (later calls are refused).")
@click.option("--note", default="", help="Text kept with the decision.")
@_salvage_option
def receipts_resolve(
    key: str, db: str, rerun: bool, fail_: bool, note: str, salvage_path: str | None
) -> None:
    """Decide a receipt whose outcome is uncertain (KEY may be a unique prefix).

    A call to a tool that is not retry-safe whose request may have reached the provider
    (it timed out or lost its connection after sending, or its process died while it
    ran) is recorded uncertain and never re-run silently. Check with the provider (the
    call sent the receipt's idempotency key), then --rerun (the next run calls it again,
    with the same Idempotency-Key, so a provider that honours it answers from its records)
    or --fail (later calls are refused with the recorded error). A refresh that kept the
    receipt's previous output is completed with that output again either way. When the
    salvage file holds the receipt's output (its run paid for it, but could not store
    it), it is replayed first: a receipt it completes needs no decision.
    """
    from stores.types import ReceiptStatus, ResolveAction

    if rerun == fail_:
        raise ConfigError("say what to do: --rerun or --fail (one of them)")
    action = "rerun" if rerun else "fail"
    if salvage_path is not None and not os.path.exists(salvage_path):
        raise ConfigError(f"no salvage file at {salvage_path}")
    rows = _query(db, "select org_id, key, status from receipts where key like ? limit 2", [f"{key}%"])
    if len(rows) != 1:
        raise ConfigError(f"{'no' if not rows else 'more than one'} receipt matches {key!r}")
    row = rows[0]
    store = open_db(db)
    try:
        replayed = _replay_first(store, row["org_id"], row["key"], salvage_path or salvage_default(db))
        (receipt,) = store.get_many(row["org_id"], [row["key"]])  # a status it cannot read: uncertain
        if replayed and receipt is not None and receipt.status is ReceiptStatus.COMPLETED:
            click.echo(
                f"receipt {row['key'][:16]}: completed with the output its run paid for, from the "
                f"salvage file {replayed}: nothing to resolve"
            )
            return
        if receipt is None or receipt.status is not ReceiptStatus.UNCERTAIN:
            status = receipt.status.value if receipt is not None else "gone"
            raise ConfigError(f"receipt {row['key'][:16]} is {status}, not uncertain: nothing to resolve")
        resolved = store.resolve(
            row["org_id"], row["key"], ResolveAction(action), note=note or "resolved by an operator"
        )
    finally:
        store.close()
    if resolved is not None and resolved.status is ReceiptStatus.COMPLETED:  # an uncertain refresh
        click.echo(
            f"receipt {row['key'][:16]}: completed with its last good output (a refresh runs it again)"
        )
        return
    click.echo(f"receipt {row['key'][:16]}: {'claimable again' if action == 'rerun' else 'failed'}")


def _replay_first(store: Any, org_id: str, key: str, path: str) -> str | None:
    """Replay the salvage file at ``path`` when it holds an output for ``key``: the path
    if it did (None: no file there, or nothing for this key)."""
    from actors.flusher.salvage import NotASalvageFileError, SalvageLog

    log = SalvageLog(path)
    try:
        if not log.salvaged(org_id, [key]):
            return None
        log.replay(store)
    except NotASalvageFileError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(
            f"cannot replay the salvage file {path} (it may hold this receipt's output): {why}"
        ) from None
    return path


@receipts.command("purge", short_help="Delete receipts (asks first).")
@db_option
@click.option(
    "--older-than-days",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Only receipts last changed at least this many days ago (by the store's clock).",
)
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

    store = open_db(db)
    chosen = [ReceiptStatus(s) for s in statuses] or None
    wanted = [s.value for s in chosen] if chosen else ["completed", "failed", "pending", "skipped"]
    older_than_s = older_than_days * 86400.0
    count = _purgeable(db, wanted, older_than_s)
    what = ", ".join(wanted[:-1]) + f" or {wanted[-1]}" if len(wanted) > 1 else wanted[0]
    age = (
        f" older than {older_than_days:g} {'day' if older_than_days == 1 else 'days'}"
        if older_than_days
        else ""
    )
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

    marks = ", ".join("?" for _ in statuses)
    if is_url(db):  # the database's clock, as the store's purge judges (this host's may be off)
        now = "(select extract(epoch from now())::float8)"
        sql = (
            f"select count(*) as n from receipts where updated_at <= {now} - ? and status in ({marks}) "
            f"and not coalesce(lease_expires_at > {now}, false)"
        )
        return int(_query(db, sql, [older_than_s, *statuses])[0]["n"])
    now_s = time.time()  # SQLite: one host, and the store's clock is this one
    rows = _query(
        db,
        f"select count(*) as n from receipts where updated_at <= ? and status in ({marks}) "
        "and not coalesce(lease_expires_at > ?, false)",
        [now_s - older_than_s, *statuses, now_s],
    )
    return int(rows[0]["n"])


# -- salvage ------------------------------------------------------------------------


@click.group(short_help="Outputs paid for but not yet stored.")
def salvage() -> None:
    """Outputs that were paid for but could not be stored."""


@salvage.command("ls", short_help="List salvaged outputs.")
@db_option
@_salvage_option
def salvage_ls(db: str, salvage_path: str | None) -> None:
    """List salvaged outputs."""
    from actors.flusher.salvage import SalvageLog

    path = salvage_path or salvage_default(db)
    if not os.path.exists(path):
        if salvage_path is not None:
            raise ConfigError(f"no salvage file at {salvage_path}")
        if not is_url(db) and not os.path.exists(db):
            raise ConfigError(f"no receipt store at {db} (and no salvage file at {path})")
    log = SalvageLog(path)
    try:
        entries = log.entries()
        unreadable = log.unreadable()
    except OSError as exc:
        raise ConfigError(f"cannot read the salvage file {path}: {exc.strerror or exc}") from None
    table = Table("key", "org", "tool", "attempts", "error")
    for e in entries:
        shown = (e.org_id, e.tool_id, e.completion_attempts)
        table.add_row(cell(e.receipt_key)[:16], *map(cell, shown), cell(e.error)[:60])
    plain_console().print(table)
    click.echo(
        f"{len(entries)} salvaged" + (f"; {unreadable} unreadable lines left in {path}" if unreadable else "")
    )


@salvage.command("replay", short_help="Write salvaged outputs into the store.")
@db_option
@_salvage_option
def salvage_replay(db: str, salvage_path: str | None) -> None:
    """Write salvaged outputs into the receipt store; keep what cannot be replayed yet."""
    from actors.flusher.salvage import NotASalvageFileError, SalvageLog

    store = open_db(db)
    path = salvage_path or salvage_default(db)
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
        + (f", {report.superseded} superseded by a later output of its call" if report.superseded else "")
        + (f", {report.unreadable} unreadable lines left in the file" if report.unreadable else "")
    )
