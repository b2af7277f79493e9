"""``tooldispatch receipts ls`` and ``show`` say what each receipt was for: its call's
canonical input (shortened in ``ls``), a failed one's too, or the digest a tool that must
not store its inputs chose. Real processes: ``examples/provider.py`` and the CLI."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.scenario

EMAIL_PLAY = """
from actors import Tool


def verify(input, ctx):
    if input["email"].startswith("bad"):
        raise ValueError("mailbox does not exist")
    return {"valid": True}


def masked(input):
    user, _, domain = input["email"].partition("@")
    return user[:1] + "…@" + domain


tools = [Tool(tool_id="verify", fn=verify, provider="mail", keep_input=masked)]


def play(row, ctx):
    return ctx.tool("verify", {"email": row})
"""


def _ls(cli, db, *extra):
    done = cli.run("receipts", "ls", "--db", db, *extra)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if line.strip().startswith("│") and len(cells) == 6:
            rows[cells[0]] = dict(zip(("org", "tool", "input", "status", "attempts"), cells[1:], strict=True))
    return rows


def test_cli_receipts_ls_and_show_say_which_domain_each_receipt_was_for(cli, provider, tmp_path):
    long_name = "x" * 200 + ".example.fr"
    rows = tmp_path / "domains.txt"
    rows.write_text("lemonde.fr\nlocalhost\n" + long_name + "\n", encoding="utf-8")
    db = tmp_path / "r.db"
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url)
    done = cli.run("run", cli.examples / "domains_play.py", "--input", rows, "--db", db, env=env)
    assert done.returncode == 1, done.stderr[-3000:]  # localhost is not a domain name: that row failed

    listed = _ls(cli, db)
    by_input = {row["input"]: (key, row) for key, row in listed.items()}
    assert by_input['{"domain":"lemonde.fr"}'][1]["status"] == "completed"
    assert by_input['{"domain":"localhost"}'][1]["status"] == "failed"  # a failed one says what it was for
    assert by_input['{"code":"FR"}'][1]["tool"] == "country"
    cut = [text for text in by_input if text.startswith('{"domain":"xxx')]
    assert len(cut) == 1 and cut[0].endswith("…") and len(cut[0]) <= 48, cut  # shortened in ls

    failed = _ls(cli, db, "--status", "failed")
    assert [row["input"] for row in failed.values()] == ['{"domain":"localhost"}']
    key = next(iter(failed))
    shown = cli.run("receipts", "show", key, "--db", db)
    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["input_text"] == '{"domain":"localhost"}'
    assert list(receipt)[:5] == ["key", "org_id", "scope", "tool_id", "input_text"]  # next to the tool
    assert receipt["status"] == "failed" and "not a domain name" in receipt["error"]
    long_key = by_input[cut[0]][0]
    whole = json.loads(cli.run("receipts", "show", long_key, "--db", db).stdout)["input_text"]
    assert whole == json.dumps({"domain": long_name}, separators=(",", ":"))  # show: as kept, whole here


def test_cli_receipts_of_a_tool_that_keeps_no_input_show_its_digest_only(cli, tmp_path):
    play = tmp_path / "email_play.py"
    play.write_text(EMAIL_PLAY, encoding="utf-8")
    rows = tmp_path / "emails.txt"
    rows.write_text("ada.lovelace@example.com\nbad.address@example.org\n", encoding="utf-8")
    db = tmp_path / "r.db"
    done = cli.run("run", play, "--input", rows, "--db", db)
    assert done.returncode == 1, done.stderr[-3000:]

    listed = _ls(cli, db)
    assert sorted((row["input"], row["status"]) for row in listed.values()) == [
        ("a…@example.com", "completed"),
        ("b…@example.org", "failed"),
    ]
    for key in listed:
        shown = cli.run("receipts", "show", key, "--db", db)
        assert shown.returncode == 0, shown.stderr
        assert "ada.lovelace" not in shown.stdout and "bad.address" not in shown.stdout
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("r.db*"))
    assert b"ada.lovelace" not in stored and b"bad.address" not in stored  # not in the store at all


PLAIN_EMAIL_PLAY = EMAIL_PLAY.replace(", keep_input=masked", "")


def _ls_narrow(cli, db, columns):
    """``receipts ls`` at ``columns`` columns as ``{key: (tool, input, status)}``, a cell
    wrapped over lines joined back; checks that no line is wider than the terminal."""
    done = cli.run("receipts", "ls", "--db", db, env=cli.env(COLUMNS=str(columns)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), done.stdout
    header = next(line for line in lines if line.startswith("┃"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    rows: list[dict[str, str]] = []
    for line in lines:
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0]:
            rows.append(dict(zip(names, cells, strict=True)))
        else:  # a cell wrapped onto this line
            for name, piece in zip(names, cells, strict=True):
                rows[-1][name] += piece
    return done.stdout, {row["key"]: (row["tool"], row["input"], row["status"]) for row in rows}


def test_cli_receipts_ls_at_80_columns_gives_the_input_room_to_be_read(cli, tmp_path):
    play = tmp_path / "email_play.py"
    play.write_text(PLAIN_EMAIL_PLAY, encoding="utf-8")
    emails = ["ada.lovelace@example.com", "bad.address@example.org", "grace.hopper@navy.example.mil"]
    rows = tmp_path / "emails.txt"
    rows.write_text("".join(f"{e}\n" for e in emails), encoding="utf-8")
    db = tmp_path / "r.db"
    assert cli.run("run", play, "--input", rows, "--db", db).returncode == 1  # bad.address failed

    out, listed = _ls_narrow(cli, db, 80)

    assert sorted(listed.values()) == [
        ("verify", '{"email":"ada.lovelace@example.com"}', "completed"),
        ("verify", '{"email":"bad.address@example.org"}', "failed"),
        ("verify", '{"email":"grace.hopper@navy.example.mil"}', "completed"),
    ], out
    assert "org default" in out  # the one org listed, named once
    for key, (_, text, _) in listed.items():  # a whole prefix, never cut with "…": show takes it
        assert len(key) >= 10 and all(c in "0123456789abcdef" for c in key), out
        shown = cli.run("receipts", "show", key, "--db", db)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["input_text"] == text


def test_cli_receipts_ls_on_a_store_from_before_inputs_were_kept(cli, tmp_path):
    import sqlite3

    import sqlite_utils

    from stores.sqlite.schema import add_v2, create_v1

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    create_v1(sqlite_utils.Database(conn))
    add_v2(sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version = 2")
    conn.execute(
        "INSERT INTO receipts (key, org_id, scope, tool_id, status, input_hash, output, attempts, "
        "created_at, updated_at, completed_at, generation) "
        "VALUES (?, 'default', 'play', 'lookup', 'completed', ?, '{}', 1, 1.0, 1.0, 1.0, 1)",
        ("c" * 64, "0" * 64),
    )
    conn.close()

    listed = _ls(cli, db)
    assert [row["input"] for row in listed.values()] == ["(not recorded)"]
    shown = json.loads(cli.run("receipts", "show", "c" * 16, "--db", db).stdout)
    assert shown["input_text"] is None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 5  # opened, and migrated
