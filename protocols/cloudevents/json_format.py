"""The JSON event format of CloudEvents 1.0: a structured event (the attributes and ``data`` or
``data_base64`` in one object) read into attributes and payload bytes, and written from them."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from .attributes import NOT_ATTRIBUTES, AttributeValue, CloudEventError, check_attributes

DEFAULT_CONTENT_TYPE = "application/json"  # of a structured event's data without datacontenttype


def is_json_type(content_type: str) -> bool:
    """application/json, text/json and any */*+json, parameters aside."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")


def read_structured(document: Any) -> tuple[dict[str, AttributeValue], bytes]:
    """(the checked attributes, the payload) of one structured event; ``datacontenttype``
    is set when the event has data (``application/json`` for JSON ``data`` without one)."""
    if not isinstance(document, dict):
        raise CloudEventError("a structured event is a JSON object")
    if "data" in document and "data_base64" in document:
        raise CloudEventError("an event has data or data_base64, not both")
    attributes = check_attributes({k: v for k, v in document.items() if k not in NOT_ATTRIBUTES})
    content_type = attributes.get("datacontenttype")
    if document.get("data_base64") is not None:
        encoded = document["data_base64"]
        try:
            if not isinstance(encoded, str):
                raise TypeError
            return attributes, base64.b64decode(encoded, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise CloudEventError("data_base64 is not base64 text") from None
    data = document.get("data")
    if data is None:
        return attributes, b""
    if content_type is None:
        attributes["datacontenttype"] = content_type = DEFAULT_CONTENT_TYPE
    try:
        if isinstance(data, str) and not is_json_type(str(content_type)):
            return attributes, data.encode()
        return attributes, json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise CloudEventError("data: not UTF-8 text (it holds a lone surrogate)") from None
    except RecursionError:
        raise CloudEventError("data: nested too deep") from None


def structured_document(attributes: dict[str, Any], content_type: str | None, body: bytes) -> dict[str, Any]:
    """One event in the JSON format: the attributes, then ``data`` (JSON, or text for
    ``text/*``) or ``data_base64``."""
    document = {name: value for name, value in attributes.items() if name != "datacontenttype"}
    if content_type:
        document["datacontenttype"] = content_type
    data = _data(content_type or "", body)
    if data is None:
        document["data_base64"] = base64.b64encode(body).decode()
    else:
        document["data"] = data[0]
    return document


def _data(content_type: str, body: bytes) -> tuple[Any] | None:
    """The payload as a JSON value (in a 1-tuple; None: only base64 can carry it)."""
    if is_json_type(content_type):
        try:
            return (json.loads(body),)
        except ValueError:
            pass
    if content_type.startswith("text/"):
        try:
            return (body.decode(),)
        except UnicodeDecodeError:
            pass
    return None
