"""The data API under the ACL (gateway/http/data_access.py), through the Spark source's and sink's
own HTTP clients: a user's Basic credentials, reads of queues whose topics the ACL denies and
publishes to them refused with 403 (nothing stored), the admin token as the operator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.data_client import HttpClient, SourceError
from bridge.spark_options import Connection, OptionError
from gateway.auth import PasswordFile
from spark_sinks.writer import PublishClient, PublishError

from .mqtt_support import PahoClient, mqtt_port, running_gateway

ACL = """
user alice
topic readwrite #
amqp ".*" ".*" ".*"

user mallory
topic readwrite #
topic deny secret/#
amqp ".*" ".*" ".*"

user bob
topic read sensors/#
"""


@pytest.fixture
def secured(tmp_path: Path) -> dict:
    users = PasswordFile()
    for name in ("alice", "mallory", "bob"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    return {"password_file": str(tmp_path / "passwd"), "acl_file": str(tmp_path / "acl"), "allow_anonymous": False,
            "metrics_bind": "127.0.0.1:0"}


def arrow_rows(*topics: str) -> bytes:
    import pyarrow as pa

    table = pa.table({"topic": list(topics), "payload": [f"row {t}".encode() for t in topics]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


async def test_sink_publish_to_denied_topic_refused(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        url = f"http://127.0.0.1:{gw.metrics_address[1]}"
        mallory = PublishClient(url, username="mallory", password="pw-mallory")
        with pytest.raises(PublishError, match="403.*secret/spark"):
            await asyncio.to_thread(mallory.publish, arrow_rows("public/spark", "secret/spark"), {}, 1)
        assert gw.store.max_offset_now("t:public/spark") == 0  # nothing of the request
        answer = await asyncio.to_thread(mallory.publish, arrow_rows("public/spark"), {}, 1)
        assert answer["stored"] == 1
        with pytest.raises(PublishError, match="401"):
            await asyncio.to_thread(PublishClient(url, username="mallory", password="wrong").publish,
                                    arrow_rows("public/spark"), {}, 1)
        with pytest.raises(PublishError, match="401"):  # anonymous is not allowed here
            await asyncio.to_thread(PublishClient(url).publish, arrow_rows("public/spark"), {}, 1)
        assert gw.authorizer.stats.denied[("http", "publish")] == 1


async def test_source_reads_of_denied_queues_refused(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, admin_token="T0K", amqp_bind="127.0.0.1:0", **secured) as gw:
        import pika

        amqp_port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")

        def alice_queue() -> None:  # an AMQP queue fed secret topics: not mallory's to read either
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", amqp_port, credentials=pika.PlainCredentials("alice", "pw-alice")))
            ch = conn.channel()
            ch.queue_declare("alice.secret")
            ch.queue_bind("alice.secret", "amq.topic", "secret.#")
            conn.close()

        await asyncio.to_thread(alice_queue)
        url = f"http://127.0.0.1:{gw.metrics_address[1]}"
        cursors = {"mallory": (await asyncio.to_thread(
                       HttpClient(url, username="mallory", password="pw-mallory").topic_listing, ["#"])).cursor,
                   "operator": (await asyncio.to_thread(HttpClient(url, token="T0K").topic_listing, ["#"])).cursor}
        alice = PahoClient(mqtt_port(gw), "alice-dev", username="alice", password="pw-alice")
        await alice.connect()
        await alice.publish("secret/plans", b"hidden", 1)
        await alice.publish("public/news", b"open", 1)
        await alice.disconnect()
        mallory = HttpClient(url, username="mallory", password="pw-mallory")
        operator = HttpClient(url, token="T0K")

        def run() -> None:
            with pytest.raises(SourceError, match="403"):
                mallory.read("t:secret/plans", 0, 10, 10)
            with pytest.raises(SourceError, match="403"):
                mallory.offsets(["t:public/news", "t:secret/plans"])
            with pytest.raises(SourceError, match="403"):  # times tell what a queue holds, too
                mallory.offsets_for_times({"t:public/news": 0, "t:secret/plans": 0})
            assert mallory.offsets_for_times({"t:public/news": 0}) == {"t:public/news": 0}
            with pytest.raises(SourceError, match="403"):
                mallory.read("w:#", 0, 10, 10)  # a deny rule touches "#": its rows cannot be checked one by one
            with pytest.raises(SourceError, match="403"):
                mallory.read("q:alice.secret", 0, 10, 10)
            assert [b.num_rows for b in mallory.read("t:public/news", 0, 10, 10).batches] == [1]
            with pytest.raises(SourceError, match="403"):  # several ranges in one read: each one checked
                mallory.read_many([("t:public/news", 0, 1), ("t:secret/plans", 0, 1)], 10)
            assert [f.batches[0].num_rows for f in mallory.read_many([("t:public/news", 0, 1)], 10)] == [1]
            listed = mallory._json("GET", "/data/queues?topicFilter=secret/plans")["queues"]
            assert listed == []  # what it may not read is not listed
            assert mallory.topic_queues(["#"]) == {"t:public/news": (0, 1)}  # nor among a filter's topics
            # what changed since a cursor: only what the caller may read
            assert set(mallory.topic_listing(["#"], since=cursors["mallory"]).queues) == {"t:public/news"}
            assert set(operator.topic_listing(["#"], since=cursors["operator"]).queues) == {
                "t:public/news", "t:secret/plans"}
            assert operator.topic_queues(["#"]) == {"t:public/news": (0, 1), "t:secret/plans": (0, 1)}
            assert [b.num_rows for b in operator.read("t:secret/plans", 0, 10, 10).batches] == [1]
            with pytest.raises(SourceError, match="401"):
                HttpClient(url, token="wrong").read("t:public/news", 0, 10, 10)

        await asyncio.to_thread(run)


async def test_spark_reads_a_list_of_filters_as_far_as_the_acl_allows(spark, data_dir: Path, secured: dict) -> None:
    """A list of overlapping filters reads each matching topic once; a user's query reads only the
    topics the ACL lets it read (the others are not even listed)."""
    async with running_gateway(data_dir, **secured) as gw:
        alice = PahoClient(mqtt_port(gw), "alice-dev", username="alice", password="pw-alice")
        await alice.connect()
        for topic, count in (("secret/plans", 2), ("public/news", 3), ("public/sports", 1), ("misc/x", 1)):
            for i in range(count):
                await alice.publish(topic, b"%d" % i, 1)
        await alice.disconnect()

        def read(user: str) -> list[tuple[str, int]]:
            rows = (spark.read.format("tidemq").option("address", f"127.0.0.1:{gw.metrics_address[1]}")
                    .option("username", user).option("password", "pw-" + user)
                    .option("topicFilter", '["public/+", "secret/#", "public/news"]').load()
                    .select("queue", "offset").collect())
            return sorted((r.queue, r.offset) for r in rows)

        public = [("t:public/news", 0), ("t:public/news", 1), ("t:public/news", 2), ("t:public/sports", 0)]
        assert await asyncio.to_thread(read, "alice") == [*public, ("t:secret/plans", 0), ("t:secret/plans", 1)]
        assert await asyncio.to_thread(read, "mallory") == public


async def test_queue_listing_pages_over_what_the_caller_may_read(data_dir: Path, secured: dict,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``/data/queues?prefix=``: the limit counts the queues the caller may read (the others are
    left out first), and ``next_after`` pages on past any number of the others, to the end."""
    from gateway.http import data_topics, queue_pages

    async with running_gateway(data_dir, **secured) as gw:
        alice = PahoClient(mqtt_port(gw), "alice-dev", username="alice", password="pw-alice")
        await alice.connect()
        for topic in [f"a/{i}" for i in range(12)] + [f"sensors/{i}" for i in range(4)]:
            await alice.publish(topic, b"x", 1)
        await alice.disconnect()
        url = f"http://127.0.0.1:{gw.metrics_address[1]}"
        bob = HttpClient(url, username="bob", password="pw-bob")
        sensors = [f"t:sensors/{i}" for i in range(4)]

        def listing(query: str) -> tuple[list[str], str | None]:
            answer = bob._json("GET", "/data/queues?" + query)
            return [row["queue"] for row in answer["queues"]], answer["next_after"]

        def pages(limit: int) -> list[list[str]]:
            found, after = [], ""
            while True:
                names, after = listing(f"prefix=t:&limit={limit}&after={after}")
                found.append(names)
                if after is None:
                    return found

        def run() -> None:
            assert listing("prefix=t:&limit=4") == (sensors, None)
            assert listing("prefix=t:&limit=2") == (sensors[:2], sensors[1])
            assert listing(f"prefix=t:&limit=2&after={sensors[1]}") == (sensors[2:], None)
            assert listing("prefix=t:sensors&limit=10") == (sensors, None)
            with pytest.raises(SourceError, match="400.*limit"):
                listing("prefix=t:&limit=10001")
            monkeypatch.setattr(queue_pages, "MAX_SCAN", 5)  # a bounded scan per page: pages on past the rest
            found = pages(3)
            assert [name for page in found for name in page] == sensors and len(found) > 2
            # a filter's topic queues: their cap counts what bob may read, not the other 12
            monkeypatch.setattr(data_topics, "MAX_TOPIC_QUEUES", 4)
            assert sorted(bob.topic_queues(["#"])) == sensors
            with pytest.raises(SourceError, match="400.*more than 4"):
                HttpClient(url, username="alice", password="pw-alice").topic_queues(["#"])

        await asyncio.to_thread(run)


def test_spark_options_take_a_user_or_the_token() -> None:
    from bridge.spark_options import SourceOptions

    options = SourceOptions.parse({"address": "h:1", "topicFilter": "a/#", "username": "u", "password": "p"})
    assert options.connection.username == "u" and "p" not in repr(options.connection)
    with pytest.raises(OptionError, match="not both"):
        SourceOptions.parse({"address": "h:1", "topicFilter": "a/#", "username": "u", "password": "p", "token": "t"})
    with pytest.raises(OptionError, match="go together"):
        Connection.of({"address": "h:1", "username": "u"}, "sink")
