"""The gateway process: opens the store, starts the listeners, shuts down cleanly."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cache import QueueCache
from lookup.redis_backend import RedisLookup
from store import MessageStore, StoreError

from . import lean_tcp
from .amqp.broker import AMQPBroker
from .amqp.connection import AMQPConnection
from .auth import Acl, PasswordFile
from .auth.authorize import Authorizer, MqttAccess
from .broker_factory import amqp_broker, mqtt_settings, remoting_broker
from .cluster.gateway_store import GatewayStore
from .cluster.mqtt_node import GatewayNode
from .cluster.notify_router import NotifyRouter
from .cluster.relayed_listeners import RelayedListeners
from .cluster.election import LeaderFinder
from .cluster.store_group import StoreGroupMember
from .cluster.store_node_link import link_to_store_node, lookup_options, start_lookup
from .cluster.store_service import StoreService
from .config import Config, ConfigError, event_rules, event_schemas, parse_bind, parse_names
from .tls import key_and_chain, tls_context
from .listen import ListeningServer, format_address
from .core.timer import TimerService
from .http.app import HttpServer
from .http.data_holds import FilterHolds
from .http.deps import STANDALONE, Brokers, ClusterParts, HttpAccess, HttpDeps
from .mqtt import listeners
from .mqtt.broker import MQTTBroker
from .mqtt.local_ports import local_ports
from .interop import AMQP_QUEUE_PREFIX, TOPIC_QUEUE_PREFIX, WILDCARD_QUEUE_PREFIX
from .mqtt.queues import WildcardQueues
from .mqtt.retained import RetainedIndex
from .ports import MQTTPorts
from .pressure import StorePressure
from .queue_policy import QueuePolicy, parse_rules
from .remoting.broker import RemotingBroker
from .remoting.connection import RemotingConnection
from .rules_host import GatewayRuleHost, LinkedSchemas, Rules, check_declared, store_node_publisher

if TYPE_CHECKING:
    from .rocketmq_grpc.server import GrpcServer
from .trace import Tracer, parse_listeners

log = logging.getLogger("tidemq.gateway")

PROTOCOLS = ("mqtt", "amqp", "remoting")
MQTT_LISTENERS = ("mqtt", "mqtts", "ws")  # config fields {name}_bind


@dataclass(slots=True)
class Listener:
    protocol: str
    server: ListeningServer

    @property
    def address(self) -> tuple[str, int]:
        sock = self.server.sockets[0]
        host, port = sock.getsockname()[:2]
        return host, port


class Gateway:
    def __init__(self, config: Config) -> None:
        for name in MQTT_LISTENERS:
            if config.role == "store" and getattr(config, f"{name}_bind"):
                raise ConfigError(f"{name}_bind: in a cluster, MQTT clients connect to the gateway nodes")
        if config.role == "gateway" and event_rules(config):
            raise ConfigError("event_rules: in a cluster, rules run on the store node (a replicated group's "
                              "leader): declare them in the store nodes' configuration", "event_rules")
        if config.role == "gateway" and config.event_schemas:
            raise ConfigError("event_schemas: in a cluster, event schemas are kept with the rules: declare them in "
                              "the store nodes' configuration", "event_schemas")
        check_declared(event_rules(config))
        self.config = config
        self.store: MessageStore | None = None
        self.timer: TimerService | None = None  # timer messages of every protocol (core/timer.py)
        self.mqtt: MQTTBroker | None = None
        self.amqp: AMQPBroker | None = None
        self.remoting: RemotingBroker | None = None
        self.grpc: GrpcServer | None = None  # RocketMQ 5 clients (grpc_bind)
        self.relayed: RelayedListeners | None = None  # a gateway node's AMQP, remoting and gRPC listeners
        self.listeners: list[Listener] = []
        self.pressure: StorePressure | None = None
        self._pressure_task: asyncio.Task[None] | None = None
        self.http: HttpServer | None = None  # the --metrics-bind listener (gateway/http/)
        self.loop_lag_s = 0.0  # how late the event loop ran a timer, lately (metrics)
        self._lag_task: asyncio.Task[None] | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.tracer: Tracer | None = None
        self.gateway_store: GatewayStore | None = None  # --role gateway: the store node's store
        self.node: GatewayNode | None = None
        self.store_service: StoreService | None = None  # --role store
        self.store_group: StoreGroupMember | None = None  # --role store in a replication group
        self.leader_finder: LeaderFinder | None = None  # --role gateway over a replication group
        self._store_address: Callable[[str], Awaitable[tuple[str, int]]] = self._no_store_address
        self.store_lookup: RedisLookup | None = None  # a store node's lookup client (Redis), for notify routing
        # where MQTT publishes find their target queues, for the other protocols to join: a
        # standalone node's MQTT gateway's (made with it), a store node's for the cluster (its
        # gateway nodes' sessions hold them); None on a gateway node, or with MQTT off
        self.wildcards: WildcardQueues | None = (WildcardQueues(subscribers_known=False) if config.role == "store"
                                                 else None)
        self._traced: frozenset[str] = parse_listeners(config.trace)
        # one authorisation model for every protocol (gateway/auth/authorize.py): loaded in start()
        self.authorizer = Authorizer(None)
        self.passwords: PasswordFile | None = None
        self.ready = False
        self._filter_holds: FilterHolds | None = None
        self.rules: Rules | None = None  # event rules (bridge/rules): a node with the store and MQTT
        self._cache: QueueCache | None = None  # the queue cache of a node with the store and no MQTT

    async def start(self) -> None:
        cfg = self.config
        self.passwords = PasswordFile.load(cfg.password_file) if cfg.password_file else None
        self.authorizer = Authorizer(Acl.load(cfg.acl_file) if cfg.acl_file else None)
        if self.config.role == "gateway":
            await self._connect_store_node()
        else:
            await self._open_store()
        if self.config.role == "store" and self.config.replication_group:
            try:
                await self._join_store_group()
            except BaseException:
                await self.stop()
                raise
            return
        try:
            await self._serve()
        except BaseException:
            await self.stop()
            raise

    async def _join_store_group(self) -> None:
        """A store node of a replicated group: it serves only while it leads (cluster/store_group.py)."""
        assert self.store is not None
        cfg = self.config
        advertised = {"remoting": cfg.remoting_advertise or cfg.remoting_bind, "amqp": cfg.amqp_bind,
                      "grpc": cfg.grpc_bind, "http": cfg.metrics_bind}  # (http: the admin API, rules included)
        self.store_group = StoreGroupMember(cfg, self.store, advertised, self._serve, self._unserve,
                                            self._reopen_store)
        await self.store_group.start()
        self.ready = True
        log.info("store node joined its replication group group=%s node_id=%s", cfg.replication_group, cfg.node_id)

    async def _serve(self) -> None:
        """Start the timer, the listeners and the HTTP listener over the open store (or store link)."""
        if self.store is not None:
            self.timer = TimerService(self.store)  # (on the node with the store: a gateway node's are there)
            self.timer.start()
            if self.config.role == "store":
                self.wildcards = WildcardQueues(subscribers_known=False)
        if self._traced and self.store is not None:
            self.tracer = Tracer(self.store)
            self.tracer.start()
            log.info("message trace on listeners=%s", ",".join(sorted(self._traced)))
        try:
            for protocol in PROTOCOLS:
                if protocol == "mqtt":  # up to three listeners (plain, TLS, WebSocket), any of them off
                    await self._start_mqtt()
                    continue
                bind = parse_bind(getattr(self.config, f"{protocol}_bind"), f"{protocol}_bind")
                if bind is None:
                    log.info("listener off protocol=%s", protocol)
                    continue
                if protocol == "amqp" and self.relayed is not None:
                    server = await self.relayed.start_amqp(bind)
                elif protocol == "amqp":
                    server = await self._start_amqp(bind)
                elif self.relayed is not None:
                    server = await self.relayed.start_remoting(bind)
                else:
                    server = await self._start_remoting(bind)
                self._started(protocol, server)
            grpc_bind = parse_bind(self.config.grpc_bind, "grpc_bind")
            grpcs_bind = parse_bind(self.config.grpcs_bind, "grpcs_bind")
            if (grpc_bind is not None or grpcs_bind is not None) and self.remoting is not None:
                await self._start_grpc(grpc_bind, grpcs_bind)
            elif (grpc_bind is not None or grpcs_bind is not None) and self.relayed is not None:
                await self.relayed.start_grpc(grpc_bind, grpcs_bind)
            metrics_bind = parse_bind(self.config.metrics_bind, "metrics_bind")
            if metrics_bind is not None:
                self._lag_task = asyncio.get_running_loop().create_task(self._watch_loop_lag(), name="loop-lag")
                self.http = HttpServer(self._http_deps(), read_timeout_s=self.config.read_timeout_s)
                self.metrics_address = await self.http.start(*metrics_bind)
                log.info("listener started protocol=metrics address=%s", format_address(*self.metrics_address))
            self._set_queue_policy()
        except BaseException:
            await self._unserve()
            raise
        self.ready = True
        log.info("gateway ready data_dir=%s flush=%s", self.config.data_dir, self.config.flush)

    async def _reopen_store(self) -> MessageStore:
        """Close the store and open it again (a replica installing its leader's seed)."""
        if self._pressure_task is not None:
            self._pressure_task.cancel()
            self._pressure_task = None
        if self.store is not None:
            await self.store.close()
        await self._open_store()
        assert self.store is not None
        return self.store

    async def _open_store(self) -> None:
        self.store = await MessageStore.open(self.config.store_options())
        self.pressure = StorePressure(self.store, disk_free_limit=self.config.disk_free_limit,
                                      backlog_limit=self.config.store_backlog_limit)
        self.pressure.check()
        self._pressure_task = asyncio.get_running_loop().create_task(self.pressure.watch(), name="store-pressure")

    async def _connect_store_node(self) -> None:
        """A gateway node: no store of its own, the store node's over the store link (a
        replicated store's: its leader's, found in etcd again at each reconnect)."""
        node_id = self.config.node_name()
        link = await link_to_store_node(self.config)
        self.gateway_store, self._store_address, self.leader_finder = link.store, link.address, link.leader_finder
        self.relayed = RelayedListeners(self.config, link.store, link.address, follows_leader=bool(link.leader_finder),
                                        remoting_advertised=self._remoting_advertised,
                                        grpc_advertised=self._grpc_advertised)
        self.node = GatewayNode(self.gateway_store, node_id, await start_lookup(self.config, node_id))
        log.info("gateway node connected to its store node node_id=%s store=%s", node_id, self.config.store_address)

    @staticmethod
    async def _no_store_address(service: str) -> tuple[str, int]:
        raise OSError("not a gateway node")

    async def _start_mqtt(self) -> None:
        """The MQTT broker and each of its listeners that is configured: plain, TLS, WebSocket."""
        cfg = self.config
        binds = {name: parse_bind(getattr(cfg, f"{name}_bind"), f"{name}_bind") for name in MQTT_LISTENERS}
        if all(bind is None for bind in binds.values()):
            log.info("listener off protocol=mqtt")
            self.filter_holds()  # a store node's: before the store link's listener
            self._start_rules()  # (refuses declared rules: they need MQTT)
            return
        settings = mqtt_settings(cfg)
        # the certificate first: a bad one stops start-up before any listener opens
        tls = tls_context(cfg) if binds["mqtts"] is not None else None
        acl = MqttAccess(self.authorizer) if self.authorizer.acl is not None else None
        ports = self._mqtt_ports()
        self.mqtt = MQTTBroker(ports, settings, cache=QueueCache(ports.store, cfg.queue_cache_bytes),
                               authenticator=self.passwords, acl=acl, pressure=self.pressure,
                               node=cfg.node_name())
        if self.node is not None:  # the store link's kicks and loss reach the broker's clients
            self.node.attach(self.mqtt)
        await self.mqtt.start()
        self.filter_holds()  # restored before the listeners: no publish misses a held filter
        self._start_rules()  # (the same: a rule's filters are held before any publish)
        for name, bind in binds.items():
            if bind is None:
                if name == "mqtt":
                    log.info("listener off protocol=mqtt")
                continue
            if name == "ws":
                server: ListeningServer = await listeners.start_websocket(
                    self.mqtt, bind[0], bind[1], self._tracer_for("ws"))
            else:
                server = await listeners.start_tcp(self.mqtt, bind[0], bind[1], tls if name == "mqtts" else None,
                                                   self._tracer_for(name))
            self._started(name, server)

    def _start_rules(self) -> None:
        """The event rules the store keeps and the configuration declares (bridge/rules), on a
        node with the store: a standalone node's over its MQTT broker, a store node's (a
        replicated group's leader: ``_serve`` runs while it leads) over the cluster's filters.
        A gateway node has none: its store node runs them."""
        declared, schemas = event_rules(self.config), event_schemas(self.config)
        if self.store is None or (self.mqtt is None and self.config.role != "store"):
            if declared:
                raise ConfigError("event_rules: rules run on a node with the store and an MQTT listener (their "
                                  "sources and topic targets are MQTT topics)", "event_rules")
            if schemas:
                raise ConfigError("event_schemas: event schemas are kept with the rules, on a node with the store "
                                  "and an MQTT listener", "event_schemas")
            return
        if self.mqtt is not None:
            host = GatewayRuleHost(self.store, self.mqtt.cache, self.mqtt.wildcards, self.mqtt.publish)
        else:
            assert self.wildcards is not None  # (a store node's: its gateway nodes' filters)
            leads_now = self.store_group.elector.leads_now if self.store_group is not None else None
            host = GatewayRuleHost(self.store, self.queue_cache(), self.wildcards,
                                   store_node_publisher(self.store, self.wildcards), leads_now)
        self.rules = Rules(self.store, host)
        try:
            self.rules.start(declared, schemas)
        except ConfigError:
            self.rules = None
            raise

    def _started(self, protocol: str, server: ListeningServer) -> None:
        self.listeners.append(Listener(protocol, server))
        for sock in server.sockets:
            log.info("listener started protocol=%s address=%s", protocol, format_address(*sock.getsockname()[:2]))

    def _mqtt_ports(self) -> MQTTPorts:
        """The MQTT gateway's ports (gateway/ports.py), chosen here once: a gateway node's, over
        its store node, or the local store's."""
        if self.node is not None:
            return self.node.ports()
        assert self.store is not None
        self.wildcards = WildcardQueues()
        return local_ports(self.store, self.wildcards)

    def _set_queue_policy(self) -> None:
        """Per-topic retention and light queues removed when idle (gateway/queue_policy.py): light
        are the queues whose readers this process knows, each protocol's check says who reads."""
        store = self.store
        if store is None:  # a gateway node: the store node decides
            return
        cfg = self.config
        light: list[str] = []
        reclaimer = store.reclaimer
        if self.wildcards is not None and self.wildcards.subscribers_known:
            light += [TOPIC_QUEUE_PREFIX, WILDCARD_QUEUE_PREFIX]
            reclaimer.checks += [self.mqtt.reads_queue if self.mqtt is not None else self.wildcards.reads,
                                 self.filter_holds().reads]
        if self.amqp is not None:
            light.append(AMQP_QUEUE_PREFIX)
            reclaimer.checks.append(self.amqp.reads)
        caches = {id(b.cache): b.cache for b in (self.mqtt, self.amqp, self.remoting) if b is not None}
        for cache in caches.values():  # removed queues, and queues a per-topic rule cut
            reclaimer.on_removed.append(cache.drop)
            store.trimmer.on_cut.append(cache.drop)
        store.set_queue_policy(QueuePolicy(parse_rules(cfg.retention_topics), cfg.queue_idle_ttl_hours, tuple(light)))

    def queue_cache(self) -> QueueCache:
        """The queue cache every reader of this node's store shares: the MQTT broker's, else one
        made for this serving (a store node, or a node with MQTT off)."""
        if self.mqtt is not None:
            return self.mqtt.cache
        assert self.store is not None
        if self._cache is None:
            self._cache = QueueCache(self.store, self.config.queue_cache_bytes)
        return self._cache

    def _tracer_for(self, listener: str) -> Tracer | None:
        return self.tracer if listener in self._traced else None

    async def _start_amqp(self, bind: tuple[str, int]) -> ListeningServer:
        assert self.store is not None
        cfg = self.config
        self.amqp = amqp_broker(cfg, self.store, self.queue_cache(), passwords=self.passwords,
                                authorizer=self.authorizer, pressure=self.pressure, mqtt_topics=self.wildcards)
        await self.amqp.start()
        broker, tracer = self.amqp, self._tracer_for("amqp")
        return await lean_tcp.serve(lambda: AMQPConnection(broker, tracer), bind[0], bind[1])

    def filter_holds(self) -> FilterHolds:
        """The wildcard filters data-API readers hold (restored from the store on first use,
        which ``_start_mqtt`` makes before any MQTT listener opens)."""
        if self._filter_holds is None:
            self._filter_holds = FilterHolds(self.store, self.wildcards)
        return self._filter_holds

    def _http_deps(self) -> HttpDeps:
        """What the HTTP listener serves from (gateway/http/deps.py), once every other listener runs."""
        cfg = self.config
        return HttpDeps(
            access=HttpAccess(cfg.admin_token, parse_names(cfg.admin_users), cfg.authentication_configured(),
                              self.passwords, self.authorizer),
            status=self, brokers=Brokers(self.mqtt, self.amqp, self.remoting), store=self.store,
            pressure=self.pressure, tracer=self.tracer, traced_listeners=self._traced,
            cluster=ClusterParts(self.node or STANDALONE, self.gateway_store, self.store_service, self.store_lookup,
                                 group_view=self.store_group.view if self.store_group is not None else
                                 self.leader_finder.view if self.leader_finder is not None else None,
                                 replica=self.store_group.replica if self.store_group is not None else None,
                                 relay_counts=self.relayed.counts() if self.relayed is not None else {}),
            filter_holds=self.filter_holds(), timer=self.timer,
            rules=self.rules.engine if self.rules is not None else None,
            rules_place=self._rules_place if self.gateway_store is not None else None,
            schema_source=LinkedSchemas(self.gateway_store) if self.gateway_store is not None
            else None)

    async def _rules_place(self) -> str:
        """Where a gateway node's cluster keeps the event rules: its store node (a replicated
        group's leader, whose admin API address is in etcd)."""
        if self.leader_finder is None:
            return f"the store node ({self.config.store_address}: its --metrics-bind listener)"
        try:
            host, port = await self.leader_finder.address("http", timeout_s=1.0)
        except OSError:
            return "the store group's leader (none serves an admin API now: retry)"
        return f"the store group's leader, http://{format_address(host, port)}"

    def _remoting_advertised(self, host: str, port: int) -> str:
        """The HOST:PORT RocketMQ clients are sent to, for a remoting listener bound at host:port."""
        cfg = self.config
        return cfg.remoting_advertise or format_address(cfg.store_host if host in ("0.0.0.0", "::") else host, port)

    async def _start_remoting(self, bind: tuple[str, int]) -> ListeningServer:
        """The name-server and broker roles on one port; the MQTT topic mapping when MQTT runs."""
        assert self.store is not None
        cfg = self.config
        self.remoting = remoting_broker(cfg, self.store, self.queue_cache(), authorizer=self.authorizer,
                                        mqtt_topics=self.wildcards)
        if cfg.role == "store":  # the store link for gateway nodes, beside RocketMQ clients
            retained = RetainedIndex(self.store)
            retained.load()
            if cfg.lookup_backend == "redis" and cfg.redis_url:  # the lookup's answers route notify
                self.store_lookup = RedisLookup(f"store@{bind[0]}:{bind[1]}", cfg.redis_url, lookup_options(cfg))
                await self.store_lookup.start()
            nodes_for = self.store_lookup.nodes_for if self.store_lookup is not None else None
            router = NotifyRouter(nodes_for, broadcast=cfg.notify_routing == "broadcast")
            assert self.wildcards is not None  # (a store node keeps one from the start)
            amqp_port = next((l.address[1] for l in self.listeners if l.protocol == "amqp"), 0)
            self.store_service = StoreService(self.store, self.wildcards, retained, router, cfg.cluster_token,
                                              amqp_port=amqp_port)
            self.store_service.start(cfg.mqtt_expiry_check_interval_s)
            link_handlers = self.store_service.handlers()
            self.remoting.relay_trusted = self.store_service.trusts  # (gateway nodes' numbered sends)
            self.remoting.handlers.update(link_handlers)
            self.remoting.access.unsigned_codes.update(link_handlers)  # they have the cluster token instead
        await self.remoting.start()
        broker, max_frame, tracer = self.remoting, cfg.remoting_max_frame_size, self._tracer_for("remoting")
        server = await lean_tcp.serve(lambda: RemotingConnection(broker, max_frame_size=max_frame, tracer=tracer),
                                      bind[0], bind[1])
        broker.set_address(self._remoting_advertised(*server.sockets[0].getsockname()[:2]))
        return server

    async def _start_grpc(self, plain: tuple[str, int] | None, tls: tuple[str, int] | None) -> None:
        """The gRPC listener of RocketMQ 5 clients (plain, TLS or both), answered by the remoting node."""
        from .rocketmq_grpc.server import GrpcBind, GrpcServer  # (grpcio and the generated modules: only when asked for)
        assert self.remoting is not None
        cfg = self.config

        def bind(address: tuple[str, int], key_and_chain: tuple[bytes, bytes] | None = None) -> GrpcBind:
            return GrpcBind(address[0], address[1], self._grpc_advertised(address[0]), key_and_chain)
        self.grpc = GrpcServer(self.remoting, self.pressure, fifo_groups=parse_names(cfg.grpc_fifo_groups))
        await self.grpc.start(bind(plain) if plain is not None else None,
                              bind(tls, key_and_chain(cfg)) if tls is not None else None)
        if plain is not None and self.store_service is not None:  # (gateway nodes proxy their gRPC clients here)
            self.store_service.grpc_port = self.grpc.address[1]
        for name, address in (("grpc", plain and self.grpc.address), ("grpcs", tls and self.grpc.tls_address)):
            if address:
                log.info("listener started protocol=%s address=%s", name, format_address(*address))
        if cfg.grpc_on_remoting_port:  # (the remoting port sniffs HTTP/2's preface and TLS handshakes)
            remoting_host, _, remoting_port = self.remoting.broker_addr.rpartition(":")
            shared = self.grpc.share_port((remoting_host.strip("[]"), int(remoting_port)))
            self.remoting.http2_handoff = shared.hand_over
            log.info("grpc also on the remoting port address=%s", self.remoting.broker_addr)

    def _grpc_advertised(self, host: str) -> str:
        """The host routes name for a gRPC listener bound on ``host``."""
        return self.config.store_host if host in ("0.0.0.0", "::") else "127.0.0.1" if host == "localhost" else host

    async def _watch_loop_lag(self, interval_s: float = 0.5) -> None:
        """Event-loop lag: how much later than asked a sleep wakes up (a busy or blocked loop)."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + interval_s
            await asyncio.sleep(interval_s)
            self.loop_lag_s = max(0.0, loop.time() - asked)

    def not_ready(self) -> str | None:
        """Why the gateway cannot take traffic now (None: it can): for /readyz."""
        if self.gateway_store is not None:
            if not self.gateway_store.remote.link.is_open:
                return "the link to the store node is down"
        elif self.store is None:
            return "the store is not open"
        if not self.ready:
            return "starting or stopping"
        if self.pressure is not None and self.pressure.raised:
            return f"publishers are blocked: {self.pressure.reason}"
        failure = self.store.write_failure() if self.store is not None else None
        if failure is not None:
            return f"the store refuses writes: {failure}"
        return None

    async def stop(self) -> None:
        """Stop accepting, then flush, checkpoint and close the store, within the shutdown timeout."""
        self.ready = False
        if self.store_group is not None:
            await self.store_group.stop()  # (stops serving first, when it leads)
            self.store_group = None
        await self._unserve()
        if self._pressure_task is not None:
            self._pressure_task.cancel()
            self._pressure_task = None
        if self.node is not None:
            await self.node.close()
            self.node = None
        if self.gateway_store is not None:
            await self.gateway_store.close()
            self.gateway_store = None
        if self.leader_finder is not None:
            await self.leader_finder.close()
            self.leader_finder = None
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.close(), self.config.shutdown_timeout_s)
            except TimeoutError:
                log.error("store did not close in time timeout_s=%s", self.config.shutdown_timeout_s)
            self.store = None
        log.info("gateway stopped")

    async def _unserve(self) -> None:
        """Close the listeners and stop what ``_serve`` started (every broker saves what it must);
        the store stays open."""
        if self._lag_task is not None:
            self._lag_task.cancel()
            self._lag_task = None
        if self.store_service is not None:  # (gateway nodes link to whichever store node serves next)
            self.store_service.stopping = True
        if self.http is not None:
            await self.http.stop()
            self.http = None
        for listener in self.listeners:
            listener.server.close()
        if self._filter_holds is not None:
            await self._filter_holds.close()
            self._filter_holds = None
        if self.rules is not None:
            await self.rules.stop()  # (before the MQTT broker, whose publish path it uses)
            self.rules = None
        if self.mqtt is not None:
            await self.mqtt.stop()  # says goodbye to clients and saves every session
            self.mqtt = None
        if self._cache is not None:
            self._cache.close()
            self._cache = None
        if self.amqp is not None:
            await self.amqp.stop()
            self.amqp = None
        if self.relayed is not None:
            await self.relayed.close()
        if self.grpc is not None:
            await self.grpc.stop()
            self.grpc = None
        if self.remoting is not None:
            await self.remoting.stop()
            self.remoting = None
        if self.store_service is not None:
            await self.store_service.stop()
            self.store_service = None
        if self.timer is not None:
            await self.timer.stop()
            self.timer = None
        if self.store_lookup is not None:
            await self.store_lookup.close()
            self.store_lookup = None
        for listener in self.listeners:
            await listener.server.wait_closed()
        self.listeners.clear()
        if self.tracer is not None:
            try:
                await self.tracer.stop()  # the last events, before the store closes
            except StoreError as exc:
                log.warning("last trace events not written error=%s", exc)
            self.tracer = None
        if self.store is not None:
            self.store.reclaimer.checks.clear()  # (_set_queue_policy's, for this serving's brokers)
            self.store.reclaimer.on_removed.clear()
            self.store.trimmer.on_cut.clear()


def tune_gc() -> None:
    """The message path allocates dozens of short-lived objects per message and Python's cyclic
    GC ran every few messages (tuned: 4 % fewer instructions per MQTT fan-in message, callgrind).
    What exists after start-up (modules, restored sessions) is frozen out of collections, and
    the young generation is collected every 200,000 net allocations instead of 700. Each young
    collection walks every young object still alive: under load that is the messages in flight
    (~30,000 objects in an 8-publisher MQTT fan-in, 2.5 ms a walk). At 50,000 their swings
    crossed the threshold every ~4,000 messages (0.6 us of CPU per message, 5 %); at 200,000
    they stay under it (gc.callbacks timing, ``loadtest.bench_mqtt --scenarios fanin``), and
    the cyclic garbage a collection waits for stays within tens of MB."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(200_000, 20, 20)


async def serve(config: Config) -> None:
    gateway = Gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    tune_gc()
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await gateway.stop()
