"""One keep-alive HTTP/1.1 connection to a webhook, one request at a time: the request's bytes
written, the answer's status awaited (the bytes are read by ``protocols.http1``). It connects
when it has no open connection, and sends a request once more on a new one when a reused
connection ended before any byte of the answer (the server closed it while it was idle)."""

from __future__ import annotations

import asyncio
import ssl

from protocols.http1 import Answer, ResponseError, ResponseReader

from .probe import until_listening


class Unanswered(ConnectionError):
    """The connection ended before any byte of the answer."""


class _Link(asyncio.Protocol):
    """The open connection: hands each answer to the request waiting for it."""

    def __init__(self) -> None:
        self.reader = ResponseReader()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            answers = self.reader.feed(data)
            if len(answers) > 1 or (answers and (self.waiter is None or self.waiter.done())):
                raise ResponseError("an answer to no request")
        except ResponseError as exc:
            self._fail(exc)
            return
        if answers:
            self.waiter.set_result(answers[0])  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        unanswered = self.reader.idle
        answer = self.reader.closed()
        if self.waiter is not None and not self.waiter.done():
            if answer is not None:
                self.waiter.set_result(answer)
            elif unanswered:
                self.waiter.set_exception(Unanswered("the connection ended before the answer"))
            else:
                self.waiter.set_exception(ResponseError("the connection ended within the answer"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class KeepAliveConnection:
    """POSTs to ``host``:``port`` (TLS with the system's trusted certificates when ``tls``),
    each request within ``timeout_s`` (TimeoutError; OSError or ResponseError when it failed)."""

    def __init__(self, host: str, port: int, *, tls: bool, timeout_s: float) -> None:
        self._host = host
        self._port = port
        self._tls = ssl.create_default_context() if tls else None
        self._timeout_s = timeout_s
        self._link: _Link | None = None

    async def send(self, request: bytes) -> int:
        """The status of the answer to ``request`` (the whole request's bytes)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                reused = self._link is not None and not self._link.lost
                try:
                    return await self._exchange(request)
                except Unanswered:
                    if not reused:
                        raise
                    return await self._exchange(request)  # (the server had closed it: at least once allows it)
        except BaseException:
            self.close()  # (an answer may still come: the connection is not used again)
            raise

    async def _exchange(self, request: bytes) -> int:
        link = self._link
        if link is None or link.lost:
            link = self._link = None
            _, link = await asyncio.get_running_loop().create_connection(
                _Link, self._host, self._port, ssl=self._tls, server_hostname=self._host if self._tls else None)
            self._link = link
        waiter = link.waiter = asyncio.get_running_loop().create_future()
        link.transport.write(request)  # type: ignore[union-attr]
        answer = await waiter
        link.waiter = None
        if answer.closes:
            self.close()
        return answer.status

    async def reachable(self) -> None:
        """Return once ``host``:``port`` takes a TCP connection (probe.py)."""
        await until_listening(self._host, self._port)

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
