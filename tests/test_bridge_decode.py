"""``bridge.decode``: JSON payloads decoded with an error column instead of a failed job, and
topic levels as columns (through the shared Spark session, on small batch DataFrames)."""

from __future__ import annotations

import pytest

from bridge.decode import level_names, topic_filter


def test_templates_are_mqtt_filters_with_named_levels() -> None:
    assert topic_filter("devices/{device}/telemetry") == "devices/+/telemetry"
    assert topic_filter("site/{site}/+/{sensor}/#") == "site/+/+/+/#"
    assert level_names("site/{site}/+/{sensor}/#") == ["site", "sensor"]
    for bad, words in [("devices/x{device}/t", "whole level"), ("a/{d}/{d}", "twice"), ("a/#/b", "'#'"),
                       ("a/{1x}", "whole level"), ("", "at least one character")]:
        with pytest.raises(ValueError, match=words):
            topic_filter(bad)


def test_topic_columns_map_levels_and_leave_other_topics_null(spark) -> None:
    from pyspark.sql import functions as F

    from bridge.decode import format_topic, topic_columns

    topics = ["devices/d1/telemetry", "devices/d-2/telemetry", "devices/d1/status", "devices/telemetry",
              "devices//telemetry", "devices/a/b/telemetry"]
    df = spark.createDataFrame([(t,) for t in topics], "topic string")
    rows = topic_columns(df, "devices/{device}/telemetry").collect()
    assert [r.device for r in rows] == ["d1", "d-2", None, None, "", None]
    rows = topic_columns(df, "{kind}/{device}/#").collect()
    assert [(r.kind, r.device) for r in rows] == [("devices", "d1"), ("devices", "d-2"), ("devices", "d1"),
                                                  ("devices", "telemetry"), ("devices", ""), ("devices", "a")]
    rows = topic_columns(spark.createDataFrame([("$SYS/x",), ("site/a",), ("site",)], "topic string"),
                         "{root}/#").collect()
    assert [r.root for r in rows] == [None, "site", "site"]  # wildcards do not match $ topics; a/# matches a
    with pytest.raises(ValueError, match="already has column"):
        topic_columns(df.withColumn("device", F.lit(1)), "devices/{device}/telemetry")
    out = topic_columns(df, "devices/{device}/telemetry").where("device is not null")
    assert [r.t for r in out.select(format_topic("alerts/{device}/high").alias("t")).collect()] == [
        "alerts/d1/high", "alerts/d-2/high", "alerts//high"]


def test_decode_json_gives_an_error_per_undecodable_payload(spark) -> None:
    from bridge.decode import decode_json

    payloads = [
        b'{"temp": 21.5, "ts": 100}',
        b'{"temp": "hot", "ts": 100}',
        b"not json",
        b"[1, 2]",
        b"",
        None,
        b'\xff\xfe{"temp": 1}',
        b'{"ts": 5}',
        b'{"temp": 3, "other": {"a": 1}}',
    ]
    df = spark.createDataFrame([(i, p) for i, p in enumerate(payloads)], "n int, payload binary")
    rows = decode_json(df, "temp double, ts double", required=("temp",)).orderBy("n").collect()
    assert [r.error for r in rows] == [
        None,
        'field temp is not double: hot',
        "payload is not JSON: not json",
        "payload is not a JSON object: [1, 2]",
        "empty payload",
        "no payload",
        "payload is not UTF-8",
        "missing field temp",
        None,
    ]
    assert [(r.data.temp, r.data.ts) if r.data else None for r in rows] == [
        (21.5, 100.0), None, None, None, None, None, None, None, (3.0, None)]
    assert rows[0].payload == payloads[0] and rows[0].n == 0  # the other columns stay
    # string payloads, other column names, no required fields
    df = spark.createDataFrame([('{"v": [1, 2]}',), ('{"v": 7}',)], "body string")
    rows = decode_json(df, "v array<int>", column="body", into="x", error="why").collect()
    assert [(r.x.v if r.x else None, r.why) for r in rows] == [([1, 2], None), (None, "field v is not array<int>: 7")]
    with pytest.raises(ValueError, match="not in the schema"):
        decode_json(df, "v int", column="body", required=("w",))
