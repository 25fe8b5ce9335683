"""A rule whose target (a webhook; an MQTT bridge to a real Mosquitto) is down when the gateway
is killed with ``kill -9`` loses nothing: what
matched waits in the store behind the rule's durable cursor and reaches the target, in order,
once a new process runs the rule (declared in the configuration file) and the target is back.
Only what at-least-once allows comes twice: events delivered after the last offset checkpoint."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from .crash_support import free_port, kill9, launch, stop
from .mosquitto_support import Mosquitto
from .mqtt_support import MQTT_5, PahoClient
from .rules_support import Webhook, admin, until


def config(path: Path, url: str) -> Path:
    # offsets checkpointed often: a cursor committed past an event not yet delivered would be on
    # disk before the kill, and the test would see the loss
    path.write_text(f"""
checkpoint_interval_s = 0.1

[event_rules.meters]
sources = ["meters/#"]
pattern = {{ data = {{ n = [{{ numeric = [">=", 0] }}] }} }}
targets = [{{ type = "webhook", url = "{url}", timeout_s = 2 }}]
retry = {{ initial_backoff_ms = 20, max_backoff_ms = 200 }}
""")
    return path


def gateway(data_dir: Path, port: int, config_file: Path):
    return launch(["--data-dir", str(data_dir), "--mqtt-bind", f"127.0.0.1:{port}", "--amqp-bind", "",
                   "--remoting-bind", "", "--config", str(config_file), "--flush", "sync"])


async def test_kill_9_while_the_webhook_is_down_loses_nothing(data_dir: Path, tmp_path: Path) -> None:
    hook = Webhook()
    await hook.up()
    settings = config(tmp_path / "tidemq.toml", hook.url)
    port = free_port()
    proc = gateway(data_dir, port, settings)
    try:
        device = PahoClient(port, "meter")
        await device.connect()
        for n in range(10):
            await device.publish(f"meters/m{n % 2}", json.dumps({"n": n}), 1)
        await hook.wait_for(10)
        hook.status = 503  # the target fails: what matches from now on waits behind the cursor
        for n in range(10, 30):
            await device.publish(f"meters/m{n % 2}", json.dumps({"n": n}), 1)  # (PUBACK: stored)
        # (about 1.5 s of attempts: many offset checkpoints while the webhook fails)
        await until(lambda: hook.refused >= 10, what="the rule to try the failing webhook")
        kill9(proc)
        device.client.loop_stop()  # (its connection died with the process)
        before = [hit.json()["n"] for hit in hook.received]
        assert before == list(range(10))
        hook.status = 200
        proc = gateway(data_dir, port, settings)
        await until(lambda: {hit.json()["n"] for hit in hook.received} >= set(range(30)), what="every event")
        await asyncio.sleep(0.3)  # (nothing more comes)
        after = [hit.json()["n"] for hit in hook.received[10:]]
        # again only what was delivered before the crash (its offsets not yet checkpointed), in
        # order; then everything that waited, once each and in order
        again = after[:len(after) - 20]
        assert again == list(range(10 - len(again), 10))
        assert after[len(again):] == list(range(10, 30))
    finally:
        stop(proc)
        await hook.down()


async def test_kill_9_while_the_mqtt_bridge_remote_is_down_loses_nothing(data_dir: Path, tmp_path: Path) -> None:
    """The same with the MQTT bridge target and a real Mosquitto as the remote, killed too."""
    remote = Mosquitto(tmp_path / "mosquitto")
    remote.start()
    cloud = PahoClient(remote.port, "cloud-app", version=MQTT_5, clean=False, session_expiry=3600)
    await cloud.connect()
    await cloud.subscribe("cloud/#", qos=1)
    settings = tmp_path / "tidemq.toml"
    settings.write_text(f"""
checkpoint_interval_s = 0.1

[event_rules.uplink]
sources = ["meters/#"]
targets = [{{ type = "mqtt", url = "mqtt://127.0.0.1:{remote.port}", topic = "cloud/${{topic}}", timeout_s = 2 }}]
retry = {{ initial_backoff_ms = 20, max_backoff_ms = 200 }}
""")
    port, admin_port = free_port(), free_port()

    def start() -> subprocess.Popen:
        return launch(["--data-dir", str(data_dir), "--mqtt-bind", f"127.0.0.1:{port}", "--amqp-bind", "",
                       "--remoting-bind", "", "--metrics-bind", f"127.0.0.1:{admin_port}", "--config", str(settings),
                       "--flush", "sync"])

    def retried() -> int:
        return admin(f"http://127.0.0.1:{admin_port}", "GET", "/admin/rules/uplink")[1]["retried"]

    proc = start()
    try:
        device = PahoClient(port, "meter")
        await device.connect()
        for n in range(10):
            await device.publish(f"meters/m{n % 2}", json.dumps({"n": n}), 1)
        first = [json.loads(m.payload)["n"] for m in await cloud.receive(10)]
        assert first == list(range(10))
        remote.kill()
        for n in range(10, 30):
            await device.publish(f"meters/m{n % 2}", json.dumps({"n": n}), 1)  # (PUBACK: stored)
        deadline = asyncio.get_running_loop().time() + 20
        while await asyncio.to_thread(retried) < 5:
            assert asyncio.get_running_loop().time() < deadline, "the rule did not try the remote"
            await asyncio.sleep(0.05)
        kill9(proc)
        device.client.loop_stop()  # (its connection died with the process)
        remote.start()
        proc = start()
        got = list(first)
        while set(got) != set(range(30)):
            got += [json.loads(m.payload)["n"] for m in await cloud.receive(1, timeout=30)]
        await asyncio.sleep(0.3)  # (nothing more comes)
        while not cloud.messages.empty():
            got.append(json.loads(cloud.messages.get().payload)["n"])
        # nothing lost, in order; again only what was delivered before the crash (the rule's
        # offset not yet checkpointed, or a message Mosquitto's own persistence had in flight to
        # the subscriber); what waited in TideMQ's store, once each and in order
        seen: set[int] = set()
        assert [n for n in got if not (n in seen or seen.add(n))] == list(range(30)), got  # type: ignore[func-returns-value]
        assert [n for n in got if n >= 10] == list(range(10, 30)), got
    finally:
        stop(proc)
        await cloud.disconnect()
        remote.stop()
