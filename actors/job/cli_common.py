"""What the ``tooldispatch`` commands share: defaults, the ``--db`` option, one-line errors."""

from __future__ import annotations

import os
from typing import Any

import click

__all__ = [
    "CONTEXT",
    "DB_HELP",
    "DEFAULT_DB",
    "EXIT_CODES",
    "ConfigError",
    "cell",
    "db_option",
    "is_url",
    "open_db",
    "plain_console",
    "salvage_default",
]

DEFAULT_DB = os.path.join(".tooldispatch", "receipts.db")
EXIT_CODES = """\b
Exit codes:
  0    every row succeeded
  1    some rows failed (each is in the output with its error; the report groups them)
  2    usage or configuration error, or the input cannot be read or the output
       cannot be written (one line, no traceback)
  130  interrupted (Ctrl-C or SIGTERM): calls not yet sent were refused and their
       receipts released, requests already sent finished and were stored; run the
       same command again to resume (finished calls are not paid again). A second
       signal aborts: requests in flight get up to 8 s, the exit comes within 10 s."""
CONTEXT = {"help_option_names": ["-h", "--help"]}
DB_HELP = "Receipt store: a SQLite file, or a postgresql:// URL (env TOOLDISPATCH_DB)."


def is_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def salvage_default(db: str) -> str:
    """Where a run on ``db`` salvages by default (as actors.system does for its store)."""
    return os.path.abspath("tooldispatch-salvage.jsonl") if is_url(db) else f"{db}.salvage.jsonl"


class ConfigError(click.ClickException):
    """A usage or configuration error: one line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"tooldispatch: error: {self.format_message()}", err=True)


def db_option(fn: Any) -> Any:
    return click.option(
        "--db", default=DEFAULT_DB, show_default=True, envvar="TOOLDISPATCH_DB", help=DB_HELP
    )(fn)


def open_db(db: str) -> Any:
    from stores import StoreError, open_store

    if not is_url(db) and not os.path.exists(db):
        raise ConfigError(
            f"no receipt store at {db}: give the run's store with --db PATH (or TOOLDISPATCH_DB; "
            "examples/demo.py keeps its own in .tooldispatch-demo/receipts.db)"
        )
    try:
        return open_store(db)
    except (StoreError, ValueError) as exc:  # ValueError: a bad schema name, say
        raise ConfigError(str(exc)) from None


def plain_console(**kwargs: Any) -> Any:
    """A rich console that prints text as it is: no markup, emoji codes or highlighting.
    What it prints comes from users' plays and stores (tool ids, error texts, paths): a
    ``[/x]`` in an error made rich raise MarkupError and the end-of-run report crash."""
    from rich.console import Console

    return Console(markup=False, emoji=False, highlight=False, **kwargs)


def cell(value: Any) -> str:
    """A stored column value as table text, whatever its type (a BLOB or a number where
    text belongs, set by hand: rich renders only text, and raised NotRenderableError)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)
