"""Event schemas: a JSON Schema per name (an event type, or a name a rule gives), every version
kept, in the store's meta tables ``schemas`` (name -> the current version) and
``schema.versions``, so they replicate with the store as rule definitions do. Compiled once
with ``jsonschema``; ``check`` says why an event's data does not fit, or None."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema
import referencing.exceptions
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from .events import NO_DATA, json_data

log = logging.getLogger("tidemq.rules")

TABLE = "schemas"
VERSIONS_TABLE = "schema.versions"
MAX_REASON = 300
NAME = re.compile(r"[\x21-\x7e]{1,256}")  # (an event type: printable ASCII without spaces)


class SchemaTable(Protocol):
    """A durable str -> bytes table (``store.KvTable``)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]: ...


class SchemaError(ValueError):
    """A schema refused (not a JSON Schema, a bad name): ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True, frozen=True)
class Violation:
    """Why an event's data does not fit the schema ``name`` at ``version``."""

    name: str
    version: int
    reason: str

    def __str__(self) -> str:
        return f"schema {self.name} v{self.version}: {self.reason}"


@dataclass(slots=True, frozen=True)
class _Compiled:
    version: int
    schema: Any
    validator: Validator


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SchemaError("a schema name (an event type) is 1-256 printable ASCII characters without spaces")
    return name


def compile_schema(schema: Any) -> Validator:
    """A validator of ``schema`` (its ``$schema`` dialect, else the latest), formats checked;
    SchemaError when it is not a valid JSON Schema."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("a JSON Schema is an object (or true/false)")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"not a valid JSON Schema: {exc.json_path}: {_short(exc.message)}") from None
    except RecursionError:
        raise SchemaError("not a JSON Schema that can be checked: nested too deep") from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _short(text: str) -> str:
    """A validation message cut to MAX_REASON characters (it may quote the whole value)."""
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


class SchemaBook:
    def __init__(self, current: SchemaTable, versions: SchemaTable) -> None:
        self._current = current
        self._versions = versions
        self._compiled: dict[str, _Compiled] = {}
        for name, raw in current.items():
            try:
                entry = json.loads(raw)
                self._compiled[name] = _Compiled(entry["version"], entry["schema"], compile_schema(entry["schema"]))
            except (ValueError, KeyError, TypeError) as exc:  # (SchemaError too)
                log.error("stored schema not loaded schema=%s error=%s", name, exc)

    def names(self) -> list[str]:
        return sorted(self._compiled)

    def list(self) -> list[dict[str, Any]]:
        return [{"name": name, "version": self._compiled[name].version} for name in self.names()]

    def get(self, name: str, version: int | None = None) -> dict[str, Any] | None:
        """The schema (its current version, or ``version``) as ``{"name", "version", "schema"}``."""
        entry = self._compiled.get(name)
        if entry is None:
            return None
        if version is None or version == entry.version:
            return {"name": name, "version": entry.version, "schema": entry.schema}
        raw = self._versions.get(_version_key(name, version))
        return {"name": name, "version": version, "schema": json.loads(raw)} if raw is not None else None

    def put(self, name: str, schema: Any) -> dict[str, Any]:
        """A new version of ``name`` (the first is 1), written before it is used."""
        check_name(name)
        validator = compile_schema(schema)
        old = self._compiled.get(name)
        version = old.version + 1 if old is not None else 1
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        self._versions.put(_version_key(name, version), text.encode())
        self._current.put(name, json.dumps({"version": version, "schema": schema}, sort_keys=True).encode())
        self._compiled[name] = _Compiled(version, schema, validator)
        return {"name": name, "version": version, "schema": schema}

    def delete(self, name: str) -> bool:
        """Every version of ``name`` gone (False: there was none)."""
        if name not in self._compiled:
            return False
        self._current.delete(name)
        for key, _ in list(self._versions.items(name + "\n")):
            self._versions.delete(key)
        del self._compiled[name]
        return True

    def check_body(self, name: str, body: bytes, content_type: str | None) -> Violation | None:
        """``check`` of a payload as received: decoded as a rule decodes it (JSON when its type is
        JSON or not given)."""
        if name not in self._compiled:
            return None
        return self.check(name, json_data(body, content_type))

    def check(self, name: str, data: Any, *, required: bool = False) -> Violation | None:
        """Why ``data`` (a decoded JSON value, or NO_DATA) does not fit the schema ``name`` (None:
        it fits, or there is no such schema and none is ``required``)."""
        entry = self._compiled.get(name)
        if entry is None:
            return Violation(name, 0, "no schema of this name is registered") if required else None
        if data is NO_DATA:
            return Violation(name, entry.version, "the event's data is not JSON")
        try:
            error = best_match(entry.validator.iter_errors(data))
        except referencing.exceptions.Unresolvable as exc:
            return Violation(name, entry.version, f"the schema refers to what cannot be resolved: {exc}")
        except RecursionError:
            return Violation(name, entry.version, "the data is nested too deep to be checked")
        if error is None:
            return None
        return Violation(name, entry.version, f"{error.json_path}: {_short(error.message)}")


def _version_key(name: str, version: int) -> str:
    return f"{name}\n{version:010d}"
