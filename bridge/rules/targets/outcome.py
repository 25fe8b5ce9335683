"""What one attempt at a target came to, and the interfaces of targets: every one delivers an
event (``Target``); one that can take several at once (``BatchTarget``) is given a batch."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..events import CloudEvent
from ..transforms import Payload


@dataclass(slots=True, frozen=True)
class Outcome:
    """``delivered``; else ``reason`` says why not, and ``retryable`` whether trying again may help
    (a refusal such as an HTTP 400 goes to the dead-letter topic at once)."""

    delivered: bool
    reason: str = ""
    retryable: bool = True
    unreachable: bool = False  # the target took no connection: tried again as soon as it does


DELIVERED = Outcome(True)


class Target(Protocol):
    label: str  # what the dead-letter properties and counters call it

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome: ...

    async def close(self) -> None: ...


@runtime_checkable
class ProbedTarget(Target, Protocol):
    async def reachable(self) -> None:
        """Return once the target takes a connection again (probed now and then; cancelled by
        the caller when its backoff ends first)."""
        ...


@runtime_checkable
class BatchTarget(Target, Protocol):
    async def deliver_batch(self, items: Sequence[tuple[CloudEvent, Payload]]) -> tuple[int, Outcome]:
        """Deliver the events in order, at once: how many leading ones it took (all of them, or
        those before the first it could not take), and the outcome of that first one."""
        ...
