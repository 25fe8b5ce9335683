"""What every remoting request handler shares: the reply kinds, the error that becomes an
error response, and reading numbers and strings out of ``extFields``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand
from store import PutResult

CONSUMER_PREFIX = "rmq:"  # store consumer name of a consumer group


@dataclass(slots=True)
class Pending:
    """A reply that waits for a store write: ``respond`` turns its results into the response."""

    future: asyncio.Future[Sequence[PutResult]]
    respond: Callable[[Sequence[PutResult]], RemotingCommand | None]


Reply = RemotingCommand | Pending | Coroutine[Any, Any, RemotingCommand | None] | None


class BadRequest(Exception):
    """A request whose header cannot be used: answered with its code and remark."""

    def __init__(self, remark: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(remark)
        self.code = code


def int_field(ext: dict[str, str], name: str, default: int | None = None) -> int:
    value = ext.get(name)
    if value is None or value == "":
        if default is None:
            raise BadRequest(f"the request header field {name} is missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"the request header field {name} is not a number: {value!r}") from None


def str_field(ext: dict[str, str], name: str) -> str:
    value = ext.get(name)
    if not value:
        raise BadRequest(f"the request header field {name} is missing")
    return value
