"""What one attempt at a target came to, and the interface every target has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..events import CloudEvent
from ..transforms import Payload


@dataclass(slots=True, frozen=True)
class Outcome:
    """``delivered``; else ``reason`` says why not, and ``retryable`` whether trying again may help
    (a refusal such as an HTTP 400 goes to the dead-letter topic at once)."""

    delivered: bool
    reason: str = ""
    retryable: bool = True


DELIVERED = Outcome(True)


class Target(Protocol):
    label: str  # what the dead-letter properties and counters call it

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome: ...

    async def close(self) -> None: ...
