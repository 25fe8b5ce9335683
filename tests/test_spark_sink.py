"""The ``tidemq`` sink: the gateway's ``POST /data/publish`` (rows stored as MQTT publishes,
seen by MQTT subscribers and AMQP queues bound to amq.topic; idempotent by batch key; bad rows
reported) and the Spark writer over it (batch writes; streaming is in test_spark_e2e.py)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import aio_pika
import aiohttp
import pyarrow as pa
import pytest

from bridge.spark_options import OptionError
from gateway.http.data_publish import KEYS_TABLE, decode_rows
from protocols.mqtt.packets import MQTT_5
from spark_sinks.writer import SinkOptions, arrow_body, chunks
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway
from tests.spark_support import activate

ARROW = "application/vnd.apache.arrow.stream"


def sink_gateway(data_dir: Path, **config):
    config.setdefault("metrics_bind", "127.0.0.1:0")
    return running_gateway(data_dir, **config)


def base_url(gw) -> str:
    return "http://{}:{}".format(*gw.metrics_address)


def arrow(**columns) -> bytes:
    table = pa.table(columns)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue()


async def post(gw, body: bytes, content_type: str = ARROW, headers: dict | None = None, **params) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{base_url(gw)}/data/publish", data=body, params={k: str(v) for k, v in params.items()},
            headers={"Content-Type": content_type, **(headers or {})}) as response:
        return response.status, await response.json()


async def subscriber(gw, topic_filter: str, client_id: str = "app", **kwargs) -> PahoClient:
    sub = PahoClient(mqtt_port(gw), client_id, **kwargs)
    await sub.connect()
    await sub.subscribe(topic_filter, qos=1)
    return sub


# -- without Spark -----------------------------------------------------------------------------


def test_rows_are_checked_one_by_one() -> None:
    body = arrow(topic=["a/b", None, "a/+", "$SYS/x", "a/c", "a/d", "a/e", ""],
                 payload=[b"1", b"2", b"3", b"4", b"x" * 100, None, b"7", b"8"],
                 qos=pa.array([None, 1, 1, 1, 1, 1, 3, 1], pa.int8()))
    decoded = decode_rows(body, ARROW, qos=1, retain=False, max_packet=100)
    assert decoded.rows == 8 and decoded.bad_rows == 7
    assert [p.topic for p in decoded.publishes] == ["a/b"] and decoded.publishes[0].qos == 1
    reasons = {e["row"]: e["error"] for e in decoded.errors}
    assert reasons[1] == "no topic" and reasons[7] == "no topic"
    assert reasons[2].startswith("invalid topic: a topic name must not contain wildcards")
    assert "reserved" in reasons[3]
    assert "exceeds the gateway's maximum packet size of 100" in reasons[4]
    assert reasons[5].startswith("no payload")
    assert reasons[6] == "qos must be 0, 1 or 2, not 3"


def test_chunks_are_bounded_and_deterministic() -> None:
    batches = [pa.record_batch([pa.array([b"x" * 100] * n)], names=["payload"]) for n in (7, 3, 25, 0, 4)]
    for max_rows, max_bytes in [(10, 1 << 30), (10, 500), (1000, 50)]:
        groups = list(chunks(iter(batches), max_rows, max_bytes))
        sizes = [sum(b.num_rows for b in g) for g in groups]
        assert sum(sizes) == 39 and max(sizes) <= max_rows
        assert all(sum(b.nbytes for b in g) <= max_bytes or len(g) == 1 and g[0].num_rows == 1 for g in groups)
        assert sizes == [sum(b.num_rows for b in g) for g in chunks(iter(batches), max_rows, max_bytes)]
    body = arrow_body([pa.record_batch([pa.array(["t"]), pa.array(["text"])], names=["topic", "payload"])])
    assert pa.ipc.open_stream(body).read_all().column("payload").to_pylist() == [b"text"]


def test_sink_options_are_checked() -> None:
    opts = SinkOptions.parse({"address": "h:1", "writerId": "alerts", "qos": "0", "failOnBadRows": "false"})
    assert (opts.writer_id, opts.qos, opts.fail_on_bad_rows, opts.batch_id) == ("alerts", 0, False, None)
    for bad, words in [({}, "address is required"), ({"address": "h:1", "qos": "3"}, "qos"),
                       ({"address": "h:1", "writerId": "a/b"}, "writerId"),
                       ({"address": "h:1", "batchId": "-1"}, "batchId"),
                       ({"dataDir": "/d"}, "dataDir is for reading"),
                       ({"address": "h:1", "topicFilter": "x"}, "unknown option")]:
        with pytest.raises(OptionError, match=words):
            SinkOptions.parse(bad)


async def test_published_rows_reach_mqtt_subscribers_and_amqp_queues(data_dir: Path) -> None:
    async with sink_gateway(data_dir, amqp_bind="127.0.0.1:0", admin_token="s3cret") as gw:
        sub = await subscriber(gw, "alerts/#", version=MQTT_5)
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        channel = await conn.channel()
        queue = await channel.declare_queue("alerts")
        await queue.bind("amq.topic", "alerts.#")
        body = arrow(topic=["alerts/d1", "alerts/d2"], payload=[b"hot", b"cold"],
                     qos=pa.array([1, 0], pa.int32()), retain=[False, True],
                     properties=pa.array([[("site", "x")], None], pa.map_(pa.string(), pa.string())),
                     key=["k1", None])
        status, answer = await post(gw, body)
        assert status == 401
        auth = {"Authorization": "Bearer s3cret"}
        status, answer = await post(gw, body, headers=auth)
        assert status == 200, answer
        assert answer == {"rows": 2, "stored": 2, "bad_rows": 0, "errors": []}
        got = sorted(await sub.receive(2), key=lambda m: m.topic)
        assert [(m.topic, m.payload, m.qos) for m in got] == [("alerts/d1", b"hot", 1), ("alerts/d2", b"cold", 0)]
        assert got[0].properties.UserProperty == [("site", "x"), ("key", "k1")]
        stored = gw.store.get_now("t:alerts/d1", 0, 10).messages
        assert stored[0].key == "k1" and stored[0].properties["mqtt.cid"] == "data-api"
        amqp = []
        for _ in range(100):
            message = await queue.get(fail=False)
            if message is not None:
                amqp.append((message.routing_key, message.body))
                await message.ack()
            elif len(amqp) == 2:
                break
            else:
                await asyncio.sleep(0.02)
        assert sorted(amqp) == [("alerts.d1", b"hot"), ("alerts.d2", b"cold")]
        late = await subscriber(gw, "alerts/#", "late")  # the retained one
        assert [(m.topic, m.payload, m.retain) for m in await late.receive(1)] == [("alerts/d2", b"cold", True)]
        # JSON lines: text or base64 payloads, per-row errors for lines that are not objects
        lines = (b'{"topic": "alerts/d3", "payload": "warm"}\nnot json\n{"topic": "alerts/d3", "payload_base64": "AAE="}\n'
                 b'{"topic": "alerts/d4", "payload": "x", "properties": 5}\n'
                 b'{"topic": "alerts/d4", "payload": "x", "retain": "yes"}\n')
        status, answer = await post(gw, lines, "application/x-ndjson", auth)
        assert (status, answer["stored"], answer["errors"]) == (200, 2, [
            {"row": 1, "topic": None, "error": "the line is not a JSON object"},
            {"row": 3, "topic": "alerts/d4", "error": "properties must map strings to strings"},
            {"row": 4, "topic": "alerts/d4", "error": "retain must be true or false, not 'yes'"}])
        assert [m.payload for m in await sub.receive(2)] == [b"warm", b"\x00\x01"]
        for body, content_type, words in [(b"nope", ARROW, "not an Arrow IPC stream"),
                                          (arrow(topic=["a"], payload=[b""], colour=["red"]), ARROW, "unknown column"),
                                          (arrow(topic=["a"]), ARROW, "need a payload column"),
                                          (b"{}", "text/plain", "send application/vnd.apache.arrow.stream")]:
            status, answer = await post(gw, body, content_type, auth)
            assert status == 400 and words in answer["error"], answer
        async with aiohttp.ClientSession() as http, http.get(f"{base_url(gw)}/metrics") as response:
            text = await response.text()
        assert 'tidemq_data_publish_rows_total{result="stored"} 4.0' in text
        await asyncio.gather(sub.disconnect(), late.disconnect())
        await conn.close()


async def test_a_batch_key_is_stored_once(data_dir: Path) -> None:
    async with sink_gateway(data_dir) as gw:
        sub = await subscriber(gw, "alerts/#")
        body = arrow(topic=["alerts/a", "alerts/b", "alerts/+"], payload=[b"1", b"2", b"3"])
        key = {"writer": "q1", "batch": 3, "partition": 1, "chunk": 0}
        status, first = await post(gw, body, **key)
        assert status == 200 and first["stored"] == 2 and not first["duplicate"]
        assert first["key"] == "q1/00000000000000000003/0000000001/0000000000"
        # the retry of a lost answer, twice at once: answered from the remembered key
        (s1, again), (s2, twice) = await asyncio.gather(post(gw, body, **key), post(gw, body, **key))
        assert s1 == s2 == 200 and again["duplicate"] and twice["duplicate"]
        assert again["stored"] == 2 and again["bad_rows"] == 1 and again["errors"] == first["errors"]
        status, other = await post(gw, body, **{**key, "chunk": 1})  # another chunk: stored
        assert other["stored"] == 2 and not other["duplicate"]
        assert len(await sub.receive(4)) == 4
        await sub.nothing_more(0.3)
        assert gw.store.max_offset_now("t:alerts/a") == 2
        table = gw.store.table(KEYS_TABLE)
        assert len(list(table.names("q1/"))) == 2
        await post(gw, arrow(topic=["alerts/a"], payload=[b"4"]), writer="q1", batch=4)
        assert len(list(table.names("q1/"))) == 3  # batch 3 may still be re-run while batch 4 runs
        await post(gw, arrow(topic=["alerts/a"], payload=[b"5"]), writer="q1", batch=5)
        assert [n.split("/")[1] for n in table.names("q1/")] == [f"{4:020d}", f"{5:020d}"]
        for params, words in [({"writer": "a/b", "batch": 1}, "without '/'"), ({"writer": "w"}, "batch is required"),
                              ({"writer": "w", "batch": "x"}, "batch must be a number"), ({"qos": 5}, "qos")]:
            status, answer = await post(gw, body, **params)
            assert status == 400 and words in answer["error"]
        await sub.disconnect()


async def test_a_gateway_node_of_a_cluster_publishes_once_per_key(data_dir: Path) -> None:
    """On a gateway node the keys live in the store node's table, read over the store link."""
    from tests.test_cluster_mqtt import cluster

    async with cluster(data_dir) as (store, (a, b)):
        sub = await subscriber(b, "alerts/#")
        body = arrow(topic=["alerts/x", "alerts/y"], payload=[b"1", b"2"])
        for _ in range(2):
            status, answer = await post(a, body, writer="q", batch=1)
            assert status == 200 and answer["stored"] == 2
        assert answer["duplicate"]
        assert sorted(m.payload for m in await sub.receive(2)) == [b"1", b"2"]
        await sub.nothing_more(0.3)
        status, answer = await post(store, body, writer="q", batch=1)  # the store node runs no MQTT
        assert status == 503 and "MQTT" in answer["error"]
        for batch in (2, 3):
            await post(a, arrow(topic=["alerts/x"], payload=[b"%d" % batch]), writer="q", batch=batch)
        await sub.receive(2)
        table = store.store.table(KEYS_TABLE)
        for _ in range(100):  # deletes travel the link one way
            if len(list(table.names("q/"))) == 2:
                break
            await asyncio.sleep(0.02)
        assert [n.split("/")[1] for n in table.names("q/")] == [f"{2:020d}", f"{3:020d}"]
        await sub.disconnect()


# -- through Spark -------------------------------------------------------------------------------


async def test_spark_batch_write_publishes_once_per_writer_and_batch_id(spark, data_dir: Path) -> None:
    async with sink_gateway(data_dir) as gw:
        sub = await subscriber(gw, "alerts/#")
        address = "{}:{}".format(*gw.metrics_address)
        rows = [(f"alerts/d{i % 3}", f"reading {i}".encode()) for i in range(25)]

        async def write(rows: list, schema: str, partitions: int = 1, **options) -> None:
            def run() -> None:
                # (made in this thread: PySpark looks Python data sources up for writes in the
                # thread's active session, which createDataFrame sets)
                df = spark.createDataFrame(rows, schema).repartition(partitions)
                df.write.format("tidemq").option("address", address).options(**options).mode("append").save()
            await asyncio.to_thread(run)

        binary = "topic string, payload binary"
        await write(rows, binary, 2, writerId="nightly", batchId="7", maxRowsPerRequest="4")
        got = await sub.receive(25)
        assert sorted(m.payload for m in got) == sorted(p for _, p in rows)
        await write(rows, binary, 2, writerId="nightly", batchId="7", maxRowsPerRequest="4")  # a rerun: nothing
        await sub.nothing_more(0.5)
        # string payloads, qos and properties columns
        await write([("alerts/s", "text", 0, {"a": "b"})],
                    "topic string, payload string, qos int, properties map<string,string>")
        [m] = await sub.receive(1)
        assert (m.topic, m.payload, m.qos) == ("alerts/s", b"text", 0)
        # bad rows fail the job, naming them, unless skipped
        bad = [("alerts/ok", b"1"), ("alerts/#", b"2")]
        with pytest.raises(Exception, match=r"1 row\(s\) of partition 0 could not be published.*alerts/#.*wildcards"):
            await write(bad, binary, writerId="bad", batchId="1")
        await write(bad, binary, writerId="bad", batchId="2", failOnBadRows="false")
        assert sorted(m.payload for m in await sub.receive(2)) == [b"1", b"1"]  # the good row, once per batch id
        with pytest.raises(Exception, match="unknown column.*colour"):
            await write([("a", b"", "red")], "topic string, payload binary, colour string")
        with pytest.raises(Exception, match="column qos must be an integer"):
            await write([("a", b"", "1")], "topic string, payload binary, qos string")
        await sub.nothing_more(0.2)
        await sub.disconnect()
        assert json.loads(gw.store.table(KEYS_TABLE).get(
            f"nightly/{7:020d}/{0:010d}/{0:010d}"))["stored"] == 4


async def test_writes_inside_foreach_batch_use_the_query_and_batch_ids(spark, data_dir: Path, tmp_path: Path) -> None:
    async with sink_gateway(data_dir) as gw:
        address = "{}:{}".format(*gw.metrics_address)
        sub = await subscriber(gw, "in/#")  # also makes the wildcard queue the query reads
        await sub.subscribe("out/#", qos=1)
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        for i in range(10):
            await pub.publish(f"in/{i}", b"m%d" % i, qos=1)
        await sub.receive(10)

        def each(df, batch_id: int) -> None:
            (df.selectExpr("concat('out/', substring(topic, 4)) as topic", "payload")
             .write.format("tidemq").option("address", address).mode("append").save())

        def run() -> str:
            activate(spark)
            query = (spark.readStream.format("tidemq").option("address", address).option("topicFilter", "in/#")
                     .option("startingOffsets", "earliest").load()
                     .writeStream.foreachBatch(each).trigger(availableNow=True)
                     .option("checkpointLocation", str(tmp_path / "ckpt")).start())
            assert query.awaitTermination(60) and query.exception() is None
            return str(query.id)

        query_id = await asyncio.to_thread(run)
        assert sorted(m.payload for m in await sub.receive(10)) == sorted(b"m%d" % i for i in range(10))
        assert list(gw.store.table(KEYS_TABLE).names()) == [f"{query_id}/{0:020d}/{0:010d}/{0:010d}"]
        for name in ("0", ".0.crc"):  # as after a crash before Spark recorded batch 0: it runs again
            (tmp_path / "ckpt" / "commits" / name).unlink()
        await pub.publish("in/10", b"m10", qos=1)
        await sub.receive(1)
        assert await asyncio.to_thread(run) == query_id
        assert [m.payload for m in await sub.receive(1)] == [b"m10"]  # batch 0 again: nothing twice
        await sub.nothing_more(0.5)
        await asyncio.gather(sub.disconnect(), pub.disconnect())
