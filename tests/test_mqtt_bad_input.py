"""Bad MQTT input over real sockets: the offending connection is closed with the right reason
code (5.0) or closed (3.1.1), and nothing else is affected."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocols.mqtt.codec import encode, fixed_header
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from protocols.mqtt.properties import Properties

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


async def closed_with(client: RawClient) -> list[tuple[type, int]]:
    return [(type(p), getattr(p, "reason_code", None)) for p in await client.closed()]


@pytest.mark.parametrize("name, data, expected", [
    ("wildcard in topic", encode(Publish("a/+", b"x"), MQTT_5), [(Disconnect, 0x90)]),
    ("second CONNECT", encode(Connect("again", MQTT_5), MQTT_5), [(Disconnect, 0x82)]),
    ("malformed packet", b"\x30\x04\x00\x02\xc3\x28", [(Disconnect, 0x81)]),
    ("oversized packet", fixed_header(0x30, 16 << 20), [(Disconnect, 0x95)]),  # (the default limit: 16 MiB)
    ("unknown topic alias", encode(Publish("", b"x", properties=Properties(topic_alias=3)), MQTT_5),
     [(Disconnect, 0x82)]),
    ("topic alias above maximum", encode(Publish("t", b"x", properties=Properties(topic_alias=1000)), MQTT_5),
     [(Disconnect, 0x94)]),
    ("invalid UTF-8 with format indicator, QoS 0",
     encode(Publish("t", b"\xff\xfe", properties=Properties(payload_format_indicator=1)), MQTT_5),
     [(Disconnect, 0x99)]),
    ("server-only packet", encode(SubAck(1, [0]), MQTT_5), [(Disconnect, 0x82)]),
    ("no local on a shared subscription",
     encode(Subscribe(1, [Subscription("$share/g/a", 1, no_local=True)]), MQTT_5), [(Disconnect, 0x82)]),
])
async def test_v5_connection_closed_with_reason(data_dir: Path, name: str, data: bytes,
                                                expected: list) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        bystander, _ = await RawClient.connected(port, Connect("bystander", MQTT_5))
        client, ack = await RawClient.connected(port, Connect("bad", MQTT_5))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        client.send_raw(data)
        assert await closed_with(client) == expected, name
        bystander.send(PingReq())
        assert isinstance(await bystander.recv(), PingResp)
        await bystander.close()


@pytest.mark.parametrize("data", [
    encode(Publish("a/#", b"x"), MQTT_3_1_1),
    encode(Connect("again"), MQTT_3_1_1),
    b"\x30\x04\x00\x02\xc3\x28",
    b"\x82\x02\x00\x01",  # SUBSCRIBE without a filter
])
async def test_v311_connection_just_closed(data_dir: Path, data: bytes) -> None:
    async with running_gateway(data_dir) as gw:
        client, _ = await RawClient.connected(mqtt_port(gw), Connect("bad", MQTT_3_1_1))
        client.send_raw(data)
        assert await client.closed() == []


async def test_packet_before_connect_and_unsupported_version(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        client = await RawClient.open(port, MQTT_3_1_1)
        client.send(PingReq())
        assert await client.closed() == []
        client = await RawClient.open(port, MQTT_3_1_1)
        body = b"\x00\x04MQTT\x07\x02\x00\x3c\x00\x01c"  # protocol level 7
        client.send_raw(fixed_header(0x10, len(body)) + body)
        packets = await client.closed()
        assert [(type(p), p.reason_code) for p in packets] == [(ConnAck, 0x84)]  # 3.1.1 return code 1


async def test_publish_to_sys_topics_and_bad_utf8_payload_refused_with_puback_codes(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        client, _ = await RawClient.connected(mqtt_port(gw), Connect("c", MQTT_5))
        client.send(Publish("$SYS/broker/x", b"1", 1, packet_id=1))
        assert (await client.recv()).reason_code == 0x87
        client.send(Publish("t", b"\xff", 1, packet_id=2, properties=Properties(payload_format_indicator=1)))
        assert (await client.recv()).reason_code == 0x99
        client.send(Publish("t", "ü".encode(), 1, packet_id=3, properties=Properties(payload_format_indicator=1)))
        ack = await client.recv()
        assert isinstance(ack, PubAck) and (ack.packet_id, ack.reason_code) == (3, 0)
        assert [m.body for m in gw.store.get_now("t:t", 0, 10).messages] == ["ü".encode()]
        await client.close()


async def test_invalid_subscription_filters_get_failure_codes(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        v5, _ = await RawClient.connected(port, Connect("v5", MQTT_5))
        v5.send(Subscribe(1, [Subscription("a/#/b", 1), Subscription("ok/+", 2)]))
        assert (await v5.recv()).reason_codes == [0x8F, 2]
        v3, _ = await RawClient.connected(port, Connect("v3", MQTT_3_1_1))
        v3.send(Subscribe(1, [Subscription("a/b#", 1), Subscription("ok", 1)]))
        assert (await v3.recv()).reason_codes == [0x80, 1]
        await v5.close()
        await v3.close()


async def test_client_id_rules(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        _, ack = await RawClient.connected(port, Connect("", MQTT_3_1_1, clean_start=False))
        assert ack.reason_code == 0x85  # 3.1.1 return code 2: identifier rejected
        v5, ack = await RawClient.connected(port, Connect("", MQTT_5))
        assert ack.reason_code == 0 and ack.properties.assigned_client_identifier.startswith("tidemq-")
        await v5.close()


async def test_a_flood_of_garbage_does_not_hurt_other_clients(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub")
        await sub.connect()
        await sub.subscribe("ok", 1)
        for seed in range(20):
            client = await RawClient.open(port)
            client.send_raw(bytes((seed * 37 + i * 11) % 256 for i in range(500)))
            try:
                await client.closed(timeout=0.5)
            except TimeoutError:  # the garbage announced a longer packet: the server waits for it
                await client.close()
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("ok", "still fine", 1)
        assert [m.payload for m in await sub.receive(1)] == [b"still fine"]
        await sub.disconnect()
        await pub.disconnect()


async def test_a_message_the_store_refuses_is_refused_alone(data_dir: Path) -> None:
    """A publish the store cannot take (here: within the packet limit, but over the store's
    message limit once its wildcard queues are listed in the record) gets its own negative
    PUBACK; the publishes read with it are stored and acknowledged."""
    async with running_gateway(data_dir, max_message_size=9_000, mqtt_max_packet_size=9_000) as gw:
        port = mqtt_port(gw)
        sub, _ = await RawClient.connected(port, Connect("many-filters", MQTT_5))
        deep = "big/" + "/".join(str(level) for level in range(60))
        filters = [f"big/{'+/' * i}#" for i in range(60)] + ["small/#"]  # each matches ``deep``: ~4 KB of names
        sub.send(Subscribe(1, [Subscription(f, 0) for f in filters]))
        assert len((await sub.recv()).reason_codes) == len(filters)
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_5))
        pub.send_raw(encode(Publish("small/a", b"a", 1, packet_id=1), MQTT_5)
                     + encode(Publish(deep, b"x" * 6_000, 1, packet_id=2), MQTT_5)
                     + encode(Publish("small/b", b"b", 1, packet_id=3), MQTT_5))
        acks = {ack.packet_id: ack.reason_code for ack in [await pub.recv() for _ in range(3)]}
        assert acks == {1: 0, 2: 0x83, 3: 0}
        assert sorted([(await sub.recv()).payload for _ in range(2)]) == [b"a", b"b"]
        await pub.close()
        await sub.close()


def test_the_mqtt_packet_limit_may_not_exceed_the_store_message_limit(tmp_path: Path) -> None:
    from gateway.config import Config, ConfigError, validate

    with pytest.raises(ConfigError, match="mqtt_max_packet_size"):
        validate(Config(data_dir=tmp_path, max_message_size=1 << 20, mqtt_max_packet_size=2 << 20))


@pytest.mark.parametrize("version", [MQTT_5, MQTT_3_1_1])
async def test_bytes_behind_a_disconnect_are_not_answered(data_dir: Path, version: int,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A malformed packet in the same write as the client's DISCONNECT: the connection has
    closed at the DISCONNECT, so nothing answers the malformed bytes (no CONNACK on a closed
    connection) and the gateway logs no error."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        client, ack = await RawClient.connected(port, Connect("leaving", version))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        client.send_raw(encode(Disconnect(), version) + b"\x30\x04\x00\x02\xc3\x28")
        assert await client.closed() == []
        bystander, ack = await RawClient.connected(port, Connect("bystander", version))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        await bystander.close()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
