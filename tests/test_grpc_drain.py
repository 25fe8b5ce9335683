"""Graceful drain of the gRPC listener: a gateway that stops while the official client's
SimpleConsumer long-polls answers that receive at once, empty (no error on the client), and
loses nothing: what was acknowledged stays gone, what was out and not acked comes back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression

from gateway.config import Config
from gateway.server import Gateway
from tests.grpc_support import grpc_gateway, grpc_port, official_producer, official_simple_consumer
from tests.remoting_support import TEST_DELAY_LEVELS
from tests.test_grpc import normal_message


async def test_a_long_poll_ends_empty_on_shutdown_and_nothing_acknowledged_is_lost(data_dir: Path) -> None:
    gw = Gateway(Config(data_dir=data_dir, remoting_bind="127.0.0.1:0", grpc_bind="127.0.0.1:0", mqtt_bind="",
                        amqp_bind="", remoting_delay_levels=TEST_DELAY_LEVELS))
    await gw.start()
    assert gw.remoting is not None
    endpoint = f"127.0.0.1:{grpc_port(gw)}"
    async with official_producer(endpoint, "Draining") as producer:
        for body in (b"acked", b"out"):
            await asyncio.to_thread(producer.send, normal_message("Draining", body))
    # (a client whose calls would still run after the gateway stops: it is shut down by hand)
    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), "GID-drain",
                              {"Draining": FilterExpression("*")}, await_duration=20)
    await asyncio.to_thread(consumer.startup)
    try:
        got = []
        while len(got) < 2:
            got.extend(await asyncio.to_thread(consumer.receive, 2, 1))
        [acked] = [m for m in got if m.body == b"acked"]
        await asyncio.to_thread(consumer.ack, acked)  # ("out" stays unacknowledged)
        polling = asyncio.ensure_future(asyncio.to_thread(consumer.receive, 2, 30))  # (long-polls 20 s)
        while gw.remoting.pop_waiters.held() == 0:
            await asyncio.sleep(0.02)
        await gw.stop()
        assert await polling == []  # a clean end (MESSAGE_NOT_FOUND) within the grace period, no error
    finally:
        await asyncio.to_thread(consumer.shutdown)

    async with grpc_gateway(data_dir) as (_, endpoint, _):
        async with official_simple_consumer(endpoint, "GID-drain", "Draining", await_s=2) as again:
            back: list = []
            for _ in range(10):
                if back:
                    break
                back = await asyncio.to_thread(again.receive, 4, 30)
            assert [m.body for m in back] == [b"out"]  # (acked stays acked; "out" came back)
            await asyncio.to_thread(again.ack, back[0])
