"""An HTTP endpoint as a rule's target: each event POSTed as a CloudEvent (HTTP protocol
binding 1.0) in binary mode (attributes as ``ce-`` headers, the payload as the body) or
structured mode (one ``application/cloudevents+json`` document), over a keep-alive connection
pool with a timeout per request. 2xx is delivered; 408, 429, 5xx, a timeout or a connection
failure are retried; any other answer (a 4xx, a redirect) is a refusal: dead letter at once."""

from __future__ import annotations

import asyncio
import base64
import json
import string
import urllib.parse
from collections.abc import Sequence
from typing import Any

import aiohttp

from ..events import CloudEvent, is_json_type
from ..transforms import Payload
from .outcome import DELIVERED, Outcome

STRUCTURED = "application/cloudevents+json"
POOL_CONNECTIONS = 16
RETRYABLE_STATUS = frozenset({408, 429})
HEADER_SAFE = "".join(c for c in string.printable if "!" <= c <= "~" and c not in '"%')


def binary_headers(event: CloudEvent, payload: Payload) -> dict[str, str]:
    """The ``ce-`` headers of binary mode, and the payload's Content-Type."""
    headers = {}
    for name, value in event.attributes().items():
        if name == "datacontenttype":
            continue
        headers["ce-" + name] = _header_value(value)
    if payload.content_type:
        headers["Content-Type"] = payload.content_type
    return headers


def structured_body(event: CloudEvent, payload: Payload) -> bytes:
    """One CloudEvent in JSON: the attributes, then ``data`` (JSON or text) or ``data_base64``."""
    document: dict[str, Any] = event.attributes()
    document.pop("datacontenttype", None)
    if payload.content_type:
        document["datacontenttype"] = payload.content_type
    data = _data(payload)
    if data is None:
        document["data_base64"] = base64.b64encode(payload.body).decode()
    else:
        document["data"] = data[0]
    return json.dumps(document, separators=(",", ":")).encode()


def _data(payload: Payload) -> tuple[Any] | None:
    """The payload as a JSON value (in a 1-tuple; None: only base64 can carry it)."""
    content_type = payload.content_type or ""
    if is_json_type(content_type):
        try:
            return (json.loads(payload.body),)
        except ValueError:
            pass
    if content_type.startswith("text/"):
        try:
            return (payload.body.decode(),)
        except UnicodeDecodeError:
            pass
    return None


def _header_value(value: Any) -> str:
    """An attribute's value as a header: percent-encoded outside printable ASCII, and space, '"'
    and '%' (the CloudEvents HTTP binding, 3.1.3.2)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return urllib.parse.quote(str(value), safe=HEADER_SAFE)


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
            headers, body = {"Content-Type": STRUCTURED}, structured_body(event, payload)
        else:
            headers, body = binary_headers(event, payload), payload.body
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
