"""Chaos and throughput of a replicated store: faults injected into a 3-replica group under load.

    python -m loadtest.chaos_replication [--rounds 2] [--faults leader_kill9,leader_sigstop,follower_kill9,restart_all]
                                         [--protocols mqtt,amqp,remoting] [--seed N] [--flush async]
                                         [--log-dir DIR] [--out FILE]
    python -m loadtest.chaos_replication --throughput [--messages 20000] [--publishers 4] [--protocols mqtt,amqp]

Real processes on 127.0.0.1: etcd (tests/etcd_support.py), three ``--role store`` nodes of the
replication group g1 (``replication = sync``, ``min_insync_replicas = 2``) and one ``--role
gateway`` node that follows the leader. The stderr of each node and client process is appended
to ``NAME.log`` under ``--log-dir`` (default: a new temp dir, printed at the start).

Chaos (the default): for each round and each fault, numbered messages, each published again
until acknowledged, one in flight per publisher:

- mqtt: two QoS 1 publishers (paho, clean sessions) through the gateway node; a persistent
  session (clean_session false) subscribed to ``chaos/#`` at QoS 1 receives them;
- amqp: a publisher with confirms to the durable queue ``chaos`` through the gateway node's
  AMQP (relayed to the leader); a consumer (basic.consume, manual acks) receives them;
- remoting: ali-ons (loadtest/chaos_remoting.js under node, tests/remoting_js's packages) with
  the three store nodes' remoting addresses as name servers: a producer (SEND_OK) and a push
  consumer from the topic's first offset.

Consumers run the whole run long and reconnect when dropped. After 1-2 s of load (seeded) the
fault:

- ``leader_kill9``: kill -9 of the leader; once another leads, it is started again;
- ``leader_sigstop``: SIGSTOP of the leader until another leads (at least 1.5 leases), then SIGCONT;
- ``follower_kill9``: kill -9 of a follower (seeded pick), started again 1 s later;
- ``restart_all``: SIGTERM of the three store nodes, then all started again.

Load goes on until each protocol had a publish acknowledged after the fault and the group is
whole again (every node in the in-sync set), then 1 s more; the consumers drain (up to 30 s).
One line per round, fault and protocol:

    chaos fault=NAME protocol=P acked=N received=N lost=N duplicated=N unavailable_s=S

acked: distinct messages acknowledged (PUBACK, confirm, SEND_OK); received: those the consumer
got; lost: acked - received; duplicated: deliveries beyond the first of a message;
unavailable_s: the longest time without an acknowledgement from the fault to the end of the
load (from the fault to the first acknowledgement after it, unless one in flight at the fault
came through first; ``never``: none came). Lines starting with ``#`` say more: the seed, the
leaders, the time the group took to be whole again, the connections clients had to open again,
and ``# DEFECT`` for an acknowledged message lost, a group not whole again within 60 s or a
protocol that never acknowledged again, with how to replay it (``--seed``). ``# note`` lines
count repeats delivered without the redelivered/DUP flag (remoting: reconsumeTimes 0), and
those of a message its publisher sent once (not explained by the publisher's own retry; ali-ons'
internal retries are not seen). The exit status is 1 when there was a defect.

Throughput (``--throughput``): per protocol (mqtt, amqp), ``--messages`` QoS 1 publishes /
confirmed publishes split over ``--publishers`` concurrent clients (64 unacknowledged each)
against the group (MQTT through the gateway node, as store nodes serve no MQTT; AMQP straight
to the leader), then against one standalone node (``python -m gateway serve``, fresh data dir,
same ``--flush``). One line per protocol:

    replication mode=sync protocol=P msgs_per_s=N single_node_msgs_per_s=N leader_cpu_us_per_msg=N
        single_node_cpu_us_per_msg=N [gateway_node_cpu_us_per_msg=N] gen_cpu_us_per_msg=N

CPU figures: user + system seconds of the process (psutil) over the run, per message;
``gen``: this script's own (the clients), for telling a client-bound run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion

from loadtest import runner
from loadtest.chaos_tally import Figures, Tally
from tests.crash_support import ROOT, free_port, kill9, launch, start_gateway, stop
from tests.etcd_support import EtcdServer

HOST = "127.0.0.1"
GROUP = "g1"
NODES = ("s1", "s2", "s3")
FAULTS = ("leader_kill9", "leader_sigstop", "follower_kill9", "restart_all")
PROTOCOLS = ("mqtt", "amqp", "remoting")
THROUGHPUT_PROTOCOLS = ("mqtt", "amqp")
LEASE_S = 2.0  # replication_lease_s's default
RECOVERY_S = 60.0
DRAIN_S = 30.0
ACK_TIMEOUT_S = 10.0
MQTT_PUBLISHERS = 2
AMQP_QUEUE = "chaos"
REMOTING_TOPIC = "chaos"
ONS_DRIVER = Path(__file__).with_name("chaos_remoting.js")
NODE_MODULES = ROOT / "tests" / "remoting_js" / "node_modules"
WINDOW = 64


class Connections:
    """How many times each client connected: a client a failover dropped connects again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def made(self, client: str) -> None:
        with self._lock:
            self._counts[client] = self._counts.get(client, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# -- the processes -----------------------------------------------------------------------------
@dataclass
class StoreNode:
    name: str
    args: list[str]
    amqp_port: int
    remoting_port: int
    proc: subprocess.Popen | None = None


@dataclass
class Group:
    """etcd, the three store nodes and a gateway node; nodes keep their ports and data dirs
    across restarts."""

    workdir: Path
    log_dir: Path
    flush: str
    etcd: EtcdServer = field(init=False)
    nodes: dict[str, StoreNode] = field(init=False)
    gateway: subprocess.Popen | None = None
    mqtt_port: int = 0
    amqp_port: int = 0

    def __post_init__(self) -> None:
        self.etcd = EtcdServer(self.workdir / "etcd")
        self.nodes = {}
        for name in NODES:
            amqp, remoting = free_port(), free_port()
            args = ["--role", "store", "--node-id", name, "--replication-group", GROUP, "--etcd", "",
                    "--replication-bind", f"{HOST}:{free_port()}", "--remoting-bind", f"{HOST}:{remoting}",
                    "--amqp-bind", f"{HOST}:{amqp}", "--metrics-bind", f"{HOST}:{free_port()}",
                    "--data-dir", str(self.workdir / name), "--flush", self.flush]
            self.nodes[name] = StoreNode(name, args, amqp, remoting)

    def start(self, with_gateway: bool = True) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            node.args[node.args.index("--etcd") + 1] = self.etcd.endpoint
        self.start_nodes(list(self.nodes))
        if with_gateway:
            self.mqtt_port, self.amqp_port = free_port(), free_port()
            self.gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP,
                                   "--etcd", self.etcd.endpoint, "--mqtt-bind", f"{HOST}:{self.mqtt_port}",
                                   "--amqp-bind", f"{HOST}:{self.amqp_port}", "--metrics-bind",
                                   f"{HOST}:{free_port()}", "--data-dir", str(self.workdir / "gw1"),
                                   "--flush", self.flush], name="gw1", log=self.log_dir / "gw1.log")

    @property
    def name_servers(self) -> list[str]:
        """Every store node's remoting address: whichever leads answers RocketMQ clients."""
        return [f"{HOST}:{node.remoting_port}" for node in self.nodes.values()]

    def start_nodes(self, names: list[str]) -> None:
        """Start these store nodes together; each returns once it joined the group."""
        def one(name: str) -> None:
            node = self.nodes[name]
            with open(self.log_dir / f"{name}.log", "a") as log:
                log.write(f"=== chaos: start at {time.strftime('%H:%M:%S')}\n")
            node.proc = launch(node.args, name=name, ready="joined its replication group",
                               log=self.log_dir / f"{name}.log")

        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(one, names))

    def stop_nodes(self, names: list[str]) -> None:
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda name: stop(self.nodes[name].proc), names))

    def close(self) -> None:
        if self.gateway is not None:
            stop(self.gateway)
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.proc.pid, signal.SIGCONT)
                stop(node.proc)
        self.etcd.stop()

    async def leader(self) -> dict | None:
        with contextlib.suppress(Exception):
            return await self.etcd.leader(GROUP)
        return None

    async def wait_leader(self, not_node: str | None = None, timeout_s: float = RECOVERY_S) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = await self.leader()
            if leader is not None and leader["node"] != not_node:
                return leader
            await asyncio.sleep(0.05)
        return None

    async def wait_whole(self, timeout_s: float = RECOVERY_S) -> dict | None:
        """Until a leader leads the newest epoch with both others in sync; its state, or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                leader, state = await self.etcd.leader(GROUP), await self.etcd.state(GROUP)
                if (leader is not None and state is not None and state.get("leader") == leader["node"]
                        and state.get("epoch") == leader["epoch"]
                        and set(state.get("in_sync", ())) | {leader["node"]} == set(NODES)):
                    return state
            await asyncio.sleep(0.1)
        return None


# -- the faults --------------------------------------------------------------------------------
async def inject(fault: str, group: Group, rng: random.Random, say) -> float:
    """Do ``fault`` and start again what it stopped; returns the moment of the fault."""
    leader = await group.wait_leader()
    if leader is None:
        raise RuntimeError("no leader before the fault")
    name = leader["node"]
    say(f"# fault={fault} leader={name} epoch={leader['epoch']}")
    if fault == "leader_kill9":
        kill9(group.nodes[name].proc)
        at = time.monotonic()
        successor = await group.wait_leader(not_node=name)
        say(f"# leader_kill9: new leader {successor and successor['node']} after {time.monotonic() - at:.2f} s")
        await asyncio.to_thread(group.start_nodes, [name])
        return at
    if fault == "leader_sigstop":
        proc = group.nodes[name].proc
        os.kill(proc.pid, signal.SIGSTOP)
        at = time.monotonic()
        try:
            successor = await group.wait_leader(not_node=name)
            await asyncio.sleep(max(0.0, at + 1.5 * LEASE_S - time.monotonic()))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        say(f"# leader_sigstop: new leader {successor and successor['node']}, SIGCONT after {time.monotonic() - at:.2f} s")
        return at
    if fault == "follower_kill9":
        follower = rng.choice(sorted(set(NODES) - {name}))
        say(f"# follower_kill9: {follower}")
        kill9(group.nodes[follower].proc)
        at = time.monotonic()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(group.start_nodes, [follower])
        return at
    if fault == "restart_all":
        at = time.monotonic()
        await asyncio.to_thread(group.stop_nodes, list(NODES))
        say(f"# restart_all: stopped in {time.monotonic() - at:.2f} s")
        await asyncio.to_thread(group.start_nodes, list(NODES))
        return at
    raise ValueError(f"unknown fault {fault}")


# -- MQTT --------------------------------------------------------------------------------------
def message_round(message_id: str) -> str:
    """The round tag of a message id ``TAG/PUBLISHER/SEQ``."""
    return message_id.split("/", 1)[0]


class MqttPublisher(threading.Thread):
    """QoS 1, one message in flight, each message again (a new PUBLISH) until its PUBACK; a
    new clean connection after a disconnect or ACK_TIMEOUT_S without PUBACK."""

    def __init__(self, port: int, name: str, tag: str, tally: Tally, connections: Connections) -> None:
        super().__init__(daemon=True)
        self.port, self.name_, self.tag, self.tally = port, name, tag, tally
        self.connections = connections
        self.halt = threading.Event()
        self._event = threading.Event()
        self._lost = False

    def _connect(self) -> paho.Client | None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"chaos-{self.name_}", clean_session=True)
        connected = threading.Event()
        client.on_connect = lambda c, u, flags, rc, props: (not rc.is_failure) and connected.set()
        client.on_publish = lambda c, u, mid, rc, props: self._event.set()

        def lost(c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
            self._lost = True
            self._event.set()

        client.on_disconnect = lost
        try:
            client.connect(HOST, self.port, keepalive=10)
        except OSError:
            return None
        self._lost = False
        client.loop_start()
        if not connected.wait(5) or self._lost:
            self._close(client)
            return None
        self.connections.made("mqtt_publishers")
        return client

    @staticmethod
    def _close(client: paho.Client) -> None:
        with contextlib.suppress(Exception):
            client.disconnect()
        client.loop_stop()

    def run(self) -> None:
        seq, pending = 0, None
        while not self.halt.is_set():
            client = self._connect()
            if client is None:
                time.sleep(0.1)
                continue
            try:
                while not self.halt.is_set() and not self._lost:
                    if pending is None:
                        pending, seq = f"{self.tag}/{self.name_}/{seq}", seq + 1
                    self._event.clear()
                    self.tally.on_sent(pending)
                    info = client.publish(f"chaos/{self.tag}/{self.name_}", pending, qos=1)
                    self._event.wait(ACK_TIMEOUT_S)
                    if not info.is_published():
                        break
                    self.tally.on_acked(pending, time.monotonic())
                    pending = None
            finally:
                self._close(client)


class MqttSubscriber:
    """A persistent session (clean_session false) subscribed to chaos/# at QoS 1, reconnected
    by paho; each delivery goes to the tally of its round."""

    def __init__(self, port: int, tallies: dict[str, Tally], connections: Connections) -> None:
        self.tallies = tallies
        self.connections = connections
        self.sessions_lost = 0
        self._connected_once = False
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="chaos-subscriber", clean_session=False)
        self.client.reconnect_delay_set(0.1, 1)
        self.client.on_connect = self._on_connect
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subscribed.set()
        self.client.on_message = self._on_message
        self.port = port

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            return
        if not flags.session_present:
            if self._connected_once:
                self.sessions_lost += 1
            client.subscribe("chaos/#", 1)
        self._connected_once = True
        self.connections.made("mqtt_subscriber")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        message_id = message.payload.decode()
        tally = self.tallies.get(message_round(message_id))
        if tally is not None:
            tally.on_delivered(message_id, bool(message.dup))

    def start(self, timeout_s: float = RECOVERY_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.connect(HOST, self.port, keepalive=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.client.loop_start()
        if not self.subscribed.wait(timeout_s):  # messages published before the SUBACK are not ours to count
            raise RuntimeError("the MQTT subscriber's SUBSCRIBE was not acknowledged")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()


# -- AMQP --------------------------------------------------------------------------------------
async def amqp_connect(port: int) -> aio_pika.abc.AbstractConnection:
    return await asyncio.wait_for(aio_pika.connect(f"amqp://guest:guest@{HOST}:{port}/", timeout=5), 10)


async def amqp_publisher(port: int, tag: str, tally: Tally, halt: asyncio.Event, connections: Connections) -> None:
    """Persistent messages to the durable queue, confirms on, one in flight, each again until
    confirmed; a new connection after anything but a nack."""
    seq, pending = 0, None
    while not halt.is_set():
        connection = None
        try:
            connection = await amqp_connect(port)
            channel = await connection.channel()
            await channel.declare_queue(AMQP_QUEUE, durable=True)
            connections.made("amqp_publisher")
            while not halt.is_set():
                if pending is None:
                    pending, seq = f"{tag}/amqp/{seq}", seq + 1
                tally.on_sent(pending)
                message = aio_pika.Message(pending.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                try:
                    await asyncio.wait_for(channel.default_exchange.publish(message, routing_key=AMQP_QUEUE),
                                           ACK_TIMEOUT_S)
                except aio_pika.exceptions.DeliveryError:  # nack: not replicated (yet)
                    await asyncio.sleep(0.05)
                    continue
                tally.on_acked(pending, time.monotonic())
                pending = None
        except Exception:  # noqa: BLE001 (any failure of the connection: connect again)
            await asyncio.sleep(0.1)
        finally:
            if connection is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)


async def amqp_consumer(port: int, tallies: dict[str, Tally], halt: asyncio.Event,
                        connections: Connections) -> None:
    """basic.consume with manual acks on the durable queue, connected again whenever it drops."""
    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        message_id = message.body.decode()
        tally = tallies.get(message_round(message_id))
        if tally is not None:
            tally.on_delivered(message_id, bool(message.redelivered))
        await message.ack()

    while not halt.is_set():
        connection = None
        try:
            connection = await amqp_connect(port)
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=200)
            queue = await channel.declare_queue(AMQP_QUEUE, durable=True)
            await queue.consume(on_message)
            connections.made("amqp_consumer")
            while not halt.is_set() and not channel.is_closed and not connection.is_closed:
                await asyncio.sleep(0.2)
        except Exception:  # noqa: BLE001
            await asyncio.sleep(0.2)
        finally:
            if connection is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)


# -- RocketMQ remoting (ali-ons) ----------------------------------------------------------------
class OnsDriver:
    """One loadtest/chaos_remoting.js process (ali-ons under node); each JSON line it prints
    goes to ``on_event`` as it comes. It runs until its stdin is closed."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.Task) -> None:
        self.proc, self.reader = proc, reader

    @classmethod
    async def start(cls, spec: dict[str, Any], on_event, home: Path, log: Path) -> OnsDriver:
        if not (NODE_MODULES / "ali-ons").is_dir():
            raise RuntimeError("ali-ons is not installed: npm ci --prefix tests/remoting_js")
        with open(log, "a") as stderr:
            proc = await asyncio.create_subprocess_exec(
                "node", str(ONS_DRIVER), json.dumps(spec), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=stderr,
                env={**os.environ, "NODE_PATH": str(NODE_MODULES), "HOME": str(home)})

        async def read() -> None:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                on_event(json.loads(line))

        return cls(proc, asyncio.ensure_future(read()))

    async def stop(self, timeout_s: float = 30.0) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.wait([self.reader], timeout=5)


def on_producer_event(tally: Tally):
    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "sending":
            tally.on_sent(event["id"])
        elif event["event"] == "sent":
            tally.on_acked(event["id"], time.monotonic())
    return on_event


def on_consumer_event(tallies: dict[str, Tally], ready: asyncio.Event):
    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "ready":
            ready.set()
        elif event["event"] == "message":
            tally = tallies.get(message_round(event["id"]))
            if tally is not None:
                tally.on_delivered(event["id"], event["reconsumeTimes"] > 0)
    return on_event


async def start_ons_consumer(group: Group, tallies: dict[str, Tally]) -> OnsDriver:
    """The topic made by a first SEND_OK, then a push consumer from its first offset."""
    warmup = Tally()
    producer = await OnsDriver.start({"cmd": "produce", "nameSrv": group.name_servers, "topic": REMOTING_TOPIC,
                                      "tag": "warmup"}, on_producer_event(warmup), group.workdir,
                                     group.log_dir / "ons-producer.log")
    deadline = time.monotonic() + RECOVERY_S
    while not warmup.acked_at and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await producer.stop()
    if not warmup.acked_at:
        raise RuntimeError("ali-ons: no SEND_OK at the start")
    ready = asyncio.Event()
    consumer = await OnsDriver.start({"cmd": "consume", "nameSrv": group.name_servers, "topic": REMOTING_TOPIC,
                                      "group": "chaos-consumer"}, on_consumer_event(tallies, ready), group.workdir,
                                     group.log_dir / "ons-consumer.log")
    await asyncio.wait_for(ready.wait(), RECOVERY_S)
    return consumer


# -- a chaos round -----------------------------------------------------------------------------
@dataclass
class Consumers:
    tallies: dict[str, dict[str, Tally]]  # protocol -> round tag -> tally
    mqtt: MqttSubscriber | None = None
    amqp_task: asyncio.Task | None = None
    ons: OnsDriver | None = None
    connections: Connections = field(default_factory=Connections)
    halt: asyncio.Event = field(default_factory=asyncio.Event)


async def chaos_round(tag: str, fault: str, group: Group, protocols: list[str], consumers: Consumers,
                      rng: random.Random, say) -> tuple[dict[str, Figures], float]:
    """One fault under load; each protocol's figures and the moment of the fault."""
    tallies = {protocol: Tally() for protocol in protocols}
    for protocol, tally in tallies.items():
        consumers.tallies[protocol][tag] = tally
    publishers: list[MqttPublisher] = []
    amqp_halt = asyncio.Event()
    amqp_task = None
    if "mqtt" in protocols:
        publishers = [MqttPublisher(group.mqtt_port, f"p{i}", tag, tallies["mqtt"], consumers.connections)
                      for i in range(MQTT_PUBLISHERS)]
        for publisher in publishers:
            publisher.start()
    if "amqp" in protocols:
        amqp_task = asyncio.ensure_future(amqp_publisher(group.amqp_port, tag, tallies["amqp"], amqp_halt,
                                                         consumers.connections))
    fault_at = time.monotonic()
    ons = None
    if "remoting" in protocols:
        ons = await OnsDriver.start({"cmd": "produce", "nameSrv": group.name_servers, "topic": REMOTING_TOPIC,
                                     "tag": tag}, on_producer_event(tallies["remoting"]), group.workdir,
                                    group.log_dir / "ons-producer.log")
    try:
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        connected_before = consumers.connections.snapshot()
        fault_at = await inject(fault, group, rng, say)
        deadline = fault_at + RECOVERY_S
        while time.monotonic() < deadline and any(t.first_ack_after(fault_at) is None for t in tallies.values()):
            await asyncio.sleep(0.1)
        state = await group.wait_whole(max(1.0, deadline - time.monotonic()))
        if state is None:
            say(f"# DEFECT fault={fault} round={tag}: the group is not whole {RECOVERY_S:.0f} s after the fault: "
                f"state={await group.etcd.state(GROUP)}")
        else:
            say(f"# {tag}: whole again {time.monotonic() - fault_at:.2f} s after the fault, leader={state['leader']} "
                f"epoch={state['epoch']}")
        await asyncio.sleep(1.0)
        connected_after = consumers.connections.snapshot()
        again = " ".join(f"{client}={count - connected_before.get(client, 0)}"
                         for client, count in sorted(connected_after.items()))
        say(f"# {tag}: connections made again after the fault: {again}")
    finally:
        load_end = time.monotonic()
        for publisher in publishers:
            publisher.halt.set()
        amqp_halt.set()
        await asyncio.gather(*(asyncio.to_thread(p.join, ACK_TIMEOUT_S + 10) for p in publishers))
        if amqp_task is not None:
            await asyncio.wait([amqp_task], timeout=ACK_TIMEOUT_S + 10)
        if ons is not None:
            await ons.stop()
    drain_until = time.monotonic() + DRAIN_S
    while time.monotonic() < drain_until and any(t.missing() for t in tallies.values()):
        await asyncio.sleep(0.2)
    return {protocol: tally.figures(fault_at, load_end) for protocol, tally in tallies.items()}, fault_at


def quiet_about_dropped_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """aiormq leaves the error of a connection a node closed in a future no one reads: expected
    here; anything else is reported as usual."""
    error = context.get("exception")
    if isinstance(error, (aio_pika.exceptions.AMQPError, ConnectionError)):
        return
    loop.default_exception_handler(context)


async def chaos(args: Any, lines: runner.Lines) -> int:
    asyncio.get_running_loop().set_exception_handler(quiet_about_dropped_connections)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-chaos-"))
    log_dir = Path(args.log_dir) if args.log_dir else workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    faults = args.faults.split(",")
    protocols = args.protocols.split(",")
    lines.emit(f"# chaos seed={seed} rounds={args.rounds} faults={args.faults} protocols={args.protocols} "
               f"flush={args.flush} logs={log_dir}")
    replay = (f"replay: python -m loadtest.chaos_replication --seed {seed} --rounds {args.rounds} "
              f"--faults {args.faults} --protocols {args.protocols} --flush {args.flush}; node logs in {log_dir}")
    group = Group(workdir, log_dir, args.flush)
    consumers = Consumers({protocol: {} for protocol in protocols})
    defects = 0
    try:
        try:
            await asyncio.to_thread(group.start)
            if await group.wait_whole() is None:
                raise RuntimeError("the group did not become whole at the start")
            if "mqtt" in protocols:
                consumers.mqtt = MqttSubscriber(group.mqtt_port, consumers.tallies["mqtt"], consumers.connections)
                await asyncio.to_thread(consumers.mqtt.start)
            if "amqp" in protocols:
                consumers.amqp_task = asyncio.ensure_future(
                    amqp_consumer(group.amqp_port, consumers.tallies["amqp"], consumers.halt, consumers.connections))
            if "remoting" in protocols:
                consumers.ons = await start_ons_consumer(group, consumers.tallies["remoting"])
        except (RuntimeError, TimeoutError, AssertionError) as exc:  # (AssertionError: a node did not start)
            lines.emit(f"# DEFECT at the start, before any fault: {exc or type(exc).__name__}; {replay}")
            defects += 1
            return 1
        for round_no in range(args.rounds):
            for fault in faults:
                tag = f"r{round_no}{fault}"
                if await group.wait_whole() is None:
                    lines.emit(f"# DEFECT before {tag}: the group is not whole: {await group.etcd.state(GROUP)}")
                    defects += 1
                figures, fault_at = await chaos_round(tag, fault, group, protocols, consumers, rng, lines.emit)
                for protocol, got in figures.items():
                    lines.emit(got.line(fault, protocol))
                    if got.unflagged_duplicates:
                        lines.emit(f"# note fault={fault} protocol={protocol}: {got.unflagged_duplicates} repeats "
                                   f"without the redelivered/DUP flag, {got.unexplained_duplicates} of a message "
                                   f"its publisher sent once")
                    if got.lost or got.unavailable_s is None:
                        defects += 1
                        tally = consumers.tallies[protocol][tag]
                        missing = [f"{m} sent={tally.sent[m]} acked_at={tally.acked_at[m] - fault_at:+.2f}s"
                                   for m in sorted(tally.missing())[:10]]
                        lines.emit(f"# DEFECT fault={fault} protocol={protocol} round={tag}: lost={got.lost} "
                                   f"(e.g. {missing}) unavailable_s={got.unavailable_s}; {replay}")
        if consumers.mqtt is not None and consumers.mqtt.sessions_lost:
            lines.emit(f"# DEFECT the MQTT subscriber's persistent session was lost {consumers.mqtt.sessions_lost} times")
            defects += 1
    finally:
        consumers.halt.set()
        if consumers.ons is not None:
            await consumers.ons.stop()
        if consumers.amqp_task is not None:
            await asyncio.wait([consumers.amqp_task], timeout=10)
        if consumers.mqtt is not None:
            await asyncio.to_thread(consumers.mqtt.close)
        await asyncio.to_thread(group.close)
        lines.emit(f"# chaos done: defects={defects} seed={seed} logs={log_dir}")
    return 1 if defects else 0


# -- throughput --------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def mqtt_burst(port: int, messages: int, publishers: int) -> float:
    """``messages`` QoS 1 publishes over ``publishers`` paho clients (WINDOW in flight each);
    the seconds from the first publish to the last PUBACK."""
    share = messages // publishers
    clients, done = [], []
    for i in range(publishers):
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"burst-{i}-{time.monotonic_ns()}")
        client.max_inflight_messages_set(WINDOW)
        finished, count = threading.Event(), [0]

        def acked(c: Any, u: Any, mid: Any, rc: Any, props: Any, count: list[int] = count,
                  finished: threading.Event = finished) -> None:
            count[0] += 1
            if count[0] == share:
                finished.set()

        client.on_publish = acked
        client.connect(HOST, port, keepalive=30)
        client.loop_start()
        clients.append(client)
        done.append(finished)
    started = time.monotonic()
    for i, client in enumerate(clients):
        for n in range(share):
            client.publish(f"burst/{i}", b"x" * 64, qos=1)
    for finished in done:
        if not finished.wait(120):
            raise RuntimeError("MQTT publishes not all acknowledged within 120 s")
    elapsed = time.monotonic() - started
    for client in clients:
        client.disconnect()
        client.loop_stop()
    return elapsed


async def amqp_burst(port: int, messages: int, publishers: int) -> float:
    """``messages`` confirmed persistent publishes over ``publishers`` connections (WINDOW
    unconfirmed each); the seconds from the first publish to the last confirm."""
    share = messages // publishers
    connections = [await amqp_connect(port) for _ in range(publishers)]
    channels = [await connection.channel() for connection in connections]
    await channels[0].declare_queue("burst", durable=True)

    async def publish(channel: Any) -> None:
        window = asyncio.Semaphore(WINDOW)

        async def one() -> None:
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"x" * 64, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="burst")
            finally:
                window.release()

        tasks = []
        for _ in range(share):
            await window.acquire()
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(publish(channel) for channel in channels)), 120)
    elapsed = time.monotonic() - started
    for connection in connections:
        await connection.close()
    return elapsed


async def ready_for_writes(protocol: str, port: int) -> None:
    """Until one publish is acknowledged (a group refuses writes until a follower is in sync)."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        try:
            if protocol == "mqtt":
                await asyncio.to_thread(mqtt_burst, port, 1, 1)
            else:
                await amqp_burst(port, 1, 1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def measure(protocol: str, port: int, pids: list[int], messages: int, publishers: int) -> tuple[float, list[float]]:
    """msgs/s and each pid's CPU microseconds per message, this process's (the clients') last."""
    await ready_for_writes(protocol, port)
    pids = [*pids, os.getpid()]
    before = [cpu_s(pid) for pid in pids]
    if protocol == "mqtt":
        elapsed = await asyncio.to_thread(mqtt_burst, port, messages, publishers)
    else:
        elapsed = await amqp_burst(port, messages, publishers)
    sent = messages // publishers * publishers
    return sent / elapsed, [(cpu_s(pid) - b) * 1e6 / sent for pid, b in zip(pids, before)]


async def throughput(args: Any, lines: runner.Lines) -> int:
    protocols = [protocol for protocol in args.protocols.split(",") if protocol in THROUGHPUT_PROTOCOLS]
    if "remoting" in args.protocols.split(","):
        lines.emit("# throughput: remoting is not measured here (loadtest/bench_remoting measures one node)")
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-chaos-throughput-"))
    log_dir = Path(args.log_dir) if args.log_dir else workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    lines.emit(f"# throughput messages={args.messages} publishers={args.publishers} flush={args.flush} logs={log_dir}")
    replicated: dict[str, tuple[float, list[float]] | str] = {}
    group = Group(workdir / "group", log_dir, args.flush)
    try:
        await asyncio.to_thread(group.start, "mqtt" in protocols)
        if await group.wait_whole() is None:
            raise RuntimeError("the group did not become whole")
        leader = await group.wait_leader()
        leader_pid = group.nodes[leader["node"]].proc.pid
        for protocol in protocols:
            if protocol == "mqtt":
                port, pids = group.mqtt_port, [leader_pid, group.gateway.pid]
            else:
                port, pids = group.nodes[leader["node"]].amqp_port, [leader_pid]
            replicated[protocol] = await measured_or_error(measure(protocol, port, pids, args.messages,
                                                                   args.publishers))
    finally:
        await asyncio.to_thread(group.close)
    mqtt_port, amqp_port = free_port(), free_port()
    single = await asyncio.to_thread(start_gateway, workdir / "single", mqtt_port=mqtt_port, amqp_port=amqp_port,
                                     flush=args.flush)
    failed = False
    try:
        for protocol in protocols:
            alone = await measured_or_error(measure(protocol, mqtt_port if protocol == "mqtt" else amqp_port,
                                                    [single.pid], args.messages, args.publishers))
            together = replicated[protocol]
            if isinstance(together, str) or isinstance(alone, str):
                failed = True
                lines.emit(f"replication mode=sync protocol={protocol} error=\"group: {together if isinstance(together, str) else 'ok'}; "
                           f"single node: {alone if isinstance(alone, str) else 'ok'}\"")
                continue
            (group_rate, group_cpu), (rate, cpu) = together, alone
            line = (f"replication mode=sync protocol={protocol} msgs_per_s={group_rate:.0f} "
                    f"single_node_msgs_per_s={rate:.0f} leader_cpu_us_per_msg={group_cpu[0]:.0f} "
                    f"single_node_cpu_us_per_msg={cpu[0]:.0f}")
            if protocol == "mqtt":
                line += f" gateway_node_cpu_us_per_msg={group_cpu[1]:.0f}"
            lines.emit(f"{line} gen_cpu_us_per_msg={group_cpu[-1]:.0f}")
    finally:
        await asyncio.to_thread(stop, single)
    return 1 if failed else 0


async def measured_or_error(run) -> tuple[float, list[float]] | str:
    """A measurement, or what made it fail (the run goes on with the next case)."""
    try:
        return await run
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}".replace('"', "'")


def main() -> None:
    parser = runner.parser(__doc__, whole_doc=True)
    parser.add_argument("--throughput", action="store_true", help="the throughput runs instead of the faults")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every fault (default 2)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of " + ",".join(FAULTS))
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated, of " + ",".join(PROTOCOLS))
    parser.add_argument("--seed", type=int, help="the random source's seed (to replay a run)")
    parser.add_argument("--flush", choices=("sync", "async"), default="async", help="every node's flush (default async)")
    parser.add_argument("--log-dir", help="where the nodes' stderr goes (NAME.log; default: in a temp dir)")
    parser.add_argument("--messages", type=int, default=20000, help="throughput: messages per protocol and run")
    parser.add_argument("--publishers", type=int, default=4, help="throughput: concurrent publishers")
    args = parser.parse_args()
    for noisy in ("aio_pika", "aiormq"):  # every dropped connection is expected here
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="coroutine 'Connection.close' was never awaited")
    for name, allowed in (("faults", FAULTS), ("protocols", PROTOCOLS)):
        unknown = set(getattr(args, name).split(",")) - set(allowed)
        if unknown:
            parser.error(f"--{name}: unknown {','.join(sorted(unknown))}")
    with runner.Lines(args.out) as lines:
        status = asyncio.run(throughput(args, lines) if args.throughput else chaos(args, lines))
    raise SystemExit(status)


if __name__ == "__main__":
    main()
