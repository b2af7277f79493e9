"""The credential-scope digest of HTTP requests (:func:`credential_scope_digest`).

Receipts never cross credentials: the digest is part of every receipt key, so two
accounts never share a cached result. It is a sha256 over what authenticates the
requests as httpx sends them, never the secret itself.

Two layers, so that stored receipts keep their keys:

* the pooled form of earlier releases: the credential headers (request, client, the
  client's ``auth``) and every query parameter (URLs, client), each list sorted;
* the wire: what each URL's request carries, by position in ``urls`` (its query as
  httpx builds it, its credential headers after merging and auth, the cookies the jar
  sends to it, in order). It is added whenever the pooled form does not say it alone:
  a name given in two places with other values (a request header over the client's, a
  client parameter over the URL's), URLs with other queries (a key moved or swapped
  between the URL and the batch URL), a ``user:password@``, cookies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson

__all__ = ["AUTH_HEADER_WORDS", "NOT_CREDENTIALS", "credential_scope_digest"]

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

_SECRET_WORDS = AUTH_HEADER_WORDS[:9]
"""The words naming a secret (not an account): a query parameter so named and given twice
with other values is a credential whose order may matter."""

_SCOPE_TAG = "tooldispatch.credential-scope.v1"

Pairs = list[tuple[str, str]]


def credential_scope_digest(
    *,
    headers: Mapping[str, str] | None = None,
    urls: Sequence[str] = (),
    client: httpx.Client | None = None,
    credentials: Any = None,
    cookies: httpx.Cookies | None = None,
) -> str:
    """The credential-scope digest of HTTP requests: sha256 hex, or "" when nothing
    authenticates them (so an open API's keys do not change).

    Args:
        headers: the request headers; those named with an :data:`AUTH_HEADER_WORDS` word
            count (names compared case-insensitively; bytes read as latin-1).
        urls: the endpoints; every query-string parameter counts (API keys often travel
            as ``?key=``, ``?appid=``, ``?token=``), and a ``user:password@`` part
            (httpx sends it as Basic auth), the client's ``base_url`` joined first.
        client: a shared ``httpx.Client``: its auth headers and query parameters count,
            the auth headers its ``auth`` adds before any answer (``httpx.BasicAuth``,
            bearer tokens), and the cookies its jar sends to each URL.
        credentials: any JSON value naming the account (say an account id plus a key
            version) for credentials these rules cannot see.
        cookies: the jar whose cookies count, instead of the client's
            (:func:`~actors.http.http_tool` passes the jar as it was when the tool was
            made, so a cookie the provider sets during a run never changes the digest).

    A credential counts where it is sent: values swapped or moved between the request
    and the client, or between one URL and another, never share receipts. Where the
    pooled form of earlier releases says what is sent, the digest is that one.

    Raises:
        ValueError: without ``credentials``, when the client can add credentials the
            digest cannot see: an ``auth`` that signs only after a challenge
            (``httpx.DigestAuth``), one whose signature differs from one request to the
            next (a nonce, a timestamp finer than the call; one in whole seconds is not
            always seen: give ``credentials`` with it), or request event hooks. A
            transport that adds credentials is not seen either: give ``credentials``.
    """
    mine = _credential_headers(_texts((headers or {}).items()))
    client_headers: Pairs = []
    client_params: Pairs = []
    signed: Pairs = []
    if client is not None:
        client_headers = _credential_headers(_items(client.headers))
        client_params = list(client.params.multi_items())
        signed = _signed(client.auth, httpx.Request("GET", "https://credential-scope.invalid/"))
        if signed != _signed(client.auth, httpx.Request("GET", "https://credential-scope.invalid/")):
            signed = []  # a nonce or a timestamp: no digest can hold it
        unseen = None
        if client.auth is not None and not signed:
            unseen = f"the client's auth ({type(client.auth).__name__}) cannot be digested"
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
    jar = cookies if cookies is not None else client.cookies if client is not None else None
    sign = client is not None and client.auth is not None and bool(signed)  # an auth whose headers hold
    wire = [_as_sent(url, headers, client, jar, sign) for url in targets]
    pooled_says_it = all(
        sent["headers"] == sorted(found)
        and sorted(sent["query"]) == sorted(params + client_params)
        and not _repeated([(k, v) for k, v in sent["query"] if any(w in k.lower() for w in _SECRET_WORDS)])
        and not sent["cookies"]
        and sorted(params) == sorted(own[0])
        for sent, params in zip(wire, own, strict=True)
    )
    if not pooled_says_it:
        parts["wire"] = wire
    if credentials is not None:
        parts["credentials"] = credentials
    if not parts:
        return ""
    text = orjson.dumps([_SCOPE_TAG, parts], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()


def _as_sent(
    url: str | None,
    headers: Mapping[str, str] | None,
    client: httpx.Client | None,
    jar: httpx.Cookies | None,
    sign: bool,
) -> dict[str, Any]:
    """What a request to ``url`` carries, as httpx builds it: its query (the client's
    ``base_url`` joined, its ``params`` merged over the URL's), its credential headers
    (the request's over the client's, then the auth's: the client's, else the URL's
    ``user:password@``) sorted, and the jar's cookies for it (domain, path, ``secure``)
    in the order they are sent. ``sign``: the client's auth can be digested (else what it
    adds is left to ``credentials``)."""
    target = httpx.URL(url if url is not None else "https://credential-scope.invalid/")
    merged = httpx.Headers(client.headers if client is not None else None)  # as Client.build_request
    auth: httpx.Auth | None = None
    if client is not None:
        if target.is_relative_url:  # as httpx.Client joins it
            base = client.base_url
            target = base.copy_with(raw_path=base.raw_path + target.raw_path.lstrip(b"/"))
        target = target.copy_merge_params(client.params)
        auth = client.auth if sign else None
    merged.update(httpx.Headers(headers or {}))
    if (client is None or client.auth is None) and (target.username or target.password):
        auth = httpx.BasicAuth(target.username, target.password)
    request = httpx.Request("GET", target.copy_with(username=None, password=None), headers=merged)
    signed = _signed(auth, request) if auth is not None else _items(request.headers)
    sent: list[str] = []
    if jar is not None:
        probe = httpx.Request("GET", request.url)
        jar.set_cookie_header(probe)
        for line in probe.headers.get_list("cookie"):
            sent += [part.strip() for part in line.split(";") if part.strip()]
    return {
        "query": list(target.params.multi_items()),
        "headers": sorted(_credential_headers(signed)),
        "cookies": sent,
    }


def _repeated(items: Pairs) -> bool:
    """One name with other values in ``items`` (a credential's: which goes first may
    matter; a list parameter such as ``properties=a&properties=b`` keeps its digest)."""
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
