"""A cluster of real processes on 127.0.0.1: one store node (``--role store``) and three gateway
nodes (``--role gateway``, with the embedded lookup over them). Clients on different nodes
exchange messages at every QoS; a session moves between nodes and is taken over; a gateway node is
killed with ``kill -9`` while clients publish, its clients reconnect to the others, and no
acknowledged QoS 1 message is lost -- neither for a subscriber on a surviving node nor for one
whose node died."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from .crash_support import free_port, kill9, launch, stop
from .mqtt_support import PahoClient, receive_numbers


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    port: int  # MQTT (gateway nodes) or remoting (the store node)

    def kill(self) -> None:
        kill9(self.proc)

    def stop(self) -> None:
        stop(self.proc)


def start(name: str, args: list[str], port: int) -> Node:
    return Node(name, launch(args, name=name), port)


@contextmanager
def cluster(tmp_path: Path, gateways: int = 3) -> Iterator[tuple[Node, list[Node]]]:
    store_port = free_port()
    store = start("store", ["--role", "store", "--data-dir", str(tmp_path / "store"), "--remoting-bind",
                            f"127.0.0.1:{store_port}", "--amqp-bind", ""], store_port)
    nodes: list[Node] = []
    lookup_ports = [free_port() for _ in range(gateways)]  # the embedded lookup, over the nodes
    peers = ",".join(f"g{i}=127.0.0.1:{port}" for i, port in enumerate(lookup_ports))
    try:
        for i in range(gateways):
            port = free_port()
            nodes.append(start(f"g{i}", ["--role", "gateway", "--node-id", f"g{i}", "--store",
                                         f"127.0.0.1:{store_port}", "--mqtt-bind", f"127.0.0.1:{port}",
                                         "--data-dir", str(tmp_path / f"g{i}"), "--peers", peers,
                                         "--lookup-bind", f"127.0.0.1:{lookup_ports[i]}"], port))
        yield store, nodes
    finally:
        for node in nodes:
            node.stop()
        store.stop()


@pytest.mark.slow
async def test_kill_9_of_a_gateway_node_loses_no_acknowledged_qos1_message(tmp_path: Path) -> None:
    with cluster(tmp_path) as (_, (g0, g1, g2)):
        survivor = PahoClient(g1.port, "watcher", clean=False)  # on a node that lives
        await survivor.connect()
        await survivor.subscribe("line/#", 1)
        orphan = PahoClient(g0.port, "orphan", clean=False)  # on the node that dies
        await orphan.connect()
        await orphan.subscribe("line/+/count", 1)

        acked: list[int] = []  # mids; list.append is atomic
        publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="counter")
        publisher.max_inflight_messages_set(64)
        publisher.on_publish = lambda client, userdata, mid, reason_code, properties: acked.append(mid)
        publisher.connect("127.0.0.1", g0.port)
        publisher.loop_start()
        sent: dict[int, int] = {}
        for i in range(1500):
            sent[publisher.publish(f"line/{i % 5}/count", str(i), 1).mid] = i
            if i % 100 == 0:
                await asyncio.sleep(0.01)
        g0.kill()  # mid-load: publishes in flight, the orphan's acks partly unsaved
        await asyncio.to_thread(publisher.loop_stop)
        acknowledged = {sent[mid] for mid in list(acked)}
        assert 100 < len(acknowledged), "the kill came too early to prove anything"
        await asyncio.to_thread(orphan.client.loop_stop)  # its node is gone
        before = await receive_numbers(orphan, set(range(1500)), timeout_s=1.0)  # what it got before the kill
        assert before and len(before) < 1500, "the orphan should have been mid-stream"

        # the publisher sends what was not acknowledged again, through another node
        again = PahoClient(g2.port, "counter")
        await again.connect()
        for i in sorted(set(range(1500)) - acknowledged):
            await again.publish(f"line/{i % 5}/count", str(i), 1)
        everything = set(range(1500))

        got = await receive_numbers(survivor, everything)
        assert not everything - got, f"{len(everything - got)} lost on a surviving node, e.g. {sorted(everything - got)[:10]}"
        back = PahoClient(g2.port, "orphan", clean=False)  # the dead node's subscriber, elsewhere
        flags, _, _ = await back.connect()
        assert flags.session_present
        got = await receive_numbers(back, everything - before)
        missing = everything - before - got
        assert not missing, f"{len(missing)} lost for the dead node's subscriber, e.g. {sorted(missing)[:10]}"
        for client in (survivor, back, again):
            await client.disconnect()


async def test_processes_exchange_messages_and_a_session_moves(tmp_path: Path) -> None:
    with cluster(tmp_path) as (_, (g0, g1, g2)):
        subscriber = PahoClient(g0.port, "mover", clean=False)
        await subscriber.connect()
        await subscriber.subscribe("a/+", 2)
        publisher = PahoClient(g1.port, "pub")
        await publisher.connect()
        for qos in (0, 1, 2):
            await publisher.publish("a/b", f"{qos}", qos)
        assert sorted(r.payload for r in await subscriber.receive(3)) == [b"0", b"1", b"2"]
        await subscriber.disconnect()
        await publisher.publish("a/c", "while away", 1)
        moved = PahoClient(g2.port, "mover", clean=False)
        flags, _, _ = await moved.connect()
        assert flags.session_present
        assert [r.payload for r in await moved.receive(1)] == [b"while away"]
        # the same client id on another node while connected here: this connection is taken over
        moved.client.reconnect_delay_set(min_delay=60, max_delay=120)
        again = PahoClient(g0.port, "mover", clean=False)
        flags, _, _ = await again.connect()
        assert flags.session_present
        assert await asyncio.to_thread(moved.disconnects.get, True, 10) is not None
        await publisher.publish("a/d", "after takeover", 1)
        assert [r.payload for r in await again.receive(1)] == [b"after takeover"]
        await again.nothing_more()
        await again.disconnect()
        await publisher.disconnect()
