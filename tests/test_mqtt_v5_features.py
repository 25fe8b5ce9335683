"""MQTT 5.0 features end to end: properties forwarded, message expiry, topic aliases both ways,
subscription identifiers, No Local, maximum packet size, request/response, amqtt interop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
)
from protocols.mqtt.properties import Properties

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


async def subscribed(port: int, client_id: str, topic_filter: str, qos: int = 1, *,
                     props: Properties | None = None, sub_props: Properties | None = None) -> RawClient:
    client, ack = await RawClient.connected(port, Connect(client_id, MQTT_5, properties=props or Properties()))
    assert ack.reason_code == 0
    client.send(Subscribe(1, [Subscription(topic_filter, qos)], sub_props or Properties()))
    await client.recv()
    return client


async def test_publish_properties_reach_subscribers(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = await subscribed(port, "sub", "req/#")
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_5))
        sent = Properties(payload_format_indicator=1, content_type="application/json", response_topic="resp/1",
                          correlation_data=b"\x00\x01corr", user_properties=[("k", "v"), ("k", "v2")])
        pub.send(Publish("req/x", b'{"a":1}', 1, packet_id=1, properties=sent))
        assert isinstance(await pub.recv(), PubAck)
        got = await sub.recv()
        assert got.payload == b'{"a":1}'
        p = got.properties
        assert (p.payload_format_indicator, p.content_type, p.response_topic, p.correlation_data) == (
            1, "application/json", "resp/1", b"\x00\x01corr")
        assert p.user_properties == [("k", "v"), ("k", "v2")]
        await sub.close()
        await pub.close()


async def test_message_expiry(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        connect = Connect("late", MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=60))
        sub, _ = await RawClient.connected(port, connect)
        sub.send(Subscribe(1, [Subscription("exp/#", 1)]))
        await sub.recv()
        await sub.close()
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_5))
        pub.send(Publish("exp/short", b"gone", 1, packet_id=1, properties=Properties(message_expiry_interval=1)))
        pub.send(Publish("exp/long", b"kept", 1, packet_id=2, properties=Properties(message_expiry_interval=100)))
        await pub.recv()
        await pub.recv()
        await asyncio.sleep(2.1)
        sub, _ = await RawClient.connected(port, connect)
        got = await sub.recv()
        assert got.payload == b"kept"
        assert 95 <= got.properties.message_expiry_interval <= 98  # the remaining interval
        sub.send(PubAck(got.packet_id))
        try:
            extra = await sub.recv(timeout=0.4)
        except TimeoutError:
            extra = None
        assert extra is None
        await sub.close()
        await pub.close()


async def test_topic_aliases_both_directions(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = await subscribed(port, "sub", "alias/#", 0, props=Properties(topic_alias_maximum=5))
        pub, ack = await RawClient.connected(port, Connect("pub", MQTT_5))
        assert ack.properties.topic_alias_maximum >= 1
        pub.send(Publish("alias/long/topic/name", b"1", properties=Properties(topic_alias=1)))
        pub.send(Publish("", b"2", properties=Properties(topic_alias=1)))  # inbound alias resolved
        first, second = await sub.recv(), await sub.recv()
        assert (first.topic, first.properties.topic_alias, first.payload) == ("alias/long/topic/name", 1, b"1")
        assert (second.topic, second.properties.topic_alias, second.payload) == ("", 1, b"2")  # outbound alias
        await sub.close()
        await pub.close()


async def test_subscription_identifiers_and_no_local(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        client, _ = await RawClient.connected(port, Connect("self", MQTT_5))
        client.send(Subscribe(1, [Subscription("id/a", 1)], Properties(subscription_identifiers=[7])))
        await client.recv()
        client.send(Subscribe(2, [Subscription("id/+", 1)], Properties(subscription_identifiers=[9])))
        await client.recv()
        client.send(Subscribe(3, [Subscription("nl/#", 1, no_local=True)]))
        await client.recv()
        other, _ = await RawClient.connected(port, Connect("other", MQTT_5))
        other.send(Publish("id/a", b"x", 1, packet_id=1))
        got = await client.recv()
        assert sorted(got.properties.subscription_identifiers) == [7, 9]  # one copy, both ids
        client.send(PubAck(got.packet_id))
        client.send(Publish("nl/me", b"mine", 1, packet_id=5))  # not sent back to its publisher
        assert isinstance(await client.recv(), PubAck)
        other.send(Publish("nl/me", b"theirs", 1, packet_id=2))
        got = await client.recv()
        while isinstance(got, PubAck):
            got = await client.recv()
        assert got.payload == b"theirs"
        await client.close()
        await other.close()


async def test_client_maximum_packet_size_drops_what_does_not_fit(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = await subscribed(port, "small", "big/#", 0, props=Properties(maximum_packet_size=100))
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_5))
        pub.send(Publish("big/1", b"x" * 500))
        pub.send(Publish("big/2", b"fits"))
        got = await sub.recv()
        assert got.payload == b"fits"
        assert gw.mqtt.stats.publish_dropped == 1
        await sub.close()
        await pub.close()


async def test_request_response_over_paho(data_dir: Path) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as PahoProps

    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        responder = PahoClient(port, "responder", version=MQTT_5)
        requester = PahoClient(port, "requester", version=MQTT_5)
        await responder.connect()
        await requester.connect()
        await responder.subscribe("svc/echo", 1)
        await requester.subscribe("reply/requester", 1)
        props = PahoProps(PacketTypes.PUBLISH)
        props.ResponseTopic = "reply/requester"
        props.CorrelationData = b"id-42"
        await requester.publish("svc/echo", "ping", 1, properties=props)
        (request,) = await responder.receive(1)
        reply = PahoProps(PacketTypes.PUBLISH)
        reply.CorrelationData = request.properties.CorrelationData
        await responder.publish(request.properties.ResponseTopic, "pong", 1, properties=reply)
        (response,) = await requester.receive(1)
        assert (response.payload, response.properties.CorrelationData) == (b"pong", b"id-42")
        await responder.disconnect()
        await requester.disconnect()


async def test_amqtt_client_interop(data_dir: Path) -> None:
    from amqtt.client import MQTTClient

    async with running_gateway(data_dir) as gw:
        url = f"mqtt://127.0.0.1:{mqtt_port(gw)}/"
        sub = MQTTClient(client_id="amqtt-sub")
        pub = MQTTClient(client_id="amqtt-pub")
        await sub.connect(url)
        await pub.connect(url)
        await sub.subscribe([("amqtt/#", 1)])
        for i in range(5):
            await pub.publish(f"amqtt/{i}", f"v{i}".encode(), qos=1)
        got = []
        for _ in range(5):
            message = await asyncio.wait_for(sub.deliver_message(), 5)
            got.append((message.topic, bytes(message.data)))
        assert got == [(f"amqtt/{i}", f"v{i}".encode()) for i in range(5)]
        await pub.disconnect()
        await sub.disconnect()


async def test_v311_subscriber_gets_v5_messages_without_properties(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub, _ = await RawClient.connected(port, Connect("old", MQTT_3_1_1))
        sub.send(Subscribe(1, [Subscription("mix/#", 1)]))
        await sub.recv()
        pub, _ = await RawClient.connected(port, Connect("new", MQTT_5))
        pub.send(Publish("mix/1", b"v", 1, packet_id=1, properties=Properties(user_properties=[("a", "b")])))
        got = await sub.recv()
        assert (got.topic, got.payload, got.qos) == ("mix/1", b"v", 1)
        await sub.close()
        await pub.close()


async def test_connack_limits_and_response_information(data_dir: Path) -> None:
    async with running_gateway(data_dir, mqtt_max_keepalive=30) as gw:
        client, ack = await RawClient.connected(mqtt_port(gw), Connect(
            "asker", MQTT_5, keep_alive=600, properties=Properties(request_response_information=1)))
        p = ack.properties
        assert p.response_information == "response/asker"
        assert p.server_keep_alive == 30  # capped
        assert (p.receive_maximum, p.maximum_packet_size) == (1024, 16 << 20)
        await client.close()


async def test_retained_message_expires(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_5))
        pub.send(Publish("ret/short", b"old", 1, retain=True, packet_id=1,
                         properties=Properties(message_expiry_interval=1)))
        pub.send(Publish("ret/long", b"kept", 1, retain=True, packet_id=2,
                         properties=Properties(message_expiry_interval=60)))
        await pub.recv()
        await pub.recv()
        await asyncio.sleep(1.2)
        sub = await subscribed(port, "sub", "ret/#")
        got = await sub.recv()
        assert (got.topic, got.payload, got.retain) == ("ret/long", b"kept", True)
        assert 55 <= got.properties.message_expiry_interval <= 59
        try:
            extra = await sub.recv(timeout=0.3)
        except TimeoutError:
            extra = None
        assert extra is None and "ret/short" not in gw.mqtt.retained
        await sub.close()
        await pub.close()
