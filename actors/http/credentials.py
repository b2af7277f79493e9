"""The credential-scope digest of HTTP requests (:func:`credential_scope_digest`).

Receipts never cross credentials: the digest is part of every receipt key, so two
accounts never share a cached result. It is a sha256 over what authenticates the
requests as httpx sends them, never the secret itself.

Two layers, so that stored receipts keep their keys:

* the pooled form of earlier releases: the credential headers (request, client, the
  client's ``auth``) and every query parameter (URLs, client), each list sorted;
* the wire: what each URL's request carries, by position in ``urls``, built as the
  client builds it (its path, its query, its credential headers after merging and
  auth, the cookies the jar sends to it, in order). It is added whenever the pooled
  form does not say it alone: a name given in two places with other values (a request
  header over the client's; a client's params, which httpx 0.28 puts in place of the
  URL's query), URLs with other queries (a key moved or swapped between the URL and the
  batch URL), a name given twice with other values (which goes first may matter), a
  ``user:password@``, cookies, and the URLs' host and path when no header authenticates
  and either no query is given or a path segment looks like a key (``/v2/<key>``,
  ``/bot<token>/``, a webhook's URL; the port never counts, so a local server's changing
  port keeps its receipts).
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson

__all__ = ["AUTH_HEADER_WORDS", "NOT_CREDENTIALS", "NOT_CREDENTIAL_COOKIES", "credential_scope_digest"]

AUTH_HEADER_WORDS = (
    "auth", "token", "key", "secret", "session", "cookie", "signature", "credential", "password",
    "user", "account", "org", "project", "tenant", "workspace",
)  # fmt: skip
"""A header whose lower-cased name holds one of these words is a credential
(``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key``, ``X-Auth-Token``...),
and so is one that picks the account a key acts for (``Api-Username``,
``OpenAI-Organization``, ``Stripe-Account``, ``X-Goog-User-Project``), except
:data:`NOT_CREDENTIALS`. Every query parameter and cookie counts, whatever its name."""

NOT_CREDENTIALS = ("user-agent", "useragent", "idempotency-key")
"""Header names holding one of these (lower-cased) authenticate nothing
(``User-Agent``, ``X-Amz-User-Agent``, ``x-ms-useragent``)."""

_STABLE_AUTHS = (httpx.BasicAuth, httpx.NetRCAuth)
"""Auths whose headers are the same at every request: digested even beside
``credentials``. Another auth's headers (a token fetched, a signature with the time)
are left to ``credentials`` when it is given."""

NOT_CREDENTIAL_COOKIES = (
    "awsalb", "awsalbcors", "awselb", "awselbcors", "aws-waf-token", "__cf_bm", "_cfuvid", "cf_clearance",
    "__cflb", "bigipserver", "ts01", "incap_ses_", "visid_incap_", "nlbi_", "arraffinity", "gclb",
    "serverid",
)  # fmt: skip
"""Cookies a load balancer, a CDN or a firewall sets (names compared lower-cased, by
prefix): they route or clear a client and never name an account, and a provider sets
them anew at any answer, so they are left out. Every other cookie the jar sends counts.
Sources: AWS Elastic Load Balancing, "Sticky sessions for your Application Load Balancer"
(AWSALB, AWSALBCORS, AWSELB) and AWS WAF (aws-waf-token); Cloudflare, "Cloudflare
Cookies" (__cf_bm, _cfuvid, cf_clearance, __cflb); F5 BIG-IP persistence and ASM cookies
(BIGipServer<pool>, TS01...); Imperva/Incapsula (incap_ses_, visid_incap_, nlbi_); Azure
App Service ARR affinity (ARRAffinity); Google Cloud load balancing (GCLB); HAProxy's
conventional SERVERID."""

_SCOPE_TAG = "tooldispatch.credential-scope.v1"

Pairs = list[tuple[str, str]]


def credential_scope_digest(
    *,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
    urls: Sequence[str] = (),
    client: httpx.Client | None = None,
    credentials: Any = None,
) -> str:
    """The credential-scope digest of HTTP requests: sha256 hex, or "" when nothing
    authenticates them and no URL is given.

    Args:
        headers: the request headers (a mapping or (name, value) pairs); those named with
            an :data:`AUTH_HEADER_WORDS` word count (names compared case-insensitively;
            bytes read as latin-1).
        urls: the endpoints; every query-string parameter counts (API keys often travel
            as ``?key=``, ``?appid=``, ``?token=``), a ``user:password@`` part (httpx
            sends it as Basic auth), and, when no header authenticates, the host and path
            (a key in the path, a webhook's URL; never the port) unless a query is given
            and no path segment looks like a key, the client's ``base_url`` joined first.
        client: a shared ``httpx.Client``: its auth headers and query parameters count,
            the headers its ``auth`` adds before any answer (``httpx.BasicAuth``, bearer
            tokens), and the cookies its jar sends to each URL.
        credentials: any JSON value naming the account (say an account id plus a key
            version) for credentials these rules cannot see. Beside an auth other than
            ``httpx.BasicAuth`` / ``httpx.NetRCAuth`` (a token it fetches, a signature
            with the time), it replaces what that auth's headers would add: name the
            account in it.

    A credential counts where it is sent: values swapped or moved between the request
    and the client, or between one URL and another, never share receipts. Where the
    pooled form of earlier releases says what is sent, the digest is that one.

    Raises:
        TypeError: ``urls`` is one string, not a sequence of them.
        ValueError: httpx cannot build a request to one of ``urls`` with ``client`` (a
            relative URL and no ``base_url``, an invalid URL).
        ValueError: without ``credentials``, when the client can add credentials the
            digest cannot see: an ``auth`` that signs only after a challenge
            (``httpx.DigestAuth``), one whose headers differ from one request to the
            next (a nonce; a timestamp in whole seconds is seldom seen: give
            ``credentials`` with it), or request event hooks. A transport that adds
            credentials is not seen either: give ``credentials``.
    """
    if isinstance(urls, (str, bytes)):
        raise TypeError("urls must be a sequence of URLs, not one string")
    given = list(headers.items() if isinstance(headers, Mapping) else headers or ())
    mine = _credential_headers(_texts(given))
    client_headers: Pairs = []
    client_params: Pairs = []
    signed: Pairs = []
    sign = False  # the client's auth adds headers the digest holds
    if client is not None:
        client_headers = _credential_headers(_items(client.headers))
        client_params = list(client.params.multi_items())
        auth = client.auth
        named = credentials is not None and auth is not None and not isinstance(auth, _STABLE_AUTHS)
        if auth is not None and not named:  # a custom auth with credentials=: the account is named
            signed = _signed(auth, httpx.Request("GET", "https://credential-scope.invalid/"))
            if signed != _signed(auth, httpx.Request("GET", "https://credential-scope.invalid/")):
                signed = []  # a nonce or a timestamp: no digest can hold it
        sign = bool(signed)
        unseen = None
        if auth is not None and not signed:
            unseen = f"the client's auth ({type(auth).__name__}) cannot be digested"
        elif client.event_hooks.get("request"):
            unseen = "the client's request event hooks may add credentials the digest cannot see"
        if unseen is not None and credentials is None:
            raise ValueError(
                f"{unseen}: pass credentials= naming the account, so runs under other credentials "
                "never share receipts"
            )
    targets: list[str | None] = list(urls) or [None]  # no URL: the headers alone
    own = [list(httpx.URL(url).params.multi_items()) if url is not None else [] for url in targets]
    found = mine + client_headers + signed
    query = [item for params in own for item in params] + client_params
    parts: dict[str, Any] = {}
    if found:
        parts["headers"] = sorted(found)
    if query:
        parts["query"] = sorted(query)
    wire = [_as_sent(url, given, client, sign) for url in targets]
    pooled_says_it = all(
        sent["headers"] == sorted(set(found))
        and sorted(sent["query"]) == sorted(params + client_params)
        and not _repeated(sent["query"])
        and not sent["cookies"]
        and (url is None or credentials is not None or found or (query and not _key_in(sent["path"])))
        and sorted(params) == sorted(own[0])
        for sent, params, url in zip(wire, own, targets, strict=True)
    )
    if not pooled_says_it:
        parts["wire"] = wire
    if credentials is not None:
        parts["credentials"] = credentials
    if not parts:
        return ""
    text = orjson.dumps([_SCOPE_TAG, parts], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()


def _as_sent(url: str | None, headers: Pairs, client: httpx.Client | None, sign: bool) -> dict[str, Any]:
    """What a request to ``url`` carries, built as the client builds it (``base_url``
    joined, its ``params`` and headers merged the way this httpx merges them): its host
    (never the port) and path, its query (percent-escapes read as latin-1, so no two byte
    strings meet), its credential headers after the auth signed it (the client's when
    ``sign``, else the URL's ``user:password@``) sorted, and the cookies the client's jar
    sends to it (domain, path, ``secure``; none when a Cookie header is given, as httpx
    then sends none) in order."""
    target = url if url is not None else "https://credential-scope.invalid/"
    if httpx.URL(target).is_relative_url and (client is None or client.base_url.is_relative_url):
        raise ValueError(f"{target!r}: a relative URL needs a client with a base_url")
    try:
        if client is not None:
            request = client.build_request("GET", target, headers=headers)
        else:
            request = httpx.Request("GET", target, headers=headers)
    except (httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, TypeError, ValueError) as exc:
        raise ValueError(f"{target!r}: httpx cannot build a request to it ({exc})") from exc

    explicit = "cookie" in request.headers and (
        any(k.lower() == "cookie" for k, _ in headers) or (client is not None and "cookie" in client.headers)
    )
    if not explicit:
        request.headers.pop("cookie", None)  # the client's whole jar: counted below as given
    sent_url = request.url
    auth: httpx.Auth | None = client.auth if client is not None and sign else None
    if auth is None and (client is None or client.auth is None) and (sent_url.username or sent_url.password):
        auth = httpx.BasicAuth(sent_url.username, sent_url.password)
    signed = _signed(auth, request) if auth is not None else _items(request.headers)
    sent: list[str] = []
    if client is not None and not explicit:
        probe = httpx.Request("GET", sent_url)
        client.cookies.set_cookie_header(probe)
        for line in probe.headers.get_list("cookie"):
            sent += [part.strip() for part in line.split(";") if _counts(part.strip())]
    return {
        "host": sent_url.host,
        "path": sent_url.raw_path.split(b"?")[0].decode("latin-1"),
        "query": urllib.parse.parse_qsl(
            sent_url.query.decode("latin-1"), keep_blank_values=True, encoding="latin-1"
        ),
        "headers": sorted(set(_credential_headers(signed))),
        "cookies": sent,
    }


def _counts(cookie: str) -> bool:
    """A sent cookie (``name=value``) that may name an account."""
    return bool(cookie) and not cookie.split("=", 1)[0].lower().startswith(NOT_CREDENTIAL_COOKIES)


def _key_in(path: str) -> bool:
    """A path segment that looks like a key (``/bot<token>/``, a webhook's token): 16
    characters or more, letters and digits mixed."""
    return any(
        len(part) >= 16 and any(c.isdigit() for c in part) and any(c.isalpha() for c in part)
        for part in path.split("/")
    )


def _repeated(items: Pairs) -> bool:
    """One name with other values in ``items`` (which goes first may matter)."""
    values: dict[str, set[str]] = {}
    for name, value in items:
        values.setdefault(name, set()).add(value)
    return any(len(held) > 1 for held in values.values())


def _signed(auth: httpx.Auth | None, request: httpx.Request) -> Pairs:
    """The credential headers ``request`` carries once ``auth`` signed it before any
    answer (the first step of its public ``auth_flow``; none for a challenge-only auth)."""
    if auth is None:
        return []
    flow = auth.auth_flow(request)
    try:
        signed = next(flow)
    except StopIteration:
        return []
    finally:
        flow.close()
    return _credential_headers(_items(signed.headers))


def _items(headers: httpx.Headers) -> Pairs:
    """``headers.items()`` (one name given twice: its values joined by ", "), bytes read
    as latin-1 where ``items()`` would raise on bytes that are not UTF-8."""
    joined: dict[str, tuple[str, list[str]]] = {}
    for name, value in _texts(headers.raw):
        joined.setdefault(name.lower(), (name, []))[1].append(value)
    return [(name, ", ".join(values)) for name, values in joined.values()]


def _texts(items: Any) -> Pairs:
    """(name, value) pairs as text: bytes (as httpx accepts and sends them) read as latin-1."""
    return [(_text(k), _text(v)) for k, v in items]


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _credential_headers(items: Pairs) -> Pairs:
    """The (lower-cased name, value) pairs of ``items`` whose names name a credential."""
    return [(k.lower(), v) for k, v in items if _is_auth_header(k)]


def _is_auth_header(name: str) -> bool:
    lowered = name.lower()
    return not any(word in lowered for word in NOT_CREDENTIALS) and any(
        word in lowered for word in AUTH_HEADER_WORDS
    )
