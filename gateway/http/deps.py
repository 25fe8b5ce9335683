"""What the HTTP side reads of the running gateway, as small typed parts that
``gateway/server.py`` builds once when it starts the HTTP listener. Each module of
``gateway/http/`` takes only the parts it reads, never the ``Gateway`` object itself.

The parts are fixed for the listener's life (the protocol gateways, the store and the cluster
parts exist before it starts and outlive it); what changes while the gateway runs (readiness,
event-loop lag) is read on each request through ``Status``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lookup.api import Lookup
    from store import LatencyHistogram, MessageStore, ReplicaNode

    from ..amqp.broker import AMQPBroker
    from ..auth import PasswordFile
    from ..auth.authorize import Authorizer
    from ..cluster.failover_counts import FailoverCounts
    from ..cluster.gateway_store import GatewayStore
    from ..cluster.store_service import StoreService
    from ..core.timer import TimerService
    from ..mqtt.broker import MQTTBroker
    from ..pressure import StorePressure
    from ..remoting.broker import RemotingBroker
    from ..stats import ProtocolStats
    from ..trace import Tracer
    from .data_holds import FilterHolds


class Status(Protocol):
    """The gateway process's own state, which changes while it runs: ``Gateway`` is one."""

    @property
    def ready(self) -> bool: ...  # started, and not stopping

    @property
    def loop_lag_s(self) -> float: ...  # how late the event loop ran a timer, lately

    def not_ready(self) -> str | None: ...  # why it cannot take traffic now (None: it can)


class ProtocolGateway(Protocol):
    """What the counters and the dashboard read of every protocol gateway."""

    @property
    def stats(self) -> ProtocolStats: ...

    @property
    def connections(self) -> Sized: ...


@dataclass(slots=True, frozen=True)
class Brokers:
    """The protocol gateways this process runs (None: that protocol is off)."""

    mqtt: MQTTBroker | None = None
    amqp: AMQPBroker | None = None
    remoting: RemotingBroker | None = None

    def running(self) -> Iterator[tuple[str, ProtocolGateway]]:
        """(protocol name, gateway) of each protocol that runs, in the order metrics list them."""
        for name, broker in (("mqtt", self.mqtt), ("amqp", self.amqp), ("remoting", self.remoting)):
            if broker is not None:
                yield name, broker


@dataclass(slots=True, frozen=True)
class HttpAccess:
    """Who may use ``/admin/`` and ``/data/`` (``data_access.py``)."""

    admin_token: str  # "" : none set
    admin_users: frozenset[str]  # password-file users who are the operator
    authentication_configured: bool  # a password file, ACL or access keys, or anonymous clients refused
    passwords: PasswordFile | None
    authorizer: Authorizer

    @property
    def requires_credentials(self) -> bool:
        """Anonymous callers are refused (else they are the operator, as on a gateway without any
        authentication every client may do everything)."""
        return bool(self.admin_token) or self.authentication_configured

    @property
    def admin_credentials(self) -> bool:
        """Some caller can be the operator when credentials are required."""
        return bool(self.admin_token or self.admin_users)


class NodePlace(Protocol):
    """Where this process stands in a cluster, for locating clients and the cluster's metrics:
    a gateway node (``gateway.cluster.mqtt_node.GatewayNode``), or ``STANDALONE``."""

    @property
    def node_id(self) -> str: ...

    @property
    def lookup(self) -> Lookup | None: ...  # where clients are connected (a gateway node's)

    @property
    def takeovers(self) -> Mapping[str, int] | None: ...  # how takeovers were sent (a gateway node's)


@dataclass(slots=True, frozen=True)
class Standalone:
    """``NodePlace`` of a node that is no gateway node: its clients are here or nowhere."""

    node_id: str = "this node"
    lookup: Lookup | None = None
    takeovers: Mapping[str, int] | None = None


STANDALONE = Standalone()


@dataclass(slots=True, frozen=True)
class ClusterParts:
    """The cluster's parts in this process, for metrics and for locating clients (a
    standalone gateway: ``STANDALONE`` and None)."""

    node: NodePlace = STANDALONE
    gateway_store: GatewayStore | None = None  # a gateway node: the store node's store
    store_service: StoreService | None = None  # a store node: the store link's service
    store_lookup: Lookup | None = None  # a store node: the lookup that routes notify events
    # a replicated store: the group as etcd holds it (a store node's or a gateway node's), and a
    # store node's own replica (role, epoch, followers' lag)
    group_view: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None
    replica: ReplicaNode | None = None
    # a gateway node's RocketMQ relays (remoting, gRPC): what they did at store failovers
    relay_counts: dict[str, FailoverCounts] = field(default_factory=dict)


class EventSchemas(Protocol):
    """The event schemas (``bridge.rules.schemas.SchemaBook``): JSON Schemas by name (an event
    type), versions kept."""

    def list(self) -> list[dict[str, Any]]: ...

    def get(self, name: str, version: int | None = None) -> dict[str, Any] | None: ...

    def check_body(self, name: str, body: bytes, content_type: str | None) -> object | None:
        """Why a payload does not fit the schema ``name`` (its ``str``), or None (it fits, or there
        is no such schema)."""
        ...


# where a gateway node's cluster keeps the event rules and schemas ("the store group's leader,
# http://HOST:PORT"), said to the callers of its admin API
RulesPlace = Callable[[], Awaitable[str]]


class SchemaSource(Protocol):
    """The event schemas of a node that does not keep them (a gateway node: its store node's,
    ``gateway.rules_host.LinkedSchemas``), read when an event is checked."""

    async def current(self, names: Iterable[str]) -> EventSchemas:
        """The schemas of ``names`` as they are now (OSError: the store node did not answer)."""
        ...


class RulesControl(Protocol):
    """The event rules engine (``bridge.rules.engine.RulesEngine``): rows of plain data; it raises
    ``LookupError`` for an unknown rule or schema and ``ValueError`` (with ``reason``, and ``path``
    for a definition) for what it refuses."""

    @property
    def schemas(self) -> EventSchemas: ...

    def get(self, name: str) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...

    def target_latencies(self) -> dict[str, LatencyHistogram]: ...

    async def create(self, name: str, raw: Any) -> dict[str, Any]: ...

    async def change(self, name: str, raw: Any) -> dict[str, Any]: ...

    async def set_paused(self, name: str, paused: bool) -> dict[str, Any]: ...

    async def delete(self, name: str) -> None: ...

    async def replay(self, name: str, *, from_ms: int | None = None, offset: int | None = None
                     ) -> dict[str, Any]: ...

    def put_schema(self, name: str, schema: Any) -> dict[str, Any]: ...

    def delete_schema(self, name: str) -> None: ...


@dataclass(slots=True, frozen=True)
class HttpDeps:
    """Everything the HTTP listener serves from (``app.HttpServer`` hands each module its parts)."""

    access: HttpAccess
    status: Status
    brokers: Brokers
    store: MessageStore | None  # None on a gateway node of a cluster (its store is the store node's)
    pressure: StorePressure | None
    tracer: Tracer | None
    traced_listeners: frozenset[str]
    cluster: ClusterParts
    filter_holds: FilterHolds  # created by the server before the MQTT listeners start
    timer: TimerService | None = None  # the node with the store: its timer messages
    rules: RulesControl | None = None  # the node with the store: its event rules
    rules_place: RulesPlace | None = None  # a gateway node: where its cluster keeps them
    schema_source: SchemaSource | None = None  # a gateway node: its store node's event schemas
