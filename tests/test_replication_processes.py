"""A replicated store group of three real store node processes with a real etcd, all on
127.0.0.1: one is elected leader and serves AMQP; confirmed messages and the queue they were
declared on survive ``kill -9`` of the leader, on the follower elected in its place."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.v5.exception import InternalErrorException

from protocols.remoting.codes import RequestCode, ResponseCode

from .browser_support import Page, browser  # noqa: F401 (browser: a fixture)
from .crash_support import free_port, kill9, launch, stop
from .etcd_support import EtcdServer, etcd  # noqa: F401 (the fixture)
from .grpc_support import official_producer, official_simple_consumer, raw_receive_and_ack, raw_stub
from .mqtt_support import PahoClient, receive_numbers
from .pop_support import PopClient
from .remoting_support import OnsProcess, RawRemoting, ons, pull_header
from .test_cluster_remoting import send_header
from .test_grpc import normal_message, receive_all
from .test_metrics import fetch, samples, value

GROUP = "g1"


@dataclass
class StoreNode:
    name: str
    amqp_port: int
    metrics_port: int
    proc: subprocess.Popen
    remoting_port: int = 0
    grpc_port: int = 0


def start_group(tmp_path: Path, etcd_endpoint: str, names=("s1", "s2", "s3"),
                env: dict[str, str] | None = None) -> dict[str, StoreNode]:
    return {name: start_store_node(tmp_path, etcd_endpoint, name, env) for name in names}


def start_store_node(tmp_path: Path, etcd_endpoint: str, name: str, env: dict[str, str] | None = None) -> StoreNode:
    amqp, metrics, remoting, grpc = free_port(), free_port(), free_port(), free_port()
    args = ["--role", "store", "--node-id", name, "--replication-group", GROUP, "--etcd", etcd_endpoint,
            "--replication-bind", f"127.0.0.1:{free_port()}", "--remoting-bind", f"127.0.0.1:{remoting}",
            "--grpc-bind", f"127.0.0.1:{grpc}",
            "--amqp-bind", f"127.0.0.1:{amqp}", "--metrics-bind", f"127.0.0.1:{metrics}",
            "--data-dir", str(tmp_path / name)]
    return StoreNode(name, amqp, metrics, launch(args, name=name, ready="joined its replication group", env=env,
                                                 log=tmp_path / f"{name}.log"), remoting, grpc)


def start_group_with_grpc_gateway(tmp_path: Path, etcd: EtcdServer
                                  ) -> tuple[dict[str, StoreNode], str, subprocess.Popen]:
    """The group, and a gateway node serving gRPC at the endpoint returned."""
    nodes = start_group(tmp_path, etcd.endpoint)
    endpoint = f"127.0.0.1:{free_port()}"
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--grpc-bind", endpoint, "--data-dir", str(tmp_path / "gw1")], name="gw1")
    return nodes, endpoint, gateway


async def wait_in_sync(etcd: EtcdServer, members: set[str], timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await etcd.state(GROUP)
        if state is not None and members <= set(state["in_sync"]):
            return state
        assert time.monotonic() < deadline, f"not in sync: {members - set((state or {}).get('in_sync', []))}"
        await asyncio.sleep(0.1)


async def wait_leader(etcd: EtcdServer, *, not_node: str | None = None, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = await etcd.leader(GROUP)
        if leader is not None and leader["node"] != not_node:
            return leader
        await asyncio.sleep(0.05)
    raise AssertionError("no leader was elected")


async def connect(port: int, timeout_s: float = 20.0) -> aio_pika.abc.AbstractRobustConnection:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        except (OSError, aio_pika.exceptions.AMQPConnectionError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_confirmed_messages_and_their_queue_survive_kill9_of_the_leader(tmp_path: Path, etcd) -> None:
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        first = nodes[leader["node"]]
        connection = await connect(first.amqp_port)
        channel = await connection.channel()  # publisher confirms on
        queue = await channel.declare_queue("orders", durable=True)
        deadline = time.monotonic() + 20
        while True:  # writes are refused until a follower is in sync (min_insync_replicas 2)
            try:
                await channel.default_exchange.publish(aio_pika.Message(b"probe"), routing_key="warmup")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                if channel.is_closed:
                    channel = await connection.channel()
        bodies = [b"order-%d" % i for i in range(200)]
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue.name)
        kill9(first.proc)
        killed_at = time.monotonic()
        await connection.close()

        successor = await wait_leader(etcd, not_node=first.name)
        assert successor["epoch"] > leader["epoch"]
        second = nodes[successor["node"]]
        connection = await connect(second.amqp_port)
        channel = await connection.channel()
        again = await channel.declare_queue("orders", durable=True, passive=True)  # the declaration survived
        # refused (nack) until a follower is in sync with the new leader; then what the new leader
        # received and had not heard confirmed is confirmed too, and shown before "after"
        await publish_confirmed(channel, [b"after"])
        print(f"first confirmed publish on the new leader {time.monotonic() - killed_at:.2f} s after kill -9")
        got = []
        while True:
            message = await again.get(no_ack=False, fail=False, timeout=5)
            if message is None:
                break
            got.append(message.body)
            await message.ack()
        assert got == bodies + [b"after"]
        await connection.close()
    finally:
        for node in nodes.values():
            stop(node.proc)




async def publish_until_acknowledged(port: int, client_id: str, numbers: list[int], timeout_s: float = 30.0) -> None:
    """QoS 1, each until its PUBACK: reconnecting through the gateway node while the store fails over."""
    deadline = time.monotonic() + timeout_s
    client: PahoClient | None = None
    pending = list(numbers)
    while pending:
        try:
            if client is None:
                client = PahoClient(port, client_id)
                await client.connect()
            await client.publish("line/1", str(pending[0]), 1)
            pending.pop(0)
        except (AssertionError, OSError, TimeoutError, ValueError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            if client is not None:
                client.client.loop_stop()
                client = None
            await asyncio.sleep(0.1)
    if client is not None:
        await client.disconnect()


async def test_mqtt_clients_of_a_gateway_node_stay_connected_and_lose_nothing_when_the_store_leader_dies(
        tmp_path: Path, etcd) -> None:
    """kill -9 of the store leader under a gateway node's MQTT clients: the node links to the new
    leader and keeps them (a slower PUBACK, not a disconnect); every acknowledged publish reaches
    the persistent session and the clean session's wildcard subscription (its filter, held for
    the node's link only, is held again on the new one)."""
    nodes = start_group(tmp_path, etcd.endpoint)
    mqtt_port = free_port()
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--mqtt-bind", f"127.0.0.1:{mqtt_port}", "--data-dir", str(tmp_path / "gw1")], name="gw1")
    try:
        subscriber = PahoClient(mqtt_port, "watcher", clean=False)
        await subscriber.connect()
        await subscriber.subscribe("line/#", 1)
        clean = PahoClient(mqtt_port, "clean-watcher")
        await clean.connect()
        await clean.subscribe("line/+", 1)
        await publish_until_acknowledged(mqtt_port, "counter", list(range(100)))  # (refused until a follower is in sync)
        publisher = PahoClient(mqtt_port, "steady")
        await publisher.connect()
        leader = await wait_leader(etcd)
        kill9(nodes[leader["node"]].proc)
        killed_at = time.monotonic()
        for n in range(100, 200):  # one connection throughout: each publish acknowledged before the next
            info = publisher.client.publish("line/1", str(n), 1)
            await asyncio.to_thread(info.wait_for_publish, 30)
            assert info.is_published(), f"publish {n} not acknowledged"
            if n == 100:
                print(f"first publish after kill -9 acknowledged in {time.monotonic() - killed_at:.2f} s")
        for client in (subscriber, clean, publisher):
            assert client.disconnects.empty(), f"{client.client._client_id!r} was disconnected"
        wanted = set(range(200))
        for client in (subscriber, clean):
            missing = wanted - await receive_numbers(client, wanted)
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:10]}"
        await publisher.disconnect()
        await subscriber.disconnect()
        await clean.disconnect()
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_amqp_clients_of_a_gateway_node_stay_connected_and_lose_nothing_when_the_store_leader_dies(
        tmp_path: Path, etcd) -> None:
    """kill -9 of the store leader under a gateway node's AMQP clients (relayed to it): the relay
    opens each connection again on the new leader (channels, prefetch, confirm mode, consumers)
    and publishes again what was not confirmed; the client keeps its connection, every
    confirmed message reaches the consumer, and its acks of new deliveries settle them."""
    nodes = start_group(tmp_path, etcd.endpoint)
    amqp_port = free_port()
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--amqp-bind", f"127.0.0.1:{amqp_port}", "--data-dir", str(tmp_path / "gw1")], name="gw1")
    try:
        connection = await connect(amqp_port)
        closed: list[object] = []
        connection.close_callbacks.add(lambda *args: closed.append(args))
        publishing = await connection.channel(publisher_confirms=True)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=20)
        queue = await consuming.declare_queue("orders", durable=True)
        received: list[tuple[bytes, bool]] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received.append((message.body, message.redelivered))
            await message.ack()

        await queue.consume(on_message)
        await publish_confirmed(publishing, [b"%d" % n for n in range(100)], timeout_s=30)
        leader = await wait_leader(etcd)
        kill9(nodes[leader["node"]].proc)
        killed_at = time.monotonic()
        for n in range(100, 200):  # one connection throughout: each publish confirmed before the next
            await publishing.default_exchange.publish(
                aio_pika.Message(b"%d" % n, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="orders",
                timeout=30)
            if n == 100:
                print(f"first AMQP publish after kill -9 confirmed in {time.monotonic() - killed_at:.2f} s")
        wanted = {b"%d" % n for n in range(200)}
        deadline = time.monotonic() + 30
        while not wanted <= {body for body, _ in received}:
            assert time.monotonic() < deadline, f"lost: {sorted(wanted - {body for body, _ in received})[:10]}"
            await asyncio.sleep(0.1)
        assert not closed and not connection.is_closed, f"the relayed connection was closed: {closed}"
        first_times = [body for body, redelivered in received if not redelivered]
        assert len(first_times) == len(set(first_times)), "a message came twice, not flagged redelivered"
        count = len(received)
        await asyncio.sleep(1.0)  # what the new leader delivered was settled by the acks: nothing comes again
        assert len(received) == count
        await connection.close()
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_rocketmq_clients_of_a_gateway_node_lose_nothing_when_the_store_leader_dies(
        tmp_path: Path, etcd) -> None:
    """kill -9 of the store leader while ali-ons sends through a gateway node, the only address
    the clients know: every message answered SEND_OK is consumed through the gateway node, by a
    push consumer running across the kill and by a new group afterwards; the route names the
    gateway node throughout, and a client connection opened before the kill still answers after
    it. Requests held by the leader when it dies: a pull (a read) is sent again to the new
    leader and answered there, a pop (a change) is answered SERVICE_NOT_AVAILABLE."""
    nodes = start_group(tmp_path, etcd.endpoint)
    remoting, metrics = f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--remoting-bind", remoting, "--metrics-bind", metrics.removeprefix("http://"),
                      "--data-dir", str(tmp_path / "gw1")], name="gw1")
    across: OnsProcess | None = None
    reading: asyncio.Future[None] | None = None
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        raw = await RawRemoting.open(remoting)
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "relayed-crash"})).code == \
            ResponseCode.SUCCESS
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "relayed-idle"})).code == \
            ResponseCode.SUCCESS  # (created: a pull of it is held)
        puller = await RawRemoting.open(remoting)
        puller.send(RequestCode.PULL_MESSAGE, pull_header("relayed-idle", 0, suspend_ms=5000))
        popper = await PopClient.open(remoting, "relayed-pop")
        popping = asyncio.ensure_future(popper.request_pop("relayed-idle", 0, 1, poll_ms=5000))
        across = await OnsProcess.start({"cmd": "consume", "nameSrv": remoting, "group": "relayed-across",
                                         "topic": "relayed-crash", "count": 100_000, "timeoutMs": 60000,
                                         "fromFirst": True})
        await across.until("ready")
        seen: set[str] = set()

        async def read_across() -> None:  # (read as it comes: a full pipe would stop the consumer)
            while True:
                event = await across.next_event(timeout=120)
                if event["event"] == "message":
                    seen.add(event["body"])
        reading = asyncio.ensure_future(read_across())
        producer = await OnsProcess.start({"cmd": "send", "nameSrv": remoting, "topic": "relayed-crash",
                                           "reportErrors": True, "intervalMs": 20, "timeoutMs": 60000,
                                           "messages": [{"body": f"m{i}"} for i in range(400)]})
        try:
            for _ in range(50):
                assert (await producer.next_event())["event"] == "sent"
            kill9(nodes[leader["node"]].proc)
            events = await producer.finish(timeout=90)
        finally:
            producer.kill()
        assert (await popping).code == ResponseCode.SERVICE_NOT_AVAILABLE
        pulled = await puller.recv(timeout=20)
        assert pulled.is_response and pulled.code in (ResponseCode.PULL_NOT_FOUND,  # (answered by the new leader)
                                                      ResponseCode.PULL_RETRY_IMMEDIATELY), (pulled.code, pulled.remark)
        acknowledged = {e["body"] for e in events if e["event"] == "sent" and e["sendStatus"] == "SEND_OK"}
        refused = [e for e in events if e["event"] == "error" and "body" in e]
        print(f"{len(acknowledged)} SEND_OK, {len(refused)} refused during the failover")
        assert len(acknowledged) + len(refused) == 400
        assert {f"m{i}" for i in range(50)} | {f"m{i}" for i in range(380, 400)} <= acknowledged  # (before, after)
        route = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "relayed-crash"}, timeout_s=10)
        assert route.code == ResponseCode.SUCCESS  # the connection opened before the kill
        assert [b["brokerAddrs"] for b in json.loads(route.body)["brokerDatas"]] == [{"0": remoting}]
        consumed = await ons({"cmd": "consume", "nameSrv": remoting, "group": "relayed-readers",
                              "topic": "relayed-crash", "count": len(acknowledged), "timeoutMs": 30000,
                              "fromFirst": True}, timeout=60)
        missing = acknowledged - {e["body"] for e in consumed if e["event"] == "message"}
        assert not missing, f"{len(missing)} messages answered SEND_OK not consumed, e.g. {sorted(missing)[:5]}"
        deadline = time.monotonic() + 30  # the consumer that ran across the kill: until it has each
        while not acknowledged <= seen and time.monotonic() < deadline and not reading.done():
            await asyncio.sleep(0.1)
        missing = acknowledged - seen
        assert not missing, f"{len(missing)} SEND_OK not consumed across the kill, e.g. {sorted(missing)[:5]}"
        for client in (raw, puller, popper.raw):
            client.writer.close()
        counted = samples((await fetch(metrics, "/metrics"))[1])
        outcomes = {outcome: value(counted, "tidemq_rocketmq_failover_requests_total", protocol="remoting",
                                   outcome=outcome) for outcome in ("resent", "lost")}
        assert outcomes["resent"] >= 1 and outcomes["lost"] >= 1, outcomes  # (the pull; the pop)
    finally:
        if reading is not None:
            reading.cancel()
        if across is not None:
            across.kill()
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_grpc_clients_of_a_gateway_node_lose_nothing_when_the_store_leader_dies(tmp_path: Path, etcd) -> None:
    """kill -9 of the store leader while the official client's Producer sends through a gateway
    node, the only endpoint it and the SimpleConsumer know: every send the producer saw succeed
    is received by the consumer started before the kill, which receives and acks on through it."""
    nodes, endpoint, gateway = start_group_with_grpc_gateway(tmp_path, etcd)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        sent: list[bytes] = []
        failed: list[bytes] = []
        received: set[bytes] = set()
        async with official_simple_consumer(endpoint, "GID-relayed", "GrpcRelayed") as consumer:

            async def receive_and_ack() -> None:
                try:
                    for message in await asyncio.to_thread(consumer.receive, 16, 5):
                        await asyncio.to_thread(consumer.ack, message)
                        received.add(message.body)
                except Exception:  # (a receive or ack lost with the leader: received again later)
                    await asyncio.sleep(0.2)

            async with official_producer(endpoint, "GrpcRelayed") as producer:
                for i in range(150):
                    body = b"g%d" % i
                    if i == 50:
                        while len(received) < 50:
                            await receive_and_ack()
                        kill9(nodes[leader["node"]].proc)
                    try:
                        await asyncio.to_thread(producer.send, normal_message("GrpcRelayed", body))
                        sent.append(body)
                    except Exception:  # (the client's own retries spent during the failover)
                        failed.append(body)
            print(f"{len(sent)} sends succeeded, {len(failed)} failed during the failover")
            assert (await wait_leader(etcd, not_node=leader["node"]))["epoch"] > leader["epoch"]  # (sent across it)
            assert {b"g%d" % i for i in range(50)} | {b"g%d" % i for i in range(130, 150)} <= set(sent)
            deadline = time.monotonic() + 40
            while not set(sent) <= received and time.monotonic() < deadline:
                await receive_and_ack()
        missing = set(sent) - received
        assert not missing, f"{len(missing)} sends that succeeded were not received, e.g. {sorted(missing)[:5]}"
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_grpc_sends_across_a_leader_kill9_are_stored_once(tmp_path: Path, etcd) -> None:
    """kill -9 of the store leader while eight of the official client's sends are under way at
    a time through a gateway node: the sends lost with it are made again (by the node, or the
    client's retry, with the same message id) and answered from what the new leader holds, so
    a consumer started afterwards receives every SEND_OK'd message once (counted by message id)."""
    nodes, endpoint, gateway = start_group_with_grpc_gateway(tmp_path, etcd)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        sent: list[str] = []
        failed = 0
        after_kill = asyncio.Event()
        async with official_producer(endpoint, "GrpcOnce") as producer:

            async def sender(worker: int) -> None:
                nonlocal failed
                for i in range(1000):
                    if after_kill.is_set() and len(sent) >= 400:
                        return
                    try:
                        receipt = await asyncio.to_thread(producer.send, normal_message("GrpcOnce", b"w%d-%d" % (
                            worker, i)))
                        sent.append(receipt.message_id)
                    except Exception:  # (the client's own retries spent during the failover)
                        failed += 1

            senders = [asyncio.create_task(sender(worker)) for worker in range(8)]
            while len(sent) < 150:
                await asyncio.sleep(0.01)
            kill9(nodes[leader["node"]].proc)
            after_kill.set()
            await asyncio.gather(*senders)
        print(f"{len(sent)} sends succeeded, {failed} failed during the failover")
        assert (await wait_leader(etcd, not_node=leader["node"]))["epoch"] > leader["epoch"]
        assert len(sent) >= 400 and len(set(sent)) == len(sent)
        # Read back with grpcio's stub of the same service. The official Python client (5.1.2),
        # started after the failover, once failed an ack in CI with "Channel is closed": grpcio's
        # UsageError, raised in the client process on a channel it had closed, not an answer of
        # the gateway's. What this test counts is what the store holds, read by any correct client.
        received: Counter[str] = Counter()
        async with raw_stub(endpoint) as stub:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = await raw_receive_and_ack(stub, "GID-once", "GrpcOnce")
                for message in got:
                    received[message.system_properties.message_id] += 1
                if not got and set(sent) <= set(received):
                    break
        missing = set(sent) - set(received)
        assert not missing, f"{len(missing)} SEND_OK'd messages were not received, e.g. {sorted(missing)[:5]}"
        twice = {message_id: count for message_id, count in received.items() if count > 1}
        assert not twice, f"{len(twice)} messages were stored more than once, e.g. {list(twice.items())[:5]}"
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_a_gateway_node_leaves_a_stopped_leader_for_the_new_one(tmp_path: Path, etcd) -> None:
    """SIGSTOP of the store leader: its link stays open (nothing closes it), yet the gateway node
    moves to the leader etcd elects in its place, and its clients' publishes are acknowledged
    there on the same connections (MQTT, and AMQP through the relay). An AMQP connection that
    held an exclusive queue (lost with the old leader) is closed as a server shutting down
    closes it: 320 CONNECTION_FORCED, saying why."""
    nodes = start_group(tmp_path, etcd.endpoint)
    mqtt_port, amqp_port = free_port(), free_port()
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--mqtt-bind", f"127.0.0.1:{mqtt_port}", "--amqp-bind", f"127.0.0.1:{amqp_port}",
                      "--data-dir", str(tmp_path / "gw1")], name="gw1")
    stopped = None
    try:
        await publish_until_acknowledged(mqtt_port, "warm-up", [0])  # (refused until a follower is in sync)
        subscriber = PahoClient(mqtt_port, "watcher", clean=False)
        await subscriber.connect()
        await subscriber.subscribe("line/#", 1)
        publisher = PahoClient(mqtt_port, "steady")
        await publisher.connect()
        amqp = await connect(amqp_port)
        amqp_channel = await amqp.channel(publisher_confirms=True)
        orders = await amqp_channel.declare_queue("orders", durable=True)
        exclusive = await connect(amqp_port)
        forced: list[BaseException | None] = []
        exclusive.close_callbacks.add(lambda _conn, exc=None: forced.append(exc))
        await (await exclusive.channel()).declare_queue("", exclusive=True)
        leader = await wait_leader(etcd)
        stopped = nodes[leader["node"]].proc
        stopped.send_signal(signal.SIGSTOP)
        for n in range(1, 21):
            info = publisher.client.publish("line/1", str(n), 1)
            await asyncio.to_thread(info.wait_for_publish, 30)
            assert info.is_published(), f"publish {n} never acknowledged while the old leader is stopped"
            await amqp_channel.default_exchange.publish(aio_pika.Message(b"%d" % n, delivery_mode=2),
                                                        routing_key="orders", timeout=30)
        assert (await wait_leader(etcd))["node"] != leader["node"]
        missing = set(range(1, 21)) - await receive_numbers(subscriber, set(range(1, 21)))
        assert not missing, f"acknowledged and not delivered: {sorted(missing)}"
        assert publisher.disconnects.empty() and subscriber.disconnects.empty()
        got = set()
        while (message := await orders.get(no_ack=True, fail=False, timeout=5)) is not None:
            got.add(int(message.body))
        assert got >= set(range(1, 21)), f"confirmed and not delivered: {sorted(set(range(1, 21)) - got)}"
        assert not amqp.is_closed
        deadline = time.monotonic() + 20
        while not forced:
            assert time.monotonic() < deadline, "the connection with an exclusive queue was kept"
            await asyncio.sleep(0.05)
        assert "CONNECTION_FORCED" in str(forced[0]) and "exclusive" in str(forced[0]), forced
        await publisher.disconnect()
        await subscriber.disconnect()
        await amqp.close()
    finally:
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_rocketmq_clients_of_a_gateway_node_leave_a_stopped_leader_for_the_new_one(tmp_path: Path, etcd) -> None:
    """SIGSTOP of the store leader (its connections stay open, nothing answers): the gateway
    node's remoting relay and gRPC proxy leave it for the leader etcd elects in its place; a
    send on a remoting connection opened before is answered SEND_OK there (after refusals the
    client retries), and the official client's sends succeed."""
    nodes = start_group(tmp_path, etcd.endpoint)
    remoting, endpoint = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd.endpoint,
                      "--remoting-bind", remoting, "--grpc-bind", endpoint, "--data-dir", str(tmp_path / "gw1")],
                     name="gw1")
    stopped = None

    async def send_until_ok(raw: RawRemoting, body: bytes) -> None:
        deadline = time.monotonic() + 30
        while (answer := await raw.call(RequestCode.SEND_MESSAGE, send_header("stopped"), body,
                                        timeout_s=30)).code != ResponseCode.SUCCESS:
            assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE, (answer.code, answer.remark)
            assert time.monotonic() < deadline, answer.remark
            await asyncio.sleep(0.1)

    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        raw = await RawRemoting.open(remoting)
        await send_until_ok(raw, b"before")
        async with official_producer(endpoint, "GrpcStopped") as producer:
            await asyncio.to_thread(producer.send, normal_message("GrpcStopped", b"before"))
            stopped = nodes[leader["node"]].proc
            stopped.send_signal(signal.SIGSTOP)
            await send_until_ok(raw, b"after")  # (the same connection)
            await asyncio.to_thread(producer.send, normal_message("GrpcStopped", b"after"))
        assert (await wait_leader(etcd))["node"] != leader["node"]
        raw.writer.close()
    finally:
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)


async def test_a_new_mqtt_session_survives_kill9_of_the_leader_and_of_its_gateway_node(tmp_path: Path, etcd) -> None:
    """SUBACK of a new persistent session, then kill -9 of the store leader and of the gateway
    node at once: another gateway node finds the session on the new leader (its write was
    confirmed by the in-sync replicas before the SUBACK left) and delivers to it."""
    nodes = start_group(tmp_path, etcd.endpoint)
    ports = [free_port(), free_port()]

    def gateway_node(name: str, port: int) -> subprocess.Popen:
        return launch(["--role", "gateway", "--node-id", name, "--replication-group", GROUP, "--etcd", etcd.endpoint,
                       "--mqtt-bind", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / name)], name=name)

    gateways = [gateway_node("gw1", ports[0])]
    try:
        await publish_until_acknowledged(ports[0], "warm-up", [0])  # (refused until a follower is in sync)
        device = PahoClient(ports[0], "fresh", clean=False)
        await device.connect()
        await device.subscribe("line/#", 1)
        leader = await wait_leader(etcd)
        kill9(nodes[leader["node"]].proc)
        kill9(gateways[0])
        device.client.loop_stop()
        gateways.append(gateway_node("gw2", ports[1]))
        deadline = time.monotonic() + 20
        while True:
            back = PahoClient(ports[1], "fresh", clean=False)
            try:
                flags, rc, _ = await back.connect()
                if rc == 0:
                    break
            except (OSError, AssertionError):
                pass
            back.client.loop_stop()
            assert time.monotonic() < deadline, "the new gateway node never took the client"
            await asyncio.sleep(0.2)
        assert flags.session_present, "the acknowledged session was lost with the leader"
        await publish_until_acknowledged(ports[1], "after", list(range(1, 6)))
        missing = set(range(1, 6)) - await receive_numbers(back, set(range(1, 6)))
        assert not missing, f"the session's subscription did not survive: {sorted(missing)} not delivered"
        await back.disconnect()
    finally:
        for proc in gateways:
            stop(proc)
        for node in nodes.values():
            stop(node.proc)


async def test_rocketmq_sends_the_leader_acknowledged_survive_its_kill9(tmp_path: Path, etcd) -> None:
    """ali-ons with the three store nodes as name servers: every SEND_OK of the old leader is
    read back from the new one, with what was sent after the failover."""
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        name_servers = [f"127.0.0.1:{node.remoting_port}" for node in nodes.values()]
        before = await send_until_acknowledged(name_servers, [f"before-{i}" for i in range(20)])
        kill9(nodes[leader["node"]].proc)
        after = await send_until_acknowledged(name_servers, [f"after-{i}" for i in range(20)])
        events = await ons({"cmd": "consume", "nameSrv": name_servers, "group": "crash-readers", "topic": "crash",
                            "count": 40, "timeoutMs": 30000, "fromFirst": True}, timeout=60)
        got = {event["body"] for event in events if event["event"] == "message"}
        missing = set(before + after) - got
        assert not missing, f"{len(missing)} messages sent with SEND_OK not read back, e.g. {sorted(missing)[:5]}"
    finally:
        for node in nodes.values():
            stop(node.proc)


async def test_grpc_acks_and_held_pops_wait_until_the_in_sync_replicas_hold_them(tmp_path: Path, etcd) -> None:
    """The official client's ack and change of invisible duration, and a remoting pop answered
    after a hold, are answered by the leader only once its in-sync replicas hold their changes:
    refused, never OK, while too few replicas are in sync to hold them."""
    nodes = start_group(tmp_path, etcd.endpoint, names=("s1", "s2"))
    try:
        leader = nodes[(await wait_leader(etcd))["node"]]
        follower = next(node for node in nodes.values() if node is not leader)
        await wait_in_sync(etcd, {follower.name})
        endpoint = f"127.0.0.1:{leader.grpc_port}"
        async with official_producer(endpoint, "GrpcReplicated", "HeldPop") as producer:
            for body in (b"first", b"second"):
                await asyncio.to_thread(producer.send, normal_message("GrpcReplicated", body))
            await asyncio.to_thread(producer.send, normal_message("HeldPop", b"popped"))
        async with official_simple_consumer(endpoint, "GID-replicated", "GrpcReplicated") as consumer:
            got = await receive_all(consumer, 2)
            assert sorted(m.body for m in got) == [b"first", b"second"]
            os.kill(follower.proc.pid, signal.SIGSTOP)  # (it falls behind: out of the in-sync set)
            try:
                deadline = time.monotonic() + 20
                while follower.name in set((await etcd.state(GROUP))["in_sync"]):
                    assert time.monotonic() < deadline, "the stopped follower stayed in sync"
                    await asyncio.sleep(0.1)
                with pytest.raises(InternalErrorException) as ack:
                    await asyncio.to_thread(consumer.ack, got[0])
                with pytest.raises(InternalErrorException) as change:
                    await asyncio.to_thread(consumer.change_invisible_duration, got[1], 60)
                # a pop takes the message for a second (answered: not held); another, held
                # meanwhile, gets it when it comes back
                remoting = f"127.0.0.1:{leader.remoting_port}"
                poppers = [await PopClient.open(remoting, "GID-held"), await PopClient.open(remoting, "GID-held")]
                first_pop = asyncio.ensure_future(poppers[0].request_pop("HeldPop", -1, 1, invisible_ms=1000))
                await asyncio.sleep(0.3)
                held = await poppers[1].request_pop("HeldPop", -1, 1, invisible_ms=60_000, poll_ms=8000)
                assert (await first_pop).code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert held.code == ResponseCode.SERVICE_NOT_AVAILABLE, (held.code, held.remark)
            finally:
                os.kill(follower.proc.pid, signal.SIGCONT)
        assert ack.value.code == change.value.code == pb.HA_NOT_AVAILABLE
        for popper in poppers:
            popper.raw.close()
    finally:
        for node in nodes.values():
            stop(node.proc)


async def send_until_acknowledged(name_servers: list[str], bodies: list[str]) -> list[str]:
    """Send the bodies with ali-ons, again those not answered SEND_OK (writes are refused while
    a group has no leader, or too few replicas in sync), until each was; the bodies."""
    deadline = time.monotonic() + 30
    waiting = list(bodies)
    while waiting:
        events = await ons({"cmd": "send", "nameSrv": name_servers, "topic": "crash", "reportErrors": True,
                            "messages": [{"body": body} for body in waiting]}, timeout=30)
        outcomes = [e for e in events if e["event"] in ("sent", "error")]  # (one per message, in order)
        assert len(outcomes) == len(waiting), events
        waiting = [body for body, e in zip(waiting, outcomes, strict=True)
                   if not (e["event"] == "sent" and e["sendStatus"] == "SEND_OK")]
        assert time.monotonic() < deadline or not waiting, f"no SEND_OK for {waiting[:5]}: {events[-3:]}"
        if waiting:
            await asyncio.sleep(0.2)
    return bodies


async def test_a_leader_stopped_past_its_lease_steps_down_and_acknowledges_nothing(tmp_path: Path, etcd) -> None:
    """SIGSTOP of the leader: another is elected; a publish its client sent meanwhile is never
    confirmed by the deposed leader once it runs again (SIGCONT): it closes its listeners and
    follows the new epoch, and the group keeps every confirmed message."""
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        first = nodes[leader["node"]]
        connection = await connect(first.amqp_port)
        channel = await connection.channel()
        await channel.declare_queue("orders", durable=True)
        await publish_confirmed(channel, [b"before-%d" % i for i in range(50)])
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            successor = await wait_leader(etcd, not_node=first.name)
            late = asyncio.ensure_future(channel.default_exchange.publish(aio_pika.Message(b"late"), routing_key="orders"))
            await asyncio.sleep(0.2)
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        done, _ = await asyncio.wait([late], timeout=15)
        assert done, "the deposed leader neither confirmed nor refused the publish"
        assert late.exception() is not None, "the deposed leader confirmed a publish"
        second = nodes[successor["node"]]
        connection2 = await connect(second.amqp_port)
        channel2 = await connection2.channel()
        await publish_confirmed(channel2, [b"after"])
        queue = await channel2.declare_queue("orders", durable=True, passive=True)
        got = []
        while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
            got.append(message.body)
        assert got[:50] == [b"before-%d" % i for i in range(50)] and got[-1] == b"after"
        assert b"late" not in got
        deadline = time.monotonic() + 20
        while True:  # the deposed leader rejoined: back in the in-sync set of a newer epoch
            state = await etcd.state(GROUP)  # (a loaded machine may see one more election meanwhile)
            if state["epoch"] >= successor["epoch"] and first.name in {*state["in_sync"], state["leader"]}:
                break
            assert time.monotonic() < deadline, f"the deposed leader did not rejoin: {state}"
            await asyncio.sleep(0.1)
        for conn in (connection, connection2):
            with contextlib.suppress(Exception):
                await conn.close()
    finally:
        for node in nodes.values():
            stop(node.proc)


async def publish_confirmed(channel, bodies: list[bytes], timeout_s: float = 20.0) -> None:
    """Each body to the queue "orders", persistent, retried while the group refuses writes (no
    follower in sync yet)."""
    deadline = time.monotonic() + timeout_s
    for body in bodies:
        while True:
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="orders")
                break
            except aio_pika.exceptions.DeliveryError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)


async def test_ctl_cluster_the_metrics_and_the_dashboard_show_the_group(tmp_path: Path, etcd, browser) -> None:
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = nodes[(await wait_leader(etcd))["node"]]
        url = f"http://127.0.0.1:{leader.metrics_port}"
        deadline = time.monotonic() + 20
        while True:  # both followers join the in-sync set once they hold the leader's log
            state = await etcd.state(GROUP)
            if len(state["in_sync"]) == 2:
                break
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # (node records are renewed every quarter lease)
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gateway", "ctl", "--url", url, "cluster",
                                                       "--json"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = {row["node"]: row for row in json.loads(out.stdout)}
        assert set(rows) == set(nodes)
        assert rows[leader.name]["role"] == "leader" and rows[leader.name]["in_sync"] == "leader"
        for name in set(nodes) - {leader.name}:
            assert rows[name]["role"] == "follower" and rows[name]["in_sync"] is True
            assert rows[name]["lag_bytes"] == 0 and rows[name]["epoch"] == rows[leader.name]["epoch"]
        table = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gateway", "ctl", "--url", url,
                                                         "cluster"], capture_output=True, text=True, timeout=30)
        assert "leader" in table.stdout and "follower" in table.stdout
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
        assert "tidemq_replication_leader 1.0" in metrics
        assert "tidemq_replication_in_sync_replicas 3.0" in metrics
        assert 'tidemq_replication_follower_lag_bytes{follower="' in metrics
        page = Page(browser, url)
        await page.open("/dashboard")
        leader_row = f'#group tr[data-node="{leader.name}"] td[data-field="{{}}"]'
        await page.until_text(leader_row.format("role"), "leader")
        assert await page.shown("#group-section")
        assert await page.text(leader_row.format("in_sync")) == "leader"
        for name in set(nodes) - {leader.name}:
            row = f'#group tr[data-node="{name}"] td[data-field="{{}}"]'
            assert await page.text(row.format("role")) == "follower"
            assert await page.text(row.format("in_sync")) == "yes"
            assert await page.text(row.format("lag_bytes")) == "0 B"
    finally:
        for node in nodes.values():
            stop(node.proc)


async def test_a_group_restarted_whole_keeps_every_confirmed_message(tmp_path: Path, etcd) -> None:
    """All three store nodes stopped and started again: one of them (the last leader or an
    in-sync follower) is elected, with the queue and every confirmed message."""
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        connection = await connect(nodes[leader["node"]].amqp_port)
        channel = await connection.channel()
        await channel.declare_queue("orders", durable=True)
        bodies = [b"order-%d" % i for i in range(100)]
        await publish_confirmed(channel, bodies)
        await connection.close()
        for node in nodes.values():
            stop(node.proc)
        nodes = start_group(tmp_path, etcd.endpoint)  # (the same data dirs)
        successor = await wait_leader(etcd)
        assert successor["epoch"] > leader["epoch"]
        connection = await connect(nodes[successor["node"]].amqp_port)
        channel = await connection.channel()
        queue = await channel.declare_queue("orders", durable=True, passive=True)
        got = []
        while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
            got.append(message.body)
        assert got == bodies
        await publish_confirmed(channel, [b"after"])
        await connection.close()
    finally:
        for node in nodes.values():
            stop(node.proc)


async def test_a_wiped_follower_behind_the_leaders_retention_is_seeded_and_can_lead(tmp_path: Path, etcd) -> None:
    """A follower loses its disk (kill -9, data dir removed) while the leader's retention has
    removed the start of the log: it is seeded with the leader's files, rejoins the in-sync set,
    and, elected later, serves the queue and its newest messages."""
    small = {"TIDEMQ_SEGMENT_SIZE": str(64 << 10), "TIDEMQ_RETENTION_BYTES": str(256 << 10),
             "TIDEMQ_RETENTION_CHECK_INTERVAL_S": "0.2"}
    nodes = start_group(tmp_path, etcd.endpoint, env=small)
    try:
        leader = nodes[(await wait_leader(etcd))["node"]]
        connection = await connect(leader.amqp_port)
        channel = await connection.channel()
        await channel.declare_queue("orders", durable=True)
        bodies = [b"order-%04d-" % i + b"x" * 1000 for i in range(1500)]  # ~1.5 MB: retention cuts the start
        await publish_confirmed(channel, bodies)
        wiped = next(node for node in nodes.values() if node is not leader)
        kill9(wiped.proc)
        shutil.rmtree(tmp_path / wiped.name)
        await asyncio.sleep(1)  # (retention runs on: the log's start is gone)
        nodes[wiped.name] = start_store_node(tmp_path, etcd.endpoint, wiped.name, small)
        await publish_confirmed(channel, [b"after-the-wipe"])
        await wait_in_sync(etcd, {wiped.name})
        await connection.close()
        other = next(node for node in nodes.values() if node not in (leader, nodes[wiped.name]))
        kill9(leader.proc)
        kill9(other.proc)  # only the seeded replica is left: in sync, it may lead
        successor = await wait_leader(etcd, not_node=leader.name)
        assert successor["node"] == wiped.name
        connection = await connect(nodes[wiped.name].amqp_port)
        channel = await connection.channel()
        queue = await channel.declare_queue("orders", durable=True, passive=True)
        got: list[bytes] = []
        async with asyncio.timeout(15):  # (its newest messages once the dead replica leaves the in-sync set)
            while not got or got[-1] != b"after-the-wipe":
                message = await queue.get(no_ack=True, fail=False, timeout=5)
                if message is None:
                    await asyncio.sleep(0.1)
                else:
                    got.append(message.body)
        assert got[:-1] == bodies[len(bodies) - len(got) + 1:]
        assert len(got) < len(bodies)  # (retention did remove the start: this was a seed, not a replay)
        await connection.close()
    finally:
        for node in nodes.values():
            stop(node.proc)


async def test_an_etcd_outage_stops_acknowledgements_and_loses_nothing(tmp_path: Path, etcd) -> None:
    """etcd killed: the leader cannot renew its lease, and a leader no one can vouch for stops
    acknowledging (once etcd is back, another may be elected); etcd back: a leader is elected
    again and every message confirmed before, during and after the outage is there."""
    nodes = start_group(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        first = nodes[leader["node"]]
        connection = await connect(first.amqp_port)
        channel = await connection.channel()
        await channel.declare_queue("orders", durable=True)
        confirmed = [b"before-%d" % i for i in range(20)]
        await publish_confirmed(channel, confirmed)
        assert etcd.process is not None
        etcd.process.kill()
        etcd.process.wait()
        deadline = time.monotonic() + 20
        probe = 0
        while True:  # confirmed while its lease lasts, then refused (or its connection closed)
            body = b"during-%d" % probe
            probe += 1
            try:
                await asyncio.wait_for(channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="orders"), 10)
            except Exception:  # noqa: BLE001 -- a nack, a closed channel or connection, no answer: not confirmed
                break
            confirmed.append(body)
            assert time.monotonic() < deadline, "the leader kept acknowledging without etcd"
            await asyncio.sleep(0.2)
        etcd.start()
        deadline = time.monotonic() + 30
        while True:  # (etcd restores the deposed leader's record with its lease: a newer epoch is the next leader)
            successor = await etcd.leader(GROUP)
            if successor is not None and successor["epoch"] > leader["epoch"]:
                break
            assert time.monotonic() < deadline, f"no leader after etcd came back: {successor}"
            await asyncio.sleep(0.05)
        second = nodes[successor["node"]]
        connection2 = await connect(second.amqp_port)
        channel2 = await connection2.channel()
        await publish_confirmed(channel2, [b"after"])
        confirmed.append(b"after")
        queue = await channel2.declare_queue("orders", durable=True, passive=True)
        got = []
        while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
            got.append(message.body)
        assert [body for body in got if body in confirmed] == confirmed  # (in order, none lost)
        for conn in (connection, connection2):
            with contextlib.suppress(Exception):
                await conn.close()
    finally:
        for node in nodes.values():
            stop(node.proc)
