"""Event schemas (bridge/rules/schemas.py): JSON Schemas by event type, put, shown (every version),
listed and deleted with ``tidemq ctl schemas`` (a real subprocess) and kept in the store across a
restart; checked when CloudEvents come in over HTTP (a 400 with the validation error) and by
rules (a matched event that does not fit goes to the dead-letter topic with the reason), for
events of MQTT and AMQP publishers."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import aio_pika
import pytest
from cloudevents.core.bindings.http import to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from gateway.config import Config, ConfigError, load_config
from gateway.server import Gateway

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, call
from .test_cloudevents_ingest import batch, post
from .test_ctl import TOKEN, ctl
from .test_rules import admin_url, amqp_url

READING = "com.example.reading"
SCHEMA = {"type": "object", "required": ["temp"], "properties": {"temp": {"type": "number"}}}
SCHEMA_V2 = {**SCHEMA, "properties": {"temp": {"type": "number", "maximum": 100}}}


def reading(temp: object) -> CloudEvent:
    return CloudEvent(attributes={"type": READING, "source": "/sensors/k1", "datacontenttype": "application/json"},
                      data={"temp": temp})


async def test_schemas_put_shown_by_version_listed_deleted_and_kept_across_a_restart(data_dir: Path,
                                                                                     tmp_path: Path) -> None:
    (tmp_path / "v1.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "v2.json").write_text(json.dumps(SCHEMA_V2))
    (tmp_path / "bad.json").write_text(json.dumps({"type": "nope"}))
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        url = admin_url(gw)
        code, out, err = await ctl(url, "schemas", "put", READING, "--file", str(tmp_path / "v1.json"), "--json")
        assert code == 0 and json.loads(out) == {"name": READING, "version": 1, "schema": SCHEMA}, err
        code, out, err = await ctl(url, "schemas", "put", READING, "--file", str(tmp_path / "v2.json"), "--json")
        assert code == 0 and json.loads(out)["version"] == 2, err
        code, out, err = await ctl(url, "schemas", "put", "other", "--file", str(tmp_path / "bad.json"))
        assert code == 2 and "not a valid JSON Schema: $.type" in err, (out, err)
        code, out, err = await ctl(url, "schemas", "--json")
        assert code == 0 and json.loads(out) == [{"name": READING, "version": 2}], err
        code, out, err = await ctl(url, "schemas", "show", READING, "--version", "1", "--json")
        assert code == 0 and json.loads(out) == {"name": READING, "version": 1, "schema": SCHEMA}, err
        status, answer = await call(url, "GET", "/admin/schemas/nothing", token=TOKEN)
        assert status == 404, answer
        status, answer = await call(url, "GET", "/admin/schemas", token="")
        assert status == 401, answer
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        url = admin_url(gw)
        code, out, err = await ctl(url, "schemas", "show", READING, "--json")
        assert code == 0 and json.loads(out) == {"name": READING, "version": 2, "schema": SCHEMA_V2}, err
        message = to_structured(reading(120), JSONFormat())  # (v2, from the store, is in force)
        status, answer = await post(url, "sensors/k1", message.body,
                                    {**message.headers, "Authorization": f"Bearer {TOKEN}"})
        assert status == 400 and "120 is greater than the maximum of 100" in answer["error"], answer
        code, out, err = await ctl(url, "schemas", "delete", READING)
        assert code == 0, err
        code, out, err = await ctl(url, "schemas", "show", READING)
        assert code == 1 and "404" in err, (out, err)


async def test_cloudevents_in_are_checked_against_the_schema_of_their_type(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        url = admin_url(gw)
        status, row = await call(url, "PUT", f"/admin/schemas/{READING}", SCHEMA)
        assert status == 201, row
        app = PahoClient(mqtt_port(gw), "app", version=5)
        await app.connect()
        await app.subscribe("sensors/#", qos=1)
        bad = to_structured(reading("hot"), JSONFormat())
        status, answer = await post(url, "sensors/k1", bad.body, bad.headers)
        assert status == 400, answer
        assert answer["error"] == (f"the event does not fit its schema: schema {READING} v1: $.temp: 'hot' is not "
                                   "of type 'number'"), answer
        status, answer = await post(url, "sensors/k1", batch(reading(20), reading(None)),
                                    {"Content-Type": "application/cloudevents-batch+json"})
        assert status == 400 and answer["error"].startswith("event [1] does not fit its schema"), answer
        status, answer = await post(url, "sensors/k1", b"21", {  # binary mode, data not JSON
            "ce-specversion": "1.0", "ce-id": "t", "ce-source": "/s", "ce-type": READING, "Content-Type": "text/plain"})
        assert status == 400 and "the event's data is not JSON" in answer["error"], answer
        good = to_structured(reading(21.5), JSONFormat())
        status, answer = await post(url, "sensors/k1", good.body, good.headers)
        assert status == 200, answer
        [message] = await app.receive(1)  # (only the one that fits was stored)
        assert json.loads(message.payload) == {"temp": 21.5}
        await asyncio.sleep(0.2)
        assert app.messages.empty()
        metrics = (await asyncio.to_thread(urllib.request.urlopen, url + "/metrics", None, 10)).read().decode()
        assert 'tidemq_cloudevents_total{result="schema"} 3.0' in metrics
        assert 'tidemq_cloudevents_total{result="stored"} 1.0' in metrics
        await app.disconnect()


async def test_a_rule_sends_matched_events_that_do_not_fit_the_schema_to_the_dead_letter_topic(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0") as gw:
        url = admin_url(gw)
        status, row = await call(url, "POST", "/admin/rules", {
            "name": "named", "sources": ["sensors/#"], "schema": READING, "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 400 and row["path"] == "$.schema" and "no schema named" in row["reason"], row
        status, row = await call(url, "PUT", f"/admin/schemas/{READING}", SCHEMA)
        assert status == 201, row
        status, row = await call(url, "POST", "/admin/rules", {
            "name": "named", "sources": ["sensors/#"], "schema": READING, "dead_letter_topic": "dead/named",
            "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        # a rule without "schema": the schema of each event's type, where there is one
        status, row = await call(url, "POST", "/admin/rules", {
            "name": "typed", "sources": ["plant/#"], "dead_letter_topic": "dead/typed",
            "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        status, answer = await call(url, "DELETE", f"/admin/schemas/{READING}")
        assert status == 409 and "named" in answer["error"], answer
        ops = PahoClient(mqtt_port(gw), "ops", version=5)
        await ops.connect()
        await ops.subscribe("dead/#", qos=1)
        device = PahoClient(mqtt_port(gw), "dev")
        await device.connect()
        await device.publish("sensors/k1", json.dumps({"temp": 20}), 1)
        await device.publish("sensors/k1", json.dumps({"temp": "hot"}), 1)
        await device.publish("sensors/k1", b"no json", 1)
        conn = await aio_pika.connect(amqp_url(gw))
        exchange = await (await conn.channel()).get_exchange("amq.topic")
        for temp in ("cold", 5):
            await exchange.publish(aio_pika.Message(json.dumps({"temp": temp}).encode(), type=READING,
                                                    content_type="application/json"), "plant.p1")
        await exchange.publish(aio_pika.Message(b'{"any": 1}', type="com.example.other",
                                                content_type="application/json"), "plant.p1")
        letters = await ops.receive(3)
        by_topic = [(m.topic, dict(m.properties.UserProperty)) for m in letters]
        named = [p for t, p in by_topic if t == "dead/named"]
        assert [p["dead-letter-reason"] for p in named] == [
            f"schema {READING} v1: $.temp: 'hot' is not of type 'number'",
            f"schema {READING} v1: the event's data is not JSON"]
        assert {p["dead-letter-target"] for p in named} == {f"schema:{READING}"}
        [typed] = [p for t, p in by_topic if t == "dead/typed"]
        assert typed["dead-letter-reason"] == f"schema {READING} v1: $.temp: 'cold' is not of type 'number'"
        hits = await hook.wait_for(3)
        assert sorted(json.dumps(hit.json()) for hit in hits) == sorted(
            ['{"temp": 20}', '{"temp": 5}', '{"any": 1}'])
        rows = {name: gw.rules.engine.get(name) for name in ("named", "typed")}
        assert (rows["named"]["matched"], rows["named"]["dead_lettered"]) == (3, 2)
        await device.disconnect()
        await ops.disconnect()
        await conn.close()
    await hook.down()


async def test_a_schema_nested_too_deep_is_refused_and_the_gateway_goes_on(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        url = admin_url(gw)
        deep = '{"items": ' * 5000 + "{}" + "}" * 5000
        request = urllib.request.Request(f"{url}/admin/schemas/deep", data=deep.encode(), method="PUT")
        status, answer = await asyncio.to_thread(_send, request)
        assert status == 400, answer
        schema = {"items": {}}
        for _ in range(600):
            schema = {"items": schema}
        status, answer = await call(url, "PUT", "/admin/schemas/deep", schema)
        assert status == 400 and "nested too deep" in answer["error"], answer  # (JSON, but past what is checked)
        status, answer = await call(url, "PUT", f"/admin/schemas/{READING}", SCHEMA)
        assert status == 201, answer


def _send(request: urllib.request.Request) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_schemas_declared_in_the_config_file_are_stored_before_the_rules_that_name_them(
        data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"type": "array"}))
    settings = tmp_path / "tidemq.toml"
    settings.write_text(f"""
[event_schemas]
"{READING}" = {{ type = "object", required = ["temp"], properties = {{ temp = {{ type = "number" }} }} }}
other = "{tmp_path / 'other.json'}"

[event_rules.named]
sources = ["sensors/#"]
schema = "{READING}"
targets = [{{ type = "topic", topic = "checked/all" }}]
""")
    cfg = load_config(settings, env={})
    async with running_gateway(data_dir, event_schemas=cfg.event_schemas, event_rules=cfg.event_rules) as gw:
        assert gw.rules.engine.schemas.list() == [{"name": READING, "version": 1}, {"name": "other", "version": 1}]
        assert gw.rules.engine.schemas.get(READING)["schema"] == SCHEMA
        assert gw.rules.engine.get("named")["state"] == "running"
    async with running_gateway(data_dir, event_schemas=cfg.event_schemas) as gw:  # the same: no new version
        assert gw.rules.engine.schemas.list() == [{"name": READING, "version": 1}, {"name": "other", "version": 1}]
    changed = json.dumps({READING: SCHEMA_V2})
    async with running_gateway(data_dir, event_schemas=changed) as gw:
        assert gw.rules.engine.schemas.get(READING) == {"name": READING, "version": 2, "schema": SCHEMA_V2}
    with pytest.raises(ConfigError, match=r"event_schemas: schema 'bad': not a valid JSON Schema: \$\.type"):
        async with running_gateway(data_dir, event_schemas=json.dumps({"bad": {"type": "nope"}})):
            pass
    with pytest.raises(ConfigError, match="event_schemas: in a cluster, event schemas are kept with the rules"):
        Gateway(Config(data_dir=data_dir, role="gateway", event_schemas=changed))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="event_schemas: 'x': cannot read the JSON Schema in"):
        load_config(settings, env={"TIDEMQ_EVENT_SCHEMAS": json.dumps({"x": str(tmp_path / "broken.json")})})
