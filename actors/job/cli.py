"""The ``tooldispatch`` command line (click).

``tooldispatch run PLAY --input FILE`` runs a play over rows; ``receipts`` and
``salvage`` inspect and maintain the receipt store. Exit codes of ``run``: see
:data:`EXIT_CODES`. ``-h`` and ``--help`` work on every command.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import uuid
from typing import Any, NoReturn

import click

from actors.checks import check_weight
from actors.job.cli_common import (
    CONTEXT,
    DB_HELP,
    DEFAULT_DB,
    EXIT_CODES,
    ConfigError,
    plain_console,
    salvage_default,
)
from actors.job.cli_store import receipts, salvage


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
    """The rows of ``path`` (:func:`actors.job.rows.count_rows`: records, for CSV), the
    progress line's total; None when it cannot be read."""
    from actors.job.rows import count_rows

    try:
        return count_rows(path)
    except OSError:
        return None


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
@click.option(
    "--runtime",
    type=click.Choice(["threads", "gevent"]),
    default="threads",
    show_default=True,
    help="Run rows on threads, or on greenlets (re-executes the command under gevent).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Most rows at once (default 256; 1000 under gevent); a run adds row workers as rows wait.",
)
@click.option(
    "--pacer",
    default=None,
    envvar="TOOLDISPATCH_PACER",
    help="Pacing shared by every worker: redis://host:port/db[?prefix=NAME] (env TOOLDISPATCH_PACER; "
    "default: this process paces alone).",
)
@click.option(
    "--fairness-key",
    default=None,
    metavar="KEY",
    help="Whose share of each provider's rate this run's calls take, among the runs sharing a pacer "
    "(a customer id, a play; default: the run itself): runs that all want more than the rate get "
    "their weighted shares (docs/pacing.md).",
)
@click.option(
    "--weight",
    "fairness_weight",
    type=float,
    default=1.0,
    show_default=True,
    help="The --fairness-key's weight among the keys sharing a provider's rate (1e-6 to 1e6).",
)
@click.option(
    "--shard",
    default=None,
    metavar="I/N",
    help="Worker I of N (0 <= I < N): run only the rows whose 0-based index % N == I.",
)
@click.option(
    "--report-json",
    "report_json_path",
    default=None,
    metavar="FILE",
    help="Also write the report as JSON to FILE (what was spent and saved, calls, providers; docs/cli.md).",
)
@click.option(
    "--report-html",
    "report_html_path",
    default=None,
    metavar="FILE",
    help="Also write the report as a self-contained HTML page to FILE, with a chart per provider "
    "of requests accepted, 429s and the pacing rate over the run (docs/cli.md).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Send nothing: say which rows receipts answer, which calls the run would pay for and "
    "what they would cost (docs/cli.md).",
)
@click.option(
    "--budget",
    default=None,
    metavar="MONEY",
    help="The run's budget in money, e.g. 25USD: a call that would pass it is refused before it "
    "is sent, its receipt left for a later run.",
)
@click.option(
    "--budget-provider",
    "budget_providers",
    multiple=True,
    metavar="NAME=MONEY",
    help="A provider's own budget in money, e.g. acme=10USD (repeatable).",
)
@click.option(
    "--otel",
    is_flag=True,
    help="Export OpenTelemetry traces and metrics over OTLP/HTTP, as the OTEL_* variables say "
    "(OTEL_EXPORTER_OTLP_ENDPOINT; needs tooldispatch[otel]; docs/telemetry.md).",
)
def run(
    play_spec: str, input_path: str, output_path: str | None, db: str, run_id: str | None, org: str,
    scope: str | None, force_refresh: bool, retry_failed: bool, runtime: str, concurrency: int | None,
    pacer: str | None, fairness_key: str | None, fairness_weight: float, shard: str | None,
    report_json_path: str | None, report_html_path: str | None,
    dry_run: bool, budget: str | None, budget_providers: tuple[str, ...], otel: bool,
) -> None:  # fmt: skip
    """Run PLAY (a .py file, a module, module:attr or file.py:attr) over every row of --input.

    Receipts are scoped by the play's name (the file or module name, or the attr): the
    same play under another name, or --scope, starts a new cache.
    """
    from actors.runtime.actor import runtime_name

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
    try:
        check_weight("--weight", fairness_weight)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    taken = {os.path.realpath(p): name for p, name in ((input_path, "--input"), (db, "--db"))}
    taken[os.path.realpath(salvage_default(db))] = "the salvage file"
    for suffix in ("-wal", "-shm", "-journal"):  # SQLite's own files beside the store
        taken[os.path.realpath(db + suffix)] = f"the store's {suffix[1:]} file"
    play_file = play_spec if play_spec.endswith(".py") else play_spec.rpartition(":")[0]  # file.py:attr
    if play_file.endswith(".py"):
        taken[os.path.realpath(play_file)] = "the play"
    for option, path in (
        ("--output", output_path), ("--report-json", report_json_path), ("--report-html", report_html_path),
    ):  # fmt: skip
        if path is None:
            continue
        clash = taken.get(os.path.realpath(path))
        if clash:
            raise ConfigError(f"{option} {path} is also {clash}: writing it would destroy it")
        taken[os.path.realpath(path)] = option
    if dry_run:
        if output_path is not None:
            raise ConfigError("--dry-run writes no --output: it sends nothing, so it has no results")
        if report_html_path is not None:
            raise ConfigError(
                "--dry-run writes no --report-html: it sends nothing, so it has nothing to chart"
            )
        sys.exit(_dry_run(play_spec, input_path, db, org, scope, force_refresh, retry_failed,
                          _parse_shard(shard), report_json_path))  # fmt: skip
    policy = _budget_policy(budget, budget_providers)
    code = _run(
        play_spec, input_path, output_path, db, run_id, org, scope, force_refresh, retry_failed, concurrency,
        pacer, _parse_shard(shard), report_json_path, report_html_path, policy, otel=otel,
        fairness=(fairness_key, fairness_weight),
    )  # fmt: skip
    sys.exit(code)


def _run(
    play_spec: str, input_path: str, output_path: str | None, db: str, run_id: str | None, org: str,
    scope: str | None, force_refresh: bool, retry_failed: bool, concurrency: int | None,
    pacer_url: str | None = None, shard: tuple[int, int] | None = None, report_json_path: str | None = None,
    report_html_path: str | None = None, policy: Any = None, otel: bool = False,
    fairness: tuple[str | None, float] = (None, 1.0),
) -> int:  # fmt: skip
    from actors.governor.budgets import check_money_budgets
    from actors.job.ordered import OrderedWriter
    from actors.job.play import PlayContext, PlayLoadError, load_play
    from actors.job.report import ProgressDisplay, output_line, report_table, resume_hint, tools_table
    from actors.job.runner import RunSummary, run_rows
    from actors.job.signals import Interrupts
    from actors.job.tally import CallTally
    from actors.job.views import Timeline, provider_tools
    from actors.pacing import InvalidPacerURLError, open_pacer
    from actors.runtime.actor import runtime_name
    from actors.system import DispatchSystem
    from actors.tool import RunInfo
    from stores import StoreError, open_store

    try:
        play = load_play(play_spec)
    except PlayLoadError as exc:
        raise ConfigError(str(exc)) from None
    if policy is not None:
        try:
            check_money_budgets(play.tools, policy)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    otlp = None
    if otel:  # before anything is opened: a missing extra is a configuration error
        from actors.telemetry import TelemetryUnavailableError
        from actors.telemetry.otlp import export_otlp

        try:
            otlp = export_otlp()
        except TelemetryUnavailableError as exc:
            raise ConfigError(str(exc)) from None
    rows = _rows(input_path, shard)
    try:
        pacer = open_pacer(pacer_url) if pacer_url else None
    except InvalidPacerURLError as exc:
        raise ConfigError(str(exc)) from None
    try:
        if db == DEFAULT_DB:  # the default's folder is ours to make; a given path's folder must exist
            os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
        store = open_store(db)
    except (OSError, StoreError, ValueError) as exc:  # ValueError: a bad schema name, say
        if pacer is not None:
            pacer.close()
        raise ConfigError(str(exc)) from None
    width = concurrency or (1000 if runtime_name() == "gevent" else 256)
    console = plain_console(stderr=True)
    run_info = RunInfo(
        run_id=run_id or uuid.uuid4().hex[:12], org_id=org, scope=scope or play.name,
        fairness_key=fairness[0], fairness_weight=fairness[1],
    )  # fmt: skip
    stop = threading.Event()
    tally = CallTally(play.tools)
    try:
        out = open(output_path, "wb") if output_path else None  # noqa: SIM115 - closed below
    except OSError as exc:
        store.close()
        raise ConfigError(f"cannot write the output {output_path}: {exc.strerror or exc}") from None
    interrupts = Interrupts(stop, lambda line: console.print(line, highlight=False, soft_wrap=True), out)
    interrupts.install()
    live = RunSummary()  # filled while the rows run: what an abort that cannot wait for them reports
    writer = OrderedWriter(out)
    started = time.monotonic()
    timeline = Timeline(provider_tools(play.tools, tally.local), started)  # the live view's and the page's

    def report(stats: dict[str, Any], summary: RunSummary) -> None:
        wide = console if console.is_terminal else plain_console(stderr=True, width=max(console.width, 200))
        wide.print(
            report_table(
                stats, summary, tally, play.tools, output_path, force_refresh=force_refresh,
                retry_failed=retry_failed,
            )
        )  # fmt: skip
        wide.print(tools_table(stats, tally, stopped_by="abort" if summary.aborted else "interrupt"))
        if report_json_path is not None:
            from actors.job.report_json import report_json, write_report_json

            try:
                write_report_json(report_json_path, report_json(stats, summary, tally, play.tools))
            except OSError as exc:
                console.print(
                    f"error: cannot write --report-json {report_json_path}: {exc.strerror or exc}",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
        if report_html_path is not None:
            write_html(report_html_path, stats, summary)

    def write_html(path: str, stats: dict[str, Any], summary: RunSummary) -> None:
        from actors.job.views import render_html, write_report_html

        timeline.sample(stats, time.monotonic())  # the last point: the report's totals
        status = "aborted" if summary.aborted else "interrupted" if summary.interrupted else "finished"
        table = report_table(
            stats,
            summary,
            tally,
            play.tools,
            output_path,
            force_refresh=force_refresh,
            retry_failed=retry_failed,
        )
        tools = tools_table(stats, tally, stopped_by="abort" if summary.aborted else "interrupt")
        try:
            write_report_html(path, render_html(table, tools, timeline.series(), status=status))
        except OSError as exc:
            console.print(
                f"error: cannot write --report-html {path}: {exc.strerror or exc}",
                highlight=False,
                soft_wrap=True,
            )

    def last_line(summary: RunSummary) -> str:
        how = "aborted: receipts not yet sent were released; " if summary.aborted else "interrupted: "
        system = interrupts.system
        salvaged = system.salvage.appended if system is not None else 0  # the rerun stores them
        if output_path is not None:
            return how + output_line(summary, output_path, force_refresh=force_refresh, salvaged=salvaged)
        return f"{how}{summary.rows} rows done; {resume_hint(force_refresh, salvaged)}"

    def aborted_now() -> RunSummary:  # the rows did not end in time: what is known so far
        live.aborted = live.interrupted = True
        live.wall_s = time.monotonic() - started
        live.written = writer.written
        return live

    pacing_seen: dict[str, Any] = {}

    def stats_seen() -> dict[str, Any]:
        """The system's stats, with the last pacing report seen when the stop a signal began
        has stopped the pacing already (``stats()`` then has none)."""
        stats: dict[str, Any] = interrupts.system.stats()
        if stats.get("pacing"):
            pacing_seen.update(stats["pacing"])
        elif pacing_seen:
            stats["pacing"] = dict(pacing_seen)
        return stats

    interrupts.write_out = writer.close  # the rows finished behind one that did not end
    interrupts.short_report = lambda: report(interrupts.system.stats(), aborted_now())
    interrupts.last_line = lambda: last_line(aborted_now())
    try:
        with DispatchSystem.start(
            tools=play.tools, store=store, run=run_info, policy=policy, pacer=pacer,
            telemetry=otlp.telemetry if otlp is not None else None,
        ) as system:  # fmt: skip
            interrupts.attach(system)  # a signal from now on stops it: nothing unsent goes out
            ctx = PlayContext(
                system.proxy(),
                force_refresh=force_refresh,
                retry_failed=retry_failed,
                tally=tally,
                tools=play.tools,
            )
            total = _count_rows(input_path)
            if total is not None and shard is not None:
                total = len(range(shard[0], total, shard[1]))
            progress = ProgressDisplay(console, total, stats_seen, tally=tally, timeline=timeline).start()
            summary = None
            try:
                summary = run_rows(
                    play, rows, ctx, concurrency=width, out=out, stop=stop,
                    on_row=lambda _: progress.advance(), summary=live, writer=writer,
                )  # fmt: skip
            finally:
                progress.close(final=summary is not None and summary.config_error is None)
            stats = stats_seen()
        if interrupts.aborted:  # leaving waited for the abort's stop: the requests it let finish count
            stats = {**system.stats(), "pacing": stats["pacing"]}
    finally:
        interrupts.restore()
        close_error = _close_quietly(out)
        store.close()
        if pacer is not None:
            pacer.close()
        if otlp is not None:  # what the run's last calls made, exported before the report
            otlp.shutdown()
    if interrupts.aborted:  # the rows ended in time: this thread reports, unless the abort did
        if not interrupts.may_report():
            interrupts.wait_for_abort()  # it printed its own report and ends the process
        summary.aborted = summary.interrupted = True
        try:
            report(stats, summary)
            for error in (
                summary.config_error,
                close_error and f"cannot write the output {output_path}: {close_error}",
            ):
                if error:
                    console.print(f"error: {error}", highlight=False, soft_wrap=True)
            console.print(last_line(summary), highlight=False, soft_wrap=True)
        finally:
            interrupts.reported()
        return 130
    if summary.config_error:
        done = ""
        if summary.rows:  # stopped mid-run: say what was already paid for and kept
            tools: dict[str, Any] = stats["tools"] if isinstance(stats.get("tools"), dict) else {}
            sent = sum(int(c.get("requests", 0)) for t, c in tools.items() if t not in tally.local)
            paid = (
                f"{sent} provider {'request' if sent == 1 else 'requests'} had been sent"
                " and their results are stored, so running again after the fix"
                + (
                    " with --force-refresh pays for them again (without it, they are reused)"
                    if force_refresh
                    else " does not pay for them"
                )
                if sent
                else "no provider request had been sent"
            )
            done = (
                f" (the run stopped after {summary.rows} {'row' if summary.rows == 1 else 'rows'}; {paid}"
                + (f"; rows done so far are in {output_path}" if output_path else "")
                + ")"
            )
        raise ConfigError(summary.config_error + done)
    if close_error:
        raise ConfigError(f"cannot write the output {output_path}: {close_error}")
    report(stats, summary)  # on a log or CI as wide as its names (rich would fit 80 columns)
    if summary.interrupted:
        console.print(last_line(summary), highlight=False, soft_wrap=True)
        return 130
    return 1 if summary.failed else 0


def _dry_run(
    play_spec: str, input_path: str, db: str, org: str, scope: str | None, force_refresh: bool,
    retry_failed: bool, shard: tuple[int, int] | None, report_json_path: str | None,
) -> int:  # fmt: skip
    """``run --dry-run``: the play over the rows against the receipts, nothing sent
    (:mod:`actors.job.dry_run`); a store that does not exist yet answers nothing."""
    from actors.job.dry_run import DryProxy, DryTally, dry_run_json, dry_run_rows, dry_run_table
    from actors.job.play import PlayContext, PlayLoadError, load_play
    from actors.job.report_json import write_report_json
    from actors.tool import RunInfo
    from stores import StoreError, open_store, stored_schema_version

    try:
        play = load_play(play_spec)
    except PlayLoadError as exc:
        raise ConfigError(str(exc)) from None
    rows = _rows(input_path, shard)
    from stores.sqlite.schema import SCHEMA_VERSION

    try:
        version = stored_schema_version(db)  # read without writing: a dry run upgrades nothing
    except StoreError as exc:
        raise ConfigError(str(exc)) from None
    if version is not None and version < SCHEMA_VERSION:
        raise ConfigError(
            f"the store {db} has schema version {version}; opening it upgrades it to {SCHEMA_VERSION}, "
            "and a dry run writes nothing: run without --dry-run, or `tooldispatch receipts stats --db ...` "
            "(which upgrades it), first"
        )
    fresh = version is None  # nothing made: an empty store answers
    try:
        store = open_store(":memory:" if fresh else db)
    except (OSError, StoreError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    run_info = RunInfo(run_id="dry-run", org_id=org, scope=scope or play.name)
    proxy = DryProxy(play.tools, store, run_info, DryTally())
    ctx = PlayContext(proxy, force_refresh=force_refresh, retry_failed=retry_failed, tools=play.tools)
    try:
        tally = dry_run_rows(play, rows, ctx, proxy)
    finally:
        store.close()
    console = plain_console(stderr=True)
    wide = console if console.is_terminal else plain_console(stderr=True, width=max(console.width, 200))
    wide.print(dry_run_table(tally, play.tools))
    if report_json_path is not None:
        try:
            write_report_json(report_json_path, dry_run_json(tally, play.tools))
        except OSError as exc:
            raise ConfigError(
                f"cannot write --report-json {report_json_path}: {exc.strerror or exc}"
            ) from None
    return 0


def _budget_policy(budget: str | None, by_provider: tuple[str, ...]) -> Any:
    """The :class:`~actors.tool.Policy` of ``--budget`` and ``--budget-provider`` (None:
    neither given, the default policy); a usage error for text that is not money."""
    if budget is None and not by_provider:
        return None
    from actors.tool import Policy
    from stores.money import Money

    def money(option: str, text: str) -> Money:
        try:
            return Money.parse(text)
        except ValueError as exc:  # not money at all, or an amount Money refuses (negative, say)
            shaped = re.fullmatch(r"\s*-?[0-9.]+\s*[A-Za-z]{3}\s*", text)
            why = str(exc) if shaped else "expected an amount and a currency"
            raise ConfigError(f"{option} {text!r}: {why} (write it as 25USD or '0.5 EUR')") from None

    providers: dict[str, Money] = {}
    for item in by_provider:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--budget-provider {item!r}: expected NAME=MONEY, e.g. acme=10USD")
        providers[name.strip()] = money("--budget-provider", text)
    return Policy(
        max_spend=money("--budget", budget) if budget is not None else None, max_spend_by_provider=providers
    )


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


def _rows(path: str, shard: tuple[int, int] | None) -> Any:
    """The rows of ``path`` (checked to have one), only worker I's of N with ``shard``."""
    rows = _first_rows(path)
    return _shard_rows(rows, *shard) if shard is not None else rows


def _first_rows(path: str) -> Any:
    """The rows of ``path``, after checking that it has one (a usage error otherwise)."""
    import itertools

    from actors.job.rows import InputError, read_rows

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


main.add_command(receipts)
main.add_command(salvage)


if __name__ == "__main__":
    main(prog_name="tooldispatch")
