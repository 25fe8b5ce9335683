"""The topic queues behind MQTT filters (a filter's history, read by the Spark source's
``topicFilter``): the store's queue names scanned by prefix and matched
(``protocols.queue_names.matching_topic_queues``), the gateway's ``POST /data/topics`` and the
data directory's listing agree, overlapping filters list a queue once, and an earlier version's
checkpoint of a filter query (offsets of its wildcard queue) is refused, not misread."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from bridge.data_client import DirectClient, HttpClient, TopicListing
from bridge.planning import CheckpointError, check_checkpoint, pack
from bridge.spark_options import OptionError, SourceOptions
from protocols.queue_names import HELD_FILTERS, matching_topic_queues, topic_queue_prefix
from store.messages import Message
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

TOPICS = ["a", "a/x/b", "a/y/b", "a/x/c", "a/x/b/deep", "ab/x/b", "$SYS/a/x/b", "z/x/b"]
OTHERS = ["w:a/+/b", "q:a/x/b", "r:a:0"]  # not topic queues: never listed


async def test_store_names_match_filters_each_queue_once(open_store) -> None:
    store = await open_store()
    await store.put_batch([(Message(t, b"1"), ["t:" + t]) for t in TOPICS] +
                          [(Message("a/x/b", b"2"), [q]) for q in OTHERS])
    names = store.index.iter_names

    def listed(*filters: str) -> list[str]:
        return matching_topic_queues(filters, names)

    assert list(names("t:a/")) == ["t:a/x/b", "t:a/x/b/deep", "t:a/x/c", "t:a/y/b"]  # keys in name order
    assert listed("a/+/b") == ["t:a/x/b", "t:a/y/b"]
    assert listed("a/#") == ["t:a", "t:a/x/b", "t:a/x/b/deep", "t:a/x/c", "t:a/y/b"]  # "#" takes the parent
    assert listed("+/x/b") == ["t:a/x/b", "t:ab/x/b", "t:z/x/b"]  # not $SYS/...: "+" first never matches "$"
    assert listed("#") == sorted("t:" + t for t in TOPICS if not t.startswith("$"))
    assert listed("$SYS/#") == ["t:$SYS/a/x/b"]
    assert listed("a/x/b") == ["t:a/x/b"]  # a plain topic: its queue alone
    assert listed("a/#", "a/+/b", "a/x/+") == listed("a/#")  # overlapping: each queue once
    assert listed("nothing/+") == []
    assert [topic_queue_prefix(f) for f in ("a/+/b", "a/#", "+/b", "#", "a/b")] == ["t:a/", "t:a", "t:", "t:", "t:a/b"]

    await asyncio.to_thread(store.index.flush)  # what a data-directory reader sees
    client = DirectClient(str(store.options.data_dir))
    try:
        assert client.topic_queues(["a/+/b", "+/x/b"]) == {
            "t:a/x/b": (0, 1), "t:a/y/b": (0, 1), "t:ab/x/b": (0, 1), "t:z/x/b": (0, 1)}
    finally:
        client.close()


async def test_a_held_filters_topics_are_listed_as_its_queue(open_store) -> None:
    """The topics of a held filter (the presence events') have their history in that filter's
    queue, which a filter overlapping it lists (last) instead of their topic queues (one an earlier
    version left, or one written for an exact subscriber); the data directory lists it too, and a
    filter query's checkpoint may name it, not those topic queues."""
    store = await open_store()
    held, event = "w:" + HELD_FILTERS[0], "$SYS/brokers/n/clients/c/connected"
    await store.put_batch([(Message(event, b"1"), [held, "t:" + event]), (Message(event, b"2"), [held]),
                           (Message("$SYS/broker/uptime", b"3"), ["t:$SYS/broker/uptime"]),
                           (Message("a/b", b"4"), ["t:a/b"])])

    def listed(*filters: str) -> list[str]:
        return matching_topic_queues(filters, store.index.iter_names)

    assert listed("$SYS/brokers/+/clients/+/connected") == [held]
    assert listed(event) == [held]
    assert listed("$SYS/#", "a/b") == ["t:$SYS/broker/uptime", "t:a/b", held]
    assert listed("#") == listed("+/b") == ["t:a/b"]  # ("$" topics: not by a first-level wildcard)
    assert listed("$SYS/broker/+") == ["t:$SYS/broker/uptime"]
    await asyncio.to_thread(store.index.flush)
    client = DirectClient(str(store.options.data_dir))
    try:
        assert client.topic_queues(["$SYS/brokers/n/#"]) == {held: (0, 2)}
    finally:
        client.close()
    check_checkpoint(("$SYS/#",), {held: 2, "t:$SYS/broker/uptime": 1}, "start")
    old = re.escape(repr("t:" + event))
    with pytest.raises(CheckpointError, match=f"topic queue {old}.*presence events.*new checkpoint"):
        check_checkpoint(("$SYS/#",), {"t:" + event: 1}, "start")
    with pytest.raises(CheckpointError, match="wildcard queue"):
        check_checkpoint(("a/#",), {held: 1}, "start")


def test_topic_filter_option_takes_one_filter_or_a_json_list() -> None:
    def filters(raw: str) -> tuple[str, ...]:
        return SourceOptions.parse({"address": "h:1", "topicFilter": raw}).topic_filters

    assert filters("a/+/b") == ("a/+/b",)
    assert filters("a,b/#") == ("a,b/#",)  # a comma is a topic character, not a separator
    assert filters('["a/+", "b/#", "a/+"]') == ("a/+", "b/#")
    assert filters("[x]/y") == ("[x]/y",)  # not JSON: one filter that starts with "["
    for bad, words in [("a/#/b", "not an MQTT topic filter"), ('["a/+", 3]', "JSON is a list"), ("[]", "JSON is a list"),
                       ('["a", "b/#/c"]', "'b/#/c'"), ("$share/g/a/#", "shared subscription")]:
        with pytest.raises(OptionError, match=words):
            filters(bad)


def test_short_ranges_share_a_partition_up_to_the_limit() -> None:
    assert pack([30, 30, 30, 30], 70) == [[0, 1], [2, 3]]
    assert pack([15, 15, 15], 25) == [[0], [1], [2]]
    assert pack([100, 1, 1, 100], 10) == [[0], [1, 2], [3]]
    assert pack([1] * 5, 1000) == [[0, 1, 2, 3, 4]]
    assert pack([], 10) == []


def test_a_checkpoint_of_the_wildcard_queue_form_is_refused() -> None:
    """Until this version a topicFilter stream kept its offsets under the filter's wildcard queue
    (``{"w:fleet/+/status": 3}``): read as topic-queue offsets, it would read from wrong places."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from bridge.spark_source import TideMQStreamReader

    reader = TideMQStreamReader(SourceOptions.parse({"address": "127.0.0.1:1", "topicFilter": "fleet/+/status"}))
    with pytest.raises(CheckpointError, match="wildcard queue 'w:fleet/\\+/status'.*queues=w:fleet/\\+/status"):
        reader.latestOffset({"w:fleet/+/status": 3}, ReadAllAvailable())
    with pytest.raises(CheckpointError, match="wildcard queue"):
        reader.partitions({"w:fleet/+/status": 3}, {"w:fleet/+/status": 5})
    with pytest.raises(CheckpointError, match="does not match.*'t:other/topic'.*topicFilter"):
        reader.partitions({"t:other/topic": 0}, {"t:other/topic": 2})


async def test_gateway_lists_the_topic_queues_of_filters(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        pub = PahoClient(mqtt_port(gw), "lister-pub")
        await pub.connect()
        for i, t in enumerate(TOPICS):
            for _ in range(i % 3 + 1):
                await pub.publish(t, b"x", qos=1)
        await pub.disconnect()
        client = HttpClient("http://{}:{}".format(*gw.metrics_address))
        try:
            listed = await asyncio.to_thread(client.topic_queues, ["a/+/b", "a/#"])
            assert listed == {"t:a": (0, 1), "t:a/x/b": (0, 2), "t:a/y/b": (0, 3), "t:a/x/c": (0, 1),
                              "t:a/x/b/deep": (0, 2)}
        finally:
            client.close()
        url = "http://{}:{}/data/topics".format(*gw.metrics_address)
        async with aiohttp.ClientSession() as http:
            for bad in ({"topicFilters": ["a/#/b"]}, {"topicFilters": []}, {"topicFilter": "a/#"}, ["a"]):
                async with http.post(url, json=bad) as response:
                    assert response.status == 400 and (await response.json())["error"], bad


class ListingClient:
    """A store client that answers listings from a dict the test changes, and counts them."""

    def __init__(self) -> None:
        self.topics: dict[str, tuple[int, int]] = {}
        self.listings = 0

    def topic_listing(self, topic_filters: list[str], since: str | None = None) -> TopicListing:
        self.listings += 1
        return TopicListing(dict(self.topics))

    def hold_reading(self, topic_filters: tuple[str, ...], lease_s: float) -> bool:
        return False  # (no gateway: nothing to hold)


def test_stream_plans_new_topics_from_their_earliest_offset_with_one_listing_a_trigger(monkeypatch) -> None:
    """What the stream reader plans each trigger (Spark calls latestOffset, reportLatestOffset,
    then partitions): a topic listed for the first time starts at its first readable offset
    (retention may have removed its start), a topic no longer listed keeps its offset, and the
    filter's topics are listed once a trigger."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from bridge import data_client
    from bridge.spark_source import TideMQStreamReader

    options = SourceOptions.parse({"address": "127.0.0.1:1", "topicFilter": "a/+"})
    client = ListingClient()
    monkeypatch.setitem(data_client._CLIENTS, options.connection, client)
    reader = TideMQStreamReader(options)

    def trigger(start: dict) -> tuple[dict, list[tuple[str, int, int]]]:
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.reportLatestOffset()
        parts = reader.partitions(start, end)
        ranges = [r for p in parts for r in getattr(p, "ranges", [p])]
        return end, [(r.queue, r.start, r.end) for r in ranges]

    client.topics = {"t:a/1": (0, 3)}
    start = reader.initialOffset()  # startingOffsets: latest
    assert start == {"t:a/1": 3} and client.listings == 1
    client.topics = {"t:a/1": (0, 5), "t:a/2": (2, 4)}
    end, ranges = trigger(start)
    assert end == {"t:a/1": 5, "t:a/2": 4} and ranges == [("t:a/1", 3, 5), ("t:a/2", 2, 4)]
    assert client.listings == 2  # one for the trigger
    client.topics = {"t:a/2": (2, 6)}  # t:a/1 gone from the listing: kept where it was
    end, ranges = trigger(end)
    assert end == {"t:a/1": 5, "t:a/2": 6} and ranges == [("t:a/2", 4, 6)] and client.listings == 3


async def test_listing_since_a_cursor_names_only_the_topics_that_changed(data_dir: Path) -> None:
    """POST /data/topics with ``since``: the matching topic queues that got messages after the
    cursor (a new topic included), readable ones only; an unknown cursor gets everything."""
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        for t in ("a/x/b", "a/y/b", "z/x/b"):
            await pub.publish(t, b"1", qos=1)
        client = HttpClient("http://{}:{}".format(*gw.metrics_address))
        try:
            first = await asyncio.to_thread(client.topic_listing, ["a/+/b"])
            assert first.complete and first.queues == {"t:a/x/b": (0, 1), "t:a/y/b": (0, 1)}
            nothing = await asyncio.to_thread(client.topic_listing, ["a/+/b"], first.cursor)
            assert not nothing.complete and nothing.queues == {}
            for t in ("a/y/b", "a/y/b", "a/new/b", "z/x/b", "a/x/c"):
                await pub.publish(t, b"2", qos=1)
            changed = await asyncio.to_thread(client.topic_listing, ["a/+/b"], nothing.cursor)
            assert not changed.complete and changed.queues == {"t:a/new/b": (0, 1), "t:a/y/b": (0, 3)}
            again = await asyncio.to_thread(client.topic_listing, ["a/+/b"], changed.cursor)
            assert again.queues == {}
            unknown = await asyncio.to_thread(client.topic_listing, ["a/+/b"], "0:0")  # (another gateway's)
            assert unknown.complete and set(unknown.queues) == {"t:a/x/b", "t:a/y/b", "t:a/new/b"}
        finally:
            client.close()
            await pub.disconnect()


async def test_listing_since_a_cursor_names_the_held_queue_when_an_event_comes(data_dir: Path) -> None:
    """The presence events' topics are listed as their held filter's queue: a listing since a
    cursor names it once a client's event is stored after the cursor, as a topic queue's would be."""
    held = "w:" + HELD_FILTERS[0]
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        client = HttpClient("http://{}:{}".format(*gw.metrics_address))
        device = PahoClient(mqtt_port(gw), "comes")
        try:
            first = await asyncio.to_thread(client.topic_listing, ["$SYS/brokers/+/clients/+/connected"])
            assert first.complete and first.queues == {}
            await device.connect()
            for _ in range(100):  # (the event is stored asynchronously)
                if gw.store.max_offset_now(held) == 1:
                    break
                await asyncio.sleep(0.02)
            changed = await asyncio.to_thread(client.topic_listing, ["$SYS/brokers/+/clients/+/connected"],
                                              first.cursor)
            assert not changed.complete and changed.queues == {held: (0, 1)}
        finally:
            client.close()
            await device.disconnect()


class ChangesClient(ListingClient):
    """A listing client with cursors: what changed since the last listing, or all."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: dict[str, tuple[int, int]] = {}
        self.full = 0

    def topic_listing(self, topic_filters: list[str], since: str | None = None) -> TopicListing:
        self.listings += 1
        if since is None:
            self.full += 1
            return TopicListing(dict(self.topics), "c", True)
        changed, self.changed = self.changed, {}
        return TopicListing(changed, "c", False)


def test_stream_merges_what_changed_into_its_listing_and_lists_all_now_and_then(monkeypatch) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from bridge import data_client, spark_source
    from bridge.spark_source import TideMQStreamReader

    options = SourceOptions.parse({"address": "127.0.0.1:1", "topicFilter": "a/+"})
    client = ChangesClient()
    monkeypatch.setitem(data_client._CLIENTS, options.connection, client)
    reader = TideMQStreamReader(options)
    client.topics = {"t:a/1": (0, 3), "t:a/2": (0, 2)}
    start = reader.initialOffset()
    assert start == {"t:a/1": 3, "t:a/2": 2} and client.full == 1
    client.changed = {"t:a/2": (0, 5), "t:a/3": (1, 2)}  # t:a/1 unchanged: not in the answer
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"t:a/1": 3, "t:a/2": 5, "t:a/3": 2} and client.full == 1
    assert reader.reportLatestOffset() == {"t:a/1": 3, "t:a/2": 5, "t:a/3": 2}
    monkeypatch.setattr(spark_source, "FULL_LISTING_S", 0.0)  # time for a full listing
    client.topics = {"t:a/1": (3, 7), "t:a/2": (0, 5), "t:a/3": (1, 2)}
    assert reader.latestOffset(end, ReadAllAvailable()) == {"t:a/1": 7, "t:a/2": 5, "t:a/3": 2}
    assert client.full == 2


def test_changes_older_than_what_is_remembered_ask_for_a_full_listing(monkeypatch) -> None:
    from gateway.http import topic_changes

    monkeypatch.setattr(topic_changes, "MAX_TRACKED", 2)
    listeners = []
    changes = topic_changes.TopicChanges()
    old = changes.cursor(listeners.append)
    for queue in ("t:a", "t:b", "w:x", "t:c"):
        listeners[0]({queue: 1})
    assert changes.since(old) is None  # t:a's change is forgotten: the reader must list all
    recent = changes.cursor(listeners.append)
    listeners[0]({"t:b": 2})
    assert changes.since(recent) == ["t:b"] and len(listeners) == 1
