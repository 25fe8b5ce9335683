"""Frames that sent pamqp's decoder into an endless loop (and the gateway's event loop with it):
a content header whose property flags say "continued" (pamqp's flag reader never advances),
and a field array longer than the data left (pamqp adds ``None`` for ever), in a message's
headers or in connection.start-ok's client properties, before any login. Each must be refused
with connection.close 502 (syntax-error), and the gateway process must go on serving."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
from pamqp import commands
from pamqp import frame as pframe

from protocols.amqp.frames import PROTOCOL_HEADER, method_frame

from .crash_support import free_port, start_gateway, stop

TIMEOUT_S = 5.0


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def overlong_array_table() -> bytes:
    """A field table {"a": array} whose array says 100 bytes where 2 follow."""
    entry = b"\x01aA" + struct.pack(">I", 100) + b"tt"
    return struct.pack(">I", len(entry)) + entry


def content_header(flags: int, properties: bytes) -> bytes:
    return frame(2, 1, struct.pack(">HHQH", 60, 0, 0, flags) + properties)


PUBLISH = method_frame(1, commands.Basic.Publish(routing_key="q"))
# sent after the login: refused with connection.close 502
AFTER_LOGIN = {
    "continued property flags": PUBLISH + content_header(0x0001, b""),
    "continued flags after a property": PUBLISH + content_header(0x1001, b"\x02"),
    "overlong array in the headers property": PUBLISH + content_header(0x2000, overlong_array_table()),
}
# start-ok whose client properties end the frame: before the login a failed handshake just closes
START_OK = frame(1, 0, struct.pack(">HH", 10, 11) + overlong_array_table())


class Frames:
    """Frames read from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.data = sock, b""

    def until(self, kind: type) -> object | None:
        """The first frame of ``kind``; None if the gateway closed the socket first."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            while self.data:
                try:
                    used, _, value = pframe.unmarshal(self.data)
                except Exception:  # noqa: BLE001 - an incomplete frame: read more
                    break
                self.data = self.data[used:]
                if isinstance(value, kind):
                    return value
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                return None
            self.data += chunk
        raise AssertionError(f"no {kind.__name__} and no close: the gateway did not answer")


def logged_in(port: int) -> tuple[socket.socket, Frames]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    frames = Frames(sock)
    sock.sendall(PROTOCOL_HEADER)
    assert frames.until(commands.Connection.Start)
    sock.sendall(method_frame(0, commands.Connection.StartOk(response="\x00guest\x00guest")))
    assert frames.until(commands.Connection.Tune)
    sock.sendall(method_frame(0, commands.Connection.TuneOk(2047, 131072, 0))
                 + method_frame(0, commands.Connection.Open("/")) + method_frame(1, commands.Channel.Open()))
    assert frames.until(commands.Channel.OpenOk)
    return sock, frames


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    proc = start_gateway(Path(tmp_path_factory.mktemp("data")), amqp_port=port)
    yield port
    stop(proc)


@pytest.mark.parametrize("name", sorted(AFTER_LOGIN))
def test_a_frame_pamqp_looped_on_is_refused_and_the_gateway_serves_on(gateway: int, name: str) -> None:
    sock, frames = logged_in(gateway)
    with sock:
        sock.sendall(AFTER_LOGIN[name])
        close = frames.until(commands.Connection.Close)
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 502 and "cannot decode frame" in close.reply_text, close.reply_text
    logged_in(gateway)[0].close()


def test_a_start_ok_pamqp_looped_on_closes_and_the_gateway_serves_on(gateway: int) -> None:
    with socket.create_connection(("127.0.0.1", gateway), timeout=TIMEOUT_S) as sock:
        frames = Frames(sock)
        sock.sendall(PROTOCOL_HEADER)
        assert frames.until(commands.Connection.Start)
        sock.sendall(START_OK)
        assert frames.until(commands.Connection.Tune) is None  # closed, before any login
    logged_in(gateway)[0].close()
