"""The credential scope of an http_tool derives from its credentials (issue 9, section 3).

Two runs in one org and scope whose http_tools carry different ``Authorization`` headers
never share receipts: checked end to end against a real HTTP server on 127.0.0.1 that
answers with the account it was called for.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from actors import DispatchSystem, Policy, RunInfo
from actors.http import credential_scope_digest, http_tool
from actors.results import ToolContext
from stores import SqliteReceiptStore

CALL_TIMEOUT_S = 60.0
SECRET_A, SECRET_B = "Bearer sk-live-aaaaaaaaaaaaaaaa", "Bearer sk-live-bbbbbbbbbbbbbbbb"
ACCOUNTS = {SECRET_A: "account-a", SECRET_B: "account-b"}


class _Accounts(BaseHTTPRequestHandler):
    seen: Counter[str]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        auth = self.headers.get("Authorization", "")
        account = ACCOUNTS.get(auth, "anonymous") + "|" + self.path
        self.server.seen[account] += 1  # type: ignore[attr-defined]
        answer = json.dumps({"account": account, "echo": body}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Accounts)
    httpd.seen = Counter()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def _run(tmp_path: Path, url: str, run_id: str, **tool_kw: Any) -> Any:
    tool = http_tool("lookup", url, **tool_kw)
    store = SqliteReceiptStore(tmp_path / "receipts.db")
    system = DispatchSystem.start(
        tools=[tool], store=store, run=RunInfo(run_id=run_id, org_id="acme", scope="play"), policy=Policy()
    )
    try:
        result = system.proxy().execute("lookup", {"q": "same input"}).get(timeout=CALL_TIMEOUT_S)
    finally:
        system.stop()
        store.close()
        tool.fn.close()
    return result


def test_http_tool_runs_with_other_authorization_never_share_receipts(
    tmp_path: Path, server: ThreadingHTTPServer
) -> None:
    url = f"http://127.0.0.1:{server.server_port}/v1/lookup"
    first = _run(tmp_path, url, "run-a", headers={"Authorization": SECRET_A})
    second = _run(tmp_path, url, "run-b", headers={"Authorization": SECRET_B})
    again = _run(tmp_path, url, "run-a2", headers={"Authorization": SECRET_A})
    assert first.value["account"].startswith("account-a") and first.execution == "live"
    assert second.value["account"].startswith("account-b") and second.execution == "live"
    assert again.value == first.value and again.execution == "cached"  # same account: reused
    assert first.receipt_key != second.receipt_key
    assert sorted(server.seen.values()) == [1, 1]  # type: ignore[attr-defined]
    assert SECRET_A.encode() not in (tmp_path / "receipts.db").read_bytes()


def test_http_tool_api_key_in_query_string_scopes_receipts(
    tmp_path: Path, server: ThreadingHTTPServer
) -> None:
    base = f"http://127.0.0.1:{server.server_port}/v1/lookup"
    first = _run(tmp_path, f"{base}?key=k-111", "run-a")
    second = _run(tmp_path, f"{base}?key=k-222", "run-b")
    assert second.execution == "live" and first.receipt_key != second.receipt_key


def test_http_tool_explicit_credentials_scope_receipts(tmp_path: Path, server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{server.server_port}/v1/lookup"
    _run(tmp_path, url, "run-a", credentials={"account": "acct-1"})
    second = _run(tmp_path, url, "run-b", credentials={"account": "acct-2"})
    third = _run(tmp_path, url, "run-c", credentials={"account": "acct-1"})
    assert second.execution == "live" and third.execution == "cached"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"headers": {"Authorization": SECRET_A}}, {"headers": {"Authorization": SECRET_B}}),
        ({"headers": {"X-Api-Key": "a"}}, {"headers": {"x-api-key": "b"}}),
        ({"headers": {"Cookie": "sid=1"}}, {"headers": {"Cookie": "sid=2"}}),
        ({"urls": ["https://p.example/v1?api_key=1"]}, {"urls": ["https://p.example/v1?api_key=2"]}),
        ({"client": httpx.Client(headers={"Authorization": "a"})}, {"client": httpx.Client()}),
        ({"client": httpx.Client(params={"token": "a"})}, {"client": httpx.Client(params={"token": "b"})}),
        ({"client": httpx.Client(auth=("u", "p1"))}, {"client": httpx.Client(auth=("u", "p2"))}),
        ({"credentials": "acct-1"}, {"credentials": "acct-2"}),
        ({"headers": {"Authorization": "a"}}, {}),
    ],
    ids=[
        "authorization",
        "api-key-header",
        "cookie",
        "query",
        "client-header",
        "client-params",
        "client-basic-auth",
        "explicit",
        "none",
    ],
)
def test_credential_scope_digest_differs_per_credentials_and_hides_them(
    one: dict[str, Any], other: dict[str, Any]
) -> None:
    a, b = credential_scope_digest(**one), credential_scope_digest(**other)
    assert a != b
    assert a == credential_scope_digest(**one)
    for digest in (a, b):
        assert digest == "" or (len(digest) == 64 and int(digest, 16) >= 0)
    assert "sk-live" not in a + b and "p1" not in a + b


def test_credential_scope_digest_ignores_headers_that_do_not_authenticate() -> None:
    assert credential_scope_digest(headers={"Accept": "application/json", "User-Agent": "x"}) == ""
    assert credential_scope_digest(headers={"Authorization": "a", "Accept": "x"}) == credential_scope_digest(
        headers={"authorization": "a", "Accept": "y"}
    )


def test_http_tool_refuses_client_auth_it_cannot_digest_without_credentials() -> None:
    client = httpx.Client(auth=httpx.DigestAuth("user", "secret"))
    try:
        with pytest.raises(ValueError, match="credentials="):
            http_tool("lookup", "http://127.0.0.1:9/x", client=client)
        tool = http_tool("lookup", "http://127.0.0.1:9/x", client=client, credentials="acct-1")
        assert tool.credentials is not None and len(tool.credentials()) == 64
    finally:
        client.close()


def _jar(*cookies: tuple[str, str, str]) -> httpx.Cookies:
    """A cookie jar: (name, value, host) per cookie, each host under ``.example``."""
    jar = httpx.Cookies()
    for name, value, host in cookies:
        jar.set(name, value, domain=f"{host}.example")
    return jar


def _paths(*cookies: tuple[str, str]) -> httpx.Cookies:
    """A jar holding cookie ``sid`` on each (path, value) of ``p.example``."""
    jar = httpx.Cookies()
    for path, value in cookies:
        jar.set("sid", value, domain="p.example", path=path)
    return jar


def _digest(spec: dict[str, Any]) -> str:
    spec = dict(spec)
    client = httpx.Client(**spec.pop("client")) if "client" in spec else None
    try:
        return credential_scope_digest(**spec, client=client)
    finally:
        if client is not None:
            client.close()


_OTHER_ACCOUNTS = [
    pytest.param(
        {"headers": {"Authorization": "Bearer a"}, "client": {"headers": {"Authorization": "Bearer b"}}},
        {"headers": {"Authorization": "Bearer b"}, "client": {"headers": {"Authorization": "Bearer a"}}},
        id="request-vs-client-header",
    ),
    pytest.param(
        {"urls": ["http://h/one?key=a", "http://h/batch?key=b"]},
        {"urls": ["http://h/one?key=b", "http://h/batch?key=a"]},
        id="url-vs-url",
    ),
    pytest.param(
        {"urls": ["http://h/one?key=a"], "client": {"params": {"key": "b"}}},
        {"urls": ["http://h/one?key=b"], "client": {"params": {"key": "a"}}},
        id="url-vs-client-params",
    ),
    pytest.param(
        {"headers": {"Authorization": "Basic dTpwMQ=="}, "client": {"auth": ("u", "p2")}},
        {"headers": {"Authorization": "Basic dTpwMg=="}, "client": {"auth": ("u", "p1")}},
        id="header-vs-client-auth",
    ),
    pytest.param(
        {"urls": ["http://h/one?key=a&key=b"]}, {"urls": ["http://h/one?key=b&key=a"]}, id="repeated"
    ),
    pytest.param({"urls": ["https://ann:p1@h/one"]}, {"urls": ["https://ann:p2@h/one"]}, id="url-userinfo"),
    pytest.param(
        {"urls": ["https://h/one", "https://ann:p1@h/batch"]},
        {"urls": ["https://h/one", "https://bob:p1@h/batch"]},
        id="batch-url-userinfo",
    ),
    pytest.param(
        {"urls": ["https://h/one"], "client": {"cookies": {"session": "s1"}}},
        {"urls": ["https://h/one"], "client": {"cookies": {"session": "s2"}}},
        id="client-cookies",
    ),
    pytest.param(
        {"urls": ["https://h/one"], "client": {"cookies": {"session": "s1"}}},
        {"urls": ["https://h/one"]},
        id="cookie-or-none",
    ),
    pytest.param({"urls": ["https://ann:p1@h/one"]}, {"urls": ["https://h/one"]}, id="userinfo-or-none"),
    pytest.param(
        {"urls": ["one"], "client": {"base_url": "https://ann:p1@h/v1/"}},
        {"urls": ["one"], "client": {"base_url": "https://bob:p2@h/v1/"}},
        id="base-url-userinfo",
    ),
    pytest.param(
        {"headers": {"Api-Key": "K", "Api-Username": "ann"}},
        {"headers": {"Api-Key": "K", "Api-Username": "bob"}},
        id="api-username",
    ),
    pytest.param(
        {"headers": {"Authorization": "Bearer K", "OpenAI-Organization": "org-1"}},
        {"headers": {"Authorization": "Bearer K", "OpenAI-Organization": "org-2"}},
        id="organization",
    ),
    pytest.param(
        {
            "urls": ["https://p.example/one"],
            "client": {"cookies": _jar(("sid", "A", "p"), ("tok", "B", "q"))},
        },
        {
            "urls": ["https://p.example/one"],
            "client": {"cookies": _jar(("sid", "A", "q"), ("tok", "B", "p"))},
        },
        id="cookie-domain",
    ),
    pytest.param(
        {"urls": ["https://h/one?key=A", "https://h/batch"]},
        {"urls": ["https://h/one", "https://h/batch?key=A"]},
        id="key-moved-between-urls",
    ),
    pytest.param(
        {"urls": ["https://h/one?key=A", "https://h/batch?token=B"]},
        {"urls": ["https://h/one?token=B", "https://h/batch?key=A"]},
        id="keys-swapped-between-urls",
    ),
    pytest.param(
        {"urls": ["https://ann:p1@h/one", "https://h/batch"]},
        {"urls": ["https://h/one", "https://ann:p1@h/batch"]},
        id="userinfo-moved-between-urls",
    ),
    pytest.param({"headers": {b"X-Api-Key": b"k1"}}, {"headers": {b"X-Api-Key": b"k2"}}, id="bytes-headers"),
    pytest.param(
        {"urls": ["https://h/one?appid=A"], "client": {"params": {"appid": "B"}}},
        {"urls": ["https://h/one?appid=B"], "client": {"params": {"appid": "A"}}},
        id="client-params-over-url",
    ),
    pytest.param(
        {"urls": ["https://h/one?appid=A", "https://h/batch?appid=B"]},
        {"urls": ["https://h/one?appid=B", "https://h/batch?appid=A"]},
        id="wordless-key-swapped-between-urls",
    ),
    pytest.param(
        {"urls": ["https://p.example/one"], "client": {"cookies": {"li_at": "ann"}}},
        {"urls": ["https://p.example/one"], "client": {"cookies": {"li_at": "bob"}}},
        id="wordless-cookie",
    ),
    pytest.param(
        {"urls": ["https://p.example/v1/one"], "client": {"cookies": _paths(("/", "A"), ("/v1", "B"))}},
        {"urls": ["https://p.example/v1/one"], "client": {"cookies": _paths(("/", "B"), ("/v1", "A"))}},
        id="one-cookie-name-on-two-paths",
    ),
    pytest.param(
        {"urls": ["https://h/one?mode=single", "https://h/batch?mode=batch"]},
        {"urls": ["https://h/one?mode=batch", "https://h/batch?mode=single"]},
        id="params-swapped-between-urls",
    ),
    pytest.param(
        {"urls": ["https://eth.example/v2/4f9a1c2b7d3e8a6f0b5c9d2e"]},
        {"urls": ["https://eth.example/v2/9c2e7b1d4a8f3e6b0d5a1c7f"]},
        id="key-in-the-path",
    ),
    pytest.param(
        {"urls": ["https://hooks.zapier.com/hooks/catch/1234567/abc1def/"]},
        {"urls": ["https://hooks.zapier.com/hooks/catch/7654321/xyz9uvw/"]},
        id="webhook-short-ids",
    ),
    pytest.param(
        {"urls": ["https://hooks.slack.com/services/TABCD/BABCD/abcdefghijklmnopqrstuvwx"]},
        {"urls": ["https://hooks.slack.com/services/TWXYZ/BWXYZ/qwertyuiopasdfghjklzxcvb"]},
        id="webhook-secret-without-digits",
    ),
    pytest.param(
        {"urls": ["https://eoabc123.m.pipedream.net/"]},
        {"urls": ["https://eoxyz789.m.pipedream.net/"]},
        id="key-in-the-host",
    ),
    pytest.param(
        {"urls": ["https://api.telegram.org/bot123456:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage"]},
        {"urls": ["https://api.telegram.org/bot654321:BBHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage"]},
        id="bot-token-in-the-path",
    ),
    pytest.param(
        {
            "urls": [
                "https://api.telegram.org/bot123456:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage?chat_id=1"
            ]
        },
        {
            "urls": [
                "https://api.telegram.org/bot654321:BBHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage?chat_id=1"
            ]
        },
        id="bot-token-in-the-path-beside-a-query",
    ),
    pytest.param(
        {"urls": ["https://discord.com/api/webhooks/1122334455/AbCdEf123xyzAbCdEf123xyzAbCd?wait=true"]},
        {"urls": ["https://discord.com/api/webhooks/9988776655/ZyXwVu987abcZyXwVu987abcZyXw?wait=true"]},
        id="webhook-token-beside-a-query",
    ),
    pytest.param(
        {"urls": ["https://h/one?appid=A&appid=B"]},
        {"urls": ["https://h/one?appid=B&appid=A"]},
        id="wordless-key-given-twice",
    ),
    pytest.param(
        {"urls": ["https://h/one?key=%FF"]},
        {"urls": ["https://h/one?key=%FE"]},
        id="percent-escapes-not-utf8",
    ),
]
"""Pairs of configurations that send other credentials: values swapped or moved between
the places a credential is given, and every place httpx sends one."""


@pytest.mark.parametrize(("one", "other"), _OTHER_ACCOUNTS)
def test_credential_scope_digest_of_other_credentials_on_the_wire_differs(
    one: dict[str, Any], other: dict[str, Any]
) -> None:
    """Two configurations whose requests carry other credentials are other accounts."""
    assert _digest(one) != _digest(other)
    assert _digest(one) == _digest(one) != ""


def test_credential_scope_digest_per_place_ignores_what_does_not_authenticate() -> None:
    spec = {"headers": {"Authorization": "Bearer a"}, "client": {"auth": ("u", "p1")}}
    assert _digest(spec) == _digest({**spec, "client": {"auth": ("u", "p1"), "headers": {"Accept": "x"}}})


def test_credential_scope_digest_of_unambiguous_credentials_is_unchanged() -> None:
    """Digests of credentials given in one place each (every case before the per-place rule)
    stay as they were, so receipts already stored keep their keys."""
    assert credential_scope_digest(headers={"Authorization": "Bearer a"}) == (
        "a0a3ef31029151a06a7766ade86fa5b979fffd895e3c3a65250c930e9b1af09b"
    )
    same_key_twice = {"urls": ["http://h/one?key=a", "http://h/batch?key=a"], "headers": {"X-Api-Key": "k"}}
    assert _digest(same_key_twice) == "22dc228fa448fc47a3f685af94b7141d88a292e1b01e7507dbd14b1c382e8786"
    every_place = {
        "urls": ["http://h/one"],
        "headers": {"X-Api-Key": "k"},
        "client": {"params": {"token": "t"}, "headers": {"Cookie": "c"}, "auth": ("u", "p")},
        "credentials": {"acct": 1},
    }
    assert _digest(every_place) == "7f97c59b3b1853fc4dbfc3af88eba7c3c38f0d4a6321bdb211ec3cf961104c4b"


def test_credential_scope_digest_of_common_setups_is_unchanged() -> None:
    """Where the pooled form of earlier releases says what is sent (each credential given
    once, the same query on every URL), the digest is the earlier one (pinned against
    the code before the per-place rule), so stored receipts keep their keys."""
    pinned = {
        "0dc16a2315df2793b9e9f91b2bee23eace62f0a6d286a385a0f2e05f8af5a7bf": {
            "headers": {"Authorization": "Bearer sk-1"},
            "urls": ["https://api.openai.com/v1/chat/completions"],
        },
        "2ab5e5c847dc7aeca01434a8efa4dc01e0ba776ec332187ac0af72000f6ce7ac": {
            "headers": {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"},
            "urls": [
                "https://api.anthropic.com/v1/messages",
                "https://api.anthropic.com/v1/messages/batches",
            ],
        },
        "931ae4cf40cd57cc88c2ba2f331be6764d86a9912372bf81c6c040d7045758d3": {
            "urls": ["https://maps.googleapis.com/maps/api/geocode/json?key=AIza1"]
        },
        "cfb3d43e2ae6a9354305d80d76384bf25abcf56600316dd456177b240cdb04a6": {
            "urls": [
                "https://api.hunter.io/v2/email-verifier?api_key=h1",
                "https://api.hunter.io/v2/bulk?api_key=h1",
            ]
        },
        "5a1ed5c1f1e579378f47313b5cae7e40046fc2737e3e4daf3a874daea5363718": {  # a key-like path beside a key
            "urls": [
                "https://res.openai.azure.com/openai/deployments/text-embedding-3-small/embeddings"
                "?api-version=2024-02-01"
            ],
            "headers": {"api-key": "k"},
        },
        "6b289456155defb27233ae8c44c55c3e474fefad014b4dab644ee56b89804cfe": {
            "urls": ["https://api.stripe.com/v1/charges"],
            "client": {"auth": ("sk_live_1", "")},
        },
    }
    for digest, spec in pinned.items():
        assert _digest(spec) == digest


def test_http_tool_counts_the_clients_cookies_but_not_a_load_balancers() -> None:
    """A load balancer's or a CDN's Set-Cookie lands in the shared client's jar: the tool's
    digest stays, so a rerun with the same tool is free. A session cookie counts as it is
    sent, given before the tool was made or after (a login through the shared client),
    and one the provider sends back unchanged (a rolling session) still counts."""
    answers = [
        httpx.Response(200, json={"ok": 1}, headers=[("set-cookie", "AWSALB=lb1; Path=/")]),
        httpx.Response(200, json={"ok": 1}, headers=[("set-cookie", "__cf_bm=cf2; Path=/")]),
        httpx.Response(200, json={"ok": 1}, headers=[("set-cookie", "li_at=ann; Path=/")]),  # rolling
    ]
    client = httpx.Client(transport=httpx.MockTransport(lambda r: answers.pop(0)))
    try:
        tool = http_tool("lookup", "https://p.example/one", client=client)
        assert tool.credentials is not None
        anonymous = tool.credentials()
        context = ToolContext(
            tool_id="lookup", idempotency_key="ik", receipt_keys=("k",), credential_scope_digest=anonymous,
            deadline=time.monotonic() + 5.0, timeout_s=5.0,
        )  # fmt: skip
        tool.fn({"q": 1}, context)
        tool.fn({"q": 2}, context)
        assert {"AWSALB", "__cf_bm"} <= set(client.cookies.keys())
        assert tool.credentials() == anonymous
        client.cookies.set("li_at", "ann", domain="p.example")  # logged in after the tool was made
        ann = tool.credentials()
        tool.fn({"q": 3}, context)  # the provider sends it back
        assert tool.credentials() == ann
        client.cookies.set("li_at", "bob", domain="p.example")
        assert len({anonymous, ann, tool.credentials()}) == 3
    finally:
        client.close()


def test_credential_scope_digest_refuses_what_it_cannot_see_unless_credentials_name_the_account() -> None:
    """A request event hook may add a key, and an auth that signs with a timestamp or a
    nonce differs at every request: neither can be digested, so ``credentials=`` must
    name the account (as for an auth that signs only after a challenge)."""

    class Stamped(httpx.Auth):
        def auth_flow(self, request: httpx.Request) -> Any:
            request.headers["X-Signature"] = f"sig-{time.monotonic_ns()}"
            yield request

    hooked = httpx.Client(event_hooks={"request": [lambda request: None]})
    stamped = httpx.Client(auth=Stamped())
    try:
        for client in (hooked, stamped):
            with pytest.raises(ValueError, match="credentials="):
                credential_scope_digest(urls=["https://h/one"], client=client)
            with pytest.raises(ValueError, match="credentials="):
                http_tool("lookup", "https://h/one", client=client)
            one = credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-1")
            assert one == credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-1")
            assert one != credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-2")
    finally:
        hooked.close()
        stamped.close()


def test_credential_scope_digest_never_raises_for_cookies_httpx_sends() -> None:
    """Two cookies of one name on other paths (``client.cookies[name]`` would raise
    CookieConflict), a header httpx takes as bytes, non-ASCII bytes, an IPv6 host: a digest
    each. A relative URL with no base_url, which httpx cannot send, is a clear ValueError."""
    jar = httpx.Cookies()
    jar.set("sid", "1", domain="p.example", path="/")
    jar.set("sid", "2", domain="p.example", path="/v1")
    for spec in (
        {"urls": ["https://p.example/v1/one"], "client": {"cookies": jar}},
        {"client": {"headers": {"X-Api-Key": b"\xc3\xa9"}}},
        {"headers": {"X-Api-Key": b"\xc3\xa9"}},
        {"urls": ["http://[::1]:8080/x?key=1#part"], "client": {"cookies": {"session": "s"}}},
    ):
        assert len(_digest(spec)) == 64
    with pytest.raises(ValueError, match="base_url"):
        http_tool("lookup", "lookup", client=httpx.Client(cookies={"session": "s"}))


def test_credential_scope_digest_holds_what_is_not_sent_apart() -> None:
    """The same credentials on the wire keep one digest: a header given both per request
    and by the client with one value (pinned against earlier releases), and a jar that
    an explicit Cookie header keeps httpx from sending."""
    both = {"headers": {"Authorization": "Bearer A"}, "client": {"headers": {"Authorization": "Bearer A"}}}
    assert _digest(both) == "f6ec249a21d5efda2bd03e373eb1485be2f7a9036f70045b0f43ee0ceee9b2a3"
    explicit = {"urls": ["https://p.example/one"], "headers": {"Cookie": "sid=A"}}
    assert _digest({**explicit, "client": {"cookies": _jar(("sid", "X", "p"))}}) == _digest(
        {**explicit, "client": {"cookies": _jar(("sid", "Y", "p"))}}
    )


def test_credential_scope_digest_of_a_custom_auth_beside_credentials_is_the_account_named() -> None:
    """An auth whose signature changes with time in whole seconds (SigV4's X-Amz-Date) or
    that fetches tokens signs the same twice within one second, so the digest cannot tell:
    with ``credentials=`` naming the account, a custom auth's headers are left out and
    the digest holds from one second (one run) to the next."""

    class PerSecond(httpx.Auth):
        def __init__(self) -> None:
            self.second = 0

        def auth_flow(self, request: httpx.Request) -> Any:
            request.headers["Authorization"] = f"AWS4-HMAC-SHA256 sig-{self.second}"
            yield request

    auth = PerSecond()
    client = httpx.Client(auth=auth)
    try:
        first = credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-1")
        auth.second += 1  # the next run starts a second later
        assert credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-1") == first
        assert credential_scope_digest(urls=["https://h/one"], client=client, credentials="acct-2") != first
    finally:
        client.close()
    basic = httpx.Client(auth=("ann", "p1"))  # a Basic auth still counts beside credentials
    other = httpx.Client(auth=("bob", "p2"))
    try:
        assert credential_scope_digest(client=basic, credentials="c") != credential_scope_digest(
            client=other, credentials="c"
        )
    finally:
        basic.close()
        other.close()


def test_credential_scope_digest_of_an_open_api_never_counts_the_port() -> None:
    """With nothing else authenticating, a tool's URLs name its scope (a webhook's secret
    is its URL), but for the port: a local provider restarted on another port keeps its
    receipts."""
    assert _digest({"urls": ["http://127.0.0.1:8001/v1/x"]}) == _digest(
        {"urls": ["http://127.0.0.1:9002/v1/x"]}
    )
    assert _digest({"urls": ["http://127.0.0.1:8001/v1/x"]}) != _digest(
        {"urls": ["http://127.0.0.1:8001/v1/y"]}
    )
    assert _digest({"headers": {"Accept": "x"}}) == ""  # no URL, nothing that authenticates
