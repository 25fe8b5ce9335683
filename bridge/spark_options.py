"""Options of the ``tidemq`` Spark source, parsed once and checked with messages that name the
option (Spark hands them over as a case-insensitive string map).

Offsets follow the Kafka source: a queue's offsets count its messages from 0, ``earliest`` is
the first offset still stored, ``latest`` the offset the next message will get, and JSON gives
one offset per queue (``{"t:devices/1/telemetry": 42}``, with -2 for earliest and -1 for
latest). Queues missing from a JSON start at earliest and end at latest. The options that come
from the Kafka source besides these (schema, timestamps, minOffsetsPerTrigger, the Kafka options
refused) are parsed in ``kafka_options.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocols.mqtt.topics import SHARE_PREFIX, TopicError, validate_topic_filter

from .kafka_options import KNOWN as KAFKA_KNOWN
from .kafka_options import KafkaOptions, refuse_kafka_only

log = logging.getLogger("tidemq.spark")

EARLIEST = -2
LATEST = -1
DEFAULT_FETCH_ROWS = 65_536
DEFAULT_MAX_RECORDS_PER_PARTITION = 262_144
DEFAULT_FILTER_LEASE_S = 600.0  # how long the gateway counts a stopped stream as a reader of its topics
DEFAULT_RETRY_TIMEOUT_S = 120.0  # how long an unreachable gateway is tried again before a query fails


class OptionError(ValueError):
    """An option of the tidemq source that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Connection:
    """Where to read from. Picklable: it travels to the executors inside every partition.

    ``address``: a running gateway's metrics listener (``host:port`` or ``http://host:port``),
    read through its ``/data/`` API from any host. ``data_dir``: the store's data directory on
    this host, read directly (co-located readers only: every executor must see the directory).
    """

    address: str | None = None
    token: str | None = None  # the gateway's admin_token: the operator's rights
    data_dir: str | None = None
    retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S
    username: str | None = None  # or a user of the gateway's password file, under its ACL
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, opts: Mapping[str, str], what: str, data_dir: str | None = None,
           retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S) -> Connection:
        """From a source's or sink's (lower-cased) options: address, token, username, password."""
        username, password = opts.get("username") or None, opts.get("password")
        if username is not None and opts.get("token"):
            raise OptionError(f"tidemq {what}: give token (the admin token) or username and password, not both")
        if (username is None) != (password is None):
            raise OptionError(f"tidemq {what}: username and password go together")
        return cls(address=opts.get("address") or None, token=opts.get("token") or None, data_dir=data_dir,
                   retry_timeout_s=retry_timeout_s, username=username, password=password)

    @property
    def url(self) -> str:
        assert self.address is not None
        return self.address if "://" in self.address else f"http://{self.address}"


# offsets: queue -> offset, or EARLIEST / LATEST
OffsetSpec = str | dict[str, int]


@dataclass(frozen=True, slots=True)
class SourceOptions:
    connection: Connection
    queues: tuple[str, ...] = ()
    topic_filters: tuple[str, ...] = ()  # MQTT filters: their topic queues (bridge/planning.py)
    starting_offsets: OffsetSpec | None = None  # None: the mode's default (batch earliest, stream latest)
    ending_offsets: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    fetch_rows: int = DEFAULT_FETCH_ROWS
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    kafka: KafkaOptions = field(default_factory=KafkaOptions)  # schema, includeHeaders, timestamps, minOffsetsPerTrigger
    filter_lease_s: float = DEFAULT_FILTER_LEASE_S  # a stream's reading hold on its topicFilter (data_client.ReadingLease)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
        known = {"address", "token", "username", "password", "datadir", "queues", "topicfilter", "startingoffsets",
                 "endingoffsets", "maxoffsetspertrigger", "failondataloss", "fetchrows", "maxrecordsperpartition",
                 "minpartitions", "retrytimeoutms", "filterleasems"} | KAFKA_KNOWN
        refuse_kafka_only(set(opts) - known)
        unknown = sorted(set(opts) - known)
        if unknown:
            raise OptionError(f"tidemq source: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        address, data_dir = opts.get("address") or None, opts.get("datadir") or None
        if (address is None) == (data_dir is None):
            raise OptionError("tidemq source: give exactly one of address (a gateway's --metrics-bind HOST:PORT) "
                              "or dataDir (the store's data directory on this host)")
        queues: tuple[str, ...] = ()
        if opts.get("queues"):
            queues = _queue_list(opts["queues"])
        topic_filters = parse_topic_filters(opts["topicfilter"]) if opts.get("topicfilter") else ()
        if bool(queues) == bool(topic_filters):
            raise OptionError("tidemq source: give exactly one of queues (store queue names, e.g. "
                              "t:devices/1/telemetry) or topicFilter (an MQTT filter, e.g. devices/+/telemetry, "
                              'or a JSON list of them)')
        lease_ms = parse_positive(opts, "filterleasems", "filterLeaseMs")
        retry_ms = parse_positive(opts, "retrytimeoutms", "retryTimeoutMs", zero=True)
        retry_s = DEFAULT_RETRY_TIMEOUT_S if retry_ms is None else retry_ms / 1000
        return cls(
            connection=Connection.of(opts, "source", data_dir, retry_s),
            queues=queues,
            topic_filters=topic_filters,
            starting_offsets=_offsets(opts["startingoffsets"], "startingOffsets") if "startingoffsets" in opts else None,
            ending_offsets=_offsets(opts.get("endingoffsets", "latest"), "endingOffsets"),
            max_offsets_per_trigger=parse_positive(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
            fail_on_data_loss=parse_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
            fetch_rows=parse_positive(opts, "fetchrows", "fetchRows") or DEFAULT_FETCH_ROWS,
            max_records_per_partition=parse_positive(opts, "maxrecordsperpartition", "maxRecordsPerPartition")
            or DEFAULT_MAX_RECORDS_PER_PARTITION,
            min_partitions=parse_positive(opts, "minpartitions", "minPartitions"),
            kafka=KafkaOptions.parse(opts),
            filter_lease_s=DEFAULT_FILTER_LEASE_S if lease_ms is None else lease_ms / 1000,
        )


def _queue_list(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if raw.startswith("["):  # JSON, for names with commas in them
        try:
            names = json.loads(raw)
        except ValueError as exc:
            raise OptionError(f"tidemq source: queues is not a JSON list: {exc}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise OptionError("tidemq source: queues as JSON must be a list of queue names")
    else:
        names = [n.strip() for n in raw.split(",") if n.strip()]
    return tuple(dict.fromkeys(names))


def parse_topic_filters(raw: str) -> tuple[str, ...]:
    """``topicFilter``: one MQTT filter, or a JSON array of them (``["a/+", "b/#"]``). MQTT
    topics may hold commas, so a list is JSON, never comma-separated. A value that starts with
    ``[`` and is valid JSON is the list form; anything else is one filter (so ``[x]/y`` is one)."""
    text = raw.strip()
    filters: list[str]
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if value is not None:
            if not isinstance(value, list) or not value or not all(isinstance(f, str) for f in value):
                raise OptionError('tidemq source: topicFilter as JSON is a list of MQTT filters, like ["a/+/b", "c/#"]')
            filters = value
        else:
            filters = [raw]
    else:
        filters = [raw]
    for topic_filter in filters:
        if topic_filter.startswith(SHARE_PREFIX):
            raise OptionError(f"tidemq source: topicFilter {topic_filter!r} is a shared subscription; a query reads "
                              "the topics of a plain filter (without $share/{group}/)")
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise OptionError(f"tidemq source: topicFilter {topic_filter!r} is not an MQTT topic filter: {exc}") from None
    return tuple(dict.fromkeys(filters))


def _offsets(raw: str, name: str) -> OffsetSpec:
    text = raw.strip()
    if text in ("earliest", "latest"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        raise OptionError(f"tidemq source: {name} must be earliest, latest or JSON "
                          f"like {{\"t:a/b\": 42}}, not {raw!r}") from None
    if not isinstance(value, dict) or not all(
        isinstance(q, str) and isinstance(o, int) and not isinstance(o, bool) and o >= EARLIEST
        for q, o in value.items()
    ):
        raise OptionError(f"tidemq source: {name} as JSON maps queue names to offsets (-2 earliest, -1 latest)")
    return value


def parse_bool(raw: str, name: str) -> bool:
    text = raw.strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(f"tidemq source: {name} must be true or false, not {raw!r}")


def parse_positive(opts: Mapping[str, str], key: str, name: str, *, zero: bool = False) -> int | None:
    raw = opts.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"tidemq source: {name} must be a whole number, not {raw!r}") from None
    if value < (0 if zero else 1):
        raise OptionError(f"tidemq source: {name} must be at least {0 if zero else 1}")
    return value
