"""The operator's web dashboard on the metrics listener: a static page (``gateway/http/static/``,
plain HTML, CSS and JavaScript) at ``/dashboard``, and ``/admin/overview``, the JSON it polls
every second: connections and cumulative counters per protocol, store figures, the longest backlogs.

The page computes rates from two successive overviews, so the server keeps no history.
``/admin/overview`` sits under ``/admin/`` and so needs an operator's credentials when any are
required (the admin token, or an admin user's Basic credentials: ``app.py``).
"""

from __future__ import annotations

import heapq
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from store import LatencyHistogram

if TYPE_CHECKING:
    from store import MessageStore

    from ..pressure import StorePressure
    from .deps import Brokers, Status

TOP_BACKLOGS = 20  # rows of the backlog table
MAX_SESSIONS_SCANNED = 10_000  # MQTT sessions whose cursors one overview reads (1 s polls)

# The page's files, served from memory (read once; a handful of kilobytes).
STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
# served to anyone: the page holds no data, and asks for credentials when /admin/overview wants them
PUBLIC_PATHS = ("/", "/dashboard", *(f"/dashboard/static/{name}" for name in STATIC if name != "index.html"))
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # no inline script or style, and nothing from elsewhere: data reaches the DOM as text only
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}


def add_routes(app: web.Application, brokers: Brokers, store: MessageStore | None, pressure: StorePressure | None,
               status: Status) -> None:
    """``/`` redirects to ``/dashboard``; the page's files under ``/dashboard/static/``; the
    page's data at ``/admin/overview``."""
    folder = resources.files(__package__) / "static"
    files = {name: (folder / name).read_bytes() for name in STATIC}

    def serve(name: str):
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=files[name], content_type=STATIC[name], charset="utf-8", headers=HEADERS)
        return handler

    async def root(request: web.Request) -> web.Response:
        raise web.HTTPFound("dashboard")  # relative: also right behind a proxy that adds a path prefix

    async def overview_view(request: web.Request) -> web.Response:
        return web.json_response(overview(brokers, store, pressure, status))

    app.router.add_get("/", root)
    app.router.add_get("/dashboard", serve("index.html"))
    for name in STATIC:
        if name != "index.html":
            app.router.add_get(f"/dashboard/static/{name}", serve(name))
    app.router.add_get("/admin/overview", overview_view)


def overview(brokers: Brokers, store: MessageStore | None, pressure: StorePressure | None,
             status: Status) -> dict[str, Any]:
    """What the dashboard shows, read from counters the gateways keep anyway. Counters are
    cumulative since start; ``time`` (epoch ms) lets the page turn two overviews into rates."""
    protocols: dict[str, dict[str, int]] = {}
    for name, broker in brokers.running():
        stats = broker.stats
        protocols[name] = {"connections": len(broker.connections), "connections_total": stats.connections_total,
                           "messages_in": stats.messages_received, "messages_out": stats.messages_sent,
                           "bytes_in": stats.bytes_received, "bytes_out": stats.bytes_sent,
                           "dropped": stats.publish_dropped, "auth_failures": stats.auth_failures}
    backlogs, partial = top_backlogs(brokers, store)
    return {"time": time.time() * 1000.0, "protocols": protocols,
            "mqtt_sessions": len(brokers.mqtt.sessions) if brokers.mqtt is not None else None,
            "store": store_figures(store, pressure, status), "backlogs": backlogs, "backlogs_partial": partial}


def store_figures(store: MessageStore | None, pressure: StorePressure | None, status: Status) -> dict[str, Any] | None:
    if store is None:
        return None
    latency = store.put_latency
    return {"queues": store.queue_count,
            "commitlog_bytes": store.commitlog.end_position - store.commitlog.min_position,
            "dispatch_lag_bytes": store.dispatch_lag_bytes, "backlog_messages": store.backlog,
            "put_latency": {"count": latency.count, "sum_s": latency.sum,
                            "p50_s": quantile(latency, 0.5), "p99_s": quantile(latency, 0.99)},
            "resource_alarm": bool(pressure is not None and pressure.raised),
            "event_loop_lag_s": status.loop_lag_s}


def quantile(histogram: LatencyHistogram, q: float) -> float | None:
    """The q-quantile of a histogram since start, interpolated inside its bucket as Prometheus'
    ``histogram_quantile`` does (above the last bound: that bound). None before any observation."""
    if histogram.count == 0:
        return None
    rank = q * histogram.count
    lower, below = 0.0, 0
    for bound, cumulative in histogram.cumulative():
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def top_backlogs(brokers: Brokers, store: MessageStore | None, limit: int = TOP_BACKLOGS) -> tuple[list[dict[str, Any]], bool]:
    """The longest backlogs, in messages, over three kinds (only non-empty ones, longest first):

    - ``amqp queue``: ready messages (not yet delivered to a consumer);
    - ``remoting group``: messages of the group's subscribed topics not yet committed by it;
    - ``mqtt session``: for a persistent session, messages of the queues it reads beyond its
      cursors (not yet sent, or sent and not acknowledged), connected or not.

    True as second value when there were more MQTT sessions than one call reads.
    """
    rows: list[tuple[int, str, str]] = []
    amqp, remoting, mqtt = brokers.amqp, brokers.remoting, brokers.mqtt
    if amqp is not None:
        rows.extend((queue.ready_count(), "amqp queue", name) for name, queue in amqp.queues.items())
    if remoting is not None:
        rows.extend((remoting.group_lag(group), "remoting group", group) for group in list(remoting.groups.groups))
    partial = False
    if mqtt is not None and store is not None:
        max_offset = store.max_offset_now
        for scanned, (client_id, session) in enumerate(mqtt.sessions.items()):
            if scanned >= MAX_SESSIONS_SCANNED:
                partial = True
                break
            if session.persistent:
                lag = sum(max(0, max_offset(c.queue) - c.committed) for c in session.cursors.values())
                rows.append((lag, "mqtt session", client_id))
    rows = heapq.nlargest(limit, (row for row in rows if row[0] > 0))
    return [{"kind": kind, "name": name, "lag": lag} for lag, kind, name in rows], partial
