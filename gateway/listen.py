"""Listening sockets for a bind's host and port, made here for every listener. ``localhost`` is
both loopbacks, 127.0.0.1 and ::1 (whatever the resolver says of the name), the IPv6 one left
out with a warning where the system has none; another host is every address it resolves to.
The sockets of one bind share its port, also when port 0 picked it; ``[::]`` alone also takes
IPv4 clients (a dual-stack socket), any other IPv6 socket is IPv6-only."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

log = logging.getLogger("tidemq.listen")

LOOPBACK_NAME = "localhost"
LOOPBACKS = ((socket.AF_INET, "127.0.0.1", ()), (socket.AF_INET6, "::1", ()))  # family, address, scope
# what binding an IPv6 socket raises on a system without IPv6 (or without its loopback)
_NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT})
_SHARED_PORT_TRIES = 5  # port 0: a port free on the first address may be taken on the next


def format_address(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[::1]:9876``), as binds and URLs write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def listening_sockets(host: str, port: int, *, backlog: int = 100) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host`` and ``port`` (OSError naming the
    address when one cannot be bound)."""
    addresses: list[tuple[int, str, tuple[int, ...]]]
    if host == LOOPBACK_NAME:
        addresses = list(LOOPBACKS)
    else:
        infos = await asyncio.get_running_loop().getaddrinfo(host or None, port, family=socket.AF_UNSPEC,
                                                             type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        # (an IPv6 address keeps its flow info and scope id: a link-local one needs its interface)
        # (an inet address's host is a str: getaddrinfo's type allows an AF_CAN one's int too)
        addresses = list(dict.fromkeys((family, str(address[0]), tuple(address[2:]))
                                       for family, _, _, _, address in infos))
    for attempt in range(_SHARED_PORT_TRIES):
        try:
            return _bind_all(host, addresses, port, backlog)
        except _PortTaken:
            if attempt == _SHARED_PORT_TRIES - 1:
                raise OSError(errno.EADDRINUSE, f"no port free on every address of {host!r}") from None
    raise AssertionError("unreachable")  # (the loop returns or raises)


class _PortTaken(Exception):
    """Port 0's pick for the first address is taken on a later one: pick again."""


def _bind_all(host: str, addresses: Sequence[tuple[int, str, tuple[int, ...]]], port: int,
              backlog: int) -> list[socket.socket]:
    sockets: list[socket.socket] = []
    try:
        for family, address, scope in addresses:
            shared = sockets[0].getsockname()[1] if sockets and port == 0 else port
            try:
                sock = _listen(family, (address, shared, *scope), backlog,
                               dual_stack=address == "::" and len(addresses) == 1)
            except OSError as exc:
                if host == LOOPBACK_NAME and family == socket.AF_INET6 and exc.errno in _NO_IPV6:
                    log.warning("no IPv6 loopback: listening on 127.0.0.1 only port=%d error=%s", port,
                                exc.strerror or exc)
                    continue
                if exc.errno == errno.EADDRINUSE and shared != port:
                    raise _PortTaken() from None
                raise OSError(exc.errno, f"error while attempting to bind on address "
                                         f"{format_address(address, shared)}: {exc.strerror or exc}") from None
            sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _listen(family: int, sockaddr: tuple, backlog: int, *, dual_stack: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ListeningServer(asyncio.AbstractServer):
    """A listener's server, which names its listening sockets (as asyncio's Server does; its
    AbstractServer names none)."""

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        raise NotImplementedError


class Servers(ListeningServer):
    """One listener's servers, one per socket: asyncio's, websockets' and aiohttp's servers each
    take a single ready socket."""

    def __init__(self, servers: Sequence[Any]) -> None:
        self._servers = list(servers)

    @classmethod
    async def serving(cls, sockets: Sequence[socket.socket],
                      start: Callable[[socket.socket], Awaitable[Any]]) -> Servers:
        """``start(sock)`` for each socket (on a failure: the sockets closed, the servers too)."""
        servers: list[Any] = []
        try:
            for sock in sockets:
                servers.append(await start(sock))
        except BaseException:
            for server in servers:
                server.close()
            for sock in sockets:
                sock.close()
            raise
        return cls(servers)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(sock for server in self._servers for sock in server.sockets)

    def close(self) -> None:
        for server in self._servers:
            server.close()

    async def wait_closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def is_serving(self) -> bool:
        return any(server.is_serving() for server in self._servers)

    async def start_serving(self) -> None:
        return None  # (serving from creation)

    async def serve_forever(self) -> None:
        await asyncio.gather(*(server.serve_forever() for server in self._servers))
