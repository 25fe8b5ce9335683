"""What connection.start tells RabbitMQ clients (read through aio-pika and py-amqp): TideMQ's
product, version and platform, the node as cluster_name, and capabilities true only for what is
built."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aio_pika
import amqp

from gateway import __version__

from .amqp_support import port_of
from .test_amqp import amqp_gateway

CAPABILITIES = {
    "publisher_confirms": True, "exchange_exchange_bindings": True, "basic.nack": True,
    "consumer_cancel_notify": True, "connection.blocked": True, "authentication_failure_close": True,
    "per_consumer_qos": True, "consumer_priorities": True, "direct_reply_to": True,
}


async def test_server_properties_say_what_is_built(data_dir: Path) -> None:
    async with amqp_gateway(data_dir, node_id="node-7") as (_, url):
        conn = await aio_pika.connect(url)
        properties = conn.transport.connection.server_properties
        await conn.close()

        def py_amqp() -> dict:
            client = amqp.Connection(f"127.0.0.1:{port_of(url)}", userid="guest", password="guest")
            client.connect()
            try:
                return client.server_properties
            finally:
                client.close()

        assert await asyncio.to_thread(py_amqp) == properties
    assert properties["product"] == "TideMQ"
    assert properties["version"] == __version__ and re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert re.fullmatch(r"Python \d+\.\d+\.\d+", properties["platform"])
    assert properties["cluster_name"] == "node-7"
    assert properties["copyright"] and properties["information"]
    assert properties["capabilities"] == CAPABILITIES
