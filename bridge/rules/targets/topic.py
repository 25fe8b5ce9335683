"""A TideMQ topic as a rule's target: the payload republished through the gateway's MQTT publish
path (``Republish``, given by the gateway), so subscribers of every protocol see it. A batch of
events is put at once (one group commit) and acknowledged together."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from protocols.cloudevents import PROPERTY_PREFIX
from store import StoreError

from ..events import CloudEvent
from ..transforms import Payload
from .outcome import DELIVERED, Outcome

EVENT_ID_PROPERTY = PROPERTY_PREFIX + "id"
EVENT_SOURCE_PROPERTY = PROPERTY_PREFIX + "source"


@dataclass(slots=True, frozen=True)
class Republished:
    """One message a rule publishes into TideMQ."""

    topic: str
    body: bytes
    qos: int
    content_type: str | None
    user_properties: Sequence[tuple[str, str]]


# puts the messages in order; resolves once all are stored, StoreError if not
Republish = Callable[[Sequence[Republished]], Awaitable[None]]


class TopicTarget:
    def __init__(self, republish: Republish, topic: str, qos: int) -> None:
        self._republish = republish
        self.topic = topic
        self.qos = qos
        self.label = f"topic:{topic}"

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        return (await self.deliver_batch([(event, payload)]))[1]

    async def deliver_batch(self, items: Sequence[tuple[CloudEvent, Payload]]) -> tuple[int, Outcome]:
        """All the events in one put: all stored, or none known to be (then each is put again on
        its own: some may be stored twice, as at-least-once allows)."""
        try:
            await self._republish([self._message(event, payload) for event, payload in items])
        except StoreError as exc:
            return 0, Outcome(False, f"not stored: {exc}")
        return len(items), DELIVERED

    def _message(self, event: CloudEvent, payload: Payload) -> Republished:
        return Republished(self.topic, payload.body, self.qos, payload.content_type,
                           [(EVENT_ID_PROPERTY, event.id), (EVENT_SOURCE_PROPERTY, event.source)])

    async def close(self) -> None:
        pass
