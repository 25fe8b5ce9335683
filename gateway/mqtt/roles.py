"""What the MQTT gateway's parts need of one another, as small Protocols: the broker of its
clients and readers, a connection's delivery component of its connection and of the broker, a
shared group of its members and of the broker. Each part names these, not the concrete class
of the other (which imports it), so no part needs an import only for its types."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cache import QueueCache
from protocols.mqtt.connection import ServerConnection
from protocols.mqtt.packets import Packet, Will
from protocols.mqtt.reason_codes import ReasonCode
from store import StoredMessage
from store import RateLimitedLog

from ..ports import FilterRegistry, QueueStore, SessionRepository
from ..read_pauses import ReadPauses
from ..stats import ProtocolStats
from .ingest_gate import IngestGate
from .messages import Delivery as MessageDelivery, DeliveryMemo
from .presence import Presence
from .session import Session, SubscriptionState
from .settings import MQTTSettings
from .share_refusal import SharedRefusal

if TYPE_CHECKING:
    from ..trace import Tracer


class Reader(Protocol):
    """A reader of queues that a notify wakes (``broker.wake``): a connection's delivery, a shared group."""

    def schedule_pump(self) -> None: ...

    def pump(self) -> None: ...


class Acks(Protocol):
    """A shared group (shared.py), told of its member's acknowledgements."""

    def acked(self, offset: int, exchange_of: Session | None = None) -> None: ...


class DeliveryHost(Protocol):
    """What delivery reads and tells of the node's MQTT gateway (``broker.MQTTBroker``)."""

    @property
    def store(self) -> QueueStore: ...

    @property
    def cache(self) -> QueueCache: ...

    @property
    def stats(self) -> ProtocolStats: ...

    @property
    def gate(self) -> IngestGate: ...

    @property
    def share_groups(self) -> Mapping[str, Acks]: ...

    @property
    def deliveries(self) -> DeliveryMemo: ...

    def mark_dirty(self, session: Session) -> None: ...

    def mark_progress(self, session: Session) -> None: ...

    def set_retained(self, topic: str, position: int | None) -> None: ...

    def reader_count(self, queue: str) -> int: ...

    def wake(self, reader: Reader) -> None: ...

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]: ...


class Owner(Protocol):
    """The connection a Delivery belongs to (``connection.MQTTConnection``)."""

    @property
    def broker(self) -> DeliveryHost: ...

    @property
    def settings(self) -> MQTTSettings: ...

    @property
    def tracer(self) -> Tracer | None: ...

    @property
    def conn(self) -> ServerConnection: ...

    @property
    def out(self) -> bytearray: ...

    @property
    def session(self) -> Session | None: ...

    @property
    def client_id(self) -> str: ...

    @property
    def username(self) -> str | None: ...

    @property
    def peer(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def connecting(self) -> bool: ...

    @property
    def read_check(self) -> Callable[[str | None, str, str], bool] | None: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def send(self, data: bytes) -> None: ...

    def send_packet(self, packet: Packet) -> None: ...

    def flush(self) -> None: ...


class MemberDelivery(Protocol):
    """A member's outbound side (``outbound.Delivery``)."""

    @property
    def writing_paused(self) -> bool: ...

    def shared_subscription(self, key: str) -> SubscriptionState | None: ...

    def has_window(self) -> bool: ...

    def may_read(self, topic: str) -> bool: ...

    def deliver_shared(self, key: str, message: StoredMessage, delivery: MessageDelivery, qos: int,
                       state: SubscriptionState, remaining: int | None) -> bool: ...


class Member(Protocol):
    """A member of a group: a client's connection (``connection.MQTTConnection``)."""

    @property
    def client_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def delivery(self) -> MemberDelivery: ...

    def flush(self) -> None: ...


class GroupHost(Protocol):
    """What a group reads and runs on (``broker.MQTTBroker``)."""

    @property
    def store(self) -> QueueStore: ...

    @property
    def cache(self) -> QueueCache: ...

    @property
    def deliveries(self) -> DeliveryMemo: ...

    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]: ...

    def wake(self, reader: Reader) -> None: ...


class Client(Member, Protocol):
    """A client's connection as the broker, and whoever reads its ``connections``, see it
    (``connection.MQTTConnection``)."""

    @property
    def peer(self) -> str: ...

    @property
    def username(self) -> str | None: ...

    @property
    def version(self) -> int: ...

    def disconnect(self, reason: ReasonCode, message: str) -> None: ...

    def shutdown(self) -> None: ...

    def resource_alarm(self, reason: str | None) -> None: ...


# -- the packet handlers: inbound.py (PUBLISH, PUBREL), subscribe.py (SUBSCRIBE, UNSUBSCRIBE) --
class IngestHost(Protocol):
    """What the inbound side uses of the broker (``broker.MQTTBroker``)."""

    @property
    def store(self) -> QueueStore: ...

    @property
    def stats(self) -> ProtocolStats: ...

    @property
    def wildcards(self) -> FilterRegistry: ...

    @property
    def limited_log(self) -> RateLimitedLog: ...

    def record_retained(self, entries: list[tuple[str, bool] | None], fut: asyncio.Future) -> None: ...

    def mark_dirty(self, session: Session) -> None: ...


class Connection(Protocol):
    """What a packet handler uses of every connection (``connection.MQTTConnection``)."""

    @property
    def conn(self) -> ServerConnection: ...

    @property
    def session(self) -> Session | None: ...

    @property
    def client_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def allowed(self, topic: str, *, write: bool) -> bool: ...

    def send(self, data: bytes) -> None: ...

    def send_packet(self, packet: Packet) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def disconnect(self, reason: ReasonCode, message: str) -> None: ...


class Publisher(Connection, Protocol):
    """The connection an ``inbound.Inbound`` belongs to."""

    @property
    def broker(self) -> IngestHost: ...

    @property
    def read_pauses(self) -> ReadPauses: ...

    @property
    def tracer(self) -> Tracer | None: ...


class SubscriberDelivery(MemberDelivery, Protocol):
    """A subscriber's outbound side (``outbound.Delivery``); its pusher is the reader the broker wakes."""

    @property
    def pusher(self) -> Reader: ...

    def send_retained(self, state: SubscriptionState, message: StoredMessage) -> None: ...

    def take_shared_inflight(self, key: str, session: Session | None = None) -> list[tuple[int, int]]: ...


class SubscribeHost(Protocol):
    """What subscribing uses of the broker (``broker.MQTTBroker``)."""

    @property
    def store(self) -> QueueStore: ...

    @property
    def shared_refusal(self) -> SharedRefusal: ...

    def hold_filter(self, session: Session, topic_filter: str) -> None: ...

    def release_filter(self, session: Session, topic_filter: str) -> None: ...

    def join_share(self, key: str, conn: Client) -> None: ...

    def leave_share(self, key: str, conn: Client, unacked: list[tuple[int, int]]) -> None: ...

    def add_reader(self, queue: str, reader: Reader) -> None: ...

    def remove_reader(self, queue: str, conn: Reader) -> None: ...

    def retained_matching(self, topic_filter: str) -> list[StoredMessage]: ...

    def mark_dirty(self, session: Session) -> None: ...


class Subscriber(Connection, Client, Protocol):
    """The connection a SUBSCRIBE or UNSUBSCRIBE came on."""

    @property
    def broker(self) -> SubscribeHost: ...

    @property
    def delivery(self) -> SubscriberDelivery: ...


# -- the CONNECT handler and the connection's end (connect.py) ---------------------------------
class SessionHost(SubscribeHost, Protocol):
    """What connecting and the connection's end use of the broker (``broker.MQTTBroker``)."""

    @property
    def stats(self) -> ProtocolStats: ...

    @property
    def authenticator(self) -> object | None: ...

    @property
    def acl(self) -> object | None: ...

    @property
    def connections(self) -> dict[str, Client]: ...

    @property
    def sessions(self) -> dict[str, Session]: ...

    @property
    def stored_sessions(self) -> SessionRepository: ...

    @property
    def presence(self) -> Presence: ...

    async def claim_session(self, client_id: str) -> None: ...

    def cancel_will(self, client_id: str) -> None: ...

    def end_session(self, session: Session) -> None: ...

    def flush_sessions(self) -> None: ...

    def publish_will(self, client_id: str, will: Will) -> None: ...

    def schedule_will(self, session: Session, will: Will, delay: int) -> None: ...


class ConnectingDelivery(SubscriberDelivery, Protocol):
    async def inflight_messages(self) -> dict[int, StoredMessage | None]: ...

    def resend_inflight(self, messages: dict[int, StoredMessage | None]) -> None: ...


class Connecting(Subscriber, Protocol):
    """The connection a CONNECT came on (what accepting it sets, and what it starts)."""

    client_id: str
    username: str | None
    session: Session | None
    will: Will | None
    keep_alive: int
    connecting: bool
    connected_at: int | None
    ended: tuple[str, int | None] | None
    read_check: Callable[[str | None, str, str], bool] | None

    @property
    def broker(self) -> SessionHost: ...

    @property
    def delivery(self) -> ConnectingDelivery: ...

    @property
    def settings(self) -> MQTTSettings: ...

    @property
    def read_pauses(self) -> ReadPauses: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def restart_keep_alive(self) -> None: ...

    def process(self) -> None: ...
