"""Auto-renewed receipts: what a PushConsumer receives (``auto_renew``) stays invisible while its
client holds it, as RocketMQ 5's proxy keeps it: the gateway changes its invisible duration
again shortly before it runs out, until the client acks it, changes it, forwards it to the
dead letter queue, or ends (its messages then come back soon), or ``max_ms`` has passed. The
client names such a message by the receipt handle it received; ``take`` gives the check
point's current due time for it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from protocols.rocketmq_grpc.receipts import Receipt
from store import StoreError
from store import now_ms as clock_ms

from ..core.pop import PopService
from ..interop import remoting_queue

log = logging.getLogger("tidemq.grpc")

# (group, topic, queue id, offset, the due time of the receipt handle the client holds)
Key = tuple[str, str, int, int, int]


@dataclass(slots=True)
class Renewed:
    client_id: str
    due_ms: int  # the check point's due time now
    until_ms: int  # renewed no further after this


@dataclass(slots=True)
class RenewalSettings:
    invisible_ms: int = 60_000  # an auto-renewed receive's invisible duration (the proxy's default)
    ahead_ms: int = 10_000  # renewed this long before it runs out
    max_ms: int = 3 * 3600_000  # renewed for at most this long from its receive
    released_ms: int = 1_000  # what is left of its invisibility once its client ends


class Renewals:
    def __init__(self, pop: PopService, settings: RenewalSettings | None = None) -> None:
        self.pop = pop
        self.settings = settings or RenewalSettings()
        self._held: dict[Key, Renewed] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="grpc-renewals")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def hold(self, client_id: str, group: str, topic: str, receipt: Receipt) -> None:
        """A message received with ``auto_renew`` under ``receipt``: kept invisible from now on."""
        self._held[(group, topic, receipt.queue_id, receipt.offset, receipt.due_ms)] = Renewed(
            client_id, receipt.due_ms, clock_ms() + self.settings.max_ms)

    def take(self, group: str, topic: str, receipt: Receipt) -> Receipt:
        """The receipt as its check point is due now (renewed or not), renewed no more: the
        client acks, changes or forwards it."""
        renewed = self._held.pop((group, topic, receipt.queue_id, receipt.offset, receipt.due_ms), None)
        return receipt if renewed is None else Receipt(receipt.queue_id, receipt.offset, renewed.due_ms)

    def release(self, client_id: str) -> None:
        """The client ended: its messages come back ``released_ms`` from now, renewed no more."""
        for key in [k for k, r in self._held.items() if r.client_id == client_id]:
            self._change(key, self._held.pop(key), self.settings.released_ms)

    def _change(self, key: Key, renewed: Renewed, invisible_ms: int) -> int | None:
        group, topic, queue_id, offset, _ = key
        try:
            pop_time = self.pop.change(group, remoting_queue(topic, queue_id), offset, renewed.due_ms, invisible_ms)
        except StoreError as exc:  # (tried again on the next round)
            log.warning("grpc renewal failed group=%s topic=%s offset=%d error=%s", group, topic, offset, exc)
            return renewed.due_ms
        return None if pop_time is None else pop_time + invisible_ms

    def renew_due(self) -> None:
        """Every held message within ``ahead_ms`` of coming back made invisible again; those
        gone (acked through another receipt, come back) or past ``max_ms`` left."""
        now = clock_ms()
        settings = self.settings
        for key, renewed in list(self._held.items()):
            if renewed.due_ms - now > settings.ahead_ms:
                continue
            due = None if now >= renewed.until_ms else self._change(key, renewed, settings.invisible_ms)
            if due is None:
                del self._held[key]
            else:
                renewed.due_ms = due

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.ahead_ms / 2000))
            self.renew_due()
