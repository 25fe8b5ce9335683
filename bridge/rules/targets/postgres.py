"""A PostgreSQL table as a rule's target: each event a row, its columns selected from the event
by JSONPath, inserted by one parameterised statement over a small asyncpg pool; a batch of events
in one transaction, delivered once COMMIT returned. A value is converted to the type PostgreSQL
gives its parameter. A row the table refuses (a constraint, a value of the wrong type) is a
refusal: dead letter; a server that is down, restarting or unreachable is retried."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from ..events import CloudEvent
from ..transforms import Payload, select
from .outcome import DELIVERED, Outcome
from .probe import refused, until_listening
from .postgres_options import PostgresOptions

REFUSED_CLASSES = ("22", "23")  # SQLSTATE classes of a row the table will never take: data exception, constraint


class ValueRefused(ValueError):
    """A selected value cannot be the type of its column."""


class PostgresTarget:
    def __init__(self, options: PostgresOptions) -> None:
        self._address = _tcp_address(options.dsn)  # (probed after a refused connection)
        self.options = options
        self.label = options.label
        self._sql = options.insert_sql()
        self._pool: asyncpg.Pool | None = None

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        return (await self.deliver_batch([(event, payload)]))[1]

    async def deliver_batch(self, items: Sequence[tuple[CloudEvent, Payload]]) -> tuple[int, Outcome]:
        """Every event's row in one transaction: all of them or none (then each is tried on its own)."""
        views = [event.for_matching() for event, _ in items]
        try:
            pool = await self._connected()
            async with pool.acquire(timeout=self.options.timeout_s) as connection:
                async with connection.transaction():
                    statement = await connection.prepare(self._sql)
                    converters = [_converter(parameter.name) for parameter in statement.get_parameters()]
                    rows = [self._row(view, converters) for view in views]
                    await statement.executemany(rows, timeout=self.options.timeout_s)
        except ValueRefused as exc:
            return 0, Outcome(False, str(exc), retryable=False)
        except asyncpg.DataError as exc:  # (a value asyncpg cannot send as its column's type)
            return 0, Outcome(False, f"{type(exc).__name__}: {exc}", retryable=False)
        except asyncpg.PostgresError as exc:
            never = (exc.sqlstate or "")[:2] in REFUSED_CLASSES
            return 0, Outcome(False, f"{type(exc).__name__}: {exc}", retryable=not never)
        except (OSError, asyncio.TimeoutError, asyncpg.InterfaceError) as exc:
            return 0, Outcome(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                              unreachable=refused(exc) and self._address is not None)
        return len(items), DELIVERED

    def _row(self, view: dict[str, Any], converters: list[Callable[[Any], Any]]) -> tuple[Any, ...]:
        row = []
        for (column, query), convert in zip(self.options.columns, converters):
            value = select(query, view)
            try:
                row.append(None if value is None else convert(value))
            except (ValueError, TypeError, ArithmeticError) as exc:
                raise ValueRefused(f"column {column}: {value!r} cannot be stored: {exc}") from None
        return tuple(row)

    async def _connected(self) -> asyncpg.Pool:
        if self._pool is None:  # (no connection made yet: the first acquire makes it)
            self._pool = await asyncpg.create_pool(self.options.dsn, min_size=0, max_size=self.options.pool_size,
                                                   command_timeout=self.options.timeout_s,
                                                   timeout=self.options.timeout_s)
        return self._pool

    async def reachable(self) -> None:
        address = self._address
        if address is None:  # (a DSN of several hosts or a socket path: the backoff decides)
            await asyncio.Event().wait()
        else:
            await until_listening(*address)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), self.options.timeout_s)
            except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                pool.terminate()


def _tcp_address(dsn: str) -> tuple[str, int] | None:
    """The one host and port of a ``postgresql://`` DSN (None: several, a socket, or not a URL)."""
    try:
        parts = urllib.parse.urlsplit(dsn)
        port = parts.port or 5432
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme not in ("postgresql", "postgres") or not host or "," in parts.netloc or host.startswith("/"):
        return None
    return host, port


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError("not an integer")
    number = int(value) if not isinstance(value, float) else value
    if isinstance(number, float):
        if not number.is_integer():
            raise ValueError("not a whole number")
        number = int(number)
    return number


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("not a number")
    return float(value)


def _numeric(value: Any) -> decimal.Decimal:
    if isinstance(value, bool):
        raise TypeError("not a number")
    return decimal.Decimal(str(value))


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError("not true or false")


def _timestamp(value: Any) -> datetime.datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # milliseconds since the epoch
        return datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
    stamp = datetime.datetime.fromisoformat(value)
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=datetime.timezone.utc)


def _naive_timestamp(value: Any) -> datetime.datetime:
    return _timestamp(value).astimezone(datetime.timezone.utc).replace(tzinfo=None)


def _bytes(value: Any) -> bytes:
    return _text(value).encode()


CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "text": _text, "varchar": _text, "bpchar": _text, "name": _text, "json": _text, "jsonb": _text,
    "int2": _integer, "int4": _integer, "int8": _integer, "float4": _float, "float8": _float, "numeric": _numeric,
    "bool": _boolean, "timestamptz": _timestamp, "timestamp": _naive_timestamp,
    "date": lambda value: datetime.date.fromisoformat(value), "uuid": lambda value: uuid.UUID(str(value)),
    "bytea": _bytes,
}


def _converter(type_name: str) -> Callable[[Any], Any]:
    """How a JSON value becomes a parameter of this PostgreSQL type (others: as text, which
    asyncpg takes for the types it does not know and refuses, as a data error, for the rest)."""
    return CONVERTERS.get(type_name, _text)

