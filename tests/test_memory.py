"""Memory the message path keeps: messages freed as soon as they are delivered (no reference
cycles left for the cyclic GC, which the gateway runs rarely), and RocksDB's memory bounded by
the configured budget. No timing and no process-size assertions: object graphs and options."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import aio_pika

from gateway.mqtt.messages import Delivery
from store import StoredMessage
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

MESSAGES = 300


def cyclic_garbage(*kinds: type) -> list[object]:
    """Objects of ``kinds`` that only the cyclic GC would free (unreachable, in a cycle)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, kinds)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_delivered_messages_leave_no_cyclic_garbage(data_dir: Path) -> None:
    """One MQTT publish stream read by an MQTT QoS 1 subscriber and an AMQP consumer bound to
    amq.topic: once delivered and acknowledged, no StoredMessage (nor the MQTT Delivery made
    from it) is left in a reference cycle. Each one that was (a message and its Delivery
    pointing at each other) lived until a full collection: at the gateway's GC thresholds,
    hundreds of MiB under a steady load (issue 23.5)."""
    # a queue cache of a few messages: delivered messages leave it at once
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", queue_cache_bytes=4096) as gw:
        amqp_port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        sub = PahoClient(mqtt_port(gw), "mem-sub")
        pub = PahoClient(mqtt_port(gw), "mem-pub")
        gc.collect()
        gc.disable()
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue("mem-amqp", durable=True)
            await queue.bind("amq.topic", "mem.#")
            await sub.connect()
            await sub.subscribe("mem/#", qos=1)
            await pub.connect()
            for i in range(MESSAGES):
                await pub.publish(f"mem/{i % 3}", b"x" * 64, qos=1)
            assert len(await sub.receive(MESSAGES)) == MESSAGES
            got = 0
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    got += 1
                    if got == MESSAGES:
                        break
            await asyncio.sleep(0.5)  # the last PUBACKs and basic.acks reach the gateway
            leaked = cyclic_garbage(StoredMessage, Delivery)
            assert not leaked, f"{len(leaked)} messages in reference cycles, e.g. {leaked[0]!r:.300}"
        finally:
            gc.enable()
            await sub.disconnect()
            await pub.disconnect()
            await connection.close()

