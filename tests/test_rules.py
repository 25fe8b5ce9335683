"""Event rules (bridge/rules, gateway/rules_host.py) through real clients: MQTT, AMQP and
RocketMQ (ali-ons) publishers, a real aiohttp webhook, MQTT and AMQP subscribers of the topic and dead-letter
targets, and the admin API over HTTP."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import aio_pika

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .remoting_support import ons, remoting_gateway
from .rules_support import Webhook, call, until

HOT = {"data": {"temp": [{"numeric": [">", 30]}]}}


def admin_url(gw) -> str:
    host, port = gw.metrics_address
    return f"http://{host}:{port}"


def amqp_url(gw) -> str:
    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
    return f"amqp://guest:guest@127.0.0.1:{port}/"


async def test_a_matching_publish_reaches_the_webhook_as_a_cloudevent_and_others_do_not(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "hot", "sources": ["sensors/#"], "pattern": HOT,
            "targets": [{"type": "webhook", "url": hook.url, "headers": {"X-Site": "berlin"}}]})
        assert status == 201, row
        assert row["state"] == "running" and row["sources"] == ["sensors/#"]
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        await device.publish("sensors/r1/temp", json.dumps({"temp": 35}), 1)
        await device.publish("sensors/r1/temp", json.dumps({"temp": 20}), 1)  # no match
        await device.publish("sensors/r1/temp", b"not json", 1)  # no data: no match
        await device.publish("other/r1/temp", json.dumps({"temp": 50}), 1)  # not a source
        conn = await aio_pika.connect(amqp_url(gw))
        channel = await conn.channel()
        exchange = await channel.get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(json.dumps({"temp": 41}).encode(), content_type="application/json"),
                               "sensors.r2.temp")
        await device.publish("sensors/küche", json.dumps({"temp": 60}), 1)
        hits = await hook.wait_for(3)
        await asyncio.sleep(0.3)  # (nothing more comes)
        assert [hit.json()["temp"] for hit in hook.received] == [35, 41, 60]  # (one source queue: in order)
        first, second = hook.received[:2]
        # attribute values percent-encoded outside printable ASCII (the CloudEvents HTTP binding)
        assert hook.received[2].headers["ce-subject"] == "sensors/k%C3%BCche"
        # binary mode: the attributes as ce- headers, the payload as the body
        assert first.headers["ce-specversion"] == "1.0"
        assert first.headers["ce-source"] == "/mqtt/clients/dev-1"
        assert first.headers["ce-type"] == "tidemq.mqtt.message"
        assert first.headers["ce-subject"] == "sensors/r1/temp"
        assert first.headers["ce-protocol"] == "mqtt"
        assert first.headers["Content-Type"] == "application/json"
        assert first.headers["X-Site"] == "berlin"
        assert first.headers["ce-id"] != second.headers["ce-id"]
        assert second.headers["ce-source"] == "/amqp/exchanges/amq.topic"
        assert second.headers["ce-subject"] == "sensors/r2/temp"
        await until(lambda: gw.rules.engine.get("hot")["delivered"] == 3, what="the deliveries counted")
        status, row = await call(base, "GET", "/admin/rules/hot")
        assert (row["matched"], row["delivered"], row["dead_lettered"], row["lag"]) == (3, 3, 0, 0)
        assert row["target_calls"] == 3 and 0 < row["target_latency_ms"] < 10_000  # (one request an event)
        assert hits is hook.received
        metrics = (await asyncio.to_thread(urllib.request.urlopen, base + "/metrics", None, 10)).read().decode()
        assert 'tidemq_rule_matched_total{rule="hot"} 3.0' in metrics
        assert 'tidemq_rule_delivered_total{rule="hot"} 3.0' in metrics
        assert 'tidemq_rule_lag{rule="hot"} 0.0' in metrics
        assert 'tidemq_rule_target_latency_seconds_count{rule="hot"} 3.0' in metrics
        assert 'tidemq_rule_target_latency_seconds_bucket{le="+Inf",rule="hot"} 3.0' in metrics
        await device.disconnect()
        await conn.close()
    await hook.down()


async def test_structured_mode_and_a_template_transform(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "alert", "sources": ["sensors/+/temp"], "pattern": HOT,
            "transform": {"type": "TEMPLATE", "variables": {"t": "$.data.temp", "room": "$.topiclevels[1]"},
                          "template": '{"room": "${room}", "temperature": ${t}}'},
            "targets": [{"type": "webhook", "url": hook.url, "mode": "structured"}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-2")
        await device.connect()
        await device.publish("sensors/kitchen/temp", json.dumps({"temp": 31.5}), 1)
        [hit] = await hook.wait_for(1)
        assert hit.headers["Content-Type"] == "application/cloudevents+json"
        event = hit.json()
        assert event["specversion"] == "1.0" and event["subject"] == "sensors/kitchen/temp"
        assert event["source"] == "/mqtt/clients/dev-2" and event["datacontenttype"] == "application/json"
        assert event["data"] == {"room": "kitchen", "temperature": 31.5}
        await device.disconnect()
    await hook.down()


async def test_webhook_down_then_up_loses_nothing_and_keeps_the_order(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "all", "sources": ["meters/#"], "retry": {"initial_backoff_ms": 20, "max_backoff_ms": 200},
            "targets": [{"type": "webhook", "url": hook.url, "timeout_s": 2}]})
        assert status == 201, row
        await hook.down()
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(40):
            await device.publish(f"meters/m{n % 3}", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("all")["retried"] >= 3, what="retries")
        status, row = await call(base, "GET", "/admin/rules/all")
        assert row["delivered"] == 0 and row["lag"] > 0 and "ConnectionRefusedError" in row["last_error"]
        await hook.up()
        hits = await hook.wait_for(40)
        assert [hit.json()["n"] for hit in hits] == list(range(40))
        await until(lambda: gw.rules.engine.get("all")["lag"] == 0, what="the lag to go")
        status, row = await call(base, "GET", "/admin/rules/all")
        assert (row["matched"], row["delivered"], row["dead_lettered"]) == (40, 40, 0)
        await device.disconnect()
    await hook.down()


async def test_a_webhook_back_from_an_outage_gets_the_events_at_once_not_after_the_backoff(data_dir: Path) -> None:
    """A target that refused connections is probed while the retry waits: the events go on as
    soon as it listens again, however long the policy's backoff (here 20 s)."""
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "slow", "sources": ["meters/#"], "retry": {"initial_backoff_ms": 20_000, "max_backoff_ms": 20_000},
            "targets": [{"type": "webhook", "url": hook.url, "timeout_s": 2}]})
        assert status == 201, row
        await hook.down()
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(5):
            await device.publish("meters/m1", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("slow")["retried"] >= 1, what="a first failure")
        await hook.up()
        returned = time.monotonic()
        hits = await hook.wait_for(5, timeout_s=10)
        assert time.monotonic() - returned < 5  # (not the 20 s backoff)
        assert [hit.json()["n"] for hit in hits] == list(range(5))
        await device.disconnect()
    await hook.down()


async def test_a_4xx_goes_to_the_dead_letter_topic_at_once_and_the_topic_target_reaches_mqtt_and_amqp(
        data_dir: Path) -> None:
    hook = Webhook()
    hook.status = 400
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0") as gw:
        dead = PahoClient(mqtt_port(gw), "ops", version=5)
        await dead.connect()
        await dead.subscribe("rules/dead/#", qos=1)
        app = PahoClient(mqtt_port(gw), "app")
        await app.connect()
        await app.subscribe("alerts/hot", qos=1)
        conn = await aio_pika.connect(amqp_url(gw))
        channel = await conn.channel()
        queue = await channel.declare_queue("alerts")
        await queue.bind("amq.topic", "alerts.hot")
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "hot", "sources": ["sensors/#"], "pattern": HOT, "dead_letter_topic": "rules/dead/hot",
            "transform": {"type": "JSONPATH", "path": "$.data"},
            "targets": [{"type": "topic", "topic": "alerts/hot"}, {"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-3")
        await device.connect()
        await device.publish("sensors/r9/temp", json.dumps({"temp": 33, "unit": "C"}), 1)
        [letter] = await dead.receive(1)
        assert letter.topic == "rules/dead/hot" and json.loads(letter.payload) == {"temp": 33, "unit": "C"}
        properties = dict(letter.properties.UserProperty)
        assert properties["dead-letter-reason"] == "refused: HTTP 400"
        assert properties["dead-letter-attempts"] == "1"
        assert properties["dead-letter-rule"] == "hot"
        assert properties["dead-letter-target"] == f"webhook:{hook.url}"
        assert properties["dead-letter-source-topic"] == "sensors/r9/temp"
        assert hook.refused == 1  # not retried
        [alert] = await app.receive(1)
        assert (alert.topic, json.loads(alert.payload)) == ("alerts/hot", {"temp": 33, "unit": "C"})
        message = None
        for _ in range(100):
            message = await queue.get(fail=False)
            if message is not None:
                break
            await asyncio.sleep(0.05)
        assert message is not None and json.loads(message.body) == {"temp": 33, "unit": "C"}
        assert message.routing_key == "alerts.hot"
        await until(lambda: gw.rules.engine.get("hot")["lag"] == 0, what="the event done")
        status, row = await call(admin_url(gw), "GET", "/admin/rules/hot")
        assert (row["matched"], row["delivered"], row["dead_lettered"], row["retried"]) == (1, 0, 1, 0)
        await device.disconnect()
        await dead.disconnect()
        await app.disconnect()
        await conn.close()
    await hook.down()





async def test_a_rocketmq_send_reaches_a_rule_on_its_topic(data_dir: Path) -> None:
    """A remoting topic is an MQTT first level (docs/remoting.md): a rule on ``Alerts/#`` sees
    ali-ons sends to ``Alerts``, as CloudEvents of type tidemq.rocketmq.message."""
    hook = Webhook()
    await hook.up()
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0", metrics_bind="127.0.0.1:0") as (gw, addr):
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "alerts", "sources": ["Alerts/#"], "pattern": {"data": {"level": ["high"]}},
            "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Alerts",
                   "messages": [{"body": json.dumps({"level": "low"})}, {"body": json.dumps({"level": "high"})}]})
        [hit] = await hook.wait_for(1)
        await asyncio.sleep(0.3)  # (nothing more comes)
        assert len(hook.received) == 1 and hit.json() == {"level": "high"}
        assert hit.headers["ce-type"] == "tidemq.rocketmq.message" and hit.headers["ce-subject"] == "Alerts"
        assert hit.headers["ce-protocol"] == "rocketmq"
    await hook.down()


async def test_an_event_out_of_retries_goes_to_the_dead_letter_topic_and_the_next_one_goes_on(data_dir: Path) -> None:
    hook = Webhook()
    hook.status = 503
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        dead = PahoClient(mqtt_port(gw), "ops", version=5)
        await dead.connect()
        await dead.subscribe("$rules/flaky/dead-letter", qos=1)  # the default dead-letter topic
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "flaky", "sources": ["meters/#"], "retry": {"max_attempts": 3, "initial_backoff_ms": 10},
            "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        await device.publish("meters/1", json.dumps({"n": 1}), 1)
        [letter] = await dead.receive(1)
        properties = dict(letter.properties.UserProperty)
        assert properties["dead-letter-reason"] == "HTTP 503; 3 attempts made (max_attempts 3)"
        assert properties["dead-letter-attempts"] == "3" and hook.refused == 3
        hook.status = 200
        await device.publish("meters/1", json.dumps({"n": 2}), 1)
        [hit] = await hook.wait_for(1)
        assert hit.json() == {"n": 2}
        # (the runner counts it once it has the webhook's answer, a moment after the webhook has it)
        await until(lambda: gw.rules.engine.get("flaky")["delivered"] == 1, what="the delivery counted")
        row = gw.rules.engine.get("flaky")
        assert (row["matched"], row["delivered"], row["retried"], row["dead_lettered"]) == (2, 1, 2, 1)
        await device.disconnect()
        await dead.disconnect()
    await hook.down()


async def test_a_backlog_reaches_the_topic_target_in_batches_complete_and_in_order(data_dir: Path) -> None:
    """A paused rule's backlog, more than one read batch, republished when it is resumed: an
    MQTT subscriber of the target topic gets every event once, in order."""
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        app = PahoClient(mqtt_port(gw), "app", version=5)
        await app.connect()
        await app.subscribe("copies/all", qos=1)
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "copy", "sources": ["meters/#"], "paused": True, "pattern": {"data": {"n": [{"numeric": [">=", 0]}]}},
            "targets": [{"type": "topic", "topic": "copies/all"}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        events = 600
        for n in range(events):
            await device.publish(f"meters/m{n % 4}", json.dumps({"n": n if n % 7 else -n - 1}), 1)  # every 7th: no match
        expected = [n for n in range(events) if n % 7]
        status, row = await call(admin_url(gw), "POST", "/admin/rules/copy/resume")
        assert status == 200, row
        got = await app.receive(len(expected))
        assert [json.loads(m.payload)["n"] for m in got] == expected
        assert all(dict(m.properties.UserProperty)["ce-source"] == "/mqtt/clients/meter" for m in got)
        await until(lambda: gw.rules.engine.get("copy")["lag"] == 0, what="the backlog done")
        row = gw.rules.engine.get("copy")
        assert (row["matched"], row["delivered"], row["dead_lettered"]) == (len(expected), len(expected), 0)
        await asyncio.sleep(0.3)
        assert app.messages.empty()  # (nothing twice)
        await device.disconnect()
        await app.disconnect()
