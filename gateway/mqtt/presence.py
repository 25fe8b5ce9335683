"""Device presence events, as EMQX's client online/offline events: when an MQTT client's CONNECT
is accepted, and when that connection ends (with why), a JSON message on
``$SYS/brokers/{node}/clients/{client_id}/connected`` or ``.../disconnected``. They are stored
through the broker's ingest path as any publish (QoS 1, not retained), so MQTT subscribers, the
other protocols and the Spark source read them; a failed write is logged, never felt by the client."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocols.mqtt.packets import MQTT_3_1
from protocols.mqtt.reason_codes import ReasonCode
from protocols.queue_names import HELD_FILTERS
from store import RateLimitedLog

if TYPE_CHECKING:
    from .connection import MQTTConnection

# Held by every node that publishes the events, so that its wildcard queue holds all of them from
# the node's start: a held filter, whose topics get no queue of their own (queue_names.HELD_FILTERS;
# the Spark source reads them from it with topicFilter; docs/mqtt.md, Presence events).
PRESENCE_FILTER = HELD_FILTERS[0]
PRESENCE_HOLDER = "$presence"

# A client id (or node name) is one topic level: the characters that would split it or make the
# topic a filter are percent-encoded (and % itself, so the encoding can be undone).
_ESCAPES = str.maketrans({"%": "%25", "/": "%2F", "+": "%2B", "#": "%23"})

# Why the server closed a connection, by the reason code it sent (5.0) or would have (3.1.1);
# EMQX's words where it has one. Any other code is a fault of the client's: protocol_error.
_SERVER_REASONS: dict[int, str] = {
    ReasonCode.SESSION_TAKEN_OVER: "takenover",
    ReasonCode.KEEP_ALIVE_TIMEOUT: "keepalive_timeout",
    ReasonCode.SERVER_SHUTTING_DOWN: "server_shutdown",
    ReasonCode.ADMINISTRATIVE_ACTION: "kicked",
    ReasonCode.NOT_AUTHORIZED: "not_authorized",
    ReasonCode.PACKET_TOO_LARGE: "packet_too_large",
    ReasonCode.UNSPECIFIED_ERROR: "server_error",
}
CLIENT_DISCONNECT = "normal"  # the client sent DISCONNECT (its reason code goes with it)
SOCKET_CLOSED = "tcp_closed"  # the client closed its socket without DISCONNECT
SOCKET_ERROR = "sock_error"  # the socket failed (reset, timed out)
SERVER_CLOSED = "server_error"  # the gateway closed it without a reason code (a store failure, 3.1.1)


def server_reason(code: int) -> str:
    return _SERVER_REASONS.get(code, "protocol_error")


def topic_level(name: str) -> str:
    return name.translate(_ESCAPES)


def presence_topic(node: str, client_id: str, event: str) -> str:
    return f"$SYS/brokers/{topic_level(node)}/clients/{topic_level(client_id)}/{event}"


# [(topic, JSON body)]: stored QoS 1, not retained, as one put
PUT_AT_ONCE = 64  # events a put holds (one put in flight at a time)

Publish = Callable[[list[tuple[str, bytes]]], "asyncio.Future[Any]"]


# What an event waits as until it is put: (event, client id, username, peer address, local port,
# protocol version, keep alive, its own fields' values in the order of its kind's keys below).
Pending = tuple[str, str, "str | None", "tuple[str, int] | None", "int | None", int, int, tuple[Any, ...]]
_KEYS = {"connected": ("clean_start", "session_present", "expiry_interval", "connected_at", "ts"),
         "disconnected": ("reason", "reason_code", "will", "connected_at", "disconnected_at", "ts")}


class Presence:
    """Makes and publishes a node's presence events (``enabled``: the presence_events setting).
    They are written in order, ``PUT_AT_ONCE`` a put and one put at a time: 10,000 clients
    connecting at once leave their events waiting as small tuples (their JSON is made when they
    are put), not as 10,000 puts in the store's path (what a burst holds at once stays in the
    process's memory after it). Failed writes go to ``failures``: when the store is lost, every
    client's goes at once."""

    def __init__(self, node: str, enabled: bool, publish: Publish, failures: RateLimitedLog) -> None:
        self.node = node
        self.enabled = enabled
        self._publish = publish
        self._failures = failures
        self._pending: deque[Pending] = deque()
        self._writing = False  # a put is in flight
        self._scheduled = False

    def connected(self, conn: MQTTConnection, *, clean_start: bool, session_present: bool, expiry_interval: int) -> None:
        conn.connected_at = now = int(time.time() * 1000)
        if not self.enabled:
            return
        self._send(conn, "connected", (clean_start, session_present, expiry_interval, now, now))

    def disconnected(self, conn: MQTTConnection, *, will: bool) -> None:
        """``will``: the connection's will is published (or scheduled, for its delay)."""
        if not self.enabled or conn.connected_at is None:  # (no connected event: no disconnected one)
            return
        now = int(time.time() * 1000)
        reason, code = conn.ended or (SERVER_CLOSED, None)
        self._send(conn, "disconnected", (reason, code, will, conn.connected_at, now, now))
        if will:  # (stored ahead of the will, which is put next)
            self.put_all()

    def _send(self, conn: MQTTConnection, event: str, values: tuple[Any, ...]) -> None:
        transport = conn.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        sock = transport.get_extra_info("sockname") if transport is not None else None
        self._pending.append((event, conn.client_id, conn.username, peer, sock[1] if sock else None, conn.version,
                              conn.keep_alive, values))
        if not self._writing and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._put_next)

    def _message(self, pending: Pending) -> tuple[str, bytes]:
        """(topic, JSON body) of a waiting event."""
        event, client_id, username, peer, sock_port, version, keep_alive, values = pending
        body = {"clientid": client_id, "username": username, "node": self.node,
                "ipaddress": peer[0] if peer else None, "peername": f"{peer[0]}:{peer[1]}" if peer else None,
                "sockport": sock_port, "proto_name": "MQIsdp" if version == MQTT_3_1 else "MQTT",
                "proto_ver": version, "keepalive": keep_alive, **dict(zip(_KEYS[event], values, strict=True))}
        return presence_topic(self.node, client_id, event), json.dumps(body).encode()

    def put_all(self) -> None:
        """Every waiting event into the store now, in one put (ahead of a will; at stop)."""
        self._put([self._pending.popleft() for _ in range(len(self._pending))])

    def _put_next(self) -> None:
        self._scheduled = False
        if self._writing or not self._pending:
            return
        take = min(PUT_AT_ONCE, len(self._pending))
        self._writing = True
        written = self._put([self._pending.popleft() for _ in range(take)])
        if written is None:
            self._written(None)
        else:
            written.add_done_callback(self._written)

    def _written(self, _: object) -> None:
        self._writing = False
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._put_next)

    def _put(self, events: list[Pending]) -> asyncio.Future[Any] | None:
        if not events:
            return None
        try:
            written = self._publish([self._message(e) for e in events])
        except Exception as exc:  # noqa: BLE001 (the clients' connections go on: an event is not worth failing them)
            self._all_failed(events, exc)
            return None
        written.add_done_callback(
            lambda f: None if f.cancelled() or f.exception() is None else self._all_failed(events, f.exception()))
        return written

    def _all_failed(self, pending: list[Pending], exc: BaseException | None) -> None:
        for event, client_id, *_ in pending:
            self._failed(client_id, event, exc)

    def _failed(self, client_id: str, event: str, exc: BaseException | None) -> None:
        self._failures.log(logging.ERROR, f"presence:{type(exc).__name__}",
                           "presence event not stored client_id=%s event=%s error=%s", client_id, event,
                           json.dumps(str(exc)))
