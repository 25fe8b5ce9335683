"""Gateway nodes with a lookup: the embedded one (partitioned over the nodes, on their own
listeners) and Redis (a real redis-server started by the test). A takeover goes to the node
the lookup names; `tidemq ctl clients --id` says where a client is; with Redis stopped mid-run,
delivery goes on (notify broadcast, takeovers asked everywhere), counted in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.http import admin
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5

from .crash_support import free_port
from .mqtt_support import PahoClient, mqtt_port
from .test_ctl import ctl
from .test_lookup_redis import RedisServer
from .test_metrics import fetch, samples, value
from .test_store_link import remoting_port

BEAT = 0.1  # lookup heartbeat: settles in 0.25 s


@asynccontextmanager
async def cluster(data_dir: Path, store_extra: dict[str, Any], node_extra: list[dict[str, Any]]
                  ) -> AsyncIterator[tuple[Gateway, list[Gateway]]]:
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                           metrics_bind="127.0.0.1:0", lookup_heartbeat_s=BEAT, **store_extra))
    await store.start()
    nodes: list[Gateway] = []
    try:
        for i, extra in enumerate(node_extra):
            node = Gateway(Config(data_dir=data_dir / f"g{i}", role="gateway", node_id=f"g{i}", mqtt_bind="127.0.0.1:0",
                                  amqp_bind="", remoting_bind="", metrics_bind="127.0.0.1:0",
                                  store_address=f"127.0.0.1:{remoting_port(store)}", lookup_heartbeat_s=BEAT, **extra))
            await node.start()
            nodes.append(node)
        yield store, nodes
    finally:
        for node in nodes:
            await node.stop()
        await store.stop()


async def located(node: Gateway, client_id: str, expected: str, timeout_s: float = 5.0) -> None:
    """Wait until ``node`` locates ``client_id`` at ``expected`` (the lookup settles)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        [row] = await admin.locate_client(node.mqtt, node.node, client_id)
        if row["node"] == expected:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{client_id} located at {row['node']}, not {expected}"
        await asyncio.sleep(0.05)


async def test_embedded_lookup_sends_a_takeover_only_to_the_node_that_has_the_client(data_dir: Path) -> None:
    ports = [free_port(), free_port()]
    peers = ",".join(f"g{i}=127.0.0.1:{port}" for i, port in enumerate(ports))
    extra = [{"peers": peers, "lookup_bind": f"127.0.0.1:{port}"} for port in ports]
    async with cluster(data_dir, {}, extra) as (_, (a, b)):
        first = PahoClient(mqtt_port(a), "roamer", version=MQTT_5, clean=False, session_expiry=60)
        await first.connect()
        await located(b, "roamer", "g0")  # b asks the lookup, a registered it
        url = "http://{}:{}".format(*b.metrics_address)
        code, out, _ = await ctl(url, "clients", "--id", "roamer", token="")
        assert code == 0 and out.split("\n")[1].split()[:3] == ["mqtt", "roamer", "g0"]
        first.client.reconnect_delay_set(min_delay=60, max_delay=120)
        second = PahoClient(mqtt_port(b), "roamer", version=MQTT_5, clean=False, session_expiry=60)
        flags, _, _ = await second.connect()
        assert flags.session_present
        assert await asyncio.to_thread(first.disconnects.get, True, 5) == 0x8E
        assert b.node.takeovers == {"targeted": 1}  # to g0 alone, not to every node
        await located(a, "roamer", "g1")
        await second.disconnect()
        await located(a, "roamer", "offline")


async def test_redis_lookup_stopped_mid_run_delivery_goes_on(data_dir: Path, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    await redis.start()
    try:
        with_redis = {"lookup_backend": "redis", "redis_url": redis.url}
        async with cluster(data_dir, with_redis, [with_redis, with_redis]) as (store, (a, b)):
            reader = PahoClient(mqtt_port(b), "reader", clean=False)
            await reader.connect()
            await reader.subscribe("meter/+", 1)
            publisher = PahoClient(mqtt_port(a), "meter")
            await publisher.connect()
            await located(a, "reader", "g1")
            sent = 0
            for _ in range(5):
                await publisher.publish(f"meter/{sent}", str(sent), 1)
                sent += 1
            assert len(await reader.receive(5)) == 5
            router = store.store_service.router.stats
            await redis.stop()  # Redis goes away mid-run
            for _ in range(15):  # over more than the router's 1 s refresh of its answers
                await publisher.publish(f"meter/{sent}", str(sent), 1)
                sent += 1
                await asyncio.sleep(0.1)
            got = [int(r.payload) for r in await reader.receive(15)]
            assert sorted(got) == list(range(5, 20))  # nothing lost, nothing held back
            assert router.fallbacks["lookup in doubt"] >= 1 and router.broadcast >= 1
            metrics = samples((await fetch("http://{}:{}".format(*store.metrics_address), "/metrics"))[1])
            assert value(metrics, "tidemq_notify_events_routed_total", how="broadcast") >= 1
            # a takeover with the lookup down: asked of every node
            reader.client.reconnect_delay_set(min_delay=60, max_delay=120)
            moved = PahoClient(mqtt_port(a), "reader", clean=False)
            flags, _, _ = await moved.connect()
            assert flags.session_present and a.node.takeovers["everywhere"] >= 1
            assert await asyncio.to_thread(reader.disconnects.get, True, 5) is not None
            await publisher.publish("meter/x", "20", 1)
            assert [r.payload for r in await moved.receive(1)] == [b"20"]
            await moved.disconnect()
            await publisher.disconnect()
    finally:
        await redis.stop()


async def test_a_takeover_on_the_same_node_leaves_the_client_online_there(data_dir: Path) -> None:
    """The old connection's "offline" reaches the lookup before the new one's "online" (the
    other way round, the lookup forgot a connected client, and a connection on another node
    then took nothing over: two live connections for one client id)."""
    ports = [free_port(), free_port()]
    peers = ",".join(f"g{i}=127.0.0.1:{port}" for i, port in enumerate(ports))
    extra = [{"peers": peers, "lookup_bind": f"127.0.0.1:{port}"} for port in ports]
    async with cluster(data_dir, {}, extra) as (_, (a, b)):
        for client_id in ("twin-0", "twin-1", "twin-2", "twin-3"):  # owned by either node's part of the lookup
            first = PahoClient(mqtt_port(a), client_id, version=MQTT_5, clean=False, session_expiry=60)
            await first.connect()
            await located(b, client_id, "g0")
            first.client.reconnect_delay_set(min_delay=60, max_delay=120)
            second = PahoClient(mqtt_port(a), client_id, version=MQTT_5, clean=False, session_expiry=60)
            flags, _, _ = await second.connect()  # on the same node
            assert flags.session_present
            assert await asyncio.to_thread(first.disconnects.get, True, 5) == 0x8E
            await asyncio.to_thread(first.client.loop_stop)
            await asyncio.sleep(0.3)  # (the lookup settles)
            await located(b, client_id, "g0")
            second.client.reconnect_delay_set(min_delay=60, max_delay=120)
            third = PahoClient(mqtt_port(b), client_id, version=MQTT_5, clean=False, session_expiry=60)
            await third.connect()
            assert await asyncio.to_thread(second.disconnects.get, True, 5) == 0x8E
            await asyncio.to_thread(second.client.loop_stop)
            await third.disconnect()


async def test_embedded_lookup_holds_the_online_clients_and_nothing_unread(data_dir: Path) -> None:
    """With the embedded lookup the store node routes notify events by the gateway nodes'
    reading hints alone (it reads no lookup), so subscribing writes nothing to the lookup:
    it holds one entry per online client. Delivery across the nodes goes on all the same."""
    ports = [free_port(), free_port()]
    peers = ",".join(f"g{i}=127.0.0.1:{port}" for i, port in enumerate(ports))
    extra = [{"peers": peers, "lookup_bind": f"127.0.0.1:{port}"} for port in ports]
    async with cluster(data_dir, {}, extra) as (store, (a, b)):
        reader = PahoClient(mqtt_port(a), "reader")
        await reader.connect()
        await reader.subscribe("meter/+", 1)
        await reader.subscribe("alerts", 1)
        publisher = PahoClient(mqtt_port(b), "meter")
        await publisher.connect()
        for i in range(3):
            await publisher.publish(f"meter/{i}", str(i), 1)
        await publisher.publish("alerts", "3", 1)
        assert sorted(int(r.payload) for r in await reader.receive(4)) == [0, 1, 2, 3]
        await located(a, "meter", "g1")
        await located(b, "reader", "g0")
        assert store.store_lookup is None  # the store node reads no lookup
        entries = sum(len(node.node.lookup._table) for node in (a, b))  # type: ignore[union-attr]
        assert entries == 2  # "reader" and "meter", wherever their owners are
        await reader.disconnect()
        await publisher.disconnect()
