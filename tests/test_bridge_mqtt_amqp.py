"""MQTT <-> AMQP through amq.topic (RabbitMQ's convention): one stored message, both protocols."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika

from protocols.mqtt.packets import MQTT_5, Connect, Publish, Subscribe, Subscription

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


def amqp_url(gw) -> str:
    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
    return f"amqp://guest:guest@127.0.0.1:{port}/"


async def test_mqtt_publish_reaches_amqp_queue_bound_to_amq_topic(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        conn = await aio_pika.connect(amqp_url(gw))
        ch = await conn.channel()
        queue = await ch.declare_queue("telemetry")
        await queue.bind("amq.topic", "sensors.*.temp")
        pub = PahoClient(mqtt_port(gw), "device")
        await pub.connect()
        await pub.publish("sensors/r1/temp", "21.5", 1)
        await pub.publish("sensors/r1/hum", "40", 1)  # not matched by the binding
        message = None
        for _ in range(50):
            message = await queue.get(fail=False)
            if message is not None:
                break
            await asyncio.sleep(0.05)
        assert message is not None
        assert (message.body, message.routing_key, message.exchange) == (b"21.5", "sensors.r1.temp", "amq.topic")
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT  # QoS 1
        await message.ack()
        assert await queue.get(fail=False) is None
        # one stored record, indexed into the MQTT topic queue and the AMQP queue
        stored = gw.store.get_now("t:sensors/r1/temp", 0, 10).messages
        assert [m.queues for m in stored] == [[("t:sensors/r1/temp", 0), ("q:telemetry", 0)]]
        await pub.disconnect()
        await conn.close()


async def test_amqp_publish_to_amq_topic_reaches_mqtt_subscribers(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        sub, _ = await RawClient.connected(mqtt_port(gw), Connect("app", MQTT_5))
        sub.send(Subscribe(1, [Subscription("cmd/+/reboot", 1)]))
        await sub.recv()
        conn = await aio_pika.connect(amqp_url(gw))
        ch = await conn.channel(publisher_confirms=True)
        exchange = await ch.get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(b"now"), "cmd.dev7.reboot")
        await exchange.publish(aio_pika.Message(b"other"), "cmd.dev7.update")
        got = await sub.recv()
        assert isinstance(got, Publish) and (got.topic, got.payload) == ("cmd/dev7/reboot", b"now")
        try:
            extra = await sub.recv(timeout=0.3)
        except TimeoutError:
            extra = None
        assert extra is None
        await sub.close()
        await conn.close()


async def test_a_wildcard_binding_gets_no_dollar_topics_as_no_mqtt_filter_starting_with_one_does(
        data_dir: Path, tmp_path: Path) -> None:
    """'#' over amq.topic is judged by the ACL as the MQTT filter '#', which matches no '$' topic
    (MQTT 4.7.2): a user allowed 'topic read #' and refused '$SYS/...' over MQTT must not read
    the broker's '$SYS' messages (presence events: client ids, addresses) through a '#' binding.
    A binding whose first word is '$SYS' names them, and is judged by its own filter."""
    acl = tmp_path / "acl.conf"
    acl.write_text("topic write plant/#\nuser reader\ntopic read #\ntopic read $SYS/brokers/#\n"
                   'amqp ".*" ".*" ".*"\n')
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", acl_file=acl, node_id="n1") as gw:
        conn = await aio_pika.connect(amqp_url(gw).replace("guest:guest", "reader:x"))
        ch = await conn.channel()
        everything = await ch.declare_queue("everything")
        await everything.bind("amq.topic", "#")
        system = await ch.declare_queue("system")
        await system.bind("amq.topic", "$SYS.brokers.#")
        device = PahoClient(mqtt_port(gw), "dev1")
        await device.connect()
        await device.publish("plant/1/temp", "20", 1)
        await device.disconnect()
        keys: list[str] = []
        for _ in range(100):
            message = await system.get(fail=False)
            if message is not None:
                keys.append(message.routing_key)
                if message.routing_key.endswith(".disconnected"):
                    break
            else:
                await asyncio.sleep(0.05)
        assert keys == ["$SYS.brokers.n1.clients.dev1.connected", "$SYS.brokers.n1.clients.dev1.disconnected"]
        got = []
        while (message := await everything.get(fail=False)) is not None:
            got.append(message.routing_key)
        assert got == ["plant.1.temp"]
        await conn.close()
