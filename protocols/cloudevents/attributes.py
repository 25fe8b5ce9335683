"""A CloudEvent's context attributes: the checks of the specification (the required four, names,
types, ``time`` as RFC 3339) and their form as message properties -- ``ce-{name}`` with the
attribute's canonical string, the names and values the HTTP binding's binary mode uses as
headers. ``datacontenttype`` is not among them: it travels as the message's content type."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

SPEC_VERSION = "1.0"
REQUIRED = ("id", "source", "specversion", "type")
PROPERTY_PREFIX = "ce-"
NAME = re.compile(r"[a-z0-9]{1,64}")
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
INT32 = (-(2**31), 2**31 - 1)
NOT_ATTRIBUTES = ("data", "data_base64")  # members of a structured event beside the attributes

AttributeValue = str | int | bool


class CloudEventError(ValueError):
    """A malformed CloudEvent: ``reason`` says what is wrong with it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_attributes(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """The attributes of a CloudEvent 1.0, checked (a null value is an absent attribute);
    CloudEventError names the first problem."""
    out: dict[str, AttributeValue] = {}
    for name, value in attributes.items():
        if value is None:
            continue
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise CloudEventError(f"attribute name {name!r}: lower-case letters a-z and digits only")
        if isinstance(value, str) and value:
            if not is_utf8(value):
                raise CloudEventError(f"attribute {name}: not UTF-8 text (it holds a lone surrogate)")
            out[name] = value
        elif isinstance(value, bool):
            out[name] = value
        elif isinstance(value, int):
            if not INT32[0] <= value <= INT32[1]:
                raise CloudEventError(f"attribute {name}: an integer is a signed 32-bit number")
            out[name] = value
        elif isinstance(value, str):
            raise CloudEventError(f"attribute {name}: an empty string (leave the attribute out)")
        else:
            raise CloudEventError(f"attribute {name}: a string, an integer or a boolean, not {type(value).__name__}")
    for name in REQUIRED:
        if name not in out:
            raise CloudEventError(f"the required attribute {name} is missing")
        if not isinstance(out[name], str):
            raise CloudEventError(f"attribute {name}: a string")
    if out["specversion"] != SPEC_VERSION:
        raise CloudEventError(f"specversion {out['specversion']!r} is not supported (only {SPEC_VERSION})")
    for name in ("subject", "dataschema", "datacontenttype", "time"):
        if name in out and not isinstance(out[name], str):
            raise CloudEventError(f"attribute {name}: a string")
    if "time" in out:
        _check_time(str(out["time"]))
    return out


def is_utf8(text: str) -> bool:
    """The text can be written as UTF-8 (it holds no lone surrogate, which JSON escapes and
    undecodable header bytes may bring)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_time(text: str) -> None:
    if not RFC3339.fullmatch(text):
        raise CloudEventError(f"attribute time: {text!r} is not an RFC 3339 timestamp")
    try:
        dt.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise CloudEventError(f"attribute time: {text!r}: {exc}") from None


def attribute_text(value: AttributeValue) -> str:
    """An attribute's canonical string (booleans ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_properties(attributes: Mapping[str, AttributeValue]) -> list[tuple[str, str]]:
    """The attributes as ``ce-{name}`` properties (``datacontenttype`` left to the content type)."""
    return [(PROPERTY_PREFIX + name, attribute_text(value)) for name, value in attributes.items()
            if name != "datacontenttype"]


def from_properties(properties: Mapping[str, Any]) -> dict[str, str] | None:
    """The attributes of a message published as a CloudEvent (its ``ce-`` properties, the
    required ones among them), or None. Values come back as strings, as in any binary mode."""
    if PROPERTY_PREFIX + "specversion" not in properties:
        return None
    out: dict[str, str] = {}
    for name, value in properties.items():
        if name.startswith(PROPERTY_PREFIX) and isinstance(value, str) and NAME.fullmatch(name[3:]):
            out[name[3:]] = value
    if any(not out.get(name) for name in REQUIRED) or out["specversion"] != SPEC_VERSION:
        return None
    return out
