"""Raw AMQP 0-9-1 on a plain socket for tests that need exact frames: the handshake (with the
client's own frame_max), frames read until one of a kind, a publish's frames."""

from __future__ import annotations

import asyncio

from pamqp import commands
from pamqp import frame as pframe

from protocols.amqp.frames import PROTOCOL_HEADER, content_frames, method_frame

TIMEOUT = 5.0


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].strip("/"))


class RawAMQP:
    """A client on a plain socket: exact frames out, decoded frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._data = b""

    @classmethod
    async def open(cls, port: int, *, frame_max: int = 131_072, client_properties: dict | None = None) -> RawAMQP:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        writer.write(PROTOCOL_HEADER)
        await raw.until(commands.Connection.Start)
        writer.write(method_frame(0, commands.Connection.StartOk(client_properties=client_properties,
                                                                 response="\x00guest\x00guest")))
        await raw.until(commands.Connection.Tune)
        writer.write(method_frame(0, commands.Connection.TuneOk(2047, frame_max, 0)))
        writer.write(method_frame(0, commands.Connection.Open("/")))
        await raw.until(commands.Connection.OpenOk)
        return raw

    async def until(self, kind: type, timeout: float = TIMEOUT) -> list:
        """Frames read until one of ``kind`` (the last of the list)."""
        frames: list = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while self._data:
                try:
                    used, channel, value = pframe.unmarshal(self._data)
                except Exception:
                    break  # an incomplete frame: read more
                self._data = self._data[used:]
                frames.append(value)
                if isinstance(value, kind):
                    return frames
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"no {kind.__name__} in {frames}")
            chunk = await asyncio.wait_for(self.reader.read(1 << 16), left)
            if not chunk:
                raise AssertionError(f"closed before {kind.__name__}: {frames}")
            self._data += chunk


def publish(channel: int, routing_key: str, body: bytes, headers: dict | None = None) -> bytes:
    return content_frames(channel, commands.Basic.Publish(exchange="", routing_key=routing_key),
                          commands.Basic.Properties(headers=headers), body, 131_072)
