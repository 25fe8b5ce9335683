"""The gateway's HTTP listener (``--metrics-bind``): Prometheus metrics at ``/metrics``,
``/healthz`` (the process answers), ``/readyz`` (the store is open and every listener is up),
the admin API of ``tidemq ctl`` under ``/admin/`` (``admin.py``; the event rules and schemas:
``rules_api.py``, ``schemas_api.py``), the data API under ``/data/`` (``data_api.py``; CloudEvents
in: ``event_ingest.py``) and the dashboard (``dashboard.py``).

``HttpServer`` is built from ``HttpDeps`` (``deps.py``) and hands each module the parts it
reads. Every route but ``PUBLIC_PATHS`` (metrics and probes, which carry counts and names but no
message, and the dashboard's static page) goes through one guard: the caller's credentials
(``data_access.py``), the operator's for everything but ``/data/``, where users are under the
ACL. An ``AdminError`` raised by any handler becomes a JSON error answer.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from store import StoreError

from ..listen import listening_sockets

from . import admin, dashboard, data_api, event_ingest, rules_api, schemas_api
from .data_access import PRINCIPAL, DataAccess
from .data_publish import PublishApi
from .deps import HttpDeps
from .errors import AdminError
from .metrics import GatewayCollector

log = logging.getLogger("tidemq.http")

PUBLIC_PATHS = frozenset({"/metrics", "/healthz", "/readyz", *dashboard.PUBLIC_PATHS})


class HttpServer:
    def __init__(self, deps: HttpDeps, read_timeout_s: float = 60.0) -> None:
        self.deps = deps
        self.access = DataAccess(deps.access, deps.brokers.amqp)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GatewayCollector(
            deps.brokers, deps.store, authorizer=deps.access.authorizer, status=deps.status, pressure=deps.pressure,
            tracer=deps.tracer, cluster=deps.cluster, timer=deps.timer))
        app = self.app = web.Application(middlewares=[self._guard])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/admin/clients", self._clients)
        app.router.add_get("/admin/sessions", self._sessions)
        app.router.add_get("/admin/subscriptions", self._subscriptions)
        app.router.add_get("/admin/queues", self._queues)
        app.router.add_get("/admin/messages", self._messages)
        app.router.add_post("/admin/kick", self._kick)
        # /data/: bulk reads as Arrow, and publishing (data_api.py, data_publish.py)
        publish = PublishApi(deps.brokers.mqtt, self.access, deps.status, deps.pressure)
        data_api.add_routes(app, deps.store, self.access, publish, deps.filter_holds)
        self.registry.register(publish.collector())  # tidemq_data_publish_*
        # POST /data/events/{topic}: CloudEvents in (event_ingest.py), checked against the event schemas
        ingest = event_ingest.add_routes(app, deps.brokers.mqtt, self.access, deps.status, deps.pressure,
                                         deps.rules.schemas if deps.rules is not None else None, deps.schema_source)
        self.registry.register(event_ingest.IngestCollector(ingest))  # tidemq_cloudevents_total
        # /dashboard and the /admin/overview it polls
        dashboard.add_routes(app, deps.brokers, deps.store, deps.pressure, deps.status)
        app.router.add_get("/admin/trace", self._trace)
        app.router.add_get("/admin/cluster", self._cluster)
        rules_api.add_routes(app, deps.rules, deps.rules_place)  # /admin/rules: the event rules (tidemq ctl rules)
        schemas_api.add_routes(app, deps.rules, deps.rules_place)  # /admin/schemas: the event schemas
        self.registry.register(rules_api.RulesCollector(deps.rules))  # tidemq_rule_*
        # (aiohttp's keep-alive timeout also closes a connection whose request is unfinished, or none came)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=read_timeout_s)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Serve on the sockets of ``host`` and ``port``; the first one's address (port 0 picks one)."""
        access = self.deps.access
        if access.requires_credentials and not access.admin_credentials:
            log.warning("the admin API refuses every request: authentication is configured and no operator "
                        "credentials are; set admin_token or admin_users")
        await self._runner.setup()
        sockets = await listening_sockets(host, port)
        for sock in sockets:
            await web.SockSite(self._runner, sock).start()
        return sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        await self._runner.cleanup()

    # -- who may call --------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        try:
            who = await self.access.authenticate(request)
            if who is not None and not request.path.startswith("/data/"):
                raise AdminError(403, f"user {who.username!r} is not one of admin_users")
            request[PRINCIPAL] = who
            return await handler(request)
        except AdminError as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        except StoreError as exc:  # (a write the store refused: a full disk)
            return web.json_response({"error": f"not stored, retry: {exc}"}, status=503)

    @staticmethod
    async def _json(data) -> web.Response:
        return web.json_response(data, dumps=lambda d: json.dumps(d, default=str))

    async def _clients(self, request: web.Request) -> web.Response:
        client_id = request.query.get("id")
        if client_id:
            return await self._json(await admin.locate_client(self.deps.brokers.mqtt, self.deps.cluster.node,
                                                              client_id))
        return await self._json(admin.clients(self.deps.brokers))

    async def _sessions(self, request: web.Request) -> web.Response:
        return await self._json(admin.sessions(self.deps.brokers.mqtt))

    async def _subscriptions(self, request: web.Request) -> web.Response:
        return await self._json(admin.subscriptions(self.deps.brokers))

    async def _queues(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise AdminError(400, "limit must be a number") from None
        return await self._json(admin.queues(self.deps.store, self.deps.brokers, request.query.get("prefix", ""),
                                             request.query.get("after", ""), limit))

    async def _messages(self, request: web.Request) -> web.Response:
        q = request.query
        return await self._json(await admin.find_messages(self.deps.store, key=q.get("key"), topic=q.get("topic"),
                                                          msg_id=q.get("msg_id")))

    async def _cluster(self, request: web.Request) -> web.Response:
        """The replicated store group this node belongs to or follows, as etcd holds it."""
        view = self.deps.cluster.group_view
        if view is None:
            raise AdminError(404, "this node is not part of a replicated store group (replication_group)")
        try:
            return await self._json(await view())
        except OSError as exc:
            raise AdminError(503, f"etcd did not answer: {exc}") from None

    async def _trace(self, request: web.Request) -> web.Response:
        q = request.query
        return await self._json(await admin.trace(self.deps.store, self.deps.traced_listeners,
                                                  msg_id=q.get("msg_id"), key=q.get("key")))

    async def _kick(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            protocol, client = str(body["protocol"]), str(body["client"])
        except (ValueError, KeyError, TypeError):
            raise AdminError(400, 'send {"protocol": ..., "client": ...}') from None
        return await self._json(admin.kick(self.deps.brokers, protocol, client))

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        problem = self.deps.status.not_ready()
        if problem:
            return web.Response(status=503, text=f"not ready: {problem}\n")
        return web.Response(text="ready\n")
