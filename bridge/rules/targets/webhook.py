"""An HTTP endpoint as a rule's target: each event POSTed as a CloudEvent (HTTP protocol
binding 1.0) in binary mode (attributes as ``ce-`` headers, the payload as the body) or
structured mode (one ``application/cloudevents+json`` document) -- or, batched mode, up to a
batch size of events in one ``application/cloudevents-batch+json`` array -- one request at a time on a
keep-alive connection (``http_connection.py``), with a timeout per request. 2xx is delivered;
408, 429, 5xx, a timeout or a connection failure are retried; any other answer (a 4xx, a
redirect) and a request that cannot be made (a header value with a line break) are refusals:
dead letter at once."""

from __future__ import annotations

import json
from collections.abc import Sequence

from protocols.cloudevents import BATCH, STRUCTURED, binary_headers, structured_document
from protocols.http1 import RequestHead, ResponseError

from ..events import CloudEvent
from ..transforms import Payload
from .http_connection import KeepAliveConnection
from .outcome import DELIVERED, Outcome
from .probe import refused

RETRYABLE_STATUS = frozenset({408, 429})
STRUCTURED_HEADERS = {"Content-Type": STRUCTURED}
BATCH_HEADERS = {"Content-Type": BATCH}


class WebhookTarget:
    def __init__(self, url: str, *, mode: str = "binary", headers: Sequence[tuple[str, str]] = (),
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.mode = mode
        self.label = f"webhook:{url}"
        self._head = RequestHead(url, headers)  # (ValueError: the definition's checks missed it)
        self._connection = KeepAliveConnection(self._head.host, self._head.port, tls=self._head.tls,
                                               timeout_s=timeout_s)

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        try:
            if self.mode == "structured":
                document = structured_document(event.attributes(), payload.content_type, payload.body)
                request = self._head.bytes_of(STRUCTURED_HEADERS, json.dumps(document, separators=(",", ":")).encode())
            else:
                request = self._head.bytes_of(binary_headers(event.attributes(), payload.content_type), payload.body)
        except ValueError as exc:  # (a request that cannot be made of this event: trying again will not help)
            return Outcome(False, f"the request cannot be made: {exc}", retryable=False)
        return await self._send(request)

    async def _send(self, request: bytes) -> Outcome:
        try:
            status = await self._connection.send(request)
        except (OSError, TimeoutError, ResponseError) as exc:
            return Outcome(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                           unreachable=refused(exc))
        if 200 <= status < 300:
            return DELIVERED
        retryable = status >= 500 or status in RETRYABLE_STATUS
        return Outcome(False, f"HTTP {status}", retryable=retryable)

    async def reachable(self) -> None:
        await self._connection.reachable()

    async def close(self) -> None:
        self._connection.close()


class BatchedWebhookTarget(WebhookTarget):
    """The batched mode: a batch of events in requests of up to ``batch_size``, in order, each
    taken or not as a whole (``BatchTarget``); a single event is a batch of one."""

    def __init__(self, url: str, *, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 batch_size: int = 100) -> None:
        super().__init__(url, mode="batched", headers=headers, timeout_s=timeout_s)
        self.batch_size = batch_size

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        return (await self.deliver_batch([(event, payload)]))[1]

    async def deliver_batch(self, items: Sequence[tuple[CloudEvent, Payload]]) -> tuple[int, Outcome]:
        taken = 0
        while taken < len(items):
            chunk = items[taken:taken + self.batch_size]
            documents = [structured_document(event.attributes(), payload.content_type, payload.body)
                         for event, payload in chunk]
            request = self._head.bytes_of(BATCH_HEADERS, json.dumps(documents, separators=(",", ":")).encode())
            outcome = await self._send(request)
            if not outcome.delivered:
                return taken, outcome
            taken += len(chunk)
        return taken, DELIVERED
