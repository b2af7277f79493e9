"""HTTP tools: the common case of a tool that calls a provider's HTTP API.

Built on httpx's synchronous client, which runs on plain threads and, under gevent
monkey-patching, on cooperative sockets. Every request carries the provider
idempotency key as an ``Idempotency-Key`` header (the IETF draft
"The Idempotency-Key HTTP Header Field"). Responses map to tooldispatch errors:

* 429, and 503 with ``Retry-After`` → :class:`~actors.errors.RateLimitedError` carrying
  the raw Retry-After (RFC 9110 section 10.2.3): backpressure for the governor;
* a connection that could not be made (refused, no route, name not resolved, or not
  made within the timeout) →
  :class:`~actors.errors.ProviderUnreachableError` (kind ``transient``, not retried
  within the call: the provider is down, not busy; its circuit counts it);
* other 5xx and transport errors → ProviderError with kind ``transient`` (a connection
  broken after it was made, reset or closed with no answer, is marked ``sent``: the
  request may have reached the provider);
* no connection of the client's pool free in time → :class:`~actors.errors.NotSentError`
  (nothing was sent: re-admitted);
* other timeouts (the request went out) → :class:`~actors.errors.ToolTimeoutError`
  (kind ``timeout``; uncertain for a tool that is not retry-safe);
* other 4xx → ProviderError with kind ``permanent``.

Credential scope: receipts never cross credentials. An http_tool's credential-scope
digest (part of every receipt key, see :func:`credential_scope_digest`) is a sha256
over what authenticates its requests: its auth headers, every query-string parameter and
``user:password@`` of its URLs, the shared client's auth headers, cookies, query
parameters and ``auth``, and an explicit ``credentials=`` value; never the secret
itself. Two runs with different ``Authorization`` headers therefore never share receipts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import orjson

from stores.types import FailureKind

from ._pacing import SLOW_START_RPS
from .errors import NotSentError, ProviderError, ProviderUnreachableError, RateLimitedError, ToolTimeoutError
from .results import ToolContext
from .tool import BatchStrategy, Pacing, Tool

__all__ = ["AUTH_HEADER_WORDS", "NOT_CREDENTIALS", "HttpEndpoint", "credential_scope_digest", "http_tool"]

AUTH_HEADER_WORDS = (
    "auth", "token", "key", "secret", "session", "cookie", "signature", "credential", "password",
    "user", "account", "org", "project", "tenant", "workspace",
)  # fmt: skip
"""A header whose lower-cased name holds one of these words is a credential
(``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key``, ``X-Auth-Token``...),
and so is one that picks the account a key acts for (``Api-Username``,
``OpenAI-Organization``, ``OpenAI-Project``, ``X-Goog-User-Project``), except
:data:`NOT_CREDENTIALS`. Query parameters and cookies named with one of them (or ``sig``,
``sid``, ``sess``) are credentials too."""

NOT_CREDENTIALS = ("user-agent", "idempotency-key")
"""Names holding a credential word that authenticate nothing (compared lower-cased)."""

_MORE_WORDS = ("sig", "sid", "sess")

_SCOPE_TAG = "tooldispatch.credential-scope.v1"


def credential_scope_digest(
    *,
    headers: Mapping[str, str] | None = None,
    urls: Sequence[str] = (),
    client: httpx.Client | None = None,
    credentials: Any = None,
) -> str:
    """The credential-scope digest of HTTP requests: sha256 hex, or "" when nothing
    authenticates them (so an open API's keys do not change).

    Args:
        headers: the request headers; those named with an :data:`AUTH_HEADER_WORDS` word
            count (names compared case-insensitively; bytes read as latin-1).
        urls: the endpoints; every query-string parameter counts (API keys often travel
            as ``?key=``, ``?api_key=``, ``?token=``), and a ``user:password@`` part
            (httpx sends it as Basic auth), the client's ``base_url`` joined first.
        client: a shared ``httpx.Client``: its auth headers and query parameters count,
            the cookies its jar sends to each URL whose names name a credential
            (``session``, ``sid``, ``auth_token``...; a load balancer's or a locale's do
            not), and the auth headers its ``auth`` adds before any answer
            (``httpx.BasicAuth``, bearer tokens).
        credentials: any JSON value naming the account (say an account id plus a key
            version) for credentials these rules cannot see.

    A credential counts where it is given. When one name holds different values in two
    places (a request header and the client's header of that name, ``?key=`` in one URL
    and in another, by their position in ``urls``), or the URLs carry different
    credentials, the digest says which place holds which, so values swapped or moved
    between places never share receipts. Otherwise the digest is the one earlier
    releases computed.

    Raises:
        ValueError: without ``credentials``, when the client can add credentials the
            digest cannot see: an ``auth`` that signs only after a challenge
            (``httpx.DigestAuth``), one that signs each request differently (a timestamp
            or a nonce), or request event hooks. A transport that adds credentials is
            not seen either: give ``credentials`` with one.
    """
    # place -> (is a query, [(name, value)]): what each place puts on the wire
    sources: dict[str, tuple[bool, list[tuple[str, str]]]] = {
        "headers": (False, [(k.lower(), v) for k, v in _texts((headers or {}).items()) if _is_auth_header(k)])
    }
    per_url: list[list[tuple[str, str]]] = []  # each URL's own credentials (uniformity check)
    for i, url in enumerate(urls):
        parsed, cookies = _as_sent(url, client)
        params = list(httpx.URL(url).params.multi_items())
        sources[f"urls[{i}]"] = (True, params)
        own = [(k, v) for k, v in params if _names_credential(k)]
        if parsed.userinfo:  # httpx sends it as Basic auth (from the URL or the client's base_url)
            basic = _auth_headers(httpx.BasicAuth(parsed.username, parsed.password))
            sources[f"urls[{i}].userinfo"] = (False, basic)
            own += basic
        if cookies:
            sources[f"urls[{i}].cookies"] = (False, cookies)
            own += cookies
        per_url.append(sorted(own))
    if client is not None:
        client_headers = [(k.lower(), v) for k, v in _texts(client.headers.raw) if _is_auth_header(k)]
        sources["client.headers"] = (False, client_headers)
        sources["client.params"] = (True, list(client.params.multi_items()))
        signed = _auth_headers(client.auth)
        if signed != _auth_headers(client.auth):  # a timestamp or nonce: no digest can hold it
            signed = []
        sources["client.auth"] = (False, signed)
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
    found = [item for is_query, items in sources.values() if not is_query for item in items]
    query = [item for is_query, items in sources.values() if is_query for item in items]
    parts: dict[str, Any] = {}
    if found:
        parts["headers"] = sorted(found)
    if query:
        parts["query"] = sorted(query)
    named = [(k, v) for k, v in query if _names_credential(k)]
    if _ambiguous(found) or _ambiguous(named) or any(own != per_url[0] for own in per_url):
        # The pooled lists above would be the same for values swapped between places (an
        # Authorization header per request and by the client, a ?key= per URL) or for a
        # credential moved from one URL to another, so say which place holds which.
        parts["sources"] = {name: items for name, (_, items) in sources.items() if items}
    if credentials is not None:
        parts["credentials"] = credentials
    if not parts:
        return ""
    text = orjson.dumps([_SCOPE_TAG, parts], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()


def _texts(items: Any) -> list[tuple[str, str]]:
    """(name, value) pairs as text: bytes (as httpx accepts and sends them) read as latin-1."""
    return [
        (
            k.decode("latin-1") if isinstance(k, bytes) else str(k),
            v.decode("latin-1") if isinstance(v, bytes) else str(v),
        )
        for k, v in items
    ]


def _names_credential(name: str) -> bool:
    """A query parameter or cookie name that names a credential (or an account)."""
    lowered = name.lower()
    return lowered not in NOT_CREDENTIALS and any(w in lowered for w in (*AUTH_HEADER_WORDS, *_MORE_WORDS))


def _as_sent(url: str, client: httpx.Client | None) -> tuple[httpx.URL, list[tuple[str, str]]]:
    """The URL a request to ``url`` goes to (a client's ``base_url`` joined) and the
    credential cookies the client's jar puts on it (by domain, path and ``secure``)."""
    if client is None:
        return httpx.URL(url), []
    try:
        request = client.build_request("GET", url)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.CookieConflict, TypeError, ValueError):
        return httpx.URL(url), []
    cookies = []
    for raw in request.headers.get_list("cookie"):
        for part in raw.split(";"):
            name, _, value = part.strip().partition("=")
            if name and _names_credential(name):
                cookies.append(("cookie", f"{name}={value}"))
    return request.url, sorted(cookies)


def _ambiguous(items: list[tuple[str, str]]) -> bool:
    """True when one name holds more than one distinct value among ``items``."""
    values: dict[str, set[str]] = {}
    for name, value in items:
        values.setdefault(name, set()).add(value)
    return any(len(held) > 1 for held in values.values())


def _auth_headers(auth: httpx.Auth | None) -> list[tuple[str, str]]:
    """The auth headers ``auth`` puts on a request before any answer (``BasicAuth``,
    a bearer-token ``Auth``...): the first step of its public ``auth_flow``."""
    if auth is None:
        return []
    probe = httpx.Request("GET", "https://credential-scope.invalid/")
    flow = auth.auth_flow(probe)
    try:
        signed = next(flow)
    except StopIteration:
        return []
    finally:
        flow.close()
    return [(k.lower(), v) for k, v in signed.headers.items() if _is_auth_header(k)]


def _is_auth_header(name: str) -> bool:
    lowered = name.lower()
    return lowered not in NOT_CREDENTIALS and any(word in lowered for word in AUTH_HEADER_WORDS)


def _items(body: Any, n: int) -> list[Any]:
    if isinstance(body, Mapping) and isinstance(body.get("results"), list):
        return list(body["results"])
    if isinstance(body, list):
        return body
    raise ProviderError(
        f"batch response has no 'results' list: {str(body)[:200]}", failure_kind=FailureKind.TRANSIENT
    )


def _item_error(item: Any) -> str | None:
    if isinstance(item, Mapping) and item.get("error"):
        return str(item["error"])
    return None


class HttpEndpoint:
    """Calls one JSON HTTP endpoint and maps its answers to tool results or errors.

    Args:
        url: the endpoint (POSTed a JSON body).
        client: an ``httpx.Client`` to share (default: a new one per endpoint).
        headers: extra headers (for instance ``{"Authorization": "Bearer ..."}``).
        method: the HTTP method.
    """

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> None:
        self.url = url
        self.method = method
        self.headers = dict(headers or {})
        self.client = client or httpx.Client()

    def __call__(self, body: Any, ctx: ToolContext) -> Any:
        """Send ``body`` as JSON; return the decoded JSON answer.

        Raises:
            RateLimitedError: 429, or 503 with Retry-After.
            ProviderUnreachableError: no connection could be made, refused or not within
                ``ctx.timeout_s`` (nothing was sent).
            NotSentError: no connection of the client's pool was free within
                ``ctx.timeout_s`` (nothing was sent).
            ToolTimeoutError: no answer within ``ctx.timeout_s`` seconds (the request
                may have reached the provider).
            ProviderError: other failures (transient for 5xx/transport, else permanent).
        """
        headers = {**self.headers, "Idempotency-Key": ctx.idempotency_key}
        try:
            response = self.client.request(
                self.method, self.url, json=body, headers=headers, timeout=ctx.timeout_s
            )
        except httpx.ConnectTimeout as exc:  # no connection was made: nothing was sent
            raise ProviderUnreachableError(
                f"{self.url} could not be reached within {ctx.timeout_s} s"
            ) from exc
        except httpx.PoolTimeout as exc:  # every pooled connection stayed busy: nothing was sent
            raise NotSentError(f"{self.url}: no connection of the client's pool was free in time") from exc
        except httpx.TimeoutException as exc:
            raise ToolTimeoutError(f"{self.url} timed out after {ctx.timeout_s} s: {exc}") from exc
        except httpx.ConnectError as exc:
            raise ProviderUnreachableError(f"{self.url} could not be reached: {exc}") from exc
        except httpx.TransportError as exc:
            error = ProviderError(f"{self.url}: {exc}", failure_kind=FailureKind.TRANSIENT)
            # the connection broke after it was made (reset, closed with no answer): the
            # request may have reached the provider (uncertain for a tool not retry-safe)
            error.sent = isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError))
            raise error from exc
        status = response.status_code
        retry_after = response.headers.get("Retry-After")
        if status == 429 or (status == 503 and retry_after is not None):
            raise RateLimitedError(f"{self.url} answered {status}", retry_after=retry_after)
        if status >= 500:
            raise ProviderError(
                f"{self.url} answered {status}: {response.text[:200]}", failure_kind=FailureKind.TRANSIENT
            )
        if status >= 400:
            raise ProviderError(
                f"{self.url} answered {status}: {response.text[:200]}", failure_kind=FailureKind.PERMANENT
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ProviderError(
                f"{self.url} answered non-JSON: {exc}", failure_kind=FailureKind.TRANSIENT
            ) from exc

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


def http_tool(
    tool_id: str,
    url: str,
    *,
    batch_url: str | None = None,
    max_batch_size: int = 50,
    provider: str = "",
    version: str = "1",
    pacing: Pacing | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    client: httpx.Client | None = None,
    build_batch: Callable[[list[Any]], Any] = lambda inputs: {"items": inputs},
    split_batch: Callable[[Any, int], list[Any]] = _items,
    durable: bool = True,
    credentials: Any = None,
) -> Tool:
    """A :class:`~actors.tool.Tool` that POSTs its JSON input to ``url``.

    Args:
        tool_id: the tool's name.
        url: the single-call endpoint.
        batch_url: the provider's batch endpoint, if any: it receives
            ``build_batch(inputs)`` (default ``{"items": [...]}``) and answers a list or
            ``{"results": [...]}`` in member order; an item ``{"error": "..."}`` fails
            that member alone (kind permanent).
        max_batch_size: most members per batch request.
        provider: whose limits it shares (default the URL's host).
        version: the provider action version (part of the receipt key).
        pacing: the provider's limits, when known. Default: rate unknown, slow start
            from :data:`~actors._pacing.SLOW_START_RPS` requests/s (doubling until the
            first 429, then a plateau under the limit learnt), so an API is never hit with
            every row at once.
        headers: extra headers (authentication).
        timeout_s: per-request timeout, seconds.
        client: an httpx.Client to share between tools.
        build_batch / split_batch: batch body builder and answer splitter.
        durable: False skips receipts.
        credentials: a JSON value naming the account, for credentials the headers,
            URLs and client do not show (see :func:`credential_scope_digest`).

    The tool's ``credentials()`` digests the endpoints' current headers each time it is
    asked (after an ``AuthScopeChangedError`` too), so a changed key gives new receipts.

    Raises:
        ValueError: as :func:`credential_scope_digest`.
    """
    shared = client or httpx.Client()
    single = HttpEndpoint(url, client=shared, headers=headers)
    batch = None
    if batch_url is not None:
        endpoint = HttpEndpoint(batch_url, client=shared, headers=headers)

        def split(body: Any, n: int) -> list[Any]:
            out: list[Any] = []
            for item in split_batch(body, n):
                error = _item_error(item)
                out.append(ProviderError(error, failure_kind=FailureKind.PERMANENT) if error else item)
            return out

        batch = BatchStrategy(
            batch_fn=endpoint,
            max_batch_size=max_batch_size,
            build=build_batch,
            split=split,
            batch_operation=batch_url,
        )
    urls = [url] if batch_url is None else [url, batch_url]

    def scope() -> str:
        return credential_scope_digest(
            headers=single.headers, urls=urls, client=shared, credentials=credentials
        )

    scope()  # refuse an undigestable client auth now, not at the first call
    return Tool(
        tool_id=tool_id,
        fn=single,
        provider=provider or httpx.URL(url).host,
        version=version,
        pacing=pacing if pacing is not None else Pacing(start_rps=SLOW_START_RPS),
        batch=batch,
        durable=durable,
        retry_safe=True,
        timeout_s=timeout_s,
        credentials=scope,
    )
