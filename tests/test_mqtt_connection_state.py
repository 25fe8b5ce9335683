"""The sans-IO MQTT server connection (protocols/mqtt/connection.py), without a network:
CONNECT gating, the negotiated version, topic aliases both ways, Receive Maximum counting
both ways, inbound QoS 2 state, and local vs remote protocol errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.mqtt.codec import encode
from protocols.mqtt.connection import PubRecAnswer, ServerConnection, State, free_packet_id
from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError
from protocols.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode

RECEIVE_MAXIMUM = 4


def _conn() -> ServerConnection:
    return ServerConnection(max_packet_size=1 << 20, receive_maximum=RECEIVE_MAXIMUM, topic_alias_maximum=8,
                            send_quota=100)


def _connected(version: int = MQTT_5, props: Properties | None = None) -> ServerConnection:
    conn = _conn()
    connect = Connect("c", version, properties=props or Properties())
    conn.receive_data(encode(connect, version))
    [event] = list(conn.events())
    assert isinstance(event, Connect) and conn.state is State.CONNECTING and conn.version == version
    conn.accepted(event)
    conn.send(ConnAck(False, ReasonCode.SUCCESS))
    assert conn.state is State.CONNECTED
    return conn


def _feed(conn: ServerConnection, *packets) -> list:
    conn.receive_data(b"".join(encode(p, conn.version) for p in packets))
    return list(conn.events())


def test_the_first_packet_must_be_connect() -> None:
    conn = _conn()
    conn.receive_data(encode(PingReq()))
    with pytest.raises(RemoteProtocolError):
        list(conn.events())


def test_nothing_may_follow_connect_before_its_connack() -> None:
    conn = _conn()
    conn.receive_data(encode(Connect("c")) + encode(PingReq()))
    events = conn.events()
    assert isinstance(next(events), Connect)
    with pytest.raises(RemoteProtocolError, match="before CONNECT completed"):
        next(events)


def test_packets_behind_connect_are_read_once_it_is_accepted() -> None:
    conn = _conn()
    conn.receive_data(encode(Connect("c")) + encode(PingReq()))
    for event in conn.events():
        assert isinstance(event, Connect)
        conn.accepted(event)
        break
    conn.send(ConnAck(False, ReasonCode.SUCCESS))
    assert [type(e) for e in conn.events()] == [PingReq]


@pytest.mark.parametrize("packet,message", [
    (Connect("c", MQTT_5), "a second CONNECT"),
    (Auth(ReasonCode.SUCCESS), "AUTH without"),
    (SubAck(1, [0]), "must not send SUBACK"),
])
def test_what_a_connected_client_must_not_send(packet, message) -> None:
    conn = _connected()
    with pytest.raises(RemoteProtocolError, match=message) as info:
        _feed(conn, packet)
    assert info.value.reason_code == ReasonCode.PROTOCOL_ERROR


def test_the_negotiated_version_decodes_and_encodes() -> None:
    conn = _connected(4)
    assert conn.version == 4
    assert conn.send(PubAck(7, ReasonCode.SUCCESS)) == b"\x40\x02\x00\x07"
    with pytest.raises(LocalProtocolError):
        conn.send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN))  # no server DISCONNECT in 3.1.1
    assert _connected(MQTT_5).send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN)) == b"\xe0\x01\x8b"


def test_local_errors_are_the_callers() -> None:
    conn = _conn()
    with pytest.raises(LocalProtocolError):
        conn.send(PubAck(1))  # nothing but a CONNACK before the CONNECT is accepted
    with pytest.raises(LocalProtocolError):
        conn.accepted(Connect("c"))  # no CONNECT was read
    connected = _connected()
    with pytest.raises(LocalProtocolError):
        connected.send(ConnAck(False, ReasonCode.SUCCESS))


def test_a_refusing_connack_closes() -> None:
    conn = _conn()
    _feed(conn, Connect("c", MQTT_5))
    assert conn.send(ConnAck(False, ReasonCode.NOT_AUTHORIZED)) == encode(ConnAck(False, ReasonCode.NOT_AUTHORIZED), MQTT_5)
    assert conn.state is State.CLOSED


def test_connect_limits_apply_in_5_only() -> None:
    props = Properties(receive_maximum=3, maximum_packet_size=1000, topic_alias_maximum=2)
    conn = _connected(MQTT_5, props)
    assert (conn.send_quota, conn.client_max_packet, conn.alias_max_out) == (3, 1000, 2)
    assert conn.window({1: None}) == 2
    assert _connected(4).send_quota == 100


def test_inbound_topic_aliases() -> None:
    conn = _connected()
    first = Publish("a/b", b"x", properties=Properties(topic_alias=3))
    assert conn.inbound_publish(first, set()) == "a/b"
    assert conn.inbound_publish(Publish("", b"y", properties=Properties(topic_alias=3)), set()) == "a/b"
    with pytest.raises(RemoteProtocolError, match="unknown topic alias"):
        conn.inbound_publish(Publish("", b"y", properties=Properties(topic_alias=4)), set())
    with pytest.raises(RemoteProtocolError) as info:
        conn.inbound_publish(Publish("a", b"y", properties=Properties(topic_alias=9)), set())
    assert info.value.reason_code == ReasonCode.TOPIC_ALIAS_INVALID
    with pytest.raises(RemoteProtocolError) as info:
        conn.inbound_publish(Publish("a/#"), set())
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


def test_outbound_topic_aliases() -> None:
    conn = _connected(MQTT_5, Properties(topic_alias_maximum=1))
    assert conn.alias_out("t/1") == ("t/1", 1)
    assert conn.alias_out("t/1") == ("", 1)
    assert conn.alias_out("t/2") == ("t/2", None)  # no free alias: the topic goes in full
    conn2 = _connected(MQTT_5, Properties(topic_alias_maximum=1))
    assert conn2.alias_out("t/1") == ("t/1", 1)
    conn2.alias_unsent("t/1")  # never announced: the alias is free again
    assert conn2.alias_out("t/2") == ("t/2", 1)


def test_qos2_resent_publish_is_taken_once() -> None:
    conn = _connected()
    awaiting: set[int] = set()
    publish = Publish("t", b"x", qos=2, packet_id=5)
    assert conn.inbound_publish(publish, awaiting) == "t"
    assert conn.ack_publish(2, 5, ReasonCode.SUCCESS, awaiting) == b"\x50\x02\x00\x05"
    assert awaiting == {5}
    assert conn.inbound_publish(Publish("t", b"x", qos=2, dup=True, packet_id=5), awaiting) is None
    assert conn.release(5, awaiting) == ReasonCode.SUCCESS and awaiting == set()
    assert conn.release(5, awaiting) == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
    assert conn.inbound_unacked == 0


def test_receive_maximum_exceeded_in_5() -> None:
    conn = _connected()
    for pid in range(1, RECEIVE_MAXIMUM + 1):
        conn.inbound_publish(Publish("t", qos=1, packet_id=pid), set())
    with pytest.raises(RemoteProtocolError) as info:
        conn.inbound_publish(Publish("t", qos=1, packet_id=99), set())
    assert info.value.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


def test_receive_maximum_is_not_enforced_in_3() -> None:
    conn = _connected(4)
    for pid in range(1, RECEIVE_MAXIMUM + 3):
        conn.inbound_publish(Publish("t", qos=1, packet_id=pid), set())


# one step of a client's inbound QoS 1/2 traffic: (kind, packet id)
_steps = st.lists(st.tuples(st.sampled_from(["pub1", "pub2", "ack", "nack", "rel"]), st.integers(1, 6)), max_size=60)


@given(_steps)
def test_receive_maximum_counts_until_puback_or_pubcomp(steps) -> None:
    """Whatever the order, the count is the QoS 1 publishes not PUBACKed plus the QoS 2 ones
    not PUBCOMPed (a refusing PUBREC ends one), and ``awaiting_release`` holds exactly the
    QoS 2 ids PUBRECed and not released."""
    conn = ServerConnection(max_packet_size=1 << 20, receive_maximum=1 << 30, topic_alias_maximum=0, send_quota=10)
    _feed(conn, Connect("c", MQTT_5))
    conn.send(ConnAck(False, ReasonCode.SUCCESS))
    awaiting: set[int] = set()
    unacked: list[tuple[int, int]] = []  # (qos, id) read, not yet answered
    unreleased: set[int] = set()
    for kind, pid in steps:
        if kind in ("pub1", "pub2"):
            qos = 1 if kind == "pub1" else 2
            if any(p == pid for _, p in unacked) or (pid in unreleased and qos == 1):
                continue  # a client does not reuse a packet id still in use
            if conn.inbound_publish(Publish("t", qos=qos, packet_id=pid), awaiting) is not None:
                unacked.append((qos, pid))
            else:
                assert qos == 2 and pid in awaiting
        elif kind in ("ack", "nack") and unacked:
            qos, pid = unacked.pop(0)
            code = ReasonCode.SUCCESS if kind == "ack" else ReasonCode.NOT_AUTHORIZED
            data = conn.ack_publish(qos, pid, code, awaiting)
            if qos == 2 and kind == "ack":
                unreleased.add(pid)
            assert data[0] >> 4 == (4 if qos == 1 else 5)
        elif kind == "rel":
            expect = ReasonCode.SUCCESS if pid in awaiting else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
            assert conn.release(pid, awaiting) == expect
            unreleased.discard(pid)
        assert conn.inbound_unacked == len(unacked) + len(unreleased)
        assert awaiting == unreleased


def test_pubrel_is_an_event_after_connect() -> None:
    conn = _connected()
    events = _feed(conn, PubRel(3), Subscribe(4, [Subscription("a", 1)]))
    assert [type(e) for e in events] == [PubRel, Subscribe]


class _Entry:
    def __init__(self, qos: int) -> None:
        self.qos, self.released = qos, False


def test_outbound_acknowledgements() -> None:
    conn = _connected()
    inflight = {1: _Entry(1), 2: _Entry(2)}
    assert conn.acked(PubAck(1), inflight) is inflight[1]
    assert conn.acked(PubAck(2), inflight) is None  # a PUBACK for a QoS 2 delivery: not ours
    assert conn.acked(PubComp(1), inflight) is None
    assert conn.acked(PubAck(9), inflight) is None
    assert conn.pubrec(PubRec(1), inflight) is PubRecAnswer.NOT_FOUND
    assert conn.pubrec(PubRec(9), inflight) is PubRecAnswer.NOT_FOUND
    assert conn.pubrec(PubRec(2, ReasonCode.NOT_AUTHORIZED), inflight) is PubRecAnswer.REFUSED
    assert not inflight[2].released
    assert conn.pubrec(PubRec(2), inflight) is PubRecAnswer.RELEASE and inflight[2].released
    assert conn.acked(PubComp(2), inflight) is inflight[2]


def test_refusals_before_connack() -> None:
    """A protocol error before CONNACK: 5.0 gets a refusing CONNACK with the reason; a level we
    do not speak gets 3.1.1's return code 1; a connected client gets nothing here."""
    conn = _conn()
    conn.receive_data(b"\x10\x0a\x00\x04MQTT\x07\x02\x00\x3c")  # level 7
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert conn.refusal(info.value.reason_code) == b"\x20\x02\x00\x01"
    assert conn.state is State.CLOSED and conn.refusal(ReasonCode.PROTOCOL_ERROR) == b""
    five = _conn()
    _feed(five, Connect("c", MQTT_5))
    assert five.refusal(ReasonCode.PACKET_TOO_LARGE) == encode(ConnAck(False, ReasonCode.PACKET_TOO_LARGE), MQTT_5)
    assert five.state is State.CLOSED
    four = _conn()
    _feed(four, Connect("c", 4))
    assert four.refusal(ReasonCode.PROTOCOL_ERROR) == b""  # 3.1.1 has no CONNACK for it
    assert _connected().refusal(ReasonCode.PROTOCOL_ERROR) == b""


@given(st.sets(st.integers(1, 65_535), max_size=50), st.integers(1, 65_535))
def test_free_packet_id_is_the_first_free_one_from_start(in_use, start) -> None:
    pid = free_packet_id(in_use, start)
    assert pid is not None and pid not in in_use
    between = [(start - 1 + k) % 65_535 + 1 for k in range((pid - start) % 65_535)]
    assert all(p in in_use for p in between)


def test_no_packet_id_when_all_are_in_use() -> None:
    in_use = set(range(1, 65_536))
    assert free_packet_id(in_use, 7) is None
    in_use.discard(3)
    assert free_packet_id(in_use, 65_535) == 3  # wraps past 65,535 to 1


def test_a_closed_connection_reads_nothing() -> None:
    conn = _connected()
    conn.closed()
    conn.receive_data(encode(PingReq()))
    assert list(conn.events()) == []
