"""Differential tests of the compiled delivery core (gateway/mqtt/push.py): the C extension and
the interpreted reference, given the same session, subscriptions, queue reads and acks, write
the same PUBLISH bytes and leave the same inflight table, cursors, packet ids, window and counters.

The connection, broker and queue cache are stand-ins that record what the core asks of them; the
session, its cursors, the protocol state and the message memo are the real ones."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.cursor import Cursor
from gateway.interop import MQTT_FLAG, PROPS_FLAG, RETAIN_FLAG, TOPIC_QUEUE_PREFIX, WILDCARD_QUEUE_PREFIX
from gateway.mqtt.messages import CLIENT_ID, PROPS, DeliveryMemo
from gateway.mqtt.session import Session, SubscriptionState
from protocols.mqtt.connection import ServerConnection
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, PubAck, PubComp, Subscription
from protocols.mqtt.properties import Properties, encode_properties
from protocols.mqtt.topics import is_wildcard, matches
from store import GetResult, GetStatus, StoredMessage
from store import encode_properties as encode_store_properties

from .native_support import compiled, interpreted

PUSH = "gateway.mqtt.push"
NOW = 1_700_000_000.0
FILTERS = ["a/b", "a/c", "a/+", "a/#", "#", "b"]
TOPICS = ["a/b", "a/c", "b"]


@dataclass
class Stats:
    messages_sent: int = 0
    publish_dropped: int = 0


@dataclass
class Broker:
    """What the core asks of the broker, recorded."""

    readers: int
    store_max: int
    cache: Any = None
    deliveries: DeliveryMemo = field(default_factory=DeliveryMemo)
    stats: Stats = field(default_factory=Stats)
    calls: list[tuple] = field(default_factory=list)
    share_groups: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = SimpleNamespace(max_offset_now=lambda queue: self.store_max)
        self.gate = SimpleNamespace(wait=lambda c: self.calls.append(("gate wait",)),
                                    done=lambda c: self.calls.append(("gate done",)))

    def reader_count(self, queue: str) -> int:
        return self.readers

    def mark_progress(self, session: Session) -> None:
        self.calls.append(("progress", session.client_id))

    def mark_dirty(self, session: Session) -> None:
        self.calls.append(("dirty", session.client_id))

    def wake(self, reader: object) -> None:
        self.calls.append(("wake",))


class Cache:
    """A queue read: the messages from the offset on, ``batch`` at a time, up to ``end``."""

    def __init__(self, messages: list[StoredMessage], end: int) -> None:
        self.messages = {m.queue_offset: m for m in messages}
        self.end = end

    def read(self, queue: str, offset: int, max_messages: int = 32) -> GetResult:
        if offset >= self.end:
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, 0, self.end)
        found = [self.messages[o] for o in range(offset, min(self.end, offset + max_messages)) if o in self.messages]
        return GetResult(GetStatus.FOUND, found, offset + max_messages, 0, self.end)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    version = draw(st.sampled_from([MQTT_3_1_1, MQTT_5]))
    filters = draw(st.lists(st.sampled_from(FILTERS), min_size=1, max_size=3, unique=True))
    subs = [(f, draw(st.integers(0, 2)), draw(st.booleans()), draw(st.booleans()), draw(st.none() | st.integers(1, 9)))
            for f in filters]
    read = draw(st.sampled_from(filters))
    start = draw(st.integers(0, 5))
    messages = []
    for offset in range(start, start + draw(st.integers(0, 24))):
        topic = draw(st.sampled_from(TOPICS))
        if not matches(read, topic):
            continue  # a queue holds only what its filter matches
        expiry = draw(st.none() | st.sampled_from([0, 1, 5, 3600]))
        messages.append((offset, topic, draw(st.binary(max_size=40)), draw(st.integers(0, 2)), draw(st.booleans()),
                         draw(st.sampled_from(["me", "other"])), expiry, draw(st.booleans())))
    return {
        "version": version,
        "subs": subs,
        "read": read,
        "start": start,
        "messages": messages,
        "quota": draw(st.integers(1, 12)),
        "busy_ids": draw(st.lists(st.integers(1, 65_535), max_size=4)),
        "next_pid": draw(st.sampled_from([1, 2, 65_534, 65_535])),
        "max_packet": draw(st.sampled_from([0, 0, 30, 60])),
        "aliases": draw(st.integers(0, 2)) if version == MQTT_5 else 0,
        "deny": draw(st.none() | st.sampled_from(TOPICS)),
        "unacked": draw(st.lists(st.integers(start, start + 24), max_size=3)),
        "readers": draw(st.integers(1, 3)),
        "acks": draw(st.lists(st.tuples(st.integers(1, 65_535) | st.sampled_from([1, 2, 3, 65_535]), st.booleans()),
                              max_size=6)),
        "slow": draw(st.booleans()),
        "store_ahead": draw(st.integers(0, 3000)),
        "unsent": draw(st.sampled_from([0, 100])),
        "paused": draw(st.booleans()),
    }


def queue_of(topic_filter: str) -> str:
    return (WILDCARD_QUEUE_PREFIX if is_wildcard(topic_filter) else TOPIC_QUEUE_PREFIX) + topic_filter


def stored(offset: int, topic: str, body: bytes, qos: int, retain: bool, publisher: str, expiry: int | None,
           foreign: bool, queue: str) -> StoredMessage:
    props = {CLIENT_ID: publisher}
    flag = MQTT_FLAG | qos | (RETAIN_FLAG if retain else 0)
    if expiry is not None:
        props[PROPS] = base64.b64encode(encode_properties(Properties(message_expiry_interval=expiry))).decode()
        flag |= PROPS_FLAG
    if foreign:
        flag = 0  # another protocol's message
    return StoredMessage(f"id{offset}", 1000 + offset, 64, topic, "", body, 0, int(NOW * 1000) - 2000,
                         encode_store_properties(props), b"", 1, queue, offset, flag=flag)


def setup(module: ModuleType, s: dict[str, Any]) -> tuple[Any, Session, Cursor, Broker, list[str]]:
    """One build's core over a fresh session built from the scenario."""
    queue = queue_of(s["read"])
    messages = [stored(*m, queue) for m in s["messages"]]
    end = s["start"] + 25
    broker = Broker(s["readers"], end + s["store_ahead"], Cache(messages, end))
    session = Session("me", s["version"], next_packet_id=s["next_pid"])
    for f, qos, nl, rap, ident in s["subs"]:
        session.add_subscription(f, SubscriptionState(Subscription(f, qos, nl, rap), queue_of(f), None, ident))
    for f, *_ in s["subs"]:
        if queue_of(f) not in session.cursors:
            session.add_cursor(Cursor(queue_of(f), s["start"]))
    cursor = session.cursors[queue]
    for pid in s["busy_ids"]:
        session.add_inflight(module.Inflight(pid, "t:other", 0, 1, 0))
    for offset in s["unacked"]:
        cursor.unacked[offset] = 0
    conn = ServerConnection(max_packet_size=1 << 20, receive_maximum=10, topic_alias_maximum=0, send_quota=s["quota"])
    conn.version = s["version"]
    conn.client_max_packet = s["max_packet"]
    conn.alias_max_out = s["aliases"]
    flushes: list[str] = []
    connection = SimpleNamespace(broker=broker, conn=conn, out=bytearray(), tracer=None, session=session,
                                 settings=SimpleNamespace(max_queued_messages=1000), client_id="me", username=None,
                                 closed=False, connecting=False, read_check=None,
                                 transport=SimpleNamespace(get_write_buffer_size=lambda: s["unsent"]))
    connection.flush = lambda: flushes.append(bytes(connection.out)) or connection.out.clear()
    if s["deny"] is not None:
        connection.read_check = lambda user, client_id, topic: topic != s["deny"]
    pusher = module.Pusher(connection)
    pusher.slow = s["slow"]
    return pusher, session, cursor, broker, flushes


def observe(pusher: Any, session: Session, broker: Broker, flushes: list[str]) -> dict[str, Any]:
    return {
        "out": flushes + [bytes(pusher.out)],
        "inflight": [(pid, i.packet_id, i.queue, i.offset, i.qos, i.position, bool(i.released), i.share)
                     for pid, i in session.inflight.items()],
        "cursors": {q: (c.next_offset, dict(c.unacked)) for q, c in session.cursors.items()},
        "next_pid": session.next_packet_id,
        "window_full": bool(pusher._window_full),
        "stats": (broker.stats.messages_sent, broker.stats.publish_dropped),
        "calls": broker.calls,
        "memo": broker.deliveries.decoded,
    }


def run(module: ModuleType, s: dict[str, Any], how: str) -> dict[str, Any]:
    pusher, session, cursor, broker, flushes = setup(module, s)
    with mock.patch("time.time", return_value=NOW):
        if how == "batch":
            messages = broker.cache.read(cursor.queue, cursor.next_offset, 64).messages
            result: Any = pusher.deliver_batch(cursor, messages)
        elif how == "queues":
            pusher.writing_paused = s["paused"]
            result = pusher.pump_queues(session)
        else:
            pusher.pump()
            result = bool(pusher.slow)
        acked = []
        for pid, complete in s["acks"]:
            packet = PubComp(pid) if complete else PubAck(pid)
            pusher.on_ack(packet)
            acked.append(pusher.settle(pid) is not None)
        pusher.acks_done()
        # what is still inflight, resent as after a reconnect (DUP set, the same packet ids)
        by_offset = {m.queue_offset: m for m in broker.cache.messages.values()}
        resent = [pusher.send_message(by_offset[i.offset], broker.deliveries(by_offset[i.offset]), i.qos, None,
                                      i.packet_id, dup=True)
                  for i in list(session.inflight.values()) if i.offset in by_offset and i.queue == cursor.queue]
    return {"result": result, "acked": acked, "resent": resent, **observe(pusher, session, broker, flushes)}


@pytest.mark.parametrize("how", ["batch", "queues", "pump"])
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(s=scenarios())
def test_deliveries_and_acks_are_the_same(how: str, s: dict[str, Any]) -> None:
    fast, reference = compiled(PUSH), interpreted(PUSH)
    assert run(fast, s, how) == run(reference, s, how)


def test_a_fan_out_batch_sends_every_message_once_in_order() -> None:
    """The differential test's stand-ins deliver at all: a plain QoS 1 read of four messages
    gives four PUBLISHes with packet ids 1 to 4 and four inflight records (in both builds)."""
    s = {"version": MQTT_3_1_1, "subs": [("a/b", 1, False, False, None)], "read": "a/b", "start": 0,
         "messages": [(o, "a/b", b"x", 1, False, "other", None, False) for o in range(4)], "quota": 10,
         "busy_ids": [], "next_pid": 1, "max_packet": 0, "aliases": 0, "deny": None, "unacked": [], "readers": 2,
         "acks": [(2, False)], "slow": False, "store_ahead": 0, "unsent": 0, "paused": False}
    for module in (compiled(PUSH), interpreted(PUSH)):
        seen = run(module, s, "batch")
        assert seen["result"] is True
        copies = b"".join(bytes([0x32, 8, 0, 3]) + b"a/b" + bytes([0, pid]) + b"x" for pid in (1, 2, 3, 4))
        resent = b"".join(bytes([0x3A, 8, 0, 3]) + b"a/b" + bytes([0, pid]) + b"x" for pid in (1, 3, 4))  # DUP
        assert seen["out"] == [copies + resent]
        assert seen["resent"] == [True, True, True]
        assert [i[0] for i in seen["inflight"]] == [1, 3, 4]  # 2 was acknowledged
        assert seen["cursors"]["t:a/b"] == (4, {0: 1, 2: 3, 3: 4})
        assert seen["acked"] == [False]
