"""The event rules' admin API (gateway/http/rules_api.py) over HTTP: the operator's credentials
required, a bad definition refused with where and why, and a rule's life -- created, paused,
resumed, changed, deleted -- kept in the store across a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.config import Config, ConfigError, load_config
from gateway.server import Gateway

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, call, until


def admin_url(gw) -> str:
    host, port = gw.metrics_address
    return f"http://{host}:{port}"


def rule(url: str, **more) -> dict:
    return {"sources": ["sensors/#"], "targets": [{"type": "webhook", "url": url}], **more}


RULE_CALLS = [("GET", "/admin/rules", None), ("POST", "/admin/rules", {"name": "r", **rule("http://127.0.0.1:9/")}),
              ("GET", "/admin/rules/r", None), ("PUT", "/admin/rules/r", rule("http://127.0.0.1:9/")),
              ("POST", "/admin/rules/r/pause", None), ("POST", "/admin/rules/r/resume", None),
              ("DELETE", "/admin/rules/r", None)]


async def test_rule_calls_without_the_operators_credentials_are_refused(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token="s3cret") as gw:
        base = admin_url(gw)
        for method, path, body in RULE_CALLS:
            for token in ("", "guess"):
                status, answer = await call(base, method, path, body, token=token)
                assert status == 401, (method, path, token, answer)
        assert gw.rules.engine.list() == []  # nothing was created
        for method, path, body in RULE_CALLS:
            status, answer = await call(base, method, path, body, token="s3cret")
            assert status in (200, 201), (method, path, answer)
        assert gw.rules.engine.list() == []  # (the last call deleted it)


async def test_a_bad_definition_is_refused_at_creation_with_its_place_and_reason(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        cases = [
            (rule("http://h/", pattern={"data": {"temp": [{"numeric": [">", 40, "<", 30]}]}}),
             "$.pattern.data.temp[0].numeric[3]", "the range > 40 and < 30 holds no number"),
            (rule("http://h/", pattern={"source": [{"cidr": "10.0.0.1/24"}]}),
             "$.pattern.source[0].cidr", "host bits set"),
            (rule("http://h/", transform={"type": "JSONPATH", "path": "$.["}), "$.transform.path", "not a JSONPath"),
            (rule("http://h/", transform={"type": "TEMPLATE", "variables": {"t": "$.data.t"}, "template": "${x}"}),
             "$.transform.template", "${x} at character 0 is not one of the variables"),
            ({**rule("http://h/"), "targets": [{"type": "topic", "topic": "sensors/copy"}]},
             "$.targets[0].topic", "the rule would read what it writes"),
            ({**rule("http://h/"), "sources": ["a/#", "a/b"]}, "$.sources[1]", "overlaps"),
            ({**rule("ftp://h/")}, "$.targets[0].url", "http:// or https://"),
            ({**rule("http://h/"), "targets": [{"type": "webhook", "url": "http://h/", "headers": {"X Bad": "v"}}]},
             "$.targets[0].headers", "an HTTP token"),
            ({**rule("http://h/"), "targets": [{"type": "webhook", "url": "http://h/", "headers": {"Content-Length": "1"}}]},
             "$.targets[0].headers", "the client's to set"),
            ({**rule("http://h:99999/")}, "$.targets[0].url", "Port out of range"),
            ({**rule("http://h/"), "retry": {"max_attempts": 0}}, "$.retry.max_attempts", "from 1"),
        ]
        for definition, path, reason in cases:
            status, answer = await call(base, "POST", "/admin/rules", {"name": "bad", **definition})
            assert status == 400, (definition, answer)
            assert answer["path"] == path and reason in answer["reason"], answer
        status, answer = await call(base, "GET", "/admin/rules/bad")
        assert status == 404
        status, answer = await call(base, "POST", "/admin/rules", {"name": "no good/name", **rule("http://h/")})
        assert (status, answer["path"]) == (400, "$.name")


async def test_a_rules_life_paused_resumed_changed_deleted_and_kept_across_a_restart(data_dir: Path) -> None:
    hook, other = Webhook(), Webhook()
    await hook.up()
    await other.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {"name": "r", **rule(hook.url)})
        assert status == 201
        status, answer = await call(base, "POST", "/admin/rules", {"name": "r", **rule(hook.url)})
        assert status == 409, answer
        device = PahoClient(mqtt_port(gw), "dev")
        await device.connect()
        await device.publish("sensors/a", json.dumps({"n": 0}), 1)
        await hook.wait_for(1)
        status, row = await call(base, "POST", "/admin/rules/r/pause")
        assert row["state"] == "paused"
        for n in (1, 2):
            await device.publish("sensors/a", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("r")["lag"] == 2, what="the paused rule's backlog")
        assert len(hook.received) == 1  # paused: what matches waits in the store
        status, row = await call(base, "POST", "/admin/rules/r/resume")
        assert row["state"] == "running"
        await hook.wait_for(3)
        assert [hit.json()["n"] for hit in hook.received] == [0, 1, 2]
        # changed: the same cursor goes on, to the new target and with the new pattern
        status, row = await call(base, "PUT", "/admin/rules/r",
                                 rule(other.url, pattern={"data": {"n": [{"numeric": [">", 4]}]}}))
        assert status == 200 and row["definition"]["targets"][0]["url"] == other.url
        for n in (3, 5):
            await device.publish("sensors/a", json.dumps({"n": n}), 1)
        await other.wait_for(1)
        assert [hit.json()["n"] for hit in other.received] == [5] and len(hook.received) == 3
        await until(lambda: gw.rules.engine.get("r")["delivered"] == 4, what="the delivery counted")
        assert gw.rules.engine.get("r")["matched"] == 4
        await device.disconnect()
    # kept in the store: a new process runs it where it was
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, rows = await call(base, "GET", "/admin/rules")
        assert [(r["name"], r["state"], r["definition"]["targets"][0]["url"]) for r in rows] == [
            ("r", "running", other.url)]
        device = PahoClient(mqtt_port(gw), "dev")
        await device.connect()
        await device.publish("sensors/b", json.dumps({"n": 6}), 1)
        await other.wait_for(2)
        assert [hit.json()["n"] for hit in other.received] == [5, 6]
        status, answer = await call(base, "DELETE", "/admin/rules/r")
        assert status == 200
        assert not gw.mqtt.wildcards.reads("w:sensors/#")  # its filter is no longer held
        await device.publish("sensors/b", json.dumps({"n": 7}), 1)
        await asyncio.sleep(0.3)
        assert len(other.received) == 2
        status, answer = await call(base, "GET", "/admin/rules/r")
        assert status == 404
        status, answer = await call(base, "POST", "/admin/rules/r/pause")
        assert status == 404
        await device.disconnect()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        assert gw.rules.engine.list() == []  # deleted from the store too
    await hook.down()
    await other.down()


async def test_rules_declared_in_the_config_file_are_stored_and_a_bad_one_stops_start_up(
        data_dir: Path, tmp_path: Path) -> None:
    settings = tmp_path / "tidemq.toml"
    settings.write_text("""
[event_rules.copy]
sources = ["sensors/#"]
targets = [{ type = "topic", topic = "copies/all" }]

[event_rules.hot]
sources = ["sensors/#"]
pattern = { data = { temp = [{ numeric = [">", 30] }] } }
targets = [{ type = "topic", topic = "alerts/hot" }]
""")
    cfg = load_config(settings, env={})
    assert sorted(json.loads(cfg.event_rules)) == ["copy", "hot"]
    async with running_gateway(data_dir, event_rules=cfg.event_rules) as gw:
        assert [row["name"] for row in gw.rules.engine.list()] == ["copy", "hot"]
    # kept in the store: a later start without them runs them still
    async with running_gateway(data_dir) as gw:
        assert [row["name"] for row in gw.rules.engine.list()] == ["copy", "hot"]
    broken = json.dumps({"hot": {"sources": ["sensors/#"], "pattern": {"data": {"temp": [{"numeric": [">"]}]}},
                                 "targets": [{"type": "topic", "topic": "alerts/hot"}]}})
    with pytest.raises(ConfigError, match=r"event_rules: rule 'hot': \$\.pattern\.data\.temp\[0\]\.numeric"):
        async with running_gateway(data_dir, event_rules=broken):
            pass
    with pytest.raises(ConfigError, match="event_rules: in a cluster, rules run on the store node"):
        Gateway(Config(data_dir=data_dir, role="gateway", event_rules=cfg.event_rules))
    # (a store node of a replicated group runs its rules only once it leads: checked at start)
    with pytest.raises(ConfigError, match=r"event_rules: rule 'hot': \$\.pattern\.data\.temp\[0\]\.numeric"):
        Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", event_rules=broken))
    with pytest.raises(ConfigError, match="event_rules: rules run on a node with the store and an MQTT listener"):
        await Gateway(Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                             event_rules=cfg.event_rules)).start()
