"""What a run shows while it runs and after it: the live view on a terminal, the time
series sampled for the charts, and the report as a self-contained HTML page.

Nothing here touches the actors: everything is read from ``stats()`` snapshots.
"""

from actors.job.views.html import render_html, write_report_html
from actors.job.views.live import holdups, live_view
from actors.job.views.timeline import Point, Timeline, provider_tools

__all__ = ["Point", "Timeline", "holdups", "live_view", "provider_tools", "render_html", "write_report_html"]
