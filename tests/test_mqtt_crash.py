"""Crash safety through a real gateway process: QoS 1 and QoS 2 publishes acknowledged in sync
flush mode are all delivered after ``kill -9`` at a random moment of a load, or at the first
acknowledgement on a session created a moment before, and a restart (duplicates counted); what
a persistent session read and acknowledged is not delivered again once its progress was saved;
a QoS 2 delivery killed in the middle of its exchange is completed after the restart, never
repeated."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from protocols.mqtt.codec import encode
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, Publish

from .crash_support import free_port, kill9, seeded_random, start_gateway, stop
from .mqtt_support import PahoClient

LOAD = 3000  # messages per crash run


class KillingPublisher:
    """paho publishing ``LOAD`` numbered messages as fast as its window allows; the
    ``kill_at``-th acknowledgement (PUBACK, or PUBCOMP at QoS 2) kills the gateway from paho's
    network thread, so nothing more is done between the acknowledgement and the crash."""

    def __init__(self, port: int, client_id: str, qos: int, proc: subprocess.Popen, kill_at: int) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.max_inflight_messages_set(64)
        self.client.reconnect_delay_set(60, 120)  # (it must not publish again into the restarted gateway)
        self.qos = qos
        self.acked_mids: list[int] = []  # list.append is atomic: no lock shared with paho's thread
        self.sent: dict[int, int] = {}  # mid -> message number
        self.killed_at = 0.0

        def on_publish(client: paho.Client, userdata: object, mid: int, reason_code: object, properties: object) -> None:
            self.acked_mids.append(mid)
            if len(self.acked_mids) == kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                self.killed_at = time.monotonic()

        self.client.on_publish = on_publish
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, topic: str, numbers: range) -> None:
        for i in numbers:
            self.sent[self.client.publish(topic, str(i), self.qos).mid] = i

    async def acknowledged(self, proc: subprocess.Popen) -> set[int]:
        """After the kill: the numbers of the messages the gateway acknowledged."""
        await asyncio.to_thread(proc.wait, 30)
        await asyncio.to_thread(self.client.loop_stop)
        return {self.sent[mid] for mid in list(self.acked_mids)}


async def collect(client: PahoClient, wanted: set[int], counts: Counter[int], timeout_s: float = 15.0) -> None:
    """Count what ``client`` receives until it has had every number of ``wanted`` (or the
    timeout), then a quiet second more, so that duplicates are counted too."""
    deadline = time.monotonic() + timeout_s
    while not wanted <= counts.keys() and time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):
            for message in await client.receive(1, timeout=0.5):
                counts[int(message.payload)] += 1
    while True:
        try:
            for message in await client.receive(1, timeout=1.0):
                counts[int(message.payload)] += 1
        except AssertionError:
            return


def check(name: str, acknowledged: set[int], counts: Counter[int]) -> int:
    """Every acknowledged message was received; returns (and prints) the duplicates."""
    missing = acknowledged - counts.keys()
    duplicates = sum(n - 1 for n in counts.values())
    print(f"{name}: acknowledged={len(acknowledged)} received={len(counts)} duplicates={duplicates}")
    assert not missing, f"{name}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:10]}"
    return duplicates


@pytest.mark.slow
@pytest.mark.parametrize("qos", [1, 2])
async def test_kill_9_at_a_random_moment_under_load(tmp_path: Path, qos: int) -> None:
    """The gateway is killed at the k-th acknowledgement (k at random) of a publisher at full
    speed; after the restart, every acknowledged message reaches a persistent session that was
    offline (each once: nothing was published twice) and one that was reading during the load
    (QoS 1 may repeat what it read since its progress was last saved; QoS 2 repeats nothing)."""
    rng = seeded_random(f"mqtt qos {qos} random kill")
    data_dir, port = tmp_path / "data", free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    online = PahoClient(port, "reading-device", clean=False)
    try:
        offline = PahoClient(port, "offline-device", clean=False)
        await offline.connect()
        await offline.subscribe("telemetry/#", qos)
        await offline.disconnect()
        await online.connect()
        await online.subscribe("telemetry/+/load", qos)
        online.client.reconnect_delay_set(0.2, 1)  # paho reconnects it to the restarted gateway
        publisher = KillingPublisher(port, "producer", qos, proc, kill_at=rng.randrange(1, LOAD))
        publisher.publish("telemetry/line/load", range(LOAD))
        acknowledged = await publisher.acknowledged(proc)
    finally:
        kill9(proc)
    online_counts: Counter[int] = Counter()
    with contextlib.suppress(AssertionError):
        while True:  # what the reading session got before the crash
            for message in await online.receive(1, timeout=0.2):
                online_counts[int(message.payload)] += 1

    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        offline = PahoClient(port, "offline-device", clean=False)
        flags, _, _ = await offline.connect()
        assert flags.session_present
        offline_counts: Counter[int] = Counter()
        await collect(offline, acknowledged, offline_counts)
        await collect(online, acknowledged, online_counts)
        assert check("offline session", acknowledged, offline_counts) == 0
        duplicates = check("reading session", acknowledged, online_counts)
        if qos == 2:
            assert duplicates == 0
        await offline.disconnect()
        await online.disconnect()
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize("qos", [1, 2])
async def test_kill_9_at_the_first_acknowledgement_on_a_new_session(tmp_path: Path, qos: int) -> None:
    """A session and its wildcard queue created a moment ago, the gateway killed at the first
    acknowledgement of a publisher (itself a new persistent session): every acknowledged
    message reaches the session after the restart."""
    rng = seeded_random(f"mqtt qos {qos} first-ack kill")
    data_dir, port = tmp_path / "data", free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    topic = f"fresh/{rng.randrange(1 << 30)}"
    try:
        started = time.monotonic()
        device = PahoClient(port, "new-device", clean=False)
        await device.connect()
        await device.subscribe("fresh/#", qos)
        await device.disconnect()
        publisher = KillingPublisher(port, "new-producer", qos, proc, kill_at=1)
        publisher.publish(topic, range(50))
        acknowledged = await publisher.acknowledged(proc)
        print(f"killed {publisher.killed_at - started:.3f} s after the session was created")
    finally:
        kill9(proc)

    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        device = PahoClient(port, "new-device", clean=False)
        flags, _, _ = await device.connect()
        assert flags.session_present
        counts: Counter[int] = Counter()
        await collect(device, acknowledged, counts)
        assert check("new session", acknowledged, counts) == 0
        await device.disconnect()
    finally:
        stop(proc)


@pytest.mark.slow
async def test_read_progress_is_saved_within_its_interval(tmp_path: Path) -> None:
    """A persistent subscriber's offsets are saved at most ``mqtt_progress_save_interval_s``
    after its PUBACKs (not per loop turn): past that, a ``kill -9`` does not bring back what it
    had read."""
    data_dir = tmp_path / "data"
    port = free_port()
    interval = {"TIDEMQ_MQTT_PROGRESS_SAVE_INTERVAL_S": "0.2"}
    proc = start_gateway(data_dir, mqtt_port=port, env=interval)
    try:
        sub = PahoClient(port, "reader", clean=False)
        await sub.connect()
        await sub.subscribe("progress/t", 1)
        pub = PahoClient(port, "writer")
        await pub.connect()
        for i in range(20):
            await pub.publish("progress/t", f"{i}", 1)
        assert sorted(int(m.payload) for m in await sub.receive(20)) == list(range(20))
        await asyncio.sleep(1.0)  # acknowledged (paho acks on arrival), and five intervals later
        kill9(proc)
        # paho reconnects on its own: these clients must not come back to the restarted gateway
        # and take the session over from the ones below (they did, now and then)
        for client in (sub, pub):
            await asyncio.to_thread(client.client.loop_stop)
    finally:
        kill9(proc)

    proc = start_gateway(data_dir, mqtt_port=port, env=interval)
    try:
        sub = PahoClient(port, "reader", clean=False)
        flags, _, _ = await sub.connect()
        assert flags.session_present
        await sub.nothing_more(1.5)  # nothing again
        pub = PahoClient(port, "writer")
        await pub.connect()
        await pub.publish("progress/t", "20", 1)
        assert [m.payload for m in await sub.receive(1)] == [b"20"]
        await sub.disconnect()
        await pub.disconnect()
    finally:
        stop(proc)


@pytest.mark.slow
async def test_acknowledged_messages_of_a_new_shared_subscription_survive_kill_9(tmp_path: Path) -> None:
    """A shared subscription's group starts where its first member subscribed, and that start is
    on disk before the SUBACK: what a publisher got PUBACKs for right after reaches the group
    after a crash (it started at the queue's end again, after the messages, before the fix)."""
    data_dir = tmp_path / "data"
    port = free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        member = PahoClient(port, "member", clean=False)
        await member.connect()
        await member.subscribe("$share/workers/jobs/#", 1)
        await member.disconnect()
        pub = PahoClient(port, "producer")
        await pub.connect()
        for i in range(10):
            await pub.publish("jobs/a", f"{i}", 1)  # each waits for its PUBACK
        kill9(proc)
        await asyncio.to_thread(pub.client.loop_stop)
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        member = PahoClient(port, "member", clean=False)
        await member.connect()
        assert sorted(int(m.payload) for m in await member.receive(10)) == list(range(10))
        await member.disconnect()
    finally:
        kill9(proc)


class Flood:
    """Raw-socket publishers sending QoS 0 messages nobody subscribed to, as fast as the gateway
    reads them, until stopped (or the gateway dies): each turn of the gateway's loop then
    handles their reads beside the subscriber's packets, and lasts milliseconds, as under load."""

    def __init__(self, port: int, publishers: int = 2) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(port, i), daemon=True) for i in range(publishers)]
        for thread in self._threads:
            thread.start()

    def _send(self, port: int, index: int) -> None:
        chunk = encode(Publish(f"flood/{index}", b"f" * 100, 0), MQTT_3_1_1) * 1000
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(encode(Connect(f"flood-{index}", MQTT_3_1_1, keep_alive=600), MQTT_3_1_1))
            while not self._stop.is_set():
                sock.sendall(chunk)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


QOS2_BACKLOG = 300


@pytest.mark.slow
@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
async def test_a_qos2_delivery_is_not_repeated_after_kill_9_in_its_exchange(tmp_path: Path, version: int) -> None:
    await _qos2_exchange_killed(tmp_path, version, "exact/#")


@pytest.mark.slow
@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
async def test_a_shared_qos2_delivery_is_not_repeated_after_kill_9_in_its_exchange(tmp_path: Path, version: int) -> None:
    """The same through a shared subscription: the member's session keeps its shared QoS 2
    exchanges (written before the PUBLISH or PUBREL leaves) and what it completed; the group
    after the restart hands out neither again (it started again at its checkpointed offset and
    repeated every message completed since, before the fix)."""
    await _qos2_exchange_killed(tmp_path, version, "$share/workers/exact/#")


async def _qos2_exchange_killed(tmp_path: Path, version: int, topic_filter: str) -> None:
    """A persistent QoS 2 subscriber (paho, which hands a QoS 2 message to the application at
    PUBREL and then forgets its packet id) takes a backlog while publishers load the gateway;
    the gateway is killed as paho delivers the k-th message, before its PUBCOMP is sent. After
    the restart the same paho client reconnects: every message reaches it exactly once. A
    PUBREL (or PUBLISH) on the wire ahead of the session state that makes its retransmission
    recognisable (the QoS 2 record: packet id, offset, released) brings the message again."""
    rng = seeded_random(f"mqtt {version} qos 2 exchange kill" + ("" if topic_filter == "exact/#" else " shared"))
    data_dir, port = tmp_path / "data", free_port()
    session = {"clean": False} if version == MQTT_3_1_1 else {"clean": False, "session_expiry": 3600}
    proc = start_gateway(data_dir, mqtt_port=port)
    device = PahoClient(port, "exactly-once", version=version, **session)
    counts: Counter[int] = Counter()
    kill_at = rng.randrange(1, 100)
    flood = None
    try:
        await device.connect()
        await device.subscribe(topic_filter, 2)
        await device.disconnect()
        producer = PahoClient(port, "exact-producer")
        await producer.connect()
        infos = [producer.client.publish("exact/t", str(i), 2) for i in range(QOS2_BACKLOG)]
        for info in infos:
            await asyncio.to_thread(info.wait_for_publish, 10)
        await producer.disconnect()

        def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
            # paho's network thread, inside its PUBREL handling: PUBCOMP is not sent yet
            counts[int(message.payload)] += 1
            if counts.total() == kill_at:
                os.kill(proc.pid, signal.SIGKILL)

        flood = Flood(port)
        device.client.on_message = on_message
        device.client.reconnect_delay_set(0.2, 1)  # paho comes back to the restarted gateway
        await device.connect()
        await asyncio.to_thread(proc.wait, 30)
    finally:
        if flood is not None:
            flood.stop()
        kill9(proc)
    delivered_before = counts.total()

    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        deadline = time.monotonic() + 20
        while len(counts) < QOS2_BACKLOG and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # a quiet second more: duplicates come in it too
        repeated = sorted(n for n, c in counts.items() if c > 1)
        print(f"killed at delivery {kill_at}; delivered before the restart={delivered_before} "
              f"received={len(counts)} repeated={repeated[:20]}")
        assert not repeated, f"{len(repeated)} QoS 2 messages delivered twice, e.g. {repeated[:10]}"
        assert sorted(counts) == list(range(QOS2_BACKLOG))
        await device.disconnect()
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize("qos", [1, 2])
async def test_a_member_gets_its_unfinished_shared_deliveries_again_with_their_packet_ids_after_kill_9(
        tmp_path: Path, qos: int) -> None:
    """A persistent member of a shared subscription (paho, acknowledging by hand) holds
    deliveries unacknowledged when the gateway is killed: QoS 1 without PUBACK (its read
    progress saved), QoS 2 delivered to the application at PUBREL, without PUBCOMP. After the
    restart paho reconnects: the QoS 1 messages come again as retransmissions -- the same
    packet ids, DUP -- and the QoS 2 ones only as PUBRELs, which paho's application does not
    see; none comes as new (the group handed them all out again, new, before the fix: the
    session did not keep its shared deliveries)."""
    data_dir, port = tmp_path / "data", free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    got: list[tuple[int, bool, int]] = []  # (packet id, dup, number); list.append: atomic
    member = PahoClient(port, "holder", clean=False)
    member.client.manual_ack_set(True)
    member.client.on_message = lambda c, u, m: got.append((m.mid, bool(m.dup), int(m.payload)))
    try:
        await member.connect()
        await member.subscribe("$share/g/held/#", qos)
        producer = PahoClient(port, "held-producer")
        await producer.connect()
        for i in range(5):
            await producer.publish("held/a", str(i), qos)
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        first = list(got)
        assert [n for _, _, n in first] == list(range(5)) and not any(dup for _, dup, _ in first)
        await asyncio.sleep(1.5)  # (the read progress interval is 1 s: the session is saved)
        member.client.reconnect_delay_set(0.2, 1)  # paho comes back to the restarted gateway
        kill9(proc)
        await asyncio.to_thread(producer.client.loop_stop)
    finally:
        kill9(proc)
    got.clear()
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        deadline = time.monotonic() + 20
        while (len(got) < 5 if qos == 1 else not member.client.is_connected()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # a quiet moment more: copies handed out as new come in it too
        assert got == ([(mid, True, n) for mid, _, n in first] if qos == 1 else [])
        await member.disconnect()
    finally:
        stop(proc)


@pytest.mark.slow
async def test_shared_deliveries_a_restart_kept_for_a_member_go_to_another_when_its_session_ends(
        tmp_path: Path) -> None:
    """What a restart gives back to a member's session (QoS 1 deliveries it had not acknowledged)
    is its own while the session lasts; when the member comes back with a clean session, the
    group hands it to another member, once."""
    data_dir, port = tmp_path / "data", free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    got: list[int] = []
    holder = PahoClient(port, "holder", clean=False)
    holder.client.manual_ack_set(True)
    holder.client.on_message = lambda c, u, m: got.append(int(m.payload))
    try:
        await holder.connect()
        await holder.subscribe("$share/g/kept/#", 1)
        producer = PahoClient(port, "kept-producer")
        await producer.connect()
        for i in range(5):
            await producer.publish("kept/a", str(i), 1)
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert got == list(range(5))
        await asyncio.sleep(1.5)  # (the read progress interval is 1 s: the session is saved)
        kill9(proc)
        await asyncio.to_thread(holder.client.loop_stop)
        await asyncio.to_thread(producer.client.loop_stop)
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        other = PahoClient(port, "other", clean=False)
        await other.connect()
        await other.subscribe("$share/g/kept/#", 1)
        await other.nothing_more(1.0)  # (the holder's, while its session lasts)
        back = PahoClient(port, "holder", clean=True)
        await back.connect()
        assert sorted(int(m.payload) for m in await other.receive(5)) == list(range(5))
        await other.nothing_more()
        await back.disconnect()
        await other.disconnect()
    finally:
        stop(proc)
