"""gRPC on the remoting port: a remoting connection that opens with HTTP/2's connection preface
(or a TLS handshake) is handed here and forwarded, byte for byte, to the gRPC listener's plain
(or TLS) port over loopback (grpcio's server cannot adopt a socket): a store node's service, or
a gateway node's proxy. Each side's reading pauses while the other's writing is paused;
either side's end closes both. The gRPC service learns the client's own address from
``peers`` (its forwarded connection's local address -> the client's)."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("tidemq.grpc")

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_HANDSHAKE = b"\x16"  # the record type a TLS connection opens with


class _Side(asyncio.Protocol):
    """One end of a forward: what it reads goes to ``other``'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        self.pending: list[bytes] = []  # read before the other end is connected
        self.keep: object = None  # what lives as long as the connection (a stream writer would close it when collected)

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)
        else:
            self.pending.append(data)

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()
        self.other = None


class _Upstream(_Side):
    def __init__(self, client: _Side, peers: dict[str, str], client_peer: str) -> None:
        super().__init__()
        self.other = client
        self.peers = peers
        self.client_peer = client_peer
        self.local = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        host, port = transport.get_extra_info("sockname")[:2]
        self.local = f"ipv6:%5B{host}%5D:{port}" if ":" in host else f"ipv4:{host}:{port}"  # (as grpcio's peer)
        self.peers[self.local] = self.client_peer

    def connection_lost(self, exc: Exception | None) -> None:
        self.peers.pop(self.local, None)
        super().connection_lost(exc)


class SharedPort:
    """Forwards the connections handed to it to the gRPC listener's ``plain`` port, or its
    ``tls`` port for a TLS handshake; one that has no port to go to is closed."""

    def __init__(self, plain: tuple[str, int] | None, tls: tuple[str, int] | None) -> None:
        self.plain, self.tls = plain, tls
        self.peers: dict[str, str] = {}  # a forwarded connection's local address (grpc's peer) -> the client's
        self._connecting: set[asyncio.Task[None]] = set()

    def hand_over(self, transport: asyncio.Transport, first: bytes, client_peer: str, keep: object = None) -> None:
        """Take over ``transport`` (its connection read ``first`` so far; ``keep``: an object
        to keep as long as the connection, such as the asyncio stream writer it had)."""
        target = self.tls if first[:1] == TLS_HANDSHAKE else self.plain
        if target is None:
            log.info("grpc forward refused peer=%s tls=%s: no such gRPC port", client_peer, target is self.tls)
            transport.close()
            return
        client = _Side()
        client.transport = transport
        client.keep = keep
        client.pending.append(first)
        transport.set_protocol(client)
        transport.pause_reading()  # (until the gRPC side is connected)
        task = asyncio.get_running_loop().create_task(self._connect(client, client_peer, target))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, client: _Side, client_peer: str, target: tuple[str, int]) -> None:
        assert client.transport is not None
        try:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: _Upstream(client, self.peers, client_peer), *target)
        except OSError as exc:
            log.info("grpc forward failed peer=%s error=%s", client_peer, exc)
            client.transport.close()
            return
        if client.transport.is_closing():
            upstream.transport.close()  # type: ignore[union-attr]
            return
        client.other = upstream
        assert upstream.transport is not None
        upstream.transport.write(b"".join(client.pending))
        client.pending.clear()
        client.transport.resume_reading()

    async def stop(self) -> None:
        for task in list(self._connecting):
            task.cancel()
