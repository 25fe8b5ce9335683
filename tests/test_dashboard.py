"""The operator's dashboard in Debian's headless chromium (driven by selenium) against a real
gateway: it asks for the admin token or an admin user's credentials, follows live MQTT traffic
(connections, message counts and rates, a persistent session's backlog), and looks a message up
with its trace timeline -- or says the trace is not available on a gateway without
``/admin/trace``; shows the event rules (state, counters, lag, last error, delivery rate), or
what a node without them answers."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiohttp import web
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from rocketmq import client as rmq
from selenium.webdriver.remote.webdriver import WebDriver

import gateway.http.dashboard
from gateway.auth import PasswordFile
from gateway.config import Config
from gateway.http.dashboard import quantile
from gateway.interop import topic_queue
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from store.stats import LatencyHistogram

from .browser_support import TOKEN, Page, browser  # noqa: F401 (browser: a fixture)
from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .remoting_support import remoting_gateway
from .rules_support import Webhook, call
from .test_cluster_mqtt import cluster

MQTT_CELL = '#protocols tr[data-protocol="mqtt"] td[data-field="{}"]'


def dashboard(gw: Gateway, driver: WebDriver) -> Page:
    assert gw.metrics_address is not None
    host, port = gw.metrics_address
    return Page(driver, f"http://{host}:{port}")


def number(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("", "–") else 0.0


async def publish_until(client: PahoClient, topic: str, stop: asyncio.Event) -> int:
    """Publish QoS 1 messages, paced, until ``stop``; how many."""
    sent = 0
    while not stop.is_set():
        await client.publish(topic, b"reading %d" % sent, qos=1)
        sent += 1
        await asyncio.sleep(0.02)
    return sent


async def test_dashboard_follows_live_mqtt_traffic(data_dir: Path, browser: WebDriver) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        page = dashboard(gw, browser)
        assert (await page.open("/")).endswith("/dashboard")  # / redirects to the page

        # the API answers 401 without the token: the page asks for it
        await page.until("#status", lambda text: "token" in text, "that a token is needed")
        assert await asyncio.to_thread(browser.find_element("css selector", "#token-form").is_displayed)
        await page.fill({"#token-input": TOKEN})
        await page.click("#token-form button")
        await page.until_text(MQTT_CELL.format("connections"), "0")
        assert await page.text("#status") != "admin token needed"
        assert not await page.shown("#group-section")  # (no replicated store group here)

        publisher = PahoClient(mqtt_port(gw), "dash-pub")
        await publisher.connect()
        await page.until_text(MQTT_CELL.format("connections"), "1")
        await page.until('#clients td[data-field="id"]', lambda text: text == "dash-pub", "the client dash-pub")

        # a persistent session that goes away: what is published next is its backlog
        reader = PahoClient(mqtt_port(gw), "dash-away", version=MQTT_5, clean=False, session_expiry=3600)
        await reader.connect()
        await reader.subscribe("dash/readings", qos=1)
        await reader.disconnect()
        await page.until_text(MQTT_CELL.format("connections"), "1")

        stop = asyncio.Event()
        publishing = asyncio.create_task(publish_until(publisher, "dash/readings", stop))
        try:
            await page.until(MQTT_CELL.format("messages_in_rate"), lambda text: number(text) > 0,
                             "a rate of MQTT messages in")
            await page.until("#store-put-rate", lambda text: number(text) > 0, "a rate of store puts")
        finally:
            stop.set()
            sent = await publishing
        assert sent > 0
        await page.until_text(MQTT_CELL.format("messages_in"), f"{sent:,}")
        await page.until_text(MQTT_CELL.format("messages_in_rate"), "0")  # publishing stopped
        await page.until_text('#backlogs td[data-field="name"]', "dash-away")
        assert await page.text('#backlogs td[data-field="kind"]') == "mqtt session"
        assert await page.text('#backlogs td[data-field="lag"]') == f"{sent:,}"
        assert number(await page.text("#store-queues") or "") >= 1
        assert await page.text("#store-put-pct") != "– / –"
        assert await page.text("#mqtt-sessions") == "2"

        # the token stays for the browser tab's session: a reload goes straight to the numbers
        await page.open("/dashboard")
        await page.until_text(MQTT_CELL.format("messages_in"), f"{sent:,}")
        assert not await asyncio.to_thread(browser.find_element("css selector", "#token-form").is_displayed)

        await publisher.disconnect()
        await page.until_text(MQTT_CELL.format("connections"), "0")


async def test_dashboard_takes_an_admin_users_credentials(data_dir: Path, browser: WebDriver, tmp_path: Path) -> None:
    users = PasswordFile()
    for name in ("alice", "root"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=str(tmp_path / "passwd"),
                               allow_anonymous=False, admin_users="root") as gw:
        page = dashboard(gw, browser)
        await page.open("/dashboard")
        await page.until("#status", lambda text: "credentials needed" in text, "that credentials are needed")
        await page.fill({"#user-input": "alice", "#password-input": "pw-alice"})  # a user, not an admin
        await page.click("#token-form button")
        await page.until("#token-error", lambda text: "admin_users" in text, "that alice is no admin user")
        await page.fill({"#user-input": "root", "#password-input": "pw-root"})
        await page.click("#token-form button")
        await page.until_text(MQTT_CELL.format("connections"), "0")
        device = PahoClient(mqtt_port(gw), "dash-dev", username="alice", password="pw-alice")
        await device.connect()
        await page.until('#clients td[data-field="id"]', lambda text: text == "dash-dev", "the client dash-dev")
        await device.disconnect()


MARKUP = '<img src=x onerror="document.title=\'pwned\'">'  # shown as text, never run


def keyed(key: str) -> PahoProperties:
    props = PahoProperties(PacketTypes.PUBLISH)
    props.UserProperty = ("key", key)
    return props


async def test_dashboard_looks_up_a_message_and_its_trace(data_dir: Path, browser: WebDriver) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="mqtt") as gw:
        device = PahoClient(mqtt_port(gw), "press-7", version=MQTT_5)
        await device.connect()
        await device.subscribe("plant/press7", qos=1)
        await device.publish("plant/press7", MARKUP.encode(), qos=1, properties=keyed("batch-42"))
        await device.receive(1)  # delivered and acknowledged: four trace events
        await device.disconnect()
        msg_id = gw.store.get_now(topic_queue("plant/press7"), 0, 1).messages[0].msg_id

        page = dashboard(gw, browser)
        await page.open("/dashboard")
        await page.until_text(MQTT_CELL.format("messages_in"), "1")
        await page.until_text(MQTT_CELL.format("connections"), "0")  # its PUBACK was read before
        assert gw.tracer is not None
        await gw.tracer.flush()  # trace events are written in batches: write them now

        await page.fill({"#trace-msg-id": msg_id})
        await page.click("#trace-form button")
        await page.until_text('#messages td[data-field="msg_id"]', msg_id)
        assert await page.text('#messages td[data-field="topic"]') == "plant/press7"
        assert await page.text('#messages td[data-field="key"]') == "batch-42"
        assert await page.text('#messages td[data-field="body"]') == MARKUP
        await page.until_text("#trace-status", "4 events")
        types = await page.texts('#timeline td[data-field="type"]')  # (oldest first)
        # a delivery may go out before the put's acknowledgement is recorded (both follow the
        # commit: gateway/mqtt hears it inside the store's dispatch), so the two are in either order
        assert (types[0], sorted(types[1:3]), types[3:]) == ("publish", ["deliver", "store"], ["ack"]), types
        assert set(await page.texts('#timeline td[data-field="client"]')) == {"press-7"}
        assert await page.texts('#timeline td[data-field="msg_id"]') == [msg_id] * 4

        # by key: the store needs the topic too; the trace finds it by the key alone
        await page.fill({"#trace-msg-id": "", "#trace-key": "batch-42", "#trace-topic": "plant/press7"})
        await page.click("#trace-form button")
        await page.until_text("#message-status", "1 found")
        await page.until_text("#trace-status", "4 events")
        assert await page.texts('#messages td[data-field="msg_id"]') == [msg_id]

        # the data was text all along: no element was made from it
        assert await asyncio.to_thread(browser.execute_script,
                                       "return document.querySelectorAll('main img').length") == 0
        assert browser.title == "TideMQ dashboard"


@pytest.mark.usefixtures("rocketmq_home")
async def test_dashboard_looks_up_the_msgid_a_rocketmq_client_printed(data_dir: Path, browser: WebDriver) -> None:
    async with remoting_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="remoting") as (gw, addr):
        producer = rmq.Producer("PID-dash")
        producer.set_namesrv_addr(addr)
        await asyncio.to_thread(producer.start)
        try:
            sent = rmq.Message("DashOrders")
            sent.set_body("order body")
            result = await asyncio.to_thread(producer.send_sync, sent)
        finally:
            await asyncio.to_thread(producer.shutdown)
        assert gw.tracer is not None
        await gw.tracer.flush()
        page = dashboard(gw, browser)
        await page.open("/dashboard")
        await page.fill({"#trace-msg-id": result.msg_id})  # the client's id (UNIQ_KEY), not the store's
        await page.click("#trace-form button")
        await page.until_text('#messages td[data-field="body"]', "order body")
        stored_id = await page.text('#messages td[data-field="msg_id"]')
        assert stored_id != result.msg_id and stored_id is not None
        await page.until_text("#trace-status", "2 events")  # publish, store (no consumer)
        assert await page.texts('#timeline td[data-field="msg_id"]') == [stored_id] * 2


async def test_dashboard_says_when_the_gateway_has_no_trace(data_dir: Path, browser: WebDriver,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    add_routes = gateway.http.dashboard.add_routes

    def without_trace(app: web.Application, *sources: Any) -> None:  # a gateway from before /admin/trace
        @web.middleware
        async def no_trace(request: web.Request, handler):
            if request.path == "/admin/trace":
                raise web.HTTPNotFound()
            return await handler(request)

        app.middlewares.append(no_trace)
        add_routes(app, *sources)

    monkeypatch.setattr(gateway.http.dashboard, "add_routes", without_trace)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        device = PahoClient(mqtt_port(gw), "old-1")
        await device.connect()
        await device.publish("old/t", b"still found", qos=1)
        await device.disconnect()
        msg_id = gw.store.get_now(topic_queue("old/t"), 0, 1).messages[0].msg_id

        page = dashboard(gw, browser)
        await page.open("/dashboard")
        await page.fill({"#trace-msg-id": msg_id})
        await page.click("#trace-form button")
        await page.until_text('#messages td[data-field="body"]', "still found")
        await page.until("#trace-status", lambda text: text.startswith("trace not available"),
                         '"trace not available"')


RULE_CELL = '#rules tr[data-rule="{}"] td[data-field="{}"]'


async def test_dashboard_shows_each_rule_its_counters_lag_and_last_error(data_dir: Path, browser: WebDriver) -> None:
    hook = Webhook()
    hook.status = 500  # every attempt fails: the rule retries the first event, the rest wait behind it
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        base = "http://{}:{}".format(*gw.metrics_address)
        for definition in ({"name": "to-hook", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": hook.url}],
                            "retry": {"max_attempts": 1000, "initial_backoff_ms": 20, "max_backoff_ms": 100}},
                           {"name": "to-topic", "sources": ["meters/#"],
                            "targets": [{"type": "topic", "topic": "copies/meters"}]}):
            status, row = await call(base, "POST", "/admin/rules", definition, TOKEN)
            assert status == 201, row

        page = dashboard(gw, browser)
        await page.open("/dashboard")
        await page.fill({"#token-input": TOKEN})
        await page.click("#token-form button")
        await page.until_text(RULE_CELL.format("to-topic", "delivered"), "0")
        assert await page.texts('#rules td[data-field="name"]') == ["to-hook", "to-topic"]
        assert await page.text(RULE_CELL.format("to-hook", "state")) == "running"

        device = PahoClient(mqtt_port(gw), "meter-1")
        await device.connect()
        for n in range(5):
            await device.publish(f"meters/{n % 2}", b'{"n": %d}' % n, qos=1)
        await device.disconnect()

        await page.until(RULE_CELL.format("to-topic", "delivered_rate"), lambda text: number(text) > 0,
                         "a rate of deliveries of to-topic")
        await page.until_text(RULE_CELL.format("to-topic", "delivered"), "5")
        await page.until_text(RULE_CELL.format("to-topic", "matched"), "5")
        await page.until_text(RULE_CELL.format("to-topic", "lag"), "0")
        await page.until_text(RULE_CELL.format("to-topic", "delivered_rate"), "0")  # nothing more to deliver
        await page.until(RULE_CELL.format("to-hook", "retried"), lambda text: number(text) >= 2,
                         "retries of to-hook")
        await page.until(RULE_CELL.format("to-hook", "last_error"), lambda text: "500" in text,
                         "the webhook's answer as to-hook's last error")
        assert await page.text(RULE_CELL.format("to-hook", "delivered")) == "0"
        assert await page.text(RULE_CELL.format("to-hook", "lag")) == "5"
        assert await page.text(RULE_CELL.format("to-topic", "last_error")) == ""
        assert number(await page.text(RULE_CELL.format("to-hook", "target_latency_ms"))) > 0  # (the 500s' calls)
        # a long error is cut by the style, not in the text: the whole of it is in the cell
        _, rows = await call(base, "GET", "/admin/rules", token=TOKEN)
        error = next(row["last_error"] for row in rows if row["name"] == "to-hook")
        assert await page.text(RULE_CELL.format("to-hook", "last_error")) == error

        status, row = await call(base, "POST", "/admin/rules/to-topic/pause", token=TOKEN)
        assert status == 200 and row["state"] == "paused", row
        await page.until_text(RULE_CELL.format("to-topic", "state"), "paused")
        assert await page.text(RULE_CELL.format("to-hook", "state")) == "running"
    await hook.down()


async def test_dashboard_says_where_the_rules_are_or_that_a_node_has_none(data_dir: Path, browser: WebDriver) -> None:
    async with cluster(data_dir, gateways=1) as (store_node, (node,)):
        page = dashboard(node, browser)
        await page.open("/dashboard")
        note = await page.until("#rules-note", lambda text: "not on this gateway node" in text,
                                "that the rules are kept on the store node")
        assert "store node" in note
        assert not await page.shown("#rules")
        assert await page.shown("#rules-section")
    no_mqtt = Gateway(Config(data_dir=data_dir / "amqp-only", mqtt_bind="", amqp_bind="127.0.0.1:0",
                             remoting_bind="", metrics_bind="127.0.0.1:0"))
    await no_mqtt.start()
    try:
        page = dashboard(no_mqtt, browser)
        await page.open("/dashboard")
        await page.until("#rules-note", lambda text: text.startswith("no rules engine on this node: "),
                         '"no rules engine on this node"')
        assert not await page.shown("#rules")
    finally:
        await no_mqtt.stop()


def get_json(gw: Gateway, path: str, token: str | None = None) -> tuple[int, dict]:
    host, port = gw.metrics_address  # type: ignore[misc]
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_overview_counts_backlogs_of_amqp_queues_and_mqtt_sessions(data_dir: Path) -> None:
    settings = {"amqp_bind": "127.0.0.1:0", "metrics_bind": "127.0.0.1:0", "admin_token": TOKEN}
    async with running_gateway(data_dir, **settings) as gw:
        status, body = await asyncio.to_thread(get_json, gw, "/admin/overview")
        assert status == 401 and "token" in body["error"]

        away = PahoClient(mqtt_port(gw), "away-1", version=MQTT_5, clean=False, session_expiry=3600)
        await away.connect()
        await away.subscribe("lag/#", qos=1)
        await away.disconnect()
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        for i in range(4):
            await device.publish(f"lag/{i}", b"x", qos=1)
        amqp_port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        try:
            channel = await conn.channel()
            await channel.declare_queue("orders")
            await channel.declare_queue("empty")
            for _ in range(7):
                await channel.default_exchange.publish(aio_pika.Message(b"o"), "orders")
            status, overview = await asyncio.to_thread(get_json, gw, "/admin/overview", TOKEN)
        finally:
            await conn.close()
            await device.disconnect()
        assert status == 200
        assert set(overview["protocols"]) == {"mqtt", "amqp"}  # remoting is off
        assert overview["protocols"]["mqtt"]["connections"] == 1 and overview["protocols"]["amqp"]["connections"] == 1
        assert overview["protocols"]["mqtt"]["messages_in"] == 4
        assert overview["protocols"]["amqp"]["messages_in"] == 7
        assert overview["protocols"]["mqtt"]["bytes_in"] > 0
        # longest first; the empty queue is left out
        assert overview["backlogs"] == [{"kind": "amqp queue", "name": "orders", "lag": 7},
                                        {"kind": "mqtt session", "name": "away-1", "lag": 4}]
        assert overview["backlogs_partial"] is False
        store = overview["store"]
        assert store["queues"] >= 5 and store["commitlog_bytes"] > 0 and store["put_latency"]["count"] >= 11
        assert 0 < store["put_latency"]["p50_s"] <= store["put_latency"]["p99_s"]
        assert overview["mqtt_sessions"] == 2 and overview["time"] > 1.7e12


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    histogram = LatencyHistogram(bounds=(0.001, 0.01, 0.1))
    assert quantile(histogram, 0.5) is None
    for seconds in [0.0005] * 50 + [0.005] * 40 + [0.05] * 9 + [5.0]:
        histogram.observe(seconds)
    assert quantile(histogram, 0.5) == pytest.approx(0.001)  # the 50th of 50 in the first bucket
    assert quantile(histogram, 0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert quantile(histogram, 0.99) == pytest.approx(0.1)
    assert quantile(histogram, 1.0) == pytest.approx(0.1)  # above the last bound: that bound
