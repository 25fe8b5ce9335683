"""A TideMQ topic as a rule's target: the payload republished through the gateway's MQTT publish
path (``Republish``, given by the gateway), so subscribers of every protocol see it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from store import StoreError

from ..events import CloudEvent
from ..transforms import Payload
from .outcome import DELIVERED, Outcome

# (topic, body, qos, content type or None, user properties); resolves once stored, StoreError if not
Republish = Callable[[str, bytes, int, "str | None", Sequence[tuple[str, str]]], Awaitable[None]]

EVENT_ID_PROPERTY = "ce-id"
EVENT_SOURCE_PROPERTY = "ce-source"


class TopicTarget:
    def __init__(self, republish: Republish, topic: str, qos: int) -> None:
        self._republish = republish
        self.topic = topic
        self.qos = qos
        self.label = f"topic:{topic}"

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        try:
            await self._republish(self.topic, payload.body, self.qos, payload.content_type,
                                  [(EVENT_ID_PROPERTY, event.id), (EVENT_SOURCE_PROPERTY, event.source)])
        except StoreError as exc:
            return Outcome(False, f"not stored: {exc}")
        return DELIVERED

    async def close(self) -> None:
        pass
