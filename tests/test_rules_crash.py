"""A rule whose target is down when the gateway is killed with ``kill -9`` loses nothing: what
matched waits in the store behind the rule's durable cursor and reaches the target, in order,
once a new process runs the rule (declared in the configuration file) and the target is back.
Only what at-least-once allows comes twice: events delivered after the last offset checkpoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .crash_support import free_port, kill9, launch, stop
from .mqtt_support import PahoClient
from .rules_support import Webhook, until


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
