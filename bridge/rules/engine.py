"""The rules engine, the front door of ``bridge/rules`` for the gateway: the rules the store keeps
(and the configuration declares), one ``RuleRunner`` each, and the admin operations on them --
create, change, pause, resume, replay, delete, list -- and the event schemas they check. The
gateway gives it a ``RuleHost``: the durable cursors on its queues and its publish path.

Errors at this seam are the standard ones, so callers need not import this package's:
``LookupError`` (no such rule) and ``ValueError`` (a definition refused; a
``RuleDefinitionError`` with ``path`` and ``reason``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from store import LatencyHistogram

from .book import RuleBook
from .definition import RuleDefinition, TargetSpec, check_name, parse_definition
from .errors import RuleDefinitionError
from .runner import EventSource, RuleCounters, RuleRunner, describe
from .schemas import SchemaBook, SchemaError
from .targets import BatchedWebhookTarget, MqttBridgeTarget, PostgresTarget, Target, TopicTarget, WebhookTarget
from .targets.mqtt_options import MqttBridgeOptions
from .targets.postgres_options import PostgresOptions
from .targets.topic import Republished

log = logging.getLogger("tidemq.rules")

CONSUMER_PREFIX = "$rule:"  # a rule's consumer offsets: "$rule:{name}"


def parse_declared(declared: Mapping[str, Any]) -> dict[str, RuleDefinition]:
    """The definitions of rules declared in the configuration, checked as far as they can be
    without the store (RuleDefinitionError whose path names the rule: a bad one)."""
    parsed = {}
    for name, raw in declared.items():
        try:
            check_name(name)
            parsed[name] = parse_definition(name, raw)
        except RuleDefinitionError as exc:
            raise RuleDefinitionError(f"rule {name!r}: {exc.path}", exc.reason) from None
    return parsed


class RuleHost(Protocol):
    """What the engine needs of the gateway."""

    def republish(self, messages: Sequence[Republished]) -> Awaitable[None]:
        """Publish, in order, as an MQTT client would (resolves once all are stored; StoreError when not)."""
        ...

    def open_source(self, consumer: str, topic_filter: str, *, resume: bool) -> EventSource:
        """The queue ``topic_filter`` is read from, held (every matching publish is indexed into
        it from now on) and read through the durable cursor ``consumer``: at its saved offset with
        ``resume``, else from the queue's end (written through)."""
        ...

    def close_source(self, topic_filter: str, consumer: str) -> None:
        """Release the hold ``open_source`` took."""
        ...

    def queue_of(self, topic_filter: str) -> str:
        """The store queue ``open_source`` reads for ``topic_filter``."""
        ...

    def offsets_of(self, queue: str) -> tuple[int, int]:
        """The queue's first readable offset and the offset its next message will get."""
        ...

    def offset_at_time(self, queue: str, timestamp_ms: int) -> Awaitable[int]:
        """The first offset of ``queue`` stored at or after ``timestamp_ms`` (its end if none)."""
        ...

    def save_offset(self, consumer: str, queue: str, offset: int) -> None:
        """Set the durable cursor ``consumer`` of ``queue`` at ``offset``, written through."""
        ...

    def may_deliver(self) -> bool:
        """Whether this node may act for its rules now: false on a replicated group's leader
        whose lease may have lapsed (resumed after a stop), before the election's own check
        has stopped its rules."""
        ...


@dataclass(slots=True)
class _Rule:
    definition: RuleDefinition
    runner: RuleRunner
    counters: RuleCounters = field(default_factory=RuleCounters)


class RulesEngine:
    def __init__(self, book: RuleBook, host: RuleHost, schemas: SchemaBook) -> None:
        self._book = book
        self._host = host
        self.schemas = schemas
        self._rules: dict[str, _Rule] = {}
        self._readers: dict[str, list[RuleRunner]] = {}  # queue -> the runners reading it
        self._changing = asyncio.Lock()  # one admin operation at a time (each stops a runner before the next)

    # -- life ------------------------------------------------------------------------------------
    def declare_schemas(self, declared: Mapping[str, Any]) -> None:
        """Store the ``declared`` schemas (the configuration's) as their next version where they
        differ from the current one (SchemaError naming the schema: a declared one is bad)."""
        for name, schema in declared.items():
            current = self.schemas.get(name)
            if current is None or current["schema"] != schema:
                try:
                    self.schemas.put(name, schema)
                except SchemaError as exc:
                    raise SchemaError(f"schema {name!r}: {exc.reason}") from None

    def start(self, declared: Mapping[str, Any]) -> None:
        """Run the stored rules, with the ``declared`` ones (the configuration's) stored first
        where they differ (RuleDefinitionError: a declared one is bad; nothing started)."""
        rules = {rule.name: rule for rule in self._book.stored()}
        for name, rule in parse_declared(declared).items():
            self._check_schema(rule, f"rule {name!r}: $.schema")
            if name not in rules or rules[name].source_json != rule.source_json:
                self._book.save(rule)
                rules[name] = rule
        for rule in rules.values():
            self._run(rule, RuleCounters(), resume=True)
        if rules:
            log.info("rules started count=%d", len(rules))

    async def stop(self) -> None:
        for name in list(self._rules):
            await self._retire(name)

    def wake(self, queue: str, max_offset: int) -> None:
        """The store's notify: ``queue`` has new messages."""
        for runner in self._readers.get(queue, ()):
            runner.wake()

    # -- the admin operations --------------------------------------------------------------------
    def get(self, name: str) -> dict[str, Any] | None:
        rule = self._rules.get(name)
        return describe(rule.definition, rule.counters, rule.runner) if rule is not None else None

    def list(self) -> list[dict[str, Any]]:
        return [describe(r.definition, r.counters, r.runner) for _, r in sorted(self._rules.items())]

    def target_latencies(self) -> dict[str, LatencyHistogram]:
        """Each rule's calls of its targets: how long each took (for the metrics endpoint)."""
        return {name: r.counters.target_latency for name, r in sorted(self._rules.items())}

    async def create(self, name: str, raw: Any) -> dict[str, Any]:
        """A new rule, reading from now on (ValueError: refused, or the name is taken)."""
        async with self._changing:
            if name in self._rules:
                raise RuleDefinitionError("$.name", f"a rule named {name!r} exists (change it, or delete it first)")
            rule = parse_definition(name, raw)
            self._check_schema(rule)
            self._book.save(rule)
            self._run(rule, RuleCounters(), resume=False)
        log.info("rule created rule=%s sources=%s", name, ",".join(rule.sources))
        return self.get(name)  # type: ignore[return-value]

    async def change(self, name: str, raw: Any) -> dict[str, Any]:
        """A rule's new definition; sources it keeps go on from their cursors, new ones start now."""
        async with self._changing:
            return await self._change(name, raw)

    async def _change(self, name: str, raw: Any) -> dict[str, Any]:
        old = self._existing(name)
        rule = parse_definition(name, raw)
        self._check_schema(rule)
        self._book.save(rule)
        await self._retire(name)
        # (no await from here on: no publish comes between the old holds' release and the new ones)
        self._run(rule, old.counters, resume=True, new_sources=set(rule.sources) - set(old.definition.sources))
        log.info("rule changed rule=%s", name)
        return self.get(name)  # type: ignore[return-value]

    async def set_paused(self, name: str, paused: bool) -> dict[str, Any]:
        """Pause (its sources stay held: what matches meanwhile waits in the store) or resume."""
        async with self._changing:
            return await self._set_paused(name, paused)

    async def _set_paused(self, name: str, paused: bool) -> dict[str, Any]:
        old = self._existing(name)
        if old.definition.paused == paused:
            return self.get(name)  # type: ignore[return-value]
        rule = old.definition.with_paused(paused)
        self._book.save(rule)
        await self._retire(name)
        self._run(rule, old.counters, resume=True)
        log.info("rule %s rule=%s", "paused" if paused else "resumed", name)
        return self.get(name)  # type: ignore[return-value]

    async def replay(self, name: str, *, from_ms: int | None = None, offset: int | None = None) -> dict[str, Any]:
        """Move the rule's cursors: to the first message stored at or after ``from_ms`` in each
        source queue, or to ``offset`` (a rule of one source); what follows is delivered (again).
        ValueError when the point is refused (none or both given, an offset past the queue's end)."""
        if (from_ms is None) == (offset is None):
            raise RuleDefinitionError("$", "give one of from (a time) and offset")
        async with self._changing:
            old = self._existing(name)
            queues = [self._host.queue_of(topic_filter) for topic_filter in old.definition.sources]
            if offset is not None:
                if len(queues) != 1:
                    raise RuleDefinitionError("$.offset", f"the rule reads {len(queues)} queues: an offset is of "
                                                          "one queue; replay from a time")
                low, high = self._host.offsets_of(queues[0])
                if not 0 <= offset <= high:
                    raise RuleDefinitionError("$.offset", f"{offset} is not in the queue {queues[0]}: its offsets are "
                                                          f"{low} to {high}")
                points = {queues[0]: max(offset, low)}
            else:
                assert from_ms is not None
                points = {queue: await self._host.offset_at_time(queue, from_ms) for queue in queues}
            await self._retire(name)
            # (no await from here on, as in a change: the holds are taken again in this turn)
            for queue, point in points.items():
                self._host.save_offset(CONSUMER_PREFIX + name, queue, point)
            self._run(old.definition, old.counters, resume=True)
        log.info("rule replayed rule=%s from=%s", name, ",".join(f"{q}@{o}" for q, o in points.items()))
        return {**self.get(name), "replayed_from": points}  # type: ignore[dict-item]

    # -- the event schemas -----------------------------------------------------------------------
    def put_schema(self, name: str, schema: Any) -> dict[str, Any]:
        """A new version of schema ``name`` (ValueError: not a JSON Schema, or a bad name)."""
        return self.schemas.put(name, schema)

    def delete_schema(self, name: str) -> None:
        """LookupError: no such schema; ValueError: a rule names it (change the rule first)."""
        users = sorted(n for n, r in self._rules.items() if r.definition.schema == name)
        if users:
            raise RuleDefinitionError("$", f"the rules {', '.join(users)} name the schema {name!r}: change them first")
        if not self.schemas.delete(name):
            raise LookupError(f"no schema named {name!r}")

    def _check_schema(self, rule: RuleDefinition, path: str = "$.schema") -> None:
        if rule.schema is not None and self.schemas.get(rule.schema) is None:
            raise RuleDefinitionError(path, f"no schema named {rule.schema!r} (PUT /admin/schemas/{rule.schema})")

    async def delete(self, name: str) -> None:
        async with self._changing:
            self._existing(name)
            self._book.delete(name)
            await self._retire(name)
        log.info("rule deleted rule=%s", name)

    # -- running ---------------------------------------------------------------------------------
    def _existing(self, name: str) -> _Rule:
        rule = self._rules.get(name)
        if rule is None:
            raise LookupError(f"no rule named {name!r}")
        return rule

    def _run(self, rule: RuleDefinition, counters: RuleCounters, *, resume: bool,
             new_sources: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        consumer = CONSUMER_PREFIX + rule.name
        sources: list[EventSource] = []
        try:
            for topic_filter in rule.sources:
                sources.append(self._host.open_source(consumer, topic_filter,
                                                      resume=resume and topic_filter not in new_sources))
        except BaseException:  # (a start offset the store did not write: no hold left behind)
            for topic_filter in rule.sources[:len(sources)]:
                self._host.close_source(topic_filter, consumer)
            raise
        targets = [self._target(rule, i, t) for i, t in enumerate(rule.targets)]
        runner = RuleRunner(rule, sources, targets, self._host.republish, counters, self.schemas,
                            may_deliver=self._host.may_deliver)
        self._rules[rule.name] = _Rule(rule, runner, counters)
        for queue in runner.queues:
            self._readers.setdefault(queue, []).append(runner)
        if not rule.paused:
            runner.start()

    async def _retire(self, name: str) -> None:
        """Stop a rule's runner, then release its holds (a caller that runs it again takes them
        again without an await in between)."""
        rule = self._rules.pop(name)
        for queue in rule.runner.queues:
            runners = self._readers.get(queue, [])
            if rule.runner in runners:
                runners.remove(rule.runner)
            if not runners:
                self._readers.pop(queue, None)
        await rule.runner.stop()
        for topic_filter in rule.definition.sources:
            self._host.close_source(topic_filter, CONSUMER_PREFIX + name)

    def _target(self, rule: RuleDefinition, index: int, spec: TargetSpec) -> Target:
        if spec.type == "topic":
            return TopicTarget(self._host.republish, spec.topic, spec.qos)
        if isinstance(spec.options, MqttBridgeOptions):
            return MqttBridgeTarget(spec.options, client_id=f"tidemq-rule-{rule.name}-{index}")
        if isinstance(spec.options, PostgresOptions):
            return PostgresTarget(spec.options)
        if spec.mode == "batched":
            return BatchedWebhookTarget(spec.url, headers=spec.headers, timeout_s=spec.timeout_s,
                                        batch_size=spec.batch_size)
        return WebhookTarget(spec.url, mode=spec.mode, headers=spec.headers, timeout_s=spec.timeout_s)
