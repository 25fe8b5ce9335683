"""The tidemq source's options that come from Spark's Kafka source -- ``schema``, ``includeHeaders``,
the timestamp starts and ends, ``minOffsetsPerTrigger`` / ``maxTriggerDelay`` -- and the Kafka
options it refuses, each with what to use instead (never accepted and ignored).

Timestamps are ms since the epoch and compare with the store time (the time the store wrote the
message, Kafka's LogAppendTime). ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``
are JSON per queue (``{"t:devices/1/telemetry": 1767225600000}``); queues missing from them start
at earliest and end at latest, as with JSON offsets. Where Kafka applies a precedence between
``startingTimestamp``, ``startingOffsetsByTimestamp`` and ``startingOffsets``, giving two of them
is an error here: one of them would be ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's default: 15m

KNOWN = frozenset({
    "schema", "includeheaders", "startingtimestamp", "startingoffsetsbytimestamp", "endingtimestamp",
    "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy", "minoffsetspertrigger", "maxtriggerdelay",
})

# Kafka source options this source has no use for, and what to use instead
KAFKA_ONLY = {
    "subscribe": "use topicFilter (an MQTT filter) or queues (store queue names)",
    "subscribepattern": "use topicFilter (an MQTT filter with + and #)",
    "assign": "use queues (store queue names) and JSON startingOffsets",
    "groupidprefix": "offsets live in Spark's checkpoint; there is no consumer group",
    "fetchoffset.numretries": "use retryTimeoutMs (how long an unreachable gateway is retried)",
    "fetchoffset.retryintervalms": "use retryTimeoutMs (how long an unreachable gateway is retried)",
    "kafkaconsumer.polltimeoutms": "use retryTimeoutMs (how long an unreachable gateway is retried)",
    "maxoffsetsperpartition": "use maxRecordsPerPartition",
}
_KAFKA_PREFIX_HINT = ("kafka.", "the connection is address (or dataDir) with token or username and password")

_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def refuse_kafka_only(keys: set[str]) -> None:
    """A Kafka option given to the tidemq source: say what it is and what to use instead."""
    from .spark_options import OptionError

    for key in sorted(keys):
        hint = KAFKA_ONLY.get(key) or (_KAFKA_PREFIX_HINT[1] if key.startswith(_KAFKA_PREFIX_HINT[0]) else None)
        if hint is not None:
            raise OptionError(f"tidemq source: {key} is a Kafka source option the tidemq source does not support: {hint}")


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    schema: str = "native"  # or "kafka": the Kafka source's columns (bridge/kafka_schema.py)
    include_headers: bool = False
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[str, int] | None = None
    ending_timestamp: int | None = None
    ending_by_timestamp: dict[str, int] | None = None
    strategy: str = "error"  # startingOffsetsByTimestampStrategy: no offset at that time -> error | latest
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S

    @property
    def starts_by_time(self) -> bool:
        return self.starting_timestamp is not None or self.starting_by_timestamp is not None

    @property
    def ends_by_time(self) -> bool:
        return self.ending_timestamp is not None or self.ending_by_timestamp is not None

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> KafkaOptions:
        """From the source's lower-cased options."""
        from .spark_options import OptionError, parse_bool, parse_positive

        schema = opts.get("schema", "native").strip().lower()
        if schema not in ("native", "kafka"):
            raise OptionError(f"tidemq source: schema must be native or kafka, not {opts['schema']!r}")
        include_headers = parse_bool(opts.get("includeheaders", "false"), "includeHeaders")
        if include_headers and schema != "kafka":
            raise OptionError("tidemq source: includeHeaders is for schema=kafka (the native schema always has "
                              "the message properties, as the properties column)")
        if "startingoffsets" in opts and ("startingtimestamp" in opts or "startingoffsetsbytimestamp" in opts) or (
                "startingtimestamp" in opts and "startingoffsetsbytimestamp" in opts):
            raise OptionError("tidemq source: give one of startingOffsets, startingOffsetsByTimestamp and "
                              "startingTimestamp (Kafka would silently prefer one)")
        if "endingoffsets" in opts and ("endingtimestamp" in opts or "endingoffsetsbytimestamp" in opts) or (
                "endingtimestamp" in opts and "endingoffsetsbytimestamp" in opts):
            raise OptionError("tidemq source: give one of endingOffsets, endingOffsetsByTimestamp and endingTimestamp")
        strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError("tidemq source: startingOffsetsByTimestampStrategy must be error or latest, "
                              f"not {opts['startingoffsetsbytimestampstrategy']!r}")
        starting_timestamp = _timestamp(opts, "startingtimestamp", "startingTimestamp")
        starting_by = _by_timestamp(opts, "startingoffsetsbytimestamp", "startingOffsetsByTimestamp")
        if "startingoffsetsbytimestampstrategy" in opts and starting_timestamp is None and starting_by is None:
            raise OptionError("tidemq source: startingOffsetsByTimestampStrategy applies only with "
                              "startingTimestamp or startingOffsetsByTimestamp")
        min_rows = parse_positive(opts, "minoffsetspertrigger", "minOffsetsPerTrigger")
        max_rows = parse_positive(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
        if min_rows is not None and max_rows is not None and min_rows > max_rows:
            raise OptionError(f"tidemq source: minOffsetsPerTrigger ({min_rows}) is more than "
                              f"maxOffsetsPerTrigger ({max_rows})")
        delay_s = DEFAULT_MAX_TRIGGER_DELAY_S
        if "maxtriggerdelay" in opts:
            if min_rows is None:
                raise OptionError("tidemq source: maxTriggerDelay applies only with minOffsetsPerTrigger")
            delay_s = _duration_s(opts["maxtriggerdelay"], "maxTriggerDelay")
        return cls(
            schema=schema, include_headers=include_headers, starting_timestamp=starting_timestamp,
            starting_by_timestamp=starting_by, ending_timestamp=_timestamp(opts, "endingtimestamp", "endingTimestamp"),
            ending_by_timestamp=_by_timestamp(opts, "endingoffsetsbytimestamp", "endingOffsetsByTimestamp"),
            strategy=strategy, min_offsets_per_trigger=min_rows, max_trigger_delay_s=delay_s,
        )

    def check_mode(self, streaming: bool) -> None:
        """Options that only one kind of query can honour, refused by the other."""
        from .spark_options import OptionError

        if streaming and self.ends_by_time:
            raise OptionError("tidemq source: endingTimestamp and endingOffsetsByTimestamp are for batch queries only")
        if not streaming and self.min_offsets_per_trigger is not None:
            raise OptionError("tidemq source: minOffsetsPerTrigger and maxTriggerDelay are for streaming queries only")


def _timestamp(opts: Mapping[str, str], key: str, name: str) -> int | None:
    from .spark_options import OptionError

    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"tidemq source: {name} must be ms since the epoch, not {raw!r}") from None
    if value < 0:
        raise OptionError(f"tidemq source: {name} must not be negative")
    return value


def _by_timestamp(opts: Mapping[str, str], key: str, name: str) -> dict[str, int] | None:
    from .spark_options import OptionError

    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value or not all(
            isinstance(q, str) and isinstance(t, int) and not isinstance(t, bool) and t >= 0 for q, t in value.items()):
        raise OptionError(f"tidemq source: {name} must be JSON mapping queue names to times in ms since the "
                          f"epoch, like {{\"t:a/b\": 1767225600000}}, not {raw!r}")
    return value


def _duration_s(raw: str, name: str) -> float:
    """A Spark time string (``15m``, ``30s``, ``500ms``; a bare number is ms, as Spark reads it)."""
    from .spark_options import OptionError

    found = _DURATION.match(raw)
    if found is None:
        raise OptionError(f"tidemq source: {name} must be a duration like 15m, 30s or 500ms, not {raw!r}")
    return int(found.group(1)) * _UNIT_S[(found.group(2) or "ms").lower()]
