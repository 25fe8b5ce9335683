"""The options of a PostgreSQL target as a rule's definition gives them (``{"type": "postgres",
"dsn": "postgresql://...", "table": "events", "columns": {"id": "$.id", "temp": "$.data.temp"}}``),
checked once, and the one parameterised INSERT statement they make: identifiers are checked
and quoted, values only ever travel as parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import RuleDefinitionError
from ..transforms import compile_query

KEYS = frozenset({"type", "dsn", "table", "columns", "on_conflict", "key", "pool_size", "timeout_s"})
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
ON_CONFLICT = ("error", "nothing", "update")
MAX_COLUMNS = 64
MAX_POOL = 16


@dataclass(slots=True, frozen=True)
class PostgresOptions:
    dsn: str
    table: tuple[str, ...]  # [schema,] table
    columns: tuple[tuple[str, Any], ...]  # (column, compiled JSONPath over the event)
    on_conflict: str = "error"
    key: tuple[str, ...] = ()  # with "update": the unique columns a conflict is on
    pool_size: int = 2
    timeout_s: float = 10.0

    @property
    def table_name(self) -> str:
        return ".".join(self.table)

    @property
    def label(self) -> str:
        return f"postgres:{self.table_name}"

    def insert_sql(self) -> str:
        """``INSERT INTO "t" ("a", "b") VALUES ($1, $2)``, with ``ON CONFLICT DO NOTHING`` or
        ``ON CONFLICT ("a") DO UPDATE SET "b" = EXCLUDED."b"`` when asked."""
        columns = ", ".join(_quoted(name) for name, _ in self.columns)
        values = ", ".join(f"${i}" for i in range(1, len(self.columns) + 1))
        sql = f"INSERT INTO {'.'.join(_quoted(part) for part in self.table)} ({columns}) VALUES ({values})"
        if self.on_conflict == "nothing":
            return sql + " ON CONFLICT DO NOTHING"
        if self.on_conflict == "update":
            target = ", ".join(_quoted(name) for name in self.key)
            updates = ", ".join(f"{_quoted(name)} = EXCLUDED.{_quoted(name)}" for name, _ in self.columns
                                if name not in self.key)
            return sql + f" ON CONFLICT ({target}) " + (f"DO UPDATE SET {updates}" if updates else "DO NOTHING")
        return sql


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def parse_postgres_options(item: dict[str, Any], path: str) -> PostgresOptions:
    """The checked options of a ``postgres`` target (RuleDefinitionError with the JSON path when bad)."""
    unknown = sorted(set(item) - KEYS)
    if unknown:
        raise RuleDefinitionError(f"{path}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(KEYS))})")
    dsn = item.get("dsn")
    if not isinstance(dsn, str) or not re.match(r"postgres(ql)?://", dsn):
        raise RuleDefinitionError(f"{path}.dsn", "a postgresql://[user[:password]@]host[:port]/database URL")
    table = item.get("table")
    parts = table.split(".") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2 or not all(IDENTIFIER.fullmatch(part) for part in parts):
        raise RuleDefinitionError(f"{path}.table", "a table name, or schema.table: letters, digits, '_' and '$', "
                                                   "not starting with a digit, at most 63 each")
    columns = item.get("columns")
    if not isinstance(columns, dict) or not 1 <= len(columns) <= MAX_COLUMNS:
        raise RuleDefinitionError(f"{path}.columns", f"an object of 1 to {MAX_COLUMNS} column -> JSONPath over the "
                                                     "event (such as \"$.id\", \"$.data.temp\")")
    compiled = []
    for name, query in columns.items():
        if not IDENTIFIER.fullmatch(name):
            raise RuleDefinitionError(f"{path}.columns", f"{name!r} is no column name (letters, digits, '_' and '$', "
                                                         "not starting with a digit)")
        compiled.append((name, compile_query(query, f"{path}.columns.{name}")))
    on_conflict = item.get("on_conflict", "error")
    if on_conflict not in ON_CONFLICT:
        raise RuleDefinitionError(f"{path}.on_conflict", "\"error\" (a row that breaks a constraint goes to the "
                                                         "dead-letter topic), \"nothing\" (ON CONFLICT DO NOTHING) or "
                                                         "\"update\" (an upsert on the columns in key)")
    key = item.get("key")
    if on_conflict == "update":
        if not isinstance(key, list) or not key or not all(isinstance(k, str) and k in columns for k in key) \
                or len(set(key)) != len(key):
            raise RuleDefinitionError(f"{path}.key", "with on_conflict \"update\": a list of the columns (of "
                                                     "columns) a unique index or primary key is on")
    elif key is not None:
        raise RuleDefinitionError(f"{path}.key", "only with on_conflict \"update\"")
    pool_size = item.get("pool_size", 2)
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= MAX_POOL:
        raise RuleDefinitionError(f"{path}.pool_size", f"an integer from 1 to {MAX_POOL}")
    timeout = item.get("timeout_s", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise RuleDefinitionError(f"{path}.timeout_s", "more than 0 and at most 300 seconds")
    return PostgresOptions(dsn, tuple(parts), tuple(compiled), on_conflict, tuple(key or ()), pool_size,
                           float(timeout))
