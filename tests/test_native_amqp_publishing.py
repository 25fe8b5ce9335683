"""Differential tests of the compiled AMQP publish path (gateway/amqp/publishing.py and
messages.py): the C extensions and the interpreted reference, given the same publishes read
from a stream cut anywhere, route them to the same queues, hold the same places, return, refuse
and fail them alike, and make the same store messages; and they turn stored messages back into
the same views.

The broker, its queues and the channel are stand-ins that record what routing asks of them; the
exchanges, their bindings and the frame reader are the real ones."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from gateway.amqp.direct_reply import REPLY_PREFIX, REPLY_QUEUE
from gateway.amqp.model import DELAYED, Binding, Exchange, QueueDefinition, routed_queues
from gateway.interop import AMQP_FLAG, MQTT_FLAG
from protocols.amqp.frames import PROTOCOL_HEADER, AMQPError, ContentReceived, channel_error
from protocols.amqp.reader import FrameReader
from store import StoredMessage
from store import encode_properties as encode_store_properties

from .native_support import compiled, interpreted, outcome, split
from .test_native_amqp import frame, properties, shortstr

PUBLISHING = "gateway.amqp.publishing"
MESSAGES = "gateway.amqp.messages"
EXCHANGES = ["", "direct", "topic", "amq.topic", "headers", "delayed", "internal", "missing"]
KEYS = ["a", "b", "a.b", "x.y", "x.#", "", "$SYS.x", REPLY_PREFIX + "known", REPLY_PREFIX + "gone", "q1", "full"]


@dataclass
class Queue:
    """A queue as routing sees it: its store queue, definition and reject-publish places."""

    name: str
    definition: QueueDefinition
    taken: int = 0
    calls: list[tuple] = field(default_factory=list)

    @property
    def store_queue(self) -> str:
        return "amqp/" + self.name

    def take_place(self) -> bool:
        self.calls.append(("take place", self.name))
        limit = self.definition.max_length
        if limit is not None and self.taken >= limit:
            return False
        self.taken += 1
        return True

    def give_place_back(self) -> None:
        self.calls.append(("give place back", self.name))
        self.taken -= 1


class Replies:
    """Direct reply-to: one reply name with a consumer; every call recorded."""

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls

    def name_reply_to(self, channel: Any, event: ContentReceived) -> None:
        self.calls.append(("name reply to", event.reply_to))
        if event.reply_to == REPLY_QUEUE:
            raise channel_error(406, "fast reply consumer does not exist", event.channel, event.method)

    def deliver(self, routing_key: str, event: ContentReceived) -> bool:
        self.calls.append(("reply", routing_key, event.body))
        return routing_key == REPLY_PREFIX + "known"


class Broker:
    """The exchanges and queues publishes are routed by, the MQTT bridge of amq.topic, and a
    record of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        full = QueueDefinition("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        self.queues = {name: Queue(name, QueueDefinition(name), calls=self.calls) for name in ("q1", "q2", "q3")}
        self.queues["full"] = Queue("full", full, calls=self.calls)
        self.exchanges = {
            "direct": Exchange("direct", "direct", bindings=[Binding("q1", "a"), Binding("q2", "a"),
                                                             Binding("full", "b")]),
            "topic": Exchange("topic", "topic", bindings=[Binding("q1", "a.#"), Binding("full", "#")],
                              exchange_bindings=[Binding("direct", "x.*")]),
            "amq.topic": Exchange("amq.topic", "topic", bindings=[Binding("q3", "x.#")]),
            "headers": Exchange("headers", "headers", bindings=[Binding("q2", "", {"x-match": "any", "k": 1})]),
            "delayed": Exchange("delayed", DELAYED, arguments={"x-delayed-type": "direct"},
                                bindings=[Binding("q1", "a")]),
            "internal": Exchange("internal", "topic", internal=True),
        }
        self.direct_replies = Replies(self.calls)

    def route(self, exchange_name: str, routing_key: str, headers: dict[str, Any] | None) -> list[Queue]:
        self.calls.append(("route", exchange_name, routing_key))
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        names = routed_queues(self.exchanges, exchange_name, routing_key, headers)
        return [self.queues[name] for name in sorted(names) if name in self.queues]

    def mqtt_route(self, routing_key: str) -> tuple[str | None, list[str], bool]:
        self.calls.append(("mqtt route", routing_key))
        if routing_key.startswith("$") or "#" in routing_key:
            return None, [], False
        topic = routing_key.replace(".", "/")
        return topic, ["mqtt/" + topic, "amqp/q3"], routing_key == "x.y"


def routed_plainly(routed: Any) -> tuple:
    """A ``Routed`` as plain data (its message's fields, its places by name)."""
    m = routed.message
    message = None if m is None else (m.topic, m.body, m.properties, m.key, m.flag, m.hold_kind,
                                      m.hold_due_ms is not None)
    return (message, list(routed.targets), [q.name for q in routed.places], routed.refused_by_some, routed.returned)


def route_all(module: ModuleType, chunks: list[bytes]) -> list[Any]:
    """Read ``chunks`` with the real frame reader and route each publish with ``module``'s
    ``route_publish`` against a fresh broker: each outcome, then the broker's calls."""
    broker = Broker()
    reader = FrameReader(frame_max=4096, max_body=1 << 20)
    seen: list[Any] = []
    for chunk in [PROTOCOL_HEADER, *chunks]:
        reader.feed(chunk)
        for event in reader.events():
            if not isinstance(event, ContentReceived):
                continue
            try:
                routed = module.route_publish(broker, object(), event)
            except AMQPError as exc:
                seen.append(("error", (exc.reply_code, exc.text, exc.channel, exc.connection)))
                continue
            seen.append(("routed", routed_plainly(routed)))  # (places kept: "full" fills up)
    return seen + [("calls", broker.calls)]


@st.composite
def routable_publishes(draw: st.DrawFn) -> bytes:
    """basic.publish, header and body frames on channel 1: an exchange and routing key of the
    broker above (or not), the mandatory bit, random properties with a valid or invalid
    expiration, an x-delay header or not."""
    exchange = draw(st.sampled_from(EXCHANGES)).encode()
    key = draw(st.sampled_from(KEYS)).encode()
    bits = draw(st.sampled_from([0, 1]))
    method = struct.pack(">HHH", 60, 40, 0) + shortstr(exchange) + shortstr(key) + bytes((bits,))
    props = draw(properties)
    props.expiration = draw(st.one_of(st.just(props.expiration), st.sampled_from(["100", "-1", "1x", "", None])))
    props.reply_to = draw(st.one_of(st.just(props.reply_to), st.just(REPLY_QUEUE)))
    if draw(st.booleans()):
        props.headers = {**(props.headers or {}), "x-delay": draw(st.sampled_from([1000, 0, -5, "7", True])), "k": 1}
    try:
        header = pheader.ContentHeader(0, 0, props).marshal()[12:]
    except (TypeError, ValueError, OverflowError, struct.error):  # values pamqp cannot encode
        assume(False)
    body = draw(st.binary(max_size=40))
    return frame(1, 1, method) + frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + header) + \
        (frame(3, 1, body) if body else b"")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(wire=st.lists(routable_publishes(), min_size=1, max_size=6).map(b"".join),
       cuts=st.lists(st.integers(0, 1 << 12), max_size=6))
def test_publishes_read_in_any_chunks_route_the_same(wire: bytes, cuts: list[int]) -> None:
    chunks = split(wire, cuts)
    fast = route_all(compiled(PUBLISHING), chunks)
    assert fast == route_all(interpreted(PUBLISHING), chunks)
    assert len(fast) > 1  # (every publish was read and routed)


def test_the_routes_cover_each_answer() -> None:
    """The broker above gives every kind of answer: stored, returned, a place held in a queue
    with reject-publish, refused by it once full,
    a direct reply, an unknown or internal exchange, a bad expiration."""
    publish = commands.Basic.Publish
    cases = [
        (publish(exchange="direct", routing_key="a"), commands.Basic.Properties(delivery_mode=2, message_id="m")),
        (publish(exchange="direct", routing_key="zz", mandatory=True), commands.Basic.Properties()),
        (publish(exchange="topic", routing_key="b"), commands.Basic.Properties()),
        (publish(exchange="topic", routing_key="b"), commands.Basic.Properties()),
        (publish(exchange="", routing_key=REPLY_PREFIX + "known"), commands.Basic.Properties()),
        (publish(exchange="missing", routing_key="a"), commands.Basic.Properties()),
        (publish(exchange="internal", routing_key="a"), commands.Basic.Properties()),
        (publish(exchange="direct", routing_key="a"), commands.Basic.Properties(expiration="1x")),
        (publish(exchange="amq.topic", routing_key="x.y"), commands.Basic.Properties()),
        (publish(exchange="delayed", routing_key="a"), commands.Basic.Properties(headers={"x-delay": 50})),
    ]
    wire = b"".join(pframe.marshal(m, 1) + pframe.marshal(pheader.ContentHeader(0, 3, p), 1)
                    + pframe.marshal(ContentBody(b"abc"), 1) for m, p in cases)
    fast = route_all(compiled(PUBLISHING), [wire])
    assert fast == route_all(interpreted(PUBLISHING), [wire])
    answers = [value for kind, value in fast[:-1]]
    assert answers[0][1] == ["amqp/q1", "amqp/q2"] and answers[0][0][3] == "m"  # stored, its key
    assert answers[1][4] is True  # returned
    assert answers[2][2] == ["full"] and answers[3][3] is True  # a place taken, then refused: full
    assert answers[4] == (None, [], [], False, False)  # a direct reply: nothing stored
    assert [a[0] for a in answers[5:8]] == [404, 403, 406]
    assert "mqtt/x/y" in answers[8][1]
    assert answers[9][0][6] is True  # held until its time


@given(exchange=st.text(max_size=10), routing_key=st.text(max_size=10), raw=st.binary(max_size=30),
       body=st.binary(max_size=20), topic=st.one_of(st.none(), st.text(max_size=8)),
       delivery_mode=st.one_of(st.none(), st.integers(0, 3)), message_id=st.one_of(st.none(), st.text(max_size=6)))
def test_store_messages_are_the_same(exchange: str, routing_key: str, raw: bytes, body: bytes, topic: str | None,
                                     delivery_mode: int | None, message_id: str | None) -> None:
    def made(module: ModuleType) -> tuple:
        m = module.to_store_message(exchange, routing_key, raw, body, topic, delivery_mode=delivery_mode,
                                    message_id=message_id)
        return (m.topic, m.body, m.properties, m.key, m.flag)
    assert made(compiled(MESSAGES)) == made(interpreted(MESSAGES))


@given(expiration=st.one_of(st.text(max_size=12), st.integers(-10, 10 ** 10).map(str)))
def test_expiration_problems_are_the_same(expiration: str) -> None:
    assert compiled(MESSAGES).expiration_problem(expiration) == interpreted(MESSAGES).expiration_problem(expiration)


@given(flag=st.sampled_from([AMQP_FLAG, AMQP_FLAG | 1, MQTT_FLAG, MQTT_FLAG | 1, 0]), topic=st.text(max_size=8),
       header=st.one_of(st.none(), st.binary(max_size=20)), exchange=st.one_of(st.none(), st.text(max_size=6)),
       delivery_count=st.integers(0, 3), ttl=st.one_of(st.none(), st.integers(0, 100)))
def test_views_of_stored_messages_are_the_same(flag: int, topic: str, header: bytes | None, exchange: str | None,
                                               delivery_count: int, ttl: int | None) -> None:
    props: dict[str, str] = {}
    if header is not None:
        props["amqp.p"] = base64.b64encode(bytes(12) + header).decode()
    if exchange is not None:
        props["amqp.x"] = exchange
    message = StoredMessage(None, 0, 100, topic, "", b"body", 1_000, 2_000, encode_store_properties(props), b"",
                            1, "q", 0, 0, flag, None, "")

    def viewed(module: ModuleType) -> tuple:
        view = module.AMQPView.of(message, {})
        return (view.exchange, view.routing_key, view.raw_properties, view.route,
                outcome(lambda: view.expiration), outcome(view.counted_properties, delivery_count),
                outcome(view.expired, message, ttl, 5_000))
    fast = viewed(compiled(MESSAGES))
    assert fast == viewed(interpreted(MESSAGES))
