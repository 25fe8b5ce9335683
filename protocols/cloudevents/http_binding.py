"""The HTTP protocol binding of CloudEvents 1.0: what a request carries -- binary mode (the
attributes as ``ce-`` headers, percent-encoded, the body the data), structured mode
(``application/cloudevents+json``) or batched mode (``application/cloudevents-batch+json``) --
read into ``Envelope``s, and the headers of binary mode written."""

from __future__ import annotations

import json
import re
import string
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .attributes import PROPERTY_PREFIX, AttributeValue, CloudEventError, attribute_text, check_attributes
from .json_format import read_structured

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
FORMAT_PREFIX = "application/cloudevents"  # other event formats (+avro, +protobuf) are not read
HEADER_SAFE = "".join(c for c in string.printable if "!" <= c <= "~" and c not in '"%')
_HEADER_SAFE_TEXT = re.compile("[" + re.escape(HEADER_SAFE) + "]*")


@dataclass(slots=True, frozen=True)
class Envelope:
    """One CloudEvent as received: its checked attributes (``datacontenttype`` among them when
    the data has a type) and its data as bytes."""

    attributes: dict[str, AttributeValue]
    data: bytes

    @property
    def content_type(self) -> str | None:
        value = self.attributes.get("datacontenttype")
        return str(value) if value is not None else None


def from_http(content_type: str, headers: Mapping[str, str], body: bytes) -> list[Envelope]:
    """The events of one HTTP request (a batch may hold none); CloudEventError when one is
    malformed (``reason`` says which of a batch) or the content mode is not one of the three."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == STRUCTURED:
        return [Envelope(*read_structured(_json(body)))]
    if media == BATCH:
        documents = _json(body)
        if not isinstance(documents, list):
            raise CloudEventError("a batch is a JSON array of structured events")
        envelopes = []
        for i, document in enumerate(documents):
            try:
                envelopes.append(Envelope(*read_structured(document)))
            except CloudEventError as exc:
                raise CloudEventError(f"event [{i}] of the batch: {exc.reason}") from None
        return envelopes
    if media.startswith(FORMAT_PREFIX):
        raise CloudEventError(f"event format {media!r} is not read here: send {STRUCTURED}, {BATCH} or binary mode")
    return [_binary(content_type, headers, body)]


def _binary(content_type: str, headers: Mapping[str, str], body: bytes) -> Envelope:
    raw: dict[str, Any] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(PROPERTY_PREFIX):
            try:
                raw[lower[3:]] = urllib.parse.unquote(value, errors="strict")
            except UnicodeDecodeError:
                raise CloudEventError(f"header {name}: its percent-encoding is not UTF-8") from None
    if "specversion" not in raw:
        raise CloudEventError("not a CloudEvent: no ce-specversion header (binary mode), and the content type is "
                              f"neither {STRUCTURED} nor {BATCH}")
    raw.pop("datacontenttype", None)  # (binary mode: the Content-Type header is the data's type)
    if content_type:
        raw["datacontenttype"] = content_type
    return Envelope(check_attributes(raw), body)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise CloudEventError(f"the body is not JSON: {exc}") from None


def header_value(value: AttributeValue) -> str:
    """An attribute's value as a header: its canonical string, percent-encoded outside printable
    ASCII and for space, '"' and '%' (the binding, 3.1.3.2)."""
    text = attribute_text(value)
    if _HEADER_SAFE_TEXT.fullmatch(text):  # (most values: nothing to encode)
        return text
    return urllib.parse.quote(text, safe=HEADER_SAFE)


def binary_headers(attributes: Mapping[str, AttributeValue], content_type: str | None) -> dict[str, str]:
    """The headers of binary mode: a ``ce-`` header per attribute, the data's ``Content-Type``."""
    headers = {PROPERTY_PREFIX + name: header_value(value) for name, value in attributes.items()
               if name != "datacontenttype"}
    if content_type:
        headers["Content-Type"] = content_type
    return headers
