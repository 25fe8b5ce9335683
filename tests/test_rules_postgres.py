"""The rules' PostgreSQL target (bridge/rules/targets/postgres.py) against a real PostgreSQL
started on a free port: rows arrive with their columns from the event (MQTT and AMQP publishes); the server stopped and
started again mid-run loses nothing and duplicates no row; a row the table refuses (a constraint,
a value of the wrong type) goes to the dead-letter topic and the others of its batch are kept."""

from __future__ import annotations

import json
from pathlib import Path

import aio_pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .mqtt_support import MQTT_5, PahoClient, mqtt_port, running_gateway
from .postgres_support import Postgres, postgres  # noqa: F401 (the fixture)
from .rules_support import call, until
from .test_rules import admin_url, amqp_url

TABLE = """CREATE TABLE readings (
    id text PRIMARY KEY, n integer UNIQUE, topic text NOT NULL, temp double precision CHECK (temp < 100),
    site text, at timestamptz NOT NULL, body jsonb)"""
COLUMNS = {"id": "$.id", "n": "$.data.n", "topic": "$.subject", "temp": "$.data.temp", "site": "$.properties.site",
           "at": "$.time", "body": "$.data"}


def site(name: str) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("site", name)]
    return properties


async def rows(server: Postgres) -> list[dict]:
    return [dict(row) for row in await server.query("SELECT * FROM readings ORDER BY n")]


async def test_events_become_rows(data_dir: Path, postgres: Postgres) -> None:  # noqa: F811
    await postgres.execute(TABLE)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "store", "sources": ["sensors/#"], "pattern": {"data": {"n": [{"exists": True}]}},
            "targets": [{"type": "postgres", "dsn": postgres.dsn, "table": "readings", "columns": COLUMNS}]})
        assert status == 201, row
        assert row["targets"] == ["postgres:readings"]
        device = PahoClient(mqtt_port(gw), "dev-1", version=MQTT_5)
        await device.connect()
        for n in range(20):
            await device.publish(f"sensors/r{n % 2}", json.dumps({"n": n, "temp": 20 + n / 2}), 1, properties=site("berlin"))
        await device.publish("sensors/r0", json.dumps({"other": 1}), 1)  # (no match)
        connection = await aio_pika.connect(amqp_url(gw))
        exchange = await (await connection.channel()).get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(json.dumps({"n": 20, "temp": 5}).encode(), headers={"site": "paris"},
                                                content_type="application/json"), "sensors.r9")
        await until(lambda: gw.rules.engine.get("store")["delivered"] == 21, what="21 rows")
        got = await rows(postgres)
        assert [r["n"] for r in got] == list(range(21))
        assert (got[20]["topic"], got[20]["site"], got[20]["temp"]) == ("sensors/r9", "paris", 5.0)  # (an AMQP publish)
        await connection.close()
        first = got[0]
        assert (first["topic"], first["temp"], first["site"]) == ("sensors/r0", 20.0, "berlin")
        assert json.loads(first["body"]) == {"n": 0, "temp": 20.0}
        assert first["at"].tzinfo is not None and len({r["id"] for r in got}) == 21
        await device.disconnect()


async def test_postgres_down_then_up_loses_nothing_and_duplicates_nothing(data_dir: Path,
                                                                          postgres: Postgres) -> None:  # noqa: F811
    await postgres.execute(TABLE)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "store", "sources": ["sensors/#"], "retry": {"initial_backoff_ms": 50, "max_backoff_ms": 400},
            "targets": [{"type": "postgres", "dsn": postgres.dsn, "table": "public.readings", "columns": COLUMNS,
                         "on_conflict": "nothing", "timeout_s": 3}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        for n in range(10):
            await device.publish("sensors/a", json.dumps({"n": n, "temp": 1}), 1)
        await until(lambda: gw.rules.engine.get("store")["lag"] == 0, what="the first rows")
        postgres.stop()
        for n in range(10, 50):
            await device.publish("sensors/a", json.dumps({"n": n, "temp": 1}), 1)
        await until(lambda: gw.rules.engine.get("store")["retried"] >= 2, what="retries while PostgreSQL is down")
        row = gw.rules.engine.get("store")
        assert row["lag"] > 0 and row["dead_lettered"] == 0 and row["last_error"], row
        postgres.start()
        await until(lambda: gw.rules.engine.get("store")["lag"] == 0, timeout_s=40, what="the backlog done")
        assert [r["n"] for r in await rows(postgres)] == list(range(50))
        # an event of a row already there (a repeat, as at least once allows) inserts nothing and is delivered
        await device.publish("sensors/a", json.dumps({"n": 3, "temp": 1}), 1)
        await until(lambda: gw.rules.engine.get("store")["delivered"] == 51, what="the repeat delivered")
        assert len(await rows(postgres)) == 50 and gw.rules.engine.get("store")["dead_lettered"] == 0
        await device.disconnect()


async def test_a_server_that_refused_connections_gets_the_rows_as_soon_as_it_listens(data_dir: Path,
                                                                                     postgres: Postgres) -> None:  # noqa: F811
    """PostgreSQL is down when the events come: the target's connection is refused, and its
    address is probed while the retry waits (30 s here), so the rows go in as soon as it listens."""
    await postgres.execute(TABLE)
    postgres.stop()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "late", "sources": ["sensors/#"], "retry": {"initial_backoff_ms": 30_000, "max_backoff_ms": 30_000},
            "targets": [{"type": "postgres", "dsn": postgres.dsn, "table": "public.readings", "columns": COLUMNS,
                         "on_conflict": "nothing", "timeout_s": 3}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-late")
        await device.connect()
        for n in range(5):
            await device.publish("sensors/a", json.dumps({"n": n, "temp": 1}), 1)
        await until(lambda: gw.rules.engine.get("late")["retried"] >= 1, what="a refused connection")
        postgres.start()
        await until(lambda: gw.rules.engine.get("late")["lag"] == 0, timeout_s=15,
                    what="the rows written before the 30 s backoff ends")
        assert [r["n"] for r in await rows(postgres)] == list(range(5))
        await device.disconnect()


async def test_a_row_the_table_refuses_goes_to_the_dead_letter_topic_and_its_batch_goes_on(
        data_dir: Path, postgres: Postgres) -> None:  # noqa: F811
    await postgres.execute(TABLE)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        dead = PahoClient(mqtt_port(gw), "ops", version=MQTT_5)
        await dead.connect()
        await dead.subscribe("$rules/store/dead-letter", qos=1)
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "store", "sources": ["sensors/#"], "paused": True,
            "targets": [{"type": "postgres", "dsn": postgres.dsn, "table": "readings", "columns": COLUMNS}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        payloads = [{"n": 0, "temp": 1}, {"n": 1, "temp": 150},  # CHECK (temp < 100)
                    {"n": 2, "temp": "hot"},  # not a number
                    {"n": 0, "temp": 2},  # UNIQUE (n)
                    {"n": 3, "temp": 3}]
        for payload in payloads:
            await device.publish("sensors/a", json.dumps(payload), 1)
        status, row = await call(admin_url(gw), "POST", "/admin/rules/store/resume")  # (one batch of five)
        assert status == 200, row
        letters = await dead.receive(3)
        reasons = [dict(letter.properties.UserProperty)["dead-letter-reason"] for letter in letters]
        assert [json.loads(letter.payload) for letter in letters] == payloads[1:4]
        assert reasons[0].startswith("refused: CheckViolationError"), reasons
        assert reasons[1].startswith("refused: column temp: 'hot' cannot be stored"), reasons
        assert reasons[2].startswith("refused: UniqueViolationError"), reasons
        await until(lambda: gw.rules.engine.get("store")["lag"] == 0, what="the batch done")
        assert [(r["n"], r["temp"]) for r in await rows(postgres)] == [(0, 1.0), (3, 3.0)]
        row = gw.rules.engine.get("store")
        assert (row["matched"], row["delivered"], row["dead_lettered"], row["retried"]) == (5, 2, 3, 0)
        await device.disconnect()
        await dead.disconnect()


async def test_an_upsert_keeps_the_last_event_of_each_key(data_dir: Path, postgres: Postgres) -> None:  # noqa: F811
    await postgres.execute(TABLE)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "store", "sources": ["sensors/#"], "paused": True,
            "targets": [{"type": "postgres", "dsn": postgres.dsn, "table": "readings", "columns": COLUMNS,
                         "on_conflict": "update", "key": ["n"]}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()
        for n, temp in ((1, 10), (2, 20), (1, 30)):  # (one batch: the rule is paused)
            await device.publish("sensors/a", json.dumps({"n": n, "temp": temp}), 1)
        status, row = await call(admin_url(gw), "POST", "/admin/rules/store/resume")
        assert status == 200, row
        await until(lambda: gw.rules.engine.get("store")["delivered"] == 3, what="three events")
        await device.publish("sensors/a", json.dumps({"n": 2, "temp": 40}), 1)  # (on its own)
        await until(lambda: gw.rules.engine.get("store")["delivered"] == 4, what="the fourth")
        assert [(r["n"], r["temp"]) for r in await rows(postgres)] == [(1, 30.0), (2, 40.0)]
        await device.disconnect()


async def test_a_bad_postgres_target_is_refused_with_its_path(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        good = {"type": "postgres", "dsn": "postgresql://u@h/db", "table": "t", "columns": {"id": "$.id"}}
        for change, path in (({"table": "t; DROP TABLE t"}, "$.targets[0].table"),
                             ({"table": "a.b.c"}, "$.targets[0].table"),
                             ({"columns": {"id\" text": "$.id"}}, "$.targets[0].columns"),
                             ({"columns": {"id": "$.["}}, "$.targets[0].columns.id"),
                             ({"columns": {}}, "$.targets[0].columns"),
                             ({"dsn": "mysql://h/db"}, "$.targets[0].dsn"),
                             ({"on_conflict": "upsert"}, "$.targets[0].on_conflict"),
                             ({"on_conflict": "update"}, "$.targets[0].key"),
                             ({"on_conflict": "update", "key": ["x"]}, "$.targets[0].key"),
                             ({"key": ["id"]}, "$.targets[0].key")):
            status, row = await call(admin_url(gw), "POST", "/admin/rules", {
                "name": "bad", "sources": ["a/#"], "targets": [{**good, **change}]})
            assert (status, row["path"]) == (400, path), row
