"""One rule at work: reads its source queues through durable cursors (``EventSource``, given by
the gateway: the delivery core's cursor and consumer offset), matches each message as a
CloudEvent against the rule's pattern, sends the transformed payloads to every target -- a batch
at once to a target that takes batches, else one by one, retried under the rule's policy, else to
the dead-letter topic -- and only then commits the batch's offset. At least once, in order per
source queue; woken by the store's notify, never polling."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from store import LatencyHistogram, StoreError, StoredMessage, now_ms

from .definition import RuleDefinition
from .events import CloudEvent, cloud_event
from .schemas import Violation
from .targets import BatchTarget, Outcome, ProbedTarget, Target
from .targets.topic import Republish, Republished
from .transforms import Payload

log = logging.getLogger("tidemq.rules")

BATCH = 256  # messages read from a source queue at once
DEAD_LETTER_RETRY_S = 1.0  # the wait before a dead-letter topic the store refused is tried again
READ_RETRY_S = 1.0  # the wait before a source queue the store could not read is read again
FENCE_POLL_S = 0.05  # how often a rule that may not deliver now asks again

REASON_PROPERTY = "dead-letter-reason"
ATTEMPTS_PROPERTY = "dead-letter-attempts"
RULE_PROPERTY = "dead-letter-rule"
TARGET_PROPERTY = "dead-letter-target"
TOPIC_PROPERTY = "dead-letter-source-topic"


class EventSource(Protocol):
    """One source queue of a rule, read through the rule's durable cursor."""

    queue: str

    def read(self, max_messages: int) -> list[StoredMessage]:
        """The next messages not yet read (the cursor moves past them; nothing is committed)."""
        ...

    def commit(self, offset: int) -> None:
        """Every message below ``offset`` is done: a restart resumes there."""
        ...

    def lag(self) -> int:
        """Messages stored in the queue and not yet committed."""
        ...


class SchemaCheck(Protocol):
    """The event schemas (``schemas.SchemaBook``)."""

    def check(self, name: str, data: Any, *, required: bool = False) -> Violation | None: ...


@dataclass(slots=True)
class RuleCounters:
    matched: int = 0
    delivered: int = 0  # events every target took
    retried: int = 0  # attempts made again after a failure
    dead_lettered: int = 0  # (event, target) pairs sent to the dead-letter topic
    last_error: str = ""
    # each call of a target (an event, or a batch of them) until its answer: taken, refused or failed
    target_latency: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass(slots=True)
class _Refused:
    """A message a rule sends to its dead-letter topic instead of its targets."""

    event: CloudEvent | None
    target: str
    reason: str


class RuleRunner:
    def __init__(self, rule: RuleDefinition, sources: Sequence[EventSource], targets: Sequence[Target],
                 republish: Republish, counters: RuleCounters, schemas: SchemaCheck,
                 may_deliver: Callable[[], bool] = lambda: True) -> None:
        self.rule = rule
        self._may_deliver = may_deliver  # (false: wait; the node stops its rules soon after)
        self._schemas = schemas
        self.sources = list(sources)
        self.targets = list(targets)
        self._republish = republish
        self.counters = counters
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def queues(self) -> list[str]:
        return [source.queue for source in self.sources]

    def lag(self) -> int:
        return sum(source.lag() for source in self.sources)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"rule:{self.rule.name}")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # (a fault of ours: said loudly)
            self.counters.last_error = f"the rule stopped: {task.exception()!r}"
            log.error("rule stopped rule=%s", self.rule.name, exc_info=task.exception())

    def wake(self) -> None:
        """A source queue has new messages (the store's notify)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop between two messages or while waiting (an event being delivered is taken up again
        from its committed offset by the next runner)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for target in self.targets:
            await target.close()

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # (before reading: a notify during the reads is not missed)
            busy = False
            for source in self.sources:
                try:
                    batch = source.read(BATCH)
                except StoreError as exc:  # (a store read failed: tried again a moment later)
                    self._error(f"reading {source.queue}: {exc}")
                    self._wake.set()
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                if batch:
                    await self._handle_batch(batch)
                    source.commit(batch[-1].queue_offset + 1)
                busy = busy or bool(batch)
            if not busy:
                await self._wake.wait()

    async def _handle_batch(self, batch: list[StoredMessage]) -> None:
        """Every message of ``batch`` done: matched ones given to each target that takes a batch at
        once, then, one by one in order, to the targets that did not take them (with retries)."""
        matched: list[tuple[StoredMessage, CloudEvent, Payload]] = []
        for message in batch:
            prepared = self._prepare(message)
            if isinstance(prepared, _Refused):  # (to the dead letters before any later event goes on)
                await self._dead_letter(message, prepared.event, prepared.target, prepared.reason, 0)
            elif prepared is not None:
                matched.append(prepared)
        taken: dict[Target, int] = {}  # target -> how many leading events of ``matched`` it took as a batch
        if len(matched) > 1:
            items = [(event, payload) for _, event, payload in matched]
            for target in self.targets:
                if isinstance(target, BatchTarget):
                    taken[target] = await self._deliver_batch(target, items)
        for i, (message, event, payload) in enumerate(matched):
            await self._deliver(message, event, payload, [t for t in self.targets if taken.get(t, 0) <= i])

    def _prepare(self, message: StoredMessage) -> tuple[StoredMessage, CloudEvent, Payload] | _Refused | None:
        """The message as a matched event and its payload; None: the pattern does not match it;
        _Refused: it goes to the dead-letter topic (the rule cannot read it, or its schema refuses it)."""
        try:
            event = cloud_event(message)
            view = event.for_matching()
            if not self.rule.pattern.matches(view):
                return None
            schema = self.rule.schema
            violation = self._schemas.check(schema or event.type, event.data, required=schema is not None)
            payload = self.rule.transform.apply(event, view) if violation is None else None
        except Exception as exc:  # a message the rule cannot read: to the dead letters, not a stuck rule
            log.exception("rule cannot handle a message rule=%s queue=%s offset=%s", self.rule.name, message.queue,
                          message.queue_offset)
            return _Refused(None, "rule", f"cannot be handled: {exc!r}")
        self.counters.matched += 1
        if violation is not None:  # (an event the schema refuses reaches no target)
            return _Refused(event, f"schema:{violation.name}", str(violation))
        assert payload is not None
        return message, event, payload

    async def _deliver_batch(self, target: BatchTarget, items: list[tuple[CloudEvent, Payload]]) -> int:
        """How many leading events the target took as a batch (those after are delivered one by one)."""
        try:
            await self._until_deliverable()
            started = time.perf_counter()
            try:
                taken, outcome = await target.deliver_batch(items)
            finally:
                self.counters.target_latency.observe(time.perf_counter() - started)
        except Exception:  # (a fault of the target's code: each event is tried on its own)
            log.exception("rule target failed rule=%s target=%s", self.rule.name, target.label)
            return 0
        if taken < len(items):
            self._error(f"{target.label}: {outcome.reason}")
        return taken

    async def _deliver(self, message: StoredMessage, event: CloudEvent, payload: Payload,
                       pending: Sequence[Target]) -> None:
        """The event to each ``pending`` target, retried under the rule's policy, else dead-lettered."""
        attempts = 0
        everywhere = True  # every target took it (else some went to the dead-letter topic)
        while pending:
            attempts += 1
            failed: list[tuple[Target, Outcome]] = []
            for target in pending:
                await self._until_deliverable()
                started = time.perf_counter()
                try:
                    outcome = await target.deliver(event, payload)
                except Exception as exc:  # (a fault of the target's code: retried, then dead-lettered)
                    log.exception("rule target failed rule=%s target=%s", self.rule.name, target.label)
                    outcome = Outcome(False, f"the target failed: {exc!r}")
                self.counters.target_latency.observe(time.perf_counter() - started)
                if outcome.delivered:
                    continue
                self._error(f"{target.label}: {outcome.reason}")
                if outcome.retryable:
                    failed.append((target, outcome))
                else:
                    everywhere = False
                    await self._dead_letter(message, event, target.label, f"refused: {outcome.reason}", attempts)
            if not failed:
                break
            age_s = max(0.0, (now_ms() - message.store_timestamp) / 1000)
            done = self.rule.retry.exhausted(attempts, age_s)
            if done is not None:
                everywhere = False
                for target, outcome in failed:
                    await self._dead_letter(message, event, target.label, f"{outcome.reason}; {done}", attempts)
                break
            self.counters.retried += len(failed)
            await self._back_off(self.rule.retry.backoff_s(attempts), failed)
            pending = [target for target, _ in failed]
        if everywhere:
            self.counters.delivered += 1

    async def _back_off(self, seconds: float, failed: list[tuple[Target, Outcome]]) -> None:
        """Wait ``seconds`` before the failed targets are tried again -- or only until every one
        that took no connection takes one again, when all failed so (a target back from an
        outage gets the events at once, not after a long backoff)."""
        probes = [target.reachable() for target, outcome in failed
                  if outcome.unreachable and isinstance(target, ProbedTarget)]
        if len(probes) < len(failed):
            for probe in probes:
                probe.close()
            await asyncio.sleep(seconds)
            return
        waiting = asyncio.ensure_future(asyncio.gather(*probes))
        try:
            await asyncio.wait({waiting}, timeout=seconds)
        finally:
            waiting.cancel()

    async def _until_deliverable(self) -> None:
        """Wait while this node may not act for its rules (a leader whose lease may have lapsed:
        another node may be delivering the same events)."""
        while not self._may_deliver():
            await asyncio.sleep(FENCE_POLL_S)

    async def _dead_letter(self, message: StoredMessage, event: CloudEvent | None, target: str, reason: str,
                           attempts: int) -> None:
        """The original message to the dead-letter topic, with why; tried until the store takes it.
        ``target``: the label of the target that did not take it ("rule": the rule itself failed)."""
        topic = message.topic
        properties = [(REASON_PROPERTY, reason), (ATTEMPTS_PROPERTY, str(attempts)), (RULE_PROPERTY, self.rule.name),
                      (TARGET_PROPERTY, target), (TOPIC_PROPERTY, topic)]
        if event is not None:
            properties += [("ce-id", event.id), ("ce-source", event.source)]
        content_type = event.datacontenttype if event is not None else None
        while True:
            try:
                await self._republish([Republished(self.rule.dead_letter_topic, message.body, 1, content_type,
                                                   properties)])
                break
            except Exception as exc:  # (StoreError: a full disk; the event waits, uncommitted)
                self._error(f"dead-letter topic {self.rule.dead_letter_topic}: {exc}")
                await asyncio.sleep(DEAD_LETTER_RETRY_S)
        self.counters.dead_lettered += 1

    def _error(self, text: str) -> None:
        if text != self.counters.last_error:
            log.warning("rule delivery failed rule=%s error=%s", self.rule.name, text)
        self.counters.last_error = text


def describe(rule: RuleDefinition, counters: RuleCounters, runner: RuleRunner | None) -> dict[str, Any]:
    """A rule's row for the admin API: its state, counters, lag (None: not running) and the mean
    time a call of a target took (None: none yet)."""
    latency = counters.target_latency
    return {"name": rule.name, "state": "paused" if rule.paused else "running", "sources": list(rule.sources),
            "targets": [target.label for target in rule.targets], "matched": counters.matched,
            "delivered": counters.delivered, "retried": counters.retried, "dead_lettered": counters.dead_lettered,
            "lag": runner.lag() if runner is not None else None, "last_error": counters.last_error or None,
            "target_calls": latency.count,
            "target_latency_ms": round(latency.sum / latency.count * 1000, 3) if latency.count else None,
            "definition": rule.source_json}
