"""A rule's definition as an operator writes it (JSON: admin API, config file) and as the store
keeps it: sources, pattern, transform, targets, retry policy, dead-letter topic. Checked here,
once, when it is given; a bad one raises ``RuleDefinitionError`` with the JSON path and reason."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from protocols.http1 import RequestHead
from protocols.mqtt.topics import TopicError, matches, overlaps, validate_topic_filter, validate_topic_name

from .errors import RuleDefinitionError
from .patterns import CompiledPattern, PatternError, compile_pattern
from .retry import RetryPolicy
from .schemas import SchemaError
from .schemas import check_name as check_schema_name
from .targets.mqtt_options import MqttBridgeOptions, parse_mqtt_options
from .targets.postgres_options import PostgresOptions, parse_postgres_options
from .transforms import Transform, parse_transform

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TARGET_TYPES = ("topic", "webhook", "mqtt", "postgres")
WEBHOOK_MODES = ("binary", "structured", "batched")
MAX_BATCH_SIZE = 1000  # events in one request of the batched mode
MAX_TARGETS = 8
MAX_SOURCES = 16
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # (RFC 9110 token)
HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")
KEYS = frozenset({"sources", "pattern", "transform", "targets", "retry", "dead_letter_topic", "paused", "schema"})


@dataclass(slots=True, frozen=True)
class TargetSpec:
    """One target: ``topic`` (republished into TideMQ), ``webhook`` (an HTTP endpoint), ``mqtt``
    (a remote broker) or ``postgres`` (a table); the last two keep their options in ``options``."""

    type: str
    topic: str = ""
    qos: int = 1
    url: str = ""
    mode: str = "binary"
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0
    batch_size: int = 100  # (mode "batched": events per request at most)
    options: MqttBridgeOptions | PostgresOptions | None = None

    @property
    def label(self) -> str:
        if self.options is not None:
            return self.options.label
        return f"topic:{self.topic}" if self.type == "topic" else f"webhook:{self.url}"


@dataclass(slots=True, frozen=True)
class RuleDefinition:
    name: str
    sources: tuple[str, ...]
    pattern: CompiledPattern
    transform: Transform
    targets: tuple[TargetSpec, ...]
    retry: RetryPolicy
    dead_letter_topic: str
    paused: bool
    source_json: dict[str, Any]  # as given (with ``paused`` as it now is): what the store keeps
    schema: str | None = None  # the schema every matched event must fit (None: its type's, if any)

    def with_paused(self, paused: bool) -> RuleDefinition:
        return parse_definition(self.name, {**self.source_json, "paused": paused})


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RuleDefinitionError("$.name", "a rule name is 1-64 letters, digits, '_', '.' or '-', "
                                            "starting with a letter or digit")


def parse_definition(name: str, raw: Any) -> RuleDefinition:
    """The checked definition of rule ``name``; RuleDefinitionError when it cannot run."""
    check_name(name)
    if not isinstance(raw, dict):
        raise RuleDefinitionError("$", "a rule is a JSON object")
    unknown = sorted(set(raw) - KEYS - {"name"})
    if unknown:
        raise RuleDefinitionError(f"$.{unknown[0]}", f"unknown key (known: {', '.join(sorted(KEYS))})")
    sources = _sources(raw.get("sources"))
    try:
        pattern = compile_pattern(raw.get("pattern", {}))
    except PatternError as exc:
        raise RuleDefinitionError("$.pattern" + exc.path[1:], exc.reason) from None
    transform = parse_transform(raw.get("transform", {"type": "ORIGINAL"}), "$.transform")
    targets = _targets(raw.get("targets"))
    retry = RetryPolicy.parse(raw.get("retry", {}), "$.retry")
    dead_letter = raw.get("dead_letter_topic", f"$rules/{name}/dead-letter")
    _topic(dead_letter, "$.dead_letter_topic")
    for path, topic in [("$.dead_letter_topic", dead_letter)] + [
            (f"$.targets[{i}].topic", t.topic) for i, t in enumerate(targets) if t.type == "topic"]:
        for source in sources:
            if matches(source, topic):
                raise RuleDefinitionError(path, f"{topic!r} is matched by the source {source!r}: "
                                                "the rule would read what it writes, for ever")
    paused = raw.get("paused", False)
    if not isinstance(paused, bool):
        raise RuleDefinitionError("$.paused", "true or false")
    schema = raw.get("schema")
    if schema is not None:
        try:
            check_schema_name(schema)
        except SchemaError as exc:
            raise RuleDefinitionError("$.schema", exc.reason) from None
    source_json = {key: value for key, value in raw.items() if key != "name"}
    return RuleDefinition(name, sources, pattern, transform, targets, retry, dead_letter, paused, source_json, schema)


def _sources(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_SOURCES:
        raise RuleDefinitionError("$.sources", f"a list of 1 to {MAX_SOURCES} MQTT topic filters")
    for i, topic_filter in enumerate(value):
        if not isinstance(topic_filter, str):
            raise RuleDefinitionError(f"$.sources[{i}]", "a topic filter is a string")
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise RuleDefinitionError(f"$.sources[{i}]", f"not a topic filter: {exc}") from None
        if topic_filter.startswith("$share/"):
            raise RuleDefinitionError(f"$.sources[{i}]", "a rule reads every matching message: no $share/ filter")
        for j, other in enumerate(value[:i]):
            if overlaps(other, topic_filter):
                # one message in both queues would reach the targets twice
                raise RuleDefinitionError(f"$.sources[{i}]", f"overlaps $.sources[{j}] ({other!r})")
    return tuple(value)


def _topic(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise RuleDefinitionError(path, "a topic name is a string")
    try:
        validate_topic_name(value)
    except TopicError as exc:
        raise RuleDefinitionError(path, f"not a topic name: {exc}") from None
    return value


def _targets(value: Any) -> tuple[TargetSpec, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_TARGETS:
        raise RuleDefinitionError("$.targets", f"a list of 1 to {MAX_TARGETS} targets")
    return tuple(_target(item, f"$.targets[{i}]") for i, item in enumerate(value))


def _target(item: Any, path: str) -> TargetSpec:
    if not isinstance(item, dict) or item.get("type") not in TARGET_TYPES:
        raise RuleDefinitionError(f"{path}.type", f"a target is an object whose type is one of {TARGET_TYPES}")
    if item["type"] == "topic":
        _only(item, {"type", "topic", "qos"}, path)
        qos = item.get("qos", 1)
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise RuleDefinitionError(f"{path}.qos", "0, 1 or 2")
        return TargetSpec("topic", topic=_topic(item.get("topic"), f"{path}.topic"), qos=qos)
    if item["type"] == "mqtt":
        return TargetSpec("mqtt", options=parse_mqtt_options(item, path))
    if item["type"] == "postgres":
        return TargetSpec("postgres", options=parse_postgres_options(item, path))
    _only(item, {"type", "url", "mode", "headers", "timeout_s", "batch_size"}, path)
    url = item.get("url")
    if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
        raise RuleDefinitionError(f"{path}.url", "an http:// or https:// URL")
    mode = item.get("mode", "binary")
    if mode not in WEBHOOK_MODES:
        raise RuleDefinitionError(f"{path}.mode", f"one of {WEBHOOK_MODES} (CloudEvents content modes)")
    headers = item.get("headers", {})
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and HEADER_NAME.fullmatch(k) and HEADER_VALUE.fullmatch(v)
            for k, v in headers.items()):
        raise RuleDefinitionError(f"{path}.headers", "an object of header name (an HTTP token) -> value "
                                                     "(printable ASCII, spaces and tabs)")
    try:
        RequestHead(url, tuple(headers.items()))
    except ValueError as exc:
        raise RuleDefinitionError(f"{path}.headers" if "header" in str(exc) else f"{path}.url", str(exc)) from None
    timeout = item.get("timeout_s", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise RuleDefinitionError(f"{path}.timeout_s", "more than 0 and at most 300 seconds")
    batch_size = item.get("batch_size", 100)
    if "batch_size" in item and mode != "batched":
        raise RuleDefinitionError(f"{path}.batch_size", 'only with "mode": "batched"')
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise RuleDefinitionError(f"{path}.batch_size", f"an integer from 1 to {MAX_BATCH_SIZE}")
    return TargetSpec("webhook", url=url, mode=mode, headers=tuple(headers.items()), timeout_s=float(timeout),
                      batch_size=batch_size)


def _only(item: dict[str, Any], known: set[str], path: str) -> None:
    unknown = sorted(set(item) - known)
    if unknown:
        raise RuleDefinitionError(f"{path}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(known))})")
