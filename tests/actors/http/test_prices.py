"""``http_tool(price=..., request_price=...)``: what a call and a batch request cost, as
``Tool.price`` and ``BatchStrategy.request_price``; a request price needs a batch URL."""

from __future__ import annotations

import pytest

from actors.http import http_tool
from stores import Money

URL = "http://127.0.0.1:9/v1/domain"


def test_http_tool_states_its_prices() -> None:
    each, request = Money("0.001", "USD"), Money("0.01", "USD")
    tool = http_tool("inspect", URL, batch_url=URL + "/batch", price=each, request_price=request)
    assert tool.price == each
    assert tool.batch is not None and tool.batch.request_price == request
    assert http_tool("plain", URL).price is None


def test_http_tool_refuses_a_request_price_without_a_batch_url() -> None:
    with pytest.raises(ValueError, match="request_price"):
        http_tool("inspect", URL, request_price=Money("0.01", "USD"))


def test_http_tool_refuses_a_price_that_is_not_money() -> None:
    with pytest.raises(ValueError, match="price"):
        http_tool("inspect", URL, price=0.001)  # type: ignore[arg-type]
