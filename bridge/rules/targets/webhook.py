"""An HTTP endpoint as a rule's target: each event POSTed as a CloudEvent (HTTP protocol
binding 1.0) in binary mode (attributes as ``ce-`` headers, the payload as the body) or
structured mode (one ``application/cloudevents+json`` document), over a keep-alive connection
pool with a timeout per request. 2xx is delivered; 408, 429, 5xx, a timeout or a connection
failure are retried; any other answer (a 4xx, a redirect) is a refusal: dead letter at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import aiohttp

from protocols.cloudevents import STRUCTURED, binary_headers, structured_document

from ..events import CloudEvent
from ..transforms import Payload
from .outcome import DELIVERED, Outcome

POOL_CONNECTIONS = 16
RETRYABLE_STATUS = frozenset({408, 429})


class WebhookTarget:
    def __init__(self, url: str, *, mode: str = "binary", headers: Sequence[tuple[str, str]] = (),
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.mode = mode
        self.headers = dict(headers)
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.label = f"webhook:{url}"
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # (made on the loop that delivers)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=POOL_CONNECTIONS),
                                                  timeout=self.timeout)
        return self._session

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        if self.mode == "structured":
            document = structured_document(event.attributes(), payload.content_type, payload.body)
            headers, body = {"Content-Type": STRUCTURED}, json.dumps(document, separators=(",", ":")).encode()
        else:
            headers, body = binary_headers(event.attributes(), payload.content_type), payload.body
        try:
            async with self._client().post(self.url, data=body, headers={**self.headers, **headers},
                                           allow_redirects=False) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return Outcome(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        except ValueError as exc:  # (a request aiohttp cannot make of this URL: trying again will not help)
            return Outcome(False, f"{type(exc).__name__}: {exc}", retryable=False)
        if 200 <= status < 300:
            return DELIVERED
        retryable = status >= 500 or status in RETRYABLE_STATUS
        return Outcome(False, f"HTTP {status}", retryable=retryable)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
