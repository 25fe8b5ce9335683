"""Which gateway nodes a notify event goes to (the store node's side of "notify").

A gateway node only needs the events of the queues its sessions read. Who reads what is in the
lookup (``nodes_for(queue)``: the nodes with interested sessions, or None when the lookup is in
doubt); the store node asks it once per queue and keeps the answer for ``refresh_s``, asking
again in the background while the queue stays busy. Two things keep that from delaying a
message:

- a gateway node that starts reading a queue says so on its store link (a hint) before it
  reads the queue's offsets there, so every event after those offsets reaches it, whatever the
  lookup's answer still says;
- a queue the store node has no answer for yet, or one the lookup is in doubt about, goes to
  every node (broadcast), counted by reason.

Without a lookup (``nodes_for`` None) the hints alone route: a node gets the events of the
queues it said it reads, until it says it stopped or its link ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger("tidemq.cluster")

NodesFor = Callable[[str], Awaitable[frozenset[str] | None]]


@dataclass(slots=True)
class RouterStats:
    events: int = 0  # (queue, offset) events routed
    targeted: int = 0  # events sent only to the nodes the lookup or hints named
    broadcast: int = 0  # events sent to every node
    messages: int = 0  # NOTIFY messages sent (one per node per batch)
    fallbacks: Counter[str] = field(default_factory=Counter)  # broadcasts by reason


class NotifyRouter:
    def __init__(self, nodes_for: NodesFor | None = None, refresh_s: float = 1.0, broadcast: bool = False) -> None:
        self.nodes_for = nodes_for
        self.broadcast = broadcast  # every event to every node (as apache/rocketmq-mqtt does): to compare
        self.refresh_s = refresh_s
        self.nodes: set[str] = set()  # gateway nodes with a notify link
        self._hinted: dict[str, set[str]] = {}  # queue -> nodes that said they read it
        self._answers: dict[str, tuple[float, frozenset[str]]] = {}  # queue -> (when, lookup's nodes)
        self._asking: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = RouterStats()

    # -- what the nodes say ---------------------------------------------------------------------
    def node_joined(self, node: str) -> None:
        self.nodes.add(node)

    def node_left(self, node: str) -> None:
        self.nodes.discard(node)
        for readers in self._hinted.values():
            readers.discard(node)

    def hint(self, queue: str, node: str, reading: bool) -> None:
        if reading:
            self._hinted.setdefault(queue, set()).add(node)
        else:
            readers = self._hinted.get(queue)
            if readers is not None:
                readers.discard(node)
                if not readers:
                    del self._hinted[queue]
            self._answers.pop(queue, None)  # ask the lookup again rather than keep a stale "yes"

    # -- routing --------------------------------------------------------------------------------
    def route(self, events: dict[str, int]) -> dict[str, dict[str, int]]:
        """node -> the events it gets, for one batch of notify events."""
        out: dict[str, dict[str, int]] = {}
        now = time.monotonic()
        stats = self.stats
        for queue, offset in events.items():
            stats.events += 1
            targets = self._targets(queue, now)
            if targets is None:
                stats.broadcast += 1
                targets = self.nodes
            else:
                stats.targeted += 1
            for node in targets:
                if node in self.nodes:
                    out.setdefault(node, {})[queue] = offset
        stats.messages += len(out)
        return out

    def _targets(self, queue: str, now: float) -> set[str] | frozenset[str] | None:
        if self.broadcast:
            return None
        hinted = self._hinted.get(queue)
        if self.nodes_for is None:
            return hinted or frozenset()
        answer = self._answers.get(queue)
        if answer is None or now - answer[0] > self.refresh_s:
            self._ask(queue)
            if answer is None:
                self.stats.fallbacks["unknown"] += 1
                return None
        known = answer[1]
        return known | hinted if hinted else known

    def _ask(self, queue: str) -> None:
        nodes_for = self.nodes_for
        if queue in self._asking or nodes_for is None:
            return
        self._asking.add(queue)
        task = asyncio.get_running_loop().create_task(self._answer(queue, nodes_for))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, queue: str, nodes_for: NodesFor) -> None:
        try:
            nodes = await nodes_for(queue)
        except Exception as exc:  # noqa: BLE001 -- a lookup must never stop notify: in doubt, that is all
            log.warning("lookup failed queue=%s error=%s", queue, exc)
            nodes = None
        finally:
            self._asking.discard(queue)
        if nodes is None:
            self._answers.pop(queue, None)  # in doubt: broadcast until it answers
            self.stats.fallbacks["lookup in doubt"] += 1
        else:
            self._answers[queue] = (time.monotonic(), nodes)
            if len(self._answers) > 100_000:  # queues no event touched for long go first
                for stale in list(self._answers)[:10_000]:
                    del self._answers[stale]

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
