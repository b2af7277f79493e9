"""Example play: inspect domain names through the local provider (see examples/provider.py).

Each row is one domain name. ``inspect_domain`` is a batchable HTTP tool (one batch
request serves up to 100 domains); ``country`` looks up the country of the domain's
ccTLD (batchable too). Set TOOLDISPATCH_PROVIDER_URL to the provider's base URL.

Run it on any list of domain names, one per line (see the example in docs/cli.md)::

    python examples/provider.py --port 8750 &
    TOOLDISPATCH_PROVIDER_URL=http://127.0.0.1:8750 tooldispatch run examples/domains_play.py \
        --input domains.txt --output domains.out.jsonl
"""

from __future__ import annotations

import os

from actors import Pacing
from actors.http import http_tool

BASE = os.environ.get("TOOLDISPATCH_PROVIDER_URL", "http://127.0.0.1:8750")
RPS = float(os.environ.get("TOOLDISPATCH_PROVIDER_RPS", "0") or 0)
"""The provider's rate when the play knows it (0: unknown; the HTTP tools then slow-start
and AIMD learns the rate from 429s)."""
BATCH = os.environ.get("TOOLDISPATCH_BATCH", "1") != "0"
"""TOOLDISPATCH_BATCH=0 sends one request per call (used to measure pacing)."""
_pacing = Pacing(rps=RPS) if RPS else None

tools = [
    http_tool("inspect_domain", f"{BASE}/v1/domain", batch_url=f"{BASE}/v1/domain/batch" if BATCH else None,
              max_batch_size=100, provider="local-provider", pacing=_pacing),
    http_tool("country", f"{BASE}/v1/country", batch_url=f"{BASE}/v1/country/batch" if BATCH else None,
              max_batch_size=50, provider="local-provider", pacing=_pacing),
]  # fmt: skip


def play(row, ctx):
    info = ctx.tool("inspect_domain", {"domain": row})
    country = ctx.tool("country", {"code": info["country"]}) if info.get("country") else None
    return {"domain": row, "tld": info["tld"], "country": country["name"] if country else None}
