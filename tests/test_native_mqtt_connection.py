"""Differential tests of the compiled MQTT server connection (protocols/mqtt/connection.py): the
C extension and the interpreted reference, fed the same client byte streams (valid, damaged, in
any chunks) and asked the same things, give the same events, bytes, errors and state after every
step. A driver plays the gateway's part (gateway/mqtt): CONNECT accepted or refused, PUBLISHes
counted and acknowledged later, PUBRELs released, a subscriber's acknowledgements settled."""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError
from protocols.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Packet,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.writer import encode

from .mqtt_strategies import packets, text
from .native_support import compiled, damage, interpreted

CONNECTION = "protocols.mqtt.connection"
VERSIONS = [MQTT_3_1_1, MQTT_5]
# few packet ids and topics, so that ids collide (QoS 2 resent, acknowledgements of our own
# deliveries) and topics repeat (aliases both ways), and some topics are invalid
IDS = st.integers(1, 6)
TOPICS = st.sampled_from(["a", "a/b", "s/1/t", "$SYS/x"])
BAD_TOPICS = st.sampled_from(["", "a/+", "#"])
ACK_CODES = st.sampled_from([ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS, ReasonCode.NOT_AUTHORIZED,
                             ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR])
CONNACK_CODES = st.sampled_from([ReasonCode.SUCCESS] * 6 + [ReasonCode.NOT_AUTHORIZED, ReasonCode.SERVER_BUSY])


class Entry:
    """The caller's record of a delivery to the client not acknowledged yet (gateway/mqtt/session.py)."""

    __slots__ = ("qos", "released")

    def __init__(self, qos: int) -> None:
        self.qos, self.released = qos, False


class Driver:
    """One ServerConnection of ``module`` driven as the gateway drives it; ``log`` is everything
    it returned or raised, and its state after every step."""

    def __init__(self, module: ModuleType, limits: dict[str, int], inflight: list[tuple[int, int]]) -> None:
        self.module = module
        self.conn = module.ServerConnection(**limits)
        self.awaiting: set[int] = set()  # the session's inbound QoS 2 ids (awaiting_release)
        self.pending: list[tuple[int, int]] = []  # (qos, id) counted by inbound_publish, not acknowledged
        self.inflight = {pid: Entry(qos) for pid, qos in inflight}  # the session's outbound deliveries
        self.log: list[Any] = []

    # -- what the gateway does -----------------------------------------------------------------
    def step(self, op: tuple) -> None:
        kind, *args = op
        if kind == "data":
            self.call("receive_data", args[0])
            self.read(args[1])
        elif kind == "ack" and self.pending:
            qos, pid = self.pending.pop(0)
            self.call("ack_publish", qos, pid, args[0], self.awaiting)
        elif kind == "send":
            self.call("send", args[0])
        elif kind == "alias_out":
            self.call("alias_out", args[0])
        elif kind == "alias_unsent":
            self.call("alias_unsent", args[0])
        elif kind == "window":
            self.call("window", self.inflight)
        elif kind == "close":
            self.call("closed")
        self.log.append(("state", self.state()))

    def read(self, connack_code: ReasonCode) -> None:
        """Iterate the events as MQTTConnection.process does; a CONNECT ends the iteration, is
        accepted and answered, and what came behind it is read on (gateway/mqtt/connect.py)."""
        connect = None
        try:
            for event in self.conn.events():
                self.log.append(("event", event))
                if type(event) is Connect:
                    connect = event
                    break
                if not self.handle(event):
                    return
        except RemoteProtocolError as exc:
            self.remote_error("events", exc)
            return
        if (connect is not None and self.call("accepted", connect) is not _FAILED
                and self.call("send", ConnAck(False, connack_code)) is not _FAILED and connack_code < 0x80):
            self.read(connack_code)

    def handle(self, event: Packet) -> bool:
        """React to one event; False once the connection closed on an error."""
        cls = type(event)
        if cls is Publish:
            topic = self.call("inbound_publish", event, self.awaiting)
            if topic is _FAILED:
                return False
            if topic is None:  # a QoS 2 PUBLISH sent again: PUBREC again, nothing more
                self.call("send", PubRec(event.packet_id))
            elif event.qos:
                self.pending.append((event.qos, event.packet_id))
        elif cls is PubRel:
            code = self.call("release", event.packet_id, self.awaiting)
            if code is not _FAILED:
                self.call("send", PubComp(event.packet_id, code))
        elif cls is PubAck or cls is PubComp:
            entry = self.call("acked", event, self.inflight)
            if entry is not None and entry is not _FAILED:
                del self.inflight[event.packet_id]
        elif cls is PubRec:
            self.call("pubrec", event, self.inflight)
        return self.conn.state.name != "CLOSED"

    # -- recording ------------------------------------------------------------------------------
    def call(self, name: str, *args: Any) -> Any:
        try:
            value = getattr(self.conn, name)(*args)
        except RemoteProtocolError as exc:
            self.remote_error(name, exc)
            return _FAILED
        except LocalProtocolError as exc:
            self.log.append((name, "local error", str(exc)))
            return _FAILED
        self.log.append((name, self.plain(value)))
        return value

    def remote_error(self, where: str, exc: RemoteProtocolError) -> None:
        """The client broke the protocol: what the gateway sends before closing, then closed."""
        self.log.append((where, "remote error", type(exc), str(exc), exc.reason_code))
        self.call("refusal", exc.reason_code)
        self.call("closed")

    def plain(self, value: Any) -> Any:
        """A value comparable across the two builds (each has its own enum classes)."""
        if isinstance(value, (self.module.State, self.module.PubRecAnswer)):
            return (type(value).__name__, value.name)
        if isinstance(value, Entry):
            return ("entry", value.qos, value.released)
        return value

    def state(self) -> tuple:
        conn = self.conn
        return (conn.state.name, conn.version, conn.inbound_unacked, conn.receive_maximum, conn.topic_alias_maximum,
                conn.send_quota, conn.client_max_packet, conn.alias_max_out, conn.buffered, sorted(self.awaiting),
                list(self.pending), sorted((pid, e.qos, e.released) for pid, e in self.inflight.items()))


_FAILED = object()


def run_both(limits: dict[str, int], inflight: list[tuple[int, int]], ops: list[tuple]) -> set[str]:
    """Both builds through ``ops``, compared after every step; what was reached (calls made,
    remote errors, the final state), for the statistics of the hypothesis tests."""
    fast = Driver(compiled(CONNECTION), limits, inflight)
    reference = Driver(interpreted(CONNECTION), limits, inflight)
    assert fast.module is not reference.module
    seen: set[str] = set()
    for op in ops:
        fast.step(op)
        reference.step(op)
        assert fast.log == reference.log, op
        seen.update(entry[0] if entry[1] != "remote error" else "remote error" for entry in fast.log)
        fast.log.clear()
        reference.log.clear()
    assert fast.state() == reference.state()
    return seen | {f"final state {fast.conn.state.name}"}


def reached(seen: set[str]) -> None:
    """What an example reached, in ``pytest --hypothesis-show-statistics``."""
    for name in sorted(seen & {"remote error", "ack_publish", "acked", "pubrec", "release", "alias_out",
                               "final state CONNECTED", "final state CLOSED"}):
        event(name)


# -- strategies ----------------------------------------------------------------------------------
LIMITS = st.fixed_dictionaries({
    "max_packet_size": st.sampled_from([96, 1 << 20, 1 << 20]),
    "receive_maximum": st.integers(1, 8),
    "topic_alias_maximum": st.integers(0, 4),
    "send_quota": st.integers(1, 8),
})
INFLIGHT = st.lists(st.tuples(IDS, st.integers(1, 2)), max_size=6)


def connects(version: int) -> st.SearchStrategy[Connect]:
    levels = st.just(MQTT_5) if version == MQTT_5 else st.sampled_from([MQTT_3_1, MQTT_3_1_1])
    connect_props = st.just(Properties()) if version != MQTT_5 else st.builds(
        Properties, receive_maximum=st.none() | st.integers(1, 4), maximum_packet_size=st.none() | st.integers(1, 1 << 20),
        topic_alias_maximum=st.none() | st.integers(0, 3))
    return st.builds(Connect, text, levels, st.booleans(), st.integers(0, 0xFFFF), properties=connect_props)


def client_packets(version: int, size: int) -> st.SearchStrategy[list]:
    """Up to ``size`` packets of the hot path (QoS 1/2 PUBLISH, acknowledgements, PUBREL), and
    in a third of the streams one packet of any kind among them (a client must not send some:
    the error closes the connection, so it is kept rare)."""
    alias = st.sampled_from([None] * 6 + [1, 2, 5]) if version == MQTT_5 else st.none()
    publish = st.builds(Publish, TOPICS, st.binary(max_size=8), st.sampled_from([1, 1, 1, 2, 2, 0]), st.booleans(),
                        st.booleans(),
                        IDS, st.builds(Properties, topic_alias=alias)).map(_publish_fixed)
    acks = st.builds(lambda cls, pid, code: cls(pid, code), st.sampled_from([PubAck, PubRec, PubRel, PubComp]), IDS,
                     st.sampled_from([0, 0x10, 0x80]) if version == MQTT_5 else st.just(0))
    hot = st.lists(st.one_of(publish, publish, publish, acks), min_size=size // 2, max_size=size)
    bad_publish = st.builds(Publish, BAD_TOPICS, st.just(b""), st.integers(0, 2),
                            properties=st.builds(Properties, topic_alias=alias)).map(_publish_fixed)
    odd = st.one_of(st.just([]), st.just([]), st.just([]), packets(version).map(lambda p: [p]),
                    bad_publish.map(lambda p: [p]))
    return st.builds(lambda packets, extra, at: packets[:at] + extra + packets[at:], hot, odd, st.integers(0, size))


def _publish_fixed(publish: Publish) -> Publish:
    if not publish.qos:
        publish.packet_id, publish.dup = None, False
    return publish


def wire(version: int, connect: Connect, stream: list) -> bytes:
    frames = [encode(connect, connect.version)]
    for packet in stream:
        with contextlib.suppress(Exception):  # a packet the writer refuses (empty topic, no alias): not sent
            frames.append(encode(packet, version))
    return b"".join(frames)


def operations(data: st.DataObject, version: int, blob: bytes) -> list[tuple]:
    """The stream in chunks, with the gateway's other calls between them."""
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(blob)), min_size=1, max_size=6))))
    chunks = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)])]
    ack = st.tuples(st.just("ack"), ACK_CODES)
    other = st.one_of(
        ack, ack, ack, ack, ack, ack, st.tuples(st.just("alias_out"), TOPICS), st.tuples(st.just("alias_unsent"), TOPICS),
        st.tuples(st.just("window")), st.tuples(st.just("send"), packets(version)),
    )
    ops: list[tuple] = []
    for chunk in chunks:
        ops.append(("data", chunk, data.draw(CONNACK_CODES)))
        ops.extend(data.draw(st.lists(other, max_size=4)))
    if data.draw(st.booleans()):  # closed by the gateway: nothing more is read
        ops += [("close",), ("data", encode(PubAck(1), version), ReasonCode.SUCCESS), ("ack", ReasonCode.SUCCESS)]
    return ops


# -- tests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(data=st.data())
def test_client_streams_give_the_same_events_bytes_and_state(version: int, data: st.DataObject) -> None:
    blob = wire(version, data.draw(connects(version)), data.draw(client_packets(version, 12)))
    reached(run_both(data.draw(LIMITS), data.draw(INFLIGHT), operations(data, version, blob)))


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(data=st.data())
def test_damaged_client_streams_give_the_same_errors(version: int, data: st.DataObject) -> None:
    blob = wire(version, data.draw(connects(version)), data.draw(client_packets(version, 8)))
    reached(run_both(data.draw(LIMITS), data.draw(INFLIGHT), operations(data, version, damage(data, blob))))


@settings(max_examples=100, deadline=None)
@given(blob=st.binary(max_size=200), limits=LIMITS)
def test_random_bytes_give_the_same_errors(blob: bytes, limits: dict[str, int]) -> None:
    reached(run_both(limits, [], [("data", blob, ReasonCode.SUCCESS)]))


def test_a_long_qos1_fan_in_gives_the_same_acknowledgements() -> None:
    """The hot path at length: the packet ids wrap, the counts go up and down (bounded loop)."""
    connect = encode(Connect("c", MQTT_5), MQTT_5)
    frames = [encode(Publish("s/1/t", b"x", 1, False, False, i % 65_535 + 1), MQTT_5) for i in range(66_000)]
    ops: list[tuple] = [("data", connect, ReasonCode.SUCCESS)]
    for i in range(0, len(frames), 1000):
        ops.append(("data", b"".join(frames[i:i + 1000]), ReasonCode.SUCCESS))
        ops.extend([("ack", ReasonCode.SUCCESS)] * 1000)
    run_both({"max_packet_size": 1 << 20, "receive_maximum": 1000, "topic_alias_maximum": 0, "send_quota": 10}, [], ops)


@given(in_use=st.sets(st.integers(1, 65_535), max_size=30) | st.just(set(range(1, 65_536))), start=st.integers(1, 65_535))
@settings(max_examples=100, deadline=None)
def test_free_packet_ids_are_the_same(in_use: set[int], start: int) -> None:
    assert compiled(CONNECTION).free_packet_id(in_use, start) == interpreted(CONNECTION).free_packet_id(in_use, start)


def test_the_compiled_connection_is_an_extension_type() -> None:
    """What the typing gives (C fields, no instance dict) and what it keeps: the same public
    attributes, writable, as the interpreted class's slots."""
    limits = {"max_packet_size": 1 << 20, "receive_maximum": 4, "topic_alias_maximum": 2, "send_quota": 8}
    fast, reference = compiled(CONNECTION).ServerConnection(**limits), interpreted(CONNECTION).ServerConnection(**limits)
    for conn in (fast, reference):
        assert not hasattr(conn, "__dict__")
        conn.send_quota = 3
        assert conn.window({1: None}) == 2


class Ids(set):
    """A caller's own set type."""


class Text(str):
    """A caller's own string type."""


def test_arguments_that_are_not_exactly_set_or_str_are_taken_the_same() -> None:
    """Compiled, a ``set`` or ``str`` annotation would refuse subclasses and None (the module
    turns annotation typing off): both builds take what the interpreted one takes."""
    limits = {"max_packet_size": 1 << 20, "receive_maximum": 4, "topic_alias_maximum": 2, "send_quota": 8}
    results = []
    for module in (compiled(CONNECTION), interpreted(CONNECTION)):
        driver = Driver(module, limits, [])
        driver.step(("data", encode(Connect("c", MQTT_5), MQTT_5), ReasonCode.SUCCESS))
        conn, seen = driver.conn, []
        for call, args in [
            (conn.inbound_publish, (Publish(Text("t"), b"", 2, False, False, 1), frozenset({1}))),
            (conn.inbound_publish, (Publish("t", b"", 2, False, False, 2), Ids())),
            (conn.ack_publish, (2, 2, ReasonCode.SUCCESS, Ids())),
            (conn.release, (2, Ids({2}))),
            (conn.alias_out, (Text("t"),)),
            (conn.alias_out, (None,)),
            (conn.alias_unsent, (None,)),
        ]:
            try:
                seen.append(("value", call(*args)))
            except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
                seen.append(("error", type(exc).__name__))
        results.append((seen, driver.state()))
    assert results[0] == results[1]
