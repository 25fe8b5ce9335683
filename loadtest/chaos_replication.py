"""Chaos and throughput of a replicated store: faults injected into a 3-replica group under load.

    python -m loadtest.chaos_replication [--rounds 2] [--faults leader_kill9,leader_sigstop,follower_kill9,restart_all]
                                         [--window 1] [--sigstop-s S] [--max-unavailable-s 10]
                                         [--protocols mqtt,amqp,remoting] [--seed N] [--flush async]
                                         [--log-dir DIR] [--out FILE]
    python -m loadtest.chaos_replication --throughput [--seconds 5] [--protocols mqtt,amqp] [--flush async]

Real processes on 127.0.0.1: etcd (tests/etcd_support.py), three ``--role store`` nodes of the
replication group g1 (``replication = sync``, ``min_insync_replicas = 2``) and one ``--role
gateway`` node that follows the leader. The stderr of each node and client process is appended
to ``NAME.log`` under ``--log-dir`` (default: a new temp dir, printed at the start).

Chaos (the default): for each round and each fault, numbered messages, each published again
until acknowledged, one in flight per publisher (MQTT and AMQP: ``--window`` N in flight):

- mqtt: two QoS 1 publishers (paho, clean sessions) through the gateway node; a persistent
  session (clean_session false) subscribed to ``chaos/+/+`` at QoS 1 receives them (not
  ``chaos/#``: that matches the remoting topic ``chaos`` too, whose producer's retries may store a
  message twice, as RocketMQ allows: the MQTT figures would count them as MQTT repeats);
- amqp: a publisher with confirms to the durable queue ``chaos`` through the gateway node's
  AMQP (relayed to the leader); a consumer (basic.consume, manual acks) receives them;
- remoting: ali-ons (loadtest/clients/chaos_remoting.js under node, tests/remoting_js's packages) with
  the three store nodes' remoting addresses as name servers: a producer (SEND_OK) and a push
  consumer from the topic's first offset.

Consumers run the whole run long and reconnect when dropped. After 1-2 s of load (seeded) the
fault:

- ``leader_kill9``: kill -9 of the leader; once another leads, it is started again;
- ``leader_sigstop``: SIGSTOP of the leader until another leads (at least 1.5 leases, or
  ``--sigstop-s``), then SIGCONT;
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
protocol unavailable longer than ``--max-unavailable-s`` (10 s) or for good, with how to replay
it (``--seed``). ``# note`` lines
count repeats delivered without the redelivered/DUP flag (remoting: reconsumeTimes 0), and
those of a message its publisher sent once (not explained by the publisher's own retry; ali-ons'
internal retries are not seen). At the end, one ``# summary`` line per fault and protocol adds
up its rounds (acked, lost, duplicated, the median and worst unavailable_s). The exit status is
1 when there was a defect.

Throughput (``--throughput``): per protocol (mqtt, amqp), the benchmarks' own load generators
(forked raw-socket clients) for ``--seconds``: bench_mqtt's QoS 1 fan-in (8 publishers, 1,000
unacknowledged each, one subscriber) through the gateway node (store nodes serve no MQTT), and
bench_amqp's confirmed publish (4 publishers, 1,000 unconfirmed each) straight to the leader;
then the same against one standalone node (``python -m gateway serve``, fresh data dir, same
``--flush``). One line per protocol:

    replication mode=sync protocol=P msgs_per_s=N single_node_msgs_per_s=N leader_cpu_us_per_msg=N
        followers_cpu_us_per_msg=N single_node_cpu_us_per_msg=N [gateway_node_cpu_us_per_msg=N]

(``followers_cpu_us_per_msg``: the two followers' together.) AMQP's confirmed publish is also run
through the gateway node's AMQP relay (how clients that stay connected through a failover publish):

    replication_relayed mode=sync protocol=amqp msgs_per_s=N leader_cpu_us_per_msg=N
        followers_cpu_us_per_msg=N gateway_node_cpu_us_per_msg=N single_node_msgs_per_s=N

MQTT goes through a gateway node in
the group and not on one node, so MQTT is also run through a gateway node to one store node
without replication, the same topology less the replication:

    replication_vs_unreplicated protocol=mqtt msgs_per_s=N unreplicated_cluster_msgs_per_s=N ratio=X
        store_node_cpu_us_per_msg=N gateway_node_cpu_us_per_msg=N

Then, per protocol, publish-to-delivery latency at a paced 1,000 msgs/s (bench_mqtt's QoS 1
latency through the gateway node, bench_amqp's with confirms straight to the leader), group and
one node:

    replication_latency mode=sync protocol=P rate=1000 p50_ms=N p99_ms=N single_node_p50_ms=N
        single_node_p99_ms=N extra_p50_ms=N via=gateway_node|leader

(MQTT's extra includes the gateway node's store link, AMQP's only the replication.)
msgs_per_s: messages received by the subscriber (MQTT) or confirmed (AMQP) per second, as the
benchmarks count them. CPU figures: user + system seconds of the process (psutil) over the case,
set-up included, per message counted; followers: the two together.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import signal
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aio_pika
import psutil

from loadtest import bench_mqtt, runner
from loadtest.brokers import Broker
from loadtest.scenarios import amqp_scenarios
from loadtest.chaos_tally import Figures, Tally, summary_lines
from loadtest.clients.chaos_clients import (
    ACK_TIMEOUT_S, Connections, MqttPublisher, MqttSubscriber, OnsDriver, amqp_connect, amqp_consumer, amqp_publisher,
    start_ons_consumer, start_ons_producer)
from loadtest.scenarios.replication_group import FAULTS, GROUP, RECOVERY_S, Group, inject
from tests.crash_support import free_port, launch, start_gateway, stop

PROTOCOLS = ("mqtt", "amqp", "remoting")
THROUGHPUT_PROTOCOLS = ("mqtt", "amqp")
DRAIN_S = 30.0
MQTT_PUBLISHERS = 2


# -- a chaos round -----------------------------------------------------------------------------
@dataclass
class Round:
    figures: dict[str, Figures]  # per protocol
    fault_at: float
    whole: bool  # every node in sync again within RECOVERY_S


@dataclass
class Consumers:
    """What runs the whole run long: the consumers, each round's tallies, the clients' connections."""

    tallies: dict[str, dict[str, Tally]]  # protocol -> round tag -> tally
    mqtt: MqttSubscriber | None = None
    amqp_task: asyncio.Task | None = None
    ons: OnsDriver | None = None
    connections: Connections = field(default_factory=Connections)
    halt: asyncio.Event = field(default_factory=asyncio.Event)


async def chaos_round(tag: str, fault: str, group: Group, protocols: list[str], consumers: Consumers,
                      rng: random.Random, say, sigstop_s: float = 0.0, window: int = 1) -> Round:
    """One fault under load: each protocol's figures, the moment of the fault, and whether the
    group was whole again in time."""
    tallies = {protocol: Tally() for protocol in protocols}
    for protocol, tally in tallies.items():
        consumers.tallies[protocol][tag] = tally
    publishers: list[MqttPublisher] = []
    amqp_halt = asyncio.Event()
    amqp_task = None
    if "mqtt" in protocols:
        publishers = [MqttPublisher(group.mqtt_port, f"p{i}", tag, tallies["mqtt"], consumers.connections, window)
                      for i in range(MQTT_PUBLISHERS)]
        for publisher in publishers:
            publisher.start()
    if "amqp" in protocols:
        amqp_task = asyncio.ensure_future(amqp_publisher(group.amqp_port, tag, tallies["amqp"], amqp_halt,
                                                         consumers.connections, window))
    fault_at = time.monotonic()
    whole = False
    ons = None
    if "remoting" in protocols:
        ons = await start_ons_producer(group.name_servers, tag, tallies["remoting"], group.workdir, group.log_dir)
    try:
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        connected_before = consumers.connections.snapshot()
        fault_at = await inject(fault, group, rng, say, sigstop_s)
        deadline = fault_at + RECOVERY_S
        while time.monotonic() < deadline and any(t.first_ack_after(fault_at) is None for t in tallies.values()):
            await asyncio.sleep(0.1)
        state = await group.wait_whole(max(1.0, deadline - time.monotonic()))
        whole = state is not None
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
    return Round({protocol: tally.figures(fault_at, load_end) for protocol, tally in tallies.items()}, fault_at, whole)


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
              f"--faults {args.faults} --protocols {args.protocols} --flush {args.flush} --window {args.window} "
              f"--sigstop-s {args.sigstop_s} "
              f"--max-unavailable-s {args.max_unavailable_s}; node logs in {log_dir}")
    group = Group(workdir, log_dir, args.flush)
    consumers = Consumers({protocol: {} for protocol in protocols})
    defects = 0
    runs: list[tuple[str, str, Figures]] = []
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
                consumers.ons = await start_ons_consumer(group.name_servers, consumers.tallies["remoting"],
                                                         group.workdir, group.log_dir)
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
                try:
                    done = await chaos_round(tag, fault, group, protocols, consumers, rng, lines.emit,
                                             args.sigstop_s, args.window)
                except (RuntimeError, AssertionError) as exc:  # (AssertionError: a node did not start again)
                    lines.emit(f"# DEFECT fault={fault} round={tag}: the fault did not complete: {exc}; {replay}")
                    defects += 1
                    return 1
                fault_at = done.fault_at
                if not done.whole:
                    defects += 1
                for protocol, got in done.figures.items():
                    runs.append((fault, protocol, got))
                    lines.emit(got.line(fault, protocol))
                    if got.unflagged_duplicates:
                        lines.emit(f"# note fault={fault} protocol={protocol}: {got.unflagged_duplicates} repeats "
                                   f"without the redelivered/DUP flag, {got.unexplained_duplicates} of a message "
                                   f"its publisher sent once")
                    problems = []
                    if got.lost:
                        tally = consumers.tallies[protocol][tag]
                        missing = [f"{m} sent={tally.sent[m]} acked_at={tally.acked_at[m] - fault_at:+.2f}s"
                                   for m in sorted(tally.missing())[:10]]
                        problems.append(f"{got.lost} acknowledged messages lost, e.g. {missing}")
                    if got.unavailable_s is None:
                        problems.append("nothing acknowledged after the fault")
                    elif got.unavailable_s > args.max_unavailable_s:
                        problems.append(f"no acknowledgement for {got.unavailable_s:.2f} s "
                                        f"(over --max-unavailable-s {args.max_unavailable_s:g})")
                    if problems:
                        defects += 1
                        lines.emit(f"# DEFECT fault={fault} protocol={protocol} round={tag}: {'; '.join(problems)}; "
                                   f"{replay}")
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
        for line in summary_lines(runs):
            lines.emit(line)
        lines.emit(f"# chaos done: defects={defects} seed={seed} logs={log_dir}")
    return 1 if defects else 0


# -- throughput --------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def figure(line: str, name: str) -> float:
    """A ``name=N`` figure of a benchmark's result line."""
    found = re.search(rf"\b{name}=([0-9.]+)", line)
    if found is None:
        raise RuntimeError(f"no {name} in: {line}")
    return float(found.group(1))


def burst(protocol: str, target: Broker, seconds: float) -> tuple[float, float]:
    """bench_mqtt's QoS 1 fan-in (8 publishers, 1 subscriber) or bench_amqp's confirmed publish
    (4 publishers) against ``target`` for ``seconds``: msgs/s and the messages counted."""
    if protocol == "mqtt":
        line = bench_mqtt.fanin(target, replace(bench_mqtt.QUICK, fanin_seconds=seconds), 1)
        return figure(line, "msgs_per_s"), figure(line, "received")
    line = amqp_scenarios.publish_confirm(target, replace(amqp_scenarios.QUICK, seconds=seconds))
    return figure(line, "msgs_per_s"), figure(line, "confirmed")


def latency(protocol: str, target: Broker, seconds: float) -> tuple[float, float]:
    """p50 and p99 milliseconds from publish to delivery at a paced 1,000 msgs/s (bench_mqtt's
    QoS 1 latency, bench_amqp's with confirms): a replicated message is delivered once confirmed."""
    if protocol == "mqtt":
        line = bench_mqtt.latency(target, replace(bench_mqtt.QUICK, latency_seconds=seconds))
    else:
        line = amqp_scenarios.latency(target, replace(amqp_scenarios.QUICK, latency_seconds=seconds))
    return figure(line, "p50_ms"), figure(line, "p99_ms")


def measure(protocol: str, target: Broker, pids: list[int], seconds: float) -> tuple[float, list[float]]:
    """msgs/s and each pid's CPU microseconds per message (setup included)."""
    before = [cpu_s(pid) for pid in pids]
    rate, messages = burst(protocol, target, seconds)
    return rate, [(cpu_s(pid) - b) * 1e6 / max(1.0, messages) for pid, b in zip(pids, before)]


async def ready_for_writes(port: int) -> None:
    """Until one confirmed AMQP publish (a group refuses writes until a follower is in sync)."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        try:
            connection = await amqp_connect(port)
            try:
                channel = await connection.channel()
                await channel.default_exchange.publish(aio_pika.Message(b"ready"), routing_key="ready")
                return
            finally:
                await connection.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def as_broker(name: str, port: int, proc: subprocess.Popen, workdir: Path, log: Path) -> Broker:
    """A node started here, as the benchmarks' scenarios take a broker."""
    return Broker(name, port, proc, workdir, log)  # type: ignore[arg-type]


async def throughput(args: Any, lines: runner.Lines) -> int:
    protocols = [protocol for protocol in args.protocols.split(",") if protocol in THROUGHPUT_PROTOCOLS]
    if "remoting" in args.protocols.split(","):
        lines.emit("# throughput: remoting is not measured here (loadtest/bench_remoting measures one node)")
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-chaos-throughput-"))
    log_dir = Path(args.log_dir) if args.log_dir else workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    lines.emit(f"# throughput seconds={args.seconds:g} flush={args.flush} logs={log_dir}")
    replicated: dict[str, tuple[float, list[float]] | str] = {}
    relayed: tuple[float, list[float]] | str = "not measured"  # AMQP through the gateway node's relay
    delays: dict[str, tuple[float, float] | str] = {}  # p50, p99 ms
    group = Group(workdir / "group", log_dir, args.flush)
    try:
        await asyncio.to_thread(group.start, True)  # (MQTT and the AMQP relay go through the gateway node)
        if await group.wait_whole() is None:
            raise RuntimeError("the group did not become whole")
        leader = await group.wait_leader()
        node = group.nodes[leader["node"]]
        followers = [other.proc.pid for other in group.nodes.values() if other is not node]
        await ready_for_writes(node.amqp_port)
        for protocol in protocols:
            if protocol == "mqtt":
                target = as_broker("gw1", group.mqtt_port, group.gateway, workdir, log_dir / "gw1.log")
                pids = [node.proc.pid, *followers, group.gateway.pid]
            else:
                target = as_broker(node.name, node.amqp_port, node.proc, workdir, log_dir / f"{node.name}.log")
                pids = [node.proc.pid, *followers]
            replicated[protocol] = await measured_or_error(asyncio.to_thread(measure, protocol, target, pids,
                                                                             args.seconds))
            if protocol == "amqp":
                through = as_broker("gw1", group.amqp_port, group.gateway, workdir, log_dir / "gw1.log")
                relayed = await measured_or_error(asyncio.to_thread(
                    measure, protocol, through, [*pids, group.gateway.pid], args.seconds))
            delays[protocol] = await measured_or_error(asyncio.to_thread(latency, protocol, target, args.seconds))
    finally:
        await asyncio.to_thread(group.close)
    mqtt_port, amqp_port = free_port(), free_port()
    single = await asyncio.to_thread(start_gateway, workdir / "single", mqtt_port=mqtt_port, amqp_port=amqp_port,
                                     flush=args.flush)
    failed = False
    try:
        for protocol in protocols:
            port = mqtt_port if protocol == "mqtt" else amqp_port
            target = as_broker("single", port, single, workdir, log_dir / "single.log")
            alone = await measured_or_error(asyncio.to_thread(measure, protocol, target, [single.pid], args.seconds))
            together = replicated[protocol]
            if isinstance(together, str) or isinstance(alone, str):
                failed = True
                lines.emit(error_line("replication", protocol, together, alone))
                continue
            (group_rate, group_cpu), (rate, cpu) = together, alone
            line = (f"replication mode=sync protocol={protocol} msgs_per_s={group_rate:.0f} "
                    f"single_node_msgs_per_s={rate:.0f} leader_cpu_us_per_msg={group_cpu[0]:.1f} "
                    f"followers_cpu_us_per_msg={group_cpu[1] + group_cpu[2]:.1f} "
                    f"single_node_cpu_us_per_msg={cpu[0]:.1f}")
            if protocol == "mqtt":
                line += f" gateway_node_cpu_us_per_msg={group_cpu[3]:.1f}"
            lines.emit(line)
            if protocol == "amqp":
                if isinstance(relayed, str):
                    failed = True
                    lines.emit(error_line("replication_relayed", protocol, relayed, alone))
                else:
                    lines.emit(f"replication_relayed mode=sync protocol=amqp msgs_per_s={relayed[0]:.0f} "
                               f"leader_cpu_us_per_msg={relayed[1][0]:.1f} "
                               f"followers_cpu_us_per_msg={relayed[1][1] + relayed[1][2]:.1f} "
                               f"gateway_node_cpu_us_per_msg={relayed[1][3]:.1f} single_node_msgs_per_s={rate:.0f}")
            alone_delay = await measured_or_error(asyncio.to_thread(latency, protocol, target, args.seconds))
            together_delay = delays[protocol]
            if isinstance(together_delay, str) or isinstance(alone_delay, str):
                failed = True
                lines.emit(error_line("replication_latency", protocol, together_delay, alone_delay))
                continue
            lines.emit(f"replication_latency mode=sync protocol={protocol} rate=1000 p50_ms={together_delay[0]:.2f} "
                       f"p99_ms={together_delay[1]:.2f} single_node_p50_ms={alone_delay[0]:.2f} "
                       f"single_node_p99_ms={alone_delay[1]:.2f} "
                       f"extra_p50_ms={together_delay[0] - alone_delay[0]:.2f}"
                       + (" via=gateway_node" if protocol == "mqtt" else " via=leader"))
    finally:
        await asyncio.to_thread(stop, single)
    if "mqtt" in protocols:
        failed = await unreplicated_cluster(workdir, log_dir, args, replicated["mqtt"], lines) or failed
    return 1 if failed else 0


async def unreplicated_cluster(workdir: Path, log_dir: Path, args: Any, together: tuple[float, list[float]] | str,
                               lines: runner.Lines) -> bool:
    """MQTT's fan-in again through a gateway node, to one store node without replication: what
    the replication itself costs, apart from the gateway node's hop (True: it failed)."""
    remoting, mqtt_port = free_port(), free_port()
    store = await asyncio.to_thread(launch, [
        "--role", "store", "--node-id", "s0", "--remoting-bind", f"127.0.0.1:{remoting}", "--mqtt-bind", "",
        "--amqp-bind", "", "--data-dir", str(workdir / "s0"), "--flush", args.flush], name="s0",
        log=log_dir / "s0.log")
    gateway = None
    try:
        gateway = await asyncio.to_thread(launch, [
            "--role", "gateway", "--node-id", "gw0", "--store", f"127.0.0.1:{remoting}", "--mqtt-bind",
            f"127.0.0.1:{mqtt_port}", "--data-dir", str(workdir / "gw0"), "--flush", args.flush], name="gw0",
            log=log_dir / "gw0.log")
        target = as_broker("gw0", mqtt_port, gateway, workdir, log_dir / "gw0.log")
        alone = await measured_or_error(asyncio.to_thread(measure, "mqtt", target, [store.pid, gateway.pid],
                                                          args.seconds))
    finally:
        for proc in (gateway, store):
            if proc is not None:
                await asyncio.to_thread(stop, proc)
    if isinstance(together, str) or isinstance(alone, str):
        lines.emit(error_line("replication_vs_unreplicated", "mqtt", together, alone))
        return True
    (group_rate, _), (rate, cpu) = together, alone
    lines.emit(f"replication_vs_unreplicated protocol=mqtt msgs_per_s={group_rate:.0f} "
               f"unreplicated_cluster_msgs_per_s={rate:.0f} ratio={group_rate / rate:.2f} "
               f"store_node_cpu_us_per_msg={cpu[0]:.1f} gateway_node_cpu_us_per_msg={cpu[1]:.1f}")
    return False


def error_line(kind: str, protocol: str, together: object, alone: object) -> str:
    """The line of a case that failed, on the group or the single node (``str``: what failed)."""
    return (f"{kind} mode=sync protocol={protocol} error=\"group: {together if isinstance(together, str) else 'ok'}; "
            f"single node: {alone if isinstance(alone, str) else 'ok'}\"")


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
    parser.add_argument("--window", type=int, default=1,
                        help="chaos: messages each MQTT and AMQP publisher keeps unacknowledged (default 1)")
    parser.add_argument("--sigstop-s", type=float, default=0.0,
                        help="leader_sigstop keeps the leader stopped at least this long (default: until another "
                             "leads, at least 1.5 leases)")
    parser.add_argument("--max-unavailable-s", type=float, default=10.0,
                        help="a longer unavailable_s is reported as a defect (default 10)")
    parser.add_argument("--seed", type=int, help="the random source's seed (to replay a run)")
    parser.add_argument("--flush", choices=("sync", "async"), default="async", help="every node's flush (default async)")
    parser.add_argument("--log-dir", help="where the nodes' stderr goes (NAME.log; default: in a temp dir)")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput: how long each case publishes")
    args = parser.parse_args()
    for noisy in ("aio_pika", "aiormq"):  # every dropped connection is expected here
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="coroutine 'Connection.close' was never awaited")
    for name, allowed in (("faults", FAULTS), ("protocols", PROTOCOLS)):
        unknown = set(getattr(args, name).split(",")) - set(allowed)
        if unknown:
            parser.error(f"--{name}: unknown {','.join(sorted(unknown))}")
    with runner.Lines(args.out) as lines:
        status = asyncio.run(stopped_by_sigterm(throughput(args, lines) if args.throughput else chaos(args, lines)))
    raise SystemExit(status)


async def stopped_by_sigterm(run) -> int:
    """``run``, cancelled by SIGTERM as by Ctrl-C: its cleanup stops every process it started."""
    task = asyncio.ensure_future(run)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        return 130


if __name__ == "__main__":
    main()
