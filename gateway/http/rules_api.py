"""The admin API of the event rules (``tidemq ctl rules``), behind the same operator guard as the
rest of ``/admin/`` (app.py):

    GET    /admin/rules                 every rule: state, counters, lag, last error, definition
    POST   /admin/rules                 create: {"name": ..., "sources": [...], "targets": [...], ...}
    GET    /admin/rules/{name}
    PUT    /admin/rules/{name}          change: the whole new definition
    DELETE /admin/rules/{name}
    POST   /admin/rules/{name}/pause    POST /admin/rules/{name}/resume
    POST   /admin/rules/{name}/replay   {"from": "2026-11-29T10:00:00Z"} or {"offset": N}: the cursors moved

A definition refused is a 400 whose JSON names ``path`` (where in the definition) and ``reason``.
The same rows feed ``/metrics`` (``RulesCollector``): ``tidemq_rule_*`` per rule.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from .deps import RulesControl, RulesPlace
from .metrics import histogram_buckets
from .errors import AdminError

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def add_routes(app: web.Application, rules: RulesControl | None, place: RulesPlace | None = None) -> None:
    api = RulesApi(rules, place)
    app.router.add_get("/admin/rules", api.list)
    app.router.add_post("/admin/rules", api.create)
    app.router.add_get("/admin/rules/{name}", api.get)
    app.router.add_put("/admin/rules/{name}", api.change)
    app.router.add_delete("/admin/rules/{name}", api.delete)
    app.router.add_post("/admin/rules/{name}/pause", api.pause)
    app.router.add_post("/admin/rules/{name}/resume", api.resume)
    app.router.add_post("/admin/rules/{name}/replay", api.replay)


async def not_here(place: RulesPlace | None, what: str) -> AdminError:
    """The answer to a request for the event rules or schemas (``what``) on a node that does not
    keep them: a gateway node names where its cluster keeps them (421), any other says why."""
    if place is not None:
        return AdminError(421, f"{what} are kept on {await place()}, not on this gateway node: ask there")
    return AdminError(501, f"no {what} on this node: they are kept on a node with the store and an MQTT listener, "
                           "or on a cluster's store node")


class RulesApi:
    def __init__(self, rules: RulesControl | None, place: RulesPlace | None = None) -> None:
        self._rules = rules
        self._place = place

    async def _engine(self) -> RulesControl:
        if self._rules is None:
            raise await not_here(self._place, "event rules")
        return self._rules

    async def list(self, request: web.Request) -> web.Response:
        return _json((await self._engine()).list())

    async def get(self, request: web.Request) -> web.Response:
        row = (await self._engine()).get(request.match_info["name"])
        if row is None:
            raise AdminError(404, f"no rule named {request.match_info['name']!r}")
        return _json(row)

    async def create(self, request: web.Request) -> web.Response:
        engine = (await self._engine())
        body = await _body(request)
        name = body.pop("name", None)
        if not isinstance(name, str):
            return _refused("$.name", "a rule needs a name (a string)")
        if engine.get(name) is not None:
            raise AdminError(409, f"a rule named {name!r} exists: change it (PUT /admin/rules/{name}) or delete it")
        try:
            return _json(await engine.create(name, body), status=201)
        except ValueError as exc:
            return _refused(getattr(exc, "path", "$"), getattr(exc, "reason", str(exc)))

    async def change(self, request: web.Request) -> web.Response:
        engine = (await self._engine())
        body = await _body(request)
        try:
            return _json(await engine.change(request.match_info["name"], body))
        except LookupError as exc:
            raise AdminError(404, str(exc)) from None
        except ValueError as exc:
            return _refused(getattr(exc, "path", "$"), getattr(exc, "reason", str(exc)))

    async def delete(self, request: web.Request) -> web.Response:
        try:
            await (await self._engine()).delete(request.match_info["name"])
        except LookupError as exc:
            raise AdminError(404, str(exc)) from None
        return _json({"deleted": request.match_info["name"]})

    async def pause(self, request: web.Request) -> web.Response:
        return await self._pause(request, True)

    async def resume(self, request: web.Request) -> web.Response:
        return await self._pause(request, False)

    async def _pause(self, request: web.Request, paused: bool) -> web.Response:
        try:
            return _json(await (await self._engine()).set_paused(request.match_info["name"], paused))
        except LookupError as exc:
            raise AdminError(404, str(exc)) from None


    async def replay(self, request: web.Request) -> web.Response:
        engine = (await self._engine())
        body = await _body(request)
        unknown = sorted(set(body) - {"from", "offset"})
        if unknown or ("from" in body) == ("offset" in body):
            return _refused("$", 'send {"from": TIME} (RFC 3339, or milliseconds since the epoch) or {"offset": N}')
        try:
            from_ms = replay_time(body["from"]) if "from" in body else None
            offset = body.get("offset")
            if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
                return _refused("$.offset", "an offset is a whole number, 0 or more")
            return _json(await engine.replay(request.match_info["name"], from_ms=from_ms, offset=offset))
        except LookupError as exc:
            raise AdminError(404, str(exc)) from None
        except ValueError as exc:
            return _refused(getattr(exc, "path", "$.from"), getattr(exc, "reason", str(exc)))


def replay_time(value: Any) -> int:
    """Milliseconds since the epoch of a replay's ``from``: RFC 3339 text with its offset, or a
    number of milliseconds (ValueError otherwise)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and RFC3339.fullmatch(value):
        moment = dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        return int(moment.timestamp() * 1000)
    raise ValueError("a time in RFC 3339 with its offset (2026-11-29T10:00:00Z), or milliseconds since the epoch")


class RulesCollector:
    """Each rule's counters and lag for Prometheus (labelled by rule: as many as the operator made)."""

    COUNTERS = (("matched", "events that matched the rule's pattern"),
                ("delivered", "matched events every target of the rule took"),
                ("retried", "attempts at a target made again after a failure"),
                ("dead_lettered", "(event, target) pairs sent to the rule's dead-letter topic"))

    def __init__(self, rules: RulesControl | None) -> None:
        self._rules = rules

    def describe(self) -> list[Metric]:
        return []  # collected on each scrape only

    def collect(self) -> Iterator[Metric]:
        if self._rules is None:
            return
        rows = self._rules.list()
        for key, documentation in self.COUNTERS:
            family = CounterMetricFamily(f"tidemq_rule_{key}", documentation, labels=["rule"])
            for row in rows:
                family.add_metric([row["name"]], row[key])
            yield family
        lag = GaugeMetricFamily("tidemq_rule_lag", "messages of a rule's source queues not yet done", labels=["rule"])
        for row in rows:
            lag.add_metric([row["name"]], row["lag"])
        yield lag
        latency = HistogramMetricFamily("tidemq_rule_target_latency_seconds",
                                        "each call of a rule's target (an event, or a batch) until its answer",
                                        labels=["rule"])
        for name, histogram in self._rules.target_latencies().items():
            latency.add_metric([name], histogram_buckets(histogram), histogram.sum)
        yield latency


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise AdminError(400, f"$: the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise AdminError(400, "$: a rule is a JSON object")
    return body


def _refused(path: str, reason: str) -> web.Response:
    return web.json_response({"error": f"{path}: {reason}", "path": path, "reason": reason}, status=400)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))
