"""Crash safety through a real gateway process: QoS 1 publishes acknowledged in sync flush mode
are all delivered after ``kill -9`` and a restart, to a persistent session that was offline; what
a persistent session read and acknowledged is not delivered again once its progress was saved."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from .crash_support import free_port, kill9, start_gateway, stop
from .mqtt_support import PahoClient


@pytest.mark.slow
async def test_acknowledged_qos1_survives_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        sub = PahoClient(port, "offline-device", clean=False)
        await sub.connect()
        await sub.subscribe("telemetry/#", 1)
        await sub.disconnect()

        acked_mids: list[int] = []  # list.append is atomic: no lock shared with paho's thread
        pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="producer")
        pub.max_inflight_messages_set(64)
        sent: dict[int, int] = {}
        pub.on_publish = lambda client, userdata, mid, reason_code, properties: acked_mids.append(mid)
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        for i in range(1500):
            sent[pub.publish(f"telemetry/{i % 7}", f"{i}", 1).mid] = i
            if i % 100 == 0:
                await asyncio.sleep(0.01)
        kill9(proc)  # mid-load: many publishes still in flight
        await asyncio.to_thread(pub.loop_stop)
        acknowledged = {sent[mid] for mid in list(acked_mids)}
        assert 100 < len(acknowledged), "the crash came too early to prove anything"
    finally:
        kill9(proc)

    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        sub = PahoClient(port, "offline-device", clean=False)
        flags, _, _ = await sub.connect()
        assert flags.session_present
        got: set[int] = set()
        deadline = time.monotonic() + 20
        while not acknowledged <= got and time.monotonic() < deadline:
            try:
                for message in await sub.receive(1, timeout=1.0):
                    got.add(int(message.payload))
            except AssertionError:
                continue
        missing = acknowledged - got
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:10]}"
        await sub.disconnect()
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
