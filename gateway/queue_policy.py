"""Per-queue settings the store asks for (store/retention/policy.py): per-topic retention rules from the
configuration, and which queues are *light* -- removed when idle and unread (store/retention/reclaim.py).

Rules are MQTT topic filters -> an age and/or a size, written in TOML as

    [retention.topics]
    "devices/+/telemetry" = { hours = 2160 }
    "devices/+/commands" = { hours = 6, bytes = 10_000_000 }
    "alerts/#" = 48                      # hours

The first rule (in file order) whose filter matches a queue's topic is the queue's: concrete
MQTT topic queues (``t:``) match their topic, remoting topic queues (``r:``) their topic name
as a one-level topic. Wildcard-filter queues (``w:``, live copies for subscribers) and AMQP
queues follow the global retention.

Light queues: concrete topic and wildcard-filter queues where this process knows their
readers (the MQTT gateway runs here, not a store node of a cluster, whose gateway nodes hold the
sessions) and AMQP queues where the AMQP gateway runs. Remoting topics are configured topics,
never light (as in RocketMQ, where only light message queues are cleaned).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from protocols.mqtt.topics import TopicError, matches, validate_topic_filter
from protocols.queue_names import REMOTING_QUEUE_PREFIX, TOPIC_QUEUE_PREFIX


class RuleError(ValueError):
    """A per-topic retention rule that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class TopicRule:
    topic_filter: str
    hours: float  # 0: no age limit
    bytes: int  # 0: no size limit


def parse_rules(table: Mapping[str, object] | str) -> tuple[TopicRule, ...]:
    """``[retention.topics]`` (or its JSON, from the environment) -> rules, in order."""
    if isinstance(table, str):
        if not table.strip():
            return ()
        try:
            table = json.loads(table)
        except ValueError as exc:
            raise RuleError(f"retention_topics: not a JSON object of filter -> rule: {exc}") from None
        if not isinstance(table, dict):
            raise RuleError("retention_topics: a JSON object of topic filter -> hours or {hours, bytes}")
    rules = []
    for topic_filter, value in table.items():
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise RuleError(f"retention_topics: {topic_filter!r} is not a topic filter: {exc}") from None
        if isinstance(value, bool):
            raise RuleError(f"retention_topics: {topic_filter!r}: give hours or {{hours, bytes}}")
        if isinstance(value, (int, float)):
            value = {"hours": value}
        if not isinstance(value, dict) or not value or set(value) - {"hours", "bytes"}:
            raise RuleError(f"retention_topics: {topic_filter!r}: give hours or {{hours, bytes}}, not {value!r}")
        hours, size = value.get("hours", 0), value.get("bytes", 0)
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours < 0:
            raise RuleError(f"retention_topics: {topic_filter!r}: hours is a number of 0 or more, not {hours!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise RuleError(f"retention_topics: {topic_filter!r}: bytes is a whole number of 0 or more, not {size!r}")
        if hours == 0 and size == 0:
            raise RuleError(f"retention_topics: {topic_filter!r}: a rule needs hours or bytes above 0")
        rules.append(TopicRule(topic_filter, float(hours), size))
    return tuple(rules)


class QueuePolicy:
    def __init__(self, rules: tuple[TopicRule, ...], idle_ttl_hours: float, light_prefixes: tuple[str, ...]) -> None:
        self.rules = rules
        self.has_rules = bool(rules)
        self.longest_hours = max((rule.hours for rule in rules), default=0.0)
        self._idle_ttl_s = idle_ttl_hours * 3600.0
        self._light = light_prefixes
        self.light_prefixes = light_prefixes if idle_ttl_hours > 0 else ()
        self._memo: dict[str, TopicRule | None] = {}  # topic -> its rule (a rule set never changes)

    def retention(self, queue: str) -> tuple[float, int] | None:
        rule = self._rule(queue)
        return (rule.hours, rule.bytes) if rule is not None else None

    def idle_ttl_s(self, queue: str) -> float:
        if not self._idle_ttl_s or not queue.startswith(self._light):
            return 0.0
        rule = self._rule(queue)
        # a rule that keeps a topic's messages longer keeps its queue as long
        return max(self._idle_ttl_s, rule.hours * 3600.0) if rule is not None else self._idle_ttl_s

    def _rule(self, queue: str) -> TopicRule | None:
        if not self.rules:
            return None
        if queue.startswith(TOPIC_QUEUE_PREFIX):
            topic = queue[len(TOPIC_QUEUE_PREFIX):]
        elif queue.startswith(REMOTING_QUEUE_PREFIX):
            topic = queue[len(REMOTING_QUEUE_PREFIX):].rpartition(":")[0]
        else:
            return None
        if topic in self._memo:
            return self._memo[topic]
        found = next((rule for rule in self.rules if matches(rule.topic_filter, topic)), None)
        if len(self._memo) >= 65_536:
            self._memo.clear()
        self._memo[topic] = found
        return found
