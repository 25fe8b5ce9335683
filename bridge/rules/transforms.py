"""What a rule sends its targets, made from the matched event (rocketmq-eventbridge's four
transforms): ORIGINAL (the message's payload as it is), CONSTANT (a fixed value), JSONPATH (a
selection from the event, as JSON) and TEMPLATE (text filled from JSONPath variables). JSONPath
is RFC 9535's (the ``jsonpath-rfc9535`` package), over the event a pattern sees
(``CloudEvent.for_matching()``: attributes, ``properties``, ``topiclevels``, ``data``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonpath_rfc9535 as jsonpath

from .errors import RuleDefinitionError
from .events import CloudEvent

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
TYPES = ("ORIGINAL", "CONSTANT", "JSONPATH", "TEMPLATE")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(slots=True, frozen=True)
class Payload:
    """The bytes a target sends and their content type (None: not known)."""

    body: bytes
    content_type: str | None


class Transform:
    """One rule's transform, checked and compiled once."""

    def __init__(self, kind: str, value: Any = None, path: Any = None,
                 variables: dict[str, Any] | None = None, template: str = "") -> None:
        self.kind = kind
        self._constant = _encode(value) if kind == "CONSTANT" else None
        self._path = path
        self._variables = variables or {}
        self._template = template

    def apply(self, event: CloudEvent, view: dict[str, Any]) -> Payload:
        """The payload for the event (``view``: its ``for_matching()``)."""
        if self.kind == "ORIGINAL":
            return Payload(event.body, event.datacontenttype)
        if self.kind == "CONSTANT":
            assert self._constant is not None
            return self._constant
        if self.kind == "JSONPATH":
            return Payload(json.dumps(select(self._path, view), separators=(",", ":")).encode(), JSON)
        values = {name: select(query, view) for name, query in self._variables.items()}
        text = VARIABLE.sub(lambda m: _as_text(values[m.group(1)]), self._template)
        return Payload(text.encode(), JSON if _is_json(text) else TEXT)


def parse_transform(raw: Any, path: str) -> Transform:
    """A definition's ``transform`` object as a Transform; ``error(path, reason)`` when it is bad."""
    if not isinstance(raw, dict) or raw.get("type") not in TYPES:
        raise RuleDefinitionError(f"{path}.type", f"a transform is an object whose type is one of {', '.join(TYPES)}")
    kind = raw["type"]
    known = {"ORIGINAL": {"type"}, "CONSTANT": {"type", "value"}, "JSONPATH": {"type", "path"},
             "TEMPLATE": {"type", "variables", "template"}}[kind]
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RuleDefinitionError(f"{path}.{unknown[0]}",
                                  f"unknown key of a {kind} transform (known: {', '.join(sorted(known))})")
    if kind == "ORIGINAL":
        return Transform(kind)
    if kind == "CONSTANT":
        if "value" not in raw:
            raise RuleDefinitionError(f"{path}.value", "a CONSTANT transform needs a value")
        return Transform(kind, value=raw["value"])
    if kind == "JSONPATH":
        return Transform(kind, path=compile_query(raw.get("path"), f"{path}.path"))
    variables = raw.get("variables", {})
    template = raw.get("template")
    if not isinstance(variables, dict):
        raise RuleDefinitionError(f"{path}.variables", "an object of name -> JSONPath")
    if not isinstance(template, str):
        raise RuleDefinitionError(f"{path}.template", "a string, with ${name} where a variable's value goes")
    queries = {}
    for name, query in variables.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise RuleDefinitionError(f"{path}.variables", f"{name!r} is no variable name (letters, digits, '_')")
        queries[name] = compile_query(query, f"{path}.variables.{name}")
    for match in VARIABLE.finditer(template):
        if match.group(1) not in queries:
            raise RuleDefinitionError(f"{path}.template", f"${{{match.group(1)}}} at character {match.start()} "
                                            "is not one of the variables")
    return Transform(kind, variables=queries, template=template)


def compile_query(text: Any, path: str) -> Any:
    """A JSONPath checked and compiled (RuleDefinitionError at ``path`` when it is not one)."""
    if not isinstance(text, str):
        raise RuleDefinitionError(path, "a JSONPath (RFC 9535) string, such as $.data.temp")
    try:
        return jsonpath.compile(text)
    except jsonpath.JSONPathError as exc:
        raise RuleDefinitionError(path, f"not a JSONPath (RFC 9535): {exc}") from None


def select(query: Any, view: dict[str, Any]) -> Any:
    """The value the query selects: one node's value, a list when it selects several, null when none."""
    values = [node.value for node in query.find(view)]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _encode(value: Any) -> Payload:
    if isinstance(value, str):
        return Payload(value.encode(), TEXT)
    return Payload(json.dumps(value, separators=(",", ":")).encode(), JSON)
