"""The rules' MQTT bridge target (bridge/rules/targets/mqtt_bridge.py) against a real Mosquitto:
a paho subscriber on Mosquitto sees the events on the topic template; Mosquitto stopped and
killed, then started again mid-run loses nothing and keeps the order; a remote that refuses the credentials,
or a TLS certificate that does not verify, is retried and then dead-lettered with the reason."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from .mosquitto_support import Mosquitto, mosquitto  # noqa: F401 (the fixture)
from .mqtt_support import MQTT_5, PahoClient, Received, mqtt_port, running_gateway
from .rules_support import call, until
from .test_rules import admin_url


def numbers(received: list[Received]) -> list[int]:
    return [json.loads(m.payload)["n"] for m in received]


async def receive_all(client: PahoClient, got: list[int], wanted: int, timeout_s: float = 40.0) -> list[int]:
    """``got`` and the numbers ``client`` receives until it has each of 0..wanted-1 (repeats included)."""
    got = list(got)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while set(got) != set(range(wanted)):
        if loop.time() > deadline:
            raise AssertionError(f"the subscriber got {sorted(set(got))} of 0..{wanted - 1}")
        try:
            got += numbers(await client.receive(1, timeout=1.0))
        except AssertionError:
            continue
    return got


def first_seen(got: list[int]) -> list[int]:
    seen: set[int] = set()
    return [n for n in got if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]


@pytest.mark.parametrize("fault", ["stop", "kill"])
async def test_events_reach_mosquitto_and_a_restart_of_it_loses_nothing(data_dir: Path, mosquitto: Mosquitto,  # noqa: F811
                                                                         fault: str) -> None:
    cloud = PahoClient(mosquitto.port, "cloud-app", version=MQTT_5, clean=False, session_expiry=3600)
    await cloud.connect()
    await cloud.subscribe("cloud/#", qos=1)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "uplink", "sources": ["sensors/#"], "retry": {"initial_backoff_ms": 50, "max_backoff_ms": 400},
            "targets": [{"type": "mqtt", "url": f"mqtt://127.0.0.1:{mosquitto.port}",
                         "topic": "cloud/site1/${topic}", "timeout_s": 2}]})
        assert status == 201, row
        assert row["targets"] == [f"mqtt:mqtt://127.0.0.1:{mosquitto.port}/cloud/site1/${{topic}}"]
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        for n in range(30):
            await device.publish(f"sensors/r{n % 3}", json.dumps({"n": n}), 1)
        first = await cloud.receive(30)
        assert numbers(first) == list(range(30))
        assert [m.topic for m in first[:3]] == ["cloud/site1/sensors/r0", "cloud/site1/sensors/r1",
                                                "cloud/site1/sensors/r2"]
        properties = dict(first[0].properties.UserProperty)
        assert properties["ce-source"] == "/mqtt/clients/dev-1" and properties["ce-id"]
        assert first[0].properties.ContentType == "application/json"
        await until(lambda: gw.rules.engine.get("uplink")["lag"] == 0, what="the first events done")

        # the remote goes away (SIGTERM or SIGKILL): what matches now waits in TideMQ's store
        if fault == "stop":
            mosquitto.stop()
        else:
            mosquitto.kill()
        for n in range(30, 80):
            await device.publish(f"sensors/r{n % 3}", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("uplink")["retried"] >= 2, what="retries while Mosquitto is down")
        row = gw.rules.engine.get("uplink")
        assert row["lag"] > 0 and row["dead_lettered"] == 0 and "connect" in row["last_error"]
        mosquitto.start()
        for n in range(80, 100):  # (published while the bridge reconnects)
            await device.publish(f"sensors/r{n % 3}", json.dumps({"n": n}), 1)
        got = await receive_all(cloud, numbers(first), 100)
        assert first_seen(got) == list(range(100))  # in order (a repeat: an event sent again)
        await until(lambda: gw.rules.engine.get("uplink")["lag"] == 0, what="the backlog done")
        row = gw.rules.engine.get("uplink")
        assert (row["matched"], row["delivered"], row["dead_lettered"]) == (100, 100, 0)
        await device.disconnect()
    await cloud.disconnect()


async def test_a_remote_that_refused_connections_gets_the_events_as_soon_as_it_listens(data_dir: Path,
                                                                                        tmp_path: Path) -> None:
    """The remote is down when the events come: the bridge's connection is refused, and it is
    probed while the retry waits (30 s here), so the events go as soon as Mosquitto listens."""
    remote = Mosquitto(tmp_path / "late")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "late", "sources": ["sensors/#"], "retry": {"initial_backoff_ms": 30_000, "max_backoff_ms": 30_000},
            "targets": [{"type": "mqtt", "url": f"mqtt://127.0.0.1:{remote.port}", "topic": "cloud/${topic}",
                         "timeout_s": 2}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-late")
        await device.connect()
        for n in range(5):
            await device.publish("sensors/r1", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("late")["retried"] >= 1, what="a refused connection")
        remote.start()
        try:
            await until(lambda: gw.rules.engine.get("late")["delivered"] == 5, timeout_s=15,
                        what="the events delivered (acknowledged by Mosquitto) before the 30 s backoff ends")
        finally:
            remote.stop()
        await device.disconnect()


async def test_refused_credentials_are_retried_then_dead_lettered_and_good_ones_deliver(
        data_dir: Path, tmp_path: Path) -> None:
    remote = Mosquitto(tmp_path / "secured", users={"edge": "secret", "reader": "r"})
    remote.start()
    try:
        cloud = PahoClient(remote.port, "cloud-app", username="reader", password="r")
        await cloud.connect()
        await cloud.subscribe("up/#", qos=1)
        async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
            dead = PahoClient(mqtt_port(gw), "ops", version=MQTT_5)
            await dead.connect()
            await dead.subscribe("$rules/up/dead-letter", qos=1)
            rule = {"sources": ["sensors/#"], "retry": {"max_attempts": 3, "initial_backoff_ms": 10},
                    "targets": [{"type": "mqtt", "url": f"mqtt://127.0.0.1:{remote.port}", "topic": "up/${topic}",
                                 "username": "edge", "password": "wrong", "version": "3.1.1"}]}
            status, row = await call(admin_url(gw), "POST", "/admin/rules", {"name": "up", **rule})
            assert status == 201, row
            device = PahoClient(mqtt_port(gw), "dev-1")
            await device.connect()
            await device.publish("sensors/a", json.dumps({"n": 1}), 1)
            [letter] = await dead.receive(1)
            properties = dict(letter.properties.UserProperty)
            reason = properties["dead-letter-reason"]
            assert reason.startswith("connect: MqttConnectError") and "3 attempts made (max_attempts 3)" in reason, reason
            assert "not authori" in reason.lower() or "bad user name or password" in reason.lower(), reason
            assert properties["dead-letter-attempts"] == "3"
            assert properties["dead-letter-target"] == f"mqtt:mqtt://127.0.0.1:{remote.port}/up/${{topic}}"
            assert json.loads(letter.payload) == {"n": 1}
            rule["targets"][0]["password"] = "secret"  # type: ignore[index]
            status, row = await call(admin_url(gw), "PUT", "/admin/rules/up", rule)
            assert status == 200, row
            await device.publish("sensors/a", json.dumps({"n": 2}), 1)
            [message] = await cloud.receive(1)
            assert (message.topic, json.loads(message.payload)) == ("up/sensors/a", {"n": 2})
            await until(lambda: gw.rules.engine.get("up")["delivered"] == 1, what="the delivery counted")
            await device.disconnect()
            await dead.disconnect()
        await cloud.disconnect()
    finally:
        remote.stop()


async def test_tls_to_the_remote_verifies_its_certificate(data_dir: Path, tmp_path: Path) -> None:
    remote = Mosquitto(tmp_path / "tls", tls=True)
    remote.start()
    try:
        cloud = PahoClient(remote.port, "cloud-app")  # (the plain listener)
        await cloud.connect()
        await cloud.subscribe("secure/#", qos=1)
        async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
            dead = PahoClient(mqtt_port(gw), "ops", version=MQTT_5)
            await dead.connect()
            await dead.subscribe("$rules/+/dead-letter", qos=1)
            url = f"mqtts://127.0.0.1:{remote.tls_port}"
            for name, tls in (("trusted", {"ca_file": str(remote.certificate)}), ("untrusted", {})):
                status, row = await call(admin_url(gw), "POST", "/admin/rules", {
                    "name": name, "sources": [f"{name}/#"], "retry": {"max_attempts": 2, "initial_backoff_ms": 10},
                    "targets": [{"type": "mqtt", "url": url, "topic": "secure/${topic}", "tls": tls}]})
                assert status == 201, row
            device = PahoClient(mqtt_port(gw), "dev-1")
            await device.connect()
            await device.publish("trusted/a", json.dumps({"n": 1}), 1)
            await device.publish("untrusted/a", json.dumps({"n": 2}), 1)
            [message] = await cloud.receive(1)
            assert (message.topic, json.loads(message.payload)) == ("secure/trusted/a", {"n": 1})
            [letter] = await dead.receive(1)
            properties = dict(letter.properties.UserProperty)
            assert properties["dead-letter-rule"] == "untrusted"
            assert "CERTIFICATE_VERIFY_FAILED" in properties["dead-letter-reason"], properties
            await device.disconnect()
            await dead.disconnect()
        await cloud.disconnect()
    finally:
        remote.stop()


async def test_a_bad_mqtt_target_is_refused_with_its_path(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        for target, path in (({"url": "http://x"}, "$.targets[0].url"),
                             ({"url": "mqtt://x", "qos": 0}, "$.targets[0].qos"),
                             ({"url": "mqtt://x", "topic": "a/+/${topic}"}, "$.targets[0].topic"),
                             ({"url": "mqtt://x", "topic": "a/${client}"}, "$.targets[0].topic"),
                             ({"url": "mqtt://x", "tls": {}}, "$.targets[0].tls"),
                             ({"url": "mqtt://x", "password": "p"}, "$.targets[0].password")):
            status, row = await call(admin_url(gw), "POST", "/admin/rules", {
                "name": "bad", "sources": ["a/#"], "targets": [{"type": "mqtt", **target}]})
            assert (status, row["path"]) == (400, path), row
