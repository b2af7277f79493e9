"""HTTP tools: the common case of a tool that calls a provider's HTTP API.

Built on httpx's synchronous client, which runs on plain threads and, under gevent
monkey-patching, on cooperative sockets. Every request carries the provider
idempotency key as an ``Idempotency-Key`` header (the IETF draft
"The Idempotency-Key HTTP Header Field"). Responses map to tooldispatch errors:

* 429, and 503 with ``Retry-After`` → :class:`~actors.errors.RateLimitedError` carrying
  the raw Retry-After (RFC 9110 section 10.2.3): backpressure for the governor;
* 409 that says a request with this ``Idempotency-Key`` is still being processed (it
  carries ``Retry-After``, or its body names the idempotency key, as the IETF draft has
  it): the same request is sent again after the Retry-After (1 s without one), under the
  same key, until the provider answers it (from its record) or the call's timeout runs
  out (:class:`~actors.errors.ToolTimeoutError`: the next attempt asks under the same key);
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
* other 4xx (another 409 too) → ProviderError with kind ``permanent``.

Every answer (refusals, 429s, included) is read for the limits the provider announces
(:func:`~actors.pacing.announced.parse_rate_limit_headers`: the IETF ``RateLimit`` /
``RateLimit-Policy`` fields, ``X-RateLimit-*`` and the LLM APIs' fields) and they are
reported (:func:`~actors.pacing.reports.report_limits`): the governor paces to them.

An answer carrying ``Idempotent-Replayed: true`` (as Stripe's API marks the stored answer
it replays for a repeated ``Idempotency-Key``) is told to the dispatcher
(:meth:`~actors.results.ToolContext.mark_replayed`): the run's report counts it apart
from the lookups the provider answered anew, which it bills.

Credential scope: receipts never cross credentials. An http_tool's credential-scope
digest (part of every receipt key, see :func:`credential_scope_digest`, in
``actors/http/credentials.py``) is a sha256 over what authenticates its requests as httpx
sends them: its auth headers, every query-string parameter and ``user:password@`` of its
URLs, the shared client's auth headers, query parameters, cookies and ``auth``, and an
explicit ``credentials=`` value; never the secret itself. Two runs with different
``Authorization`` headers therefore never share receipts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from actors.errors import (
    NotSentError,
    ProviderError,
    ProviderUnreachableError,
    RateLimitedError,
    ToolTimeoutError,
)
from actors.http.credentials import (
    AUTH_HEADER_WORDS,
    NOT_CREDENTIAL_COOKIES,
    NOT_CREDENTIALS,
    credential_scope_digest,
)
from actors.pacing.announced import parse_rate_limit_headers
from actors.pacing.bucket import SLOW_START_RPS, parse_retry_after
from actors.pacing.reports import report_limits
from actors.results import ToolContext
from actors.telemetry.config import ACTIVE
from actors.tool import BatchStrategy, Pacing, Tool
from stores.money import Money
from stores.quoting import brief, shorten
from stores.types import FailureKind

__all__ = [
    "AUTH_HEADER_WORDS",
    "NOT_CREDENTIALS",
    "NOT_CREDENTIAL_COOKIES",
    "HttpEndpoint",
    "credential_scope_digest",
    "http_tool",
]


def _items(body: Any, n: int) -> list[Any]:
    if isinstance(body, Mapping) and isinstance(body.get("results"), list):
        return list(body["results"])
    if isinstance(body, list):
        return body
    raise ProviderError(
        f"batch response has no 'results' list: {brief(body)}", failure_kind=FailureKind.TRANSIENT
    )


def _in_progress(response: httpx.Response) -> bool:
    """A 409 saying a request with the same ``Idempotency-Key`` is still being processed
    (IETF draft "The Idempotency-Key HTTP Header Field", section 2.6): it carries
    ``Retry-After``, or its body names the idempotency key. Another 409 (a conflict of the
    provider's own data) is the call's answer."""
    if response.headers.get("Retry-After") is not None:
        return True
    try:
        text = response.text[:2000].lower()
    except Exception:  # a body that cannot be decoded: not one that says so
        return False
    return "idempotency" in text or "idempotent" in text


def _item_error(item: Any) -> str | None:
    """A batch member's ``{"error": ...}``, short (a provider may quote the whole input)."""
    if isinstance(item, Mapping) and item.get("error"):
        error = item["error"]
        return shorten(error) if isinstance(error, str) else brief(error)
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
                may have reached the provider; or the provider was still processing
                this key's first request when the timeout ran out).
            ProviderError: other failures (transient for 5xx/transport, else permanent).
        """
        headers = {**self.headers, "Idempotency-Key": ctx.idempotency_key}
        timeout_s = ctx.timeout_s
        resend = max(0, getattr(ctx, "attempt", 1) - 1)  # this call's earlier attempts were sent too
        while True:
            telemetry = ACTIVE.get()  # (None unless telemetry is on: then an HTTP client span)
            if telemetry is None:
                response = self._send(body, headers, timeout_s)
            else:
                response = self._traced_send(telemetry, body, headers, timeout_s, resend)
            resend += 1
            report_limits(parse_rate_limit_headers(response.headers, time.time()))
            if response.status_code != 409 or not _in_progress(response):
                return self._answer(response, ctx)
            # the provider still processes this key's request (another attempt's, or a
            # crashed run's): its answer comes under the same key, never by a new request
            wait = parse_retry_after(
                response.headers.get("Retry-After"), time.time(), default_s=1.0, max_s=60.0, min_s=0.05
            )
            if time.monotonic() + wait >= ctx.deadline:
                raise ToolTimeoutError(
                    f"{self.url} was still processing the request with this Idempotency-Key "
                    f"(409) when the call's timeout ran out"
                )
            time.sleep(wait)
            timeout_s = max(0.001, ctx.deadline - time.monotonic())

    def _traced_send(
        self, telemetry: Any, body: Any, headers: dict[str, str], timeout_s: float, resend: int
    ) -> httpx.Response:
        """:meth:`_send` in an HTTP client span (``http`` semconv; ``resend``: the
        ``http.request.resend_count``), its trace context sent as ``traceparent``."""
        headers = dict(headers)
        span = telemetry.http(self.method, httpx.URL(self.url), resend, headers)
        try:
            response = self._send(body, headers, timeout_s)
        except BaseException as exc:
            span.close(None, exc.__cause__ if isinstance(exc.__cause__, httpx.HTTPError) else exc)
            raise
        span.close(response.status_code, None)
        return response

    def _send(self, body: Any, headers: dict[str, str], timeout_s: float) -> httpx.Response:
        """One request; transport errors mapped as :meth:`__call__` says."""
        try:
            return self.client.request(self.method, self.url, json=body, headers=headers, timeout=timeout_s)
        except httpx.ConnectTimeout as exc:  # no connection was made: nothing was sent
            raise ProviderUnreachableError(f"{self.url} could not be reached within {timeout_s} s") from exc
        except httpx.PoolTimeout as exc:  # every pooled connection stayed busy: nothing was sent
            raise NotSentError(f"{self.url}: no connection of the client's pool was free in time") from exc
        except httpx.TimeoutException as exc:
            raise ToolTimeoutError(f"{self.url} timed out after {timeout_s} s: {exc}") from exc
        except httpx.ConnectError as exc:
            raise ProviderUnreachableError(f"{self.url} could not be reached: {exc}") from exc
        except httpx.TransportError as exc:
            error = ProviderError(f"{self.url}: {exc}", failure_kind=FailureKind.TRANSIENT)
            # the connection broke after it was made (reset, closed with no answer): the
            # request may have reached the provider (uncertain for a tool not retry-safe)
            error.sent = isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError))
            raise error from exc

    def _answer(self, response: httpx.Response, ctx: ToolContext) -> Any:
        """The decoded JSON answer, or the error its status says (see :meth:`__call__`); a
        replayed answer is told to ``ctx``."""
        status = response.status_code
        if response.headers.get("Idempotent-Replayed", "").strip().lower() == "true":
            mark = getattr(ctx, "mark_replayed", None)  # a replay of a stored answer: not billed again
            if mark is not None:
                mark()
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
    keep_input: bool | Callable[[Any], str] = True,
    price: Money | Callable[[Any, Any], Money] | None = None,
    request_price: Money | None = None,
    units: Callable[[Any], Mapping[str, float]] | None = None,
    units_used: Callable[[Any, Any], Mapping[str, float]] | None = None,
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
            from :data:`~actors.pacing.bucket.SLOW_START_RPS` requests/s (doubling until the
            first 429, then a plateau under the limit learnt), so an API is never hit with
            every row at once.
        headers: extra headers (authentication).
        timeout_s: per-request timeout, seconds.
        client: an httpx.Client to share between tools.
        build_batch / split_batch: batch body builder and answer splitter.
        durable: False skips receipts.
        credentials: a JSON value naming the account, for credentials the headers,
            URLs and client do not show (see :func:`credential_scope_digest`).
        keep_input: what its receipts keep of each input (see ``Tool.keep_input``):
            the canonical input, a function's readable digest of it, or nothing.
        price: what one answered call (a batch member too) costs: ``Tool.price`` (a
            :class:`~stores.money.Money`, or ``price(input, output) -> Money``).
        request_price: what one batch request costs whatever its size
            (``BatchStrategy.request_price``; only with ``batch_url``).
        units / units_used: a call's estimate of what it uses of limits counted in units
            (tokens, credits), from its input, and its real use, from its input and
            answer (``Tool.units``, ``Tool.units_used``; see docs/pacing.md).

    The tool's ``credentials()`` digests the endpoints' current headers and the client's
    each time it is asked (after an ``AuthScopeChangedError`` too), so a changed key gives
    new receipts. The client's cookies count as they are then (a session, given or set
    by a login or by the provider), but for a load balancer's or a CDN's
    (:data:`NOT_CREDENTIAL_COOKIES`), which never name an account:
    a provider that rotates a session cookie makes the next run's digest another.

    Raises:
        ValueError: as :func:`credential_scope_digest`; a ``request_price`` without
            ``batch_url``; a price that is not a Money nor a function (``Tool``).
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
            request_price=request_price,
        )
    elif request_price is not None:
        raise ValueError(f"{tool_id}: request_price is what a batch request costs: give batch_url too")
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
        keep_input=keep_input,
        price=price,
        units=units,
        units_used=units_used,
    )
