"""The live-listener fuzz harness shared by the MQTT and AMQP fuzz tests: a gateway process with
one listener and its log in a file, connections that send bytes in random chunks and read what
comes back, frame mutations, and the checks that the process survived and logged no error."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .crash_support import ROOT, free_port, stop

READ_S = 0.05  # how long a connection waits for more of the server's answer


def mutate(rng: random.Random, data: bytes) -> bytes:
    """``data`` with a few bytes set, inserted, deleted, repeated, or the rest cut."""
    wire = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(wire) + 1)
        action = rng.choice(("set", "insert", "delete", "cut", "repeat"))
        if action == "set" and at < len(wire):
            wire[at] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif action == "insert":
            wire[at:at] = rng.randbytes(rng.randint(1, 8))
        elif action == "delete" and at < len(wire):
            del wire[at:at + rng.randint(1, 4)]
        elif action == "cut":
            del wire[at:]
        elif action == "repeat":
            wire[at:at] = wire[:at][-16:]
    return bytes(wire)


def send_and_drain(port: int, data: bytes, rng: random.Random) -> None:
    """One connection: ``data`` in chunks of a random size, then whatever the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            step = rng.choice((1, 7, 64, 4096))
            for at in range(0, len(data), step):
                sock.sendall(data[at:at + step])
            sock.settimeout(READ_S)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass  # the server waits for more, or closed the connection: both are answers


@contextlib.contextmanager
def fuzzed_gateway(tmp_path: Path, protocol: str) -> Iterator[tuple[int, Callable[[], None]]]:
    """A gateway process listening for ``protocol`` (mqtt or amqp) only: yields its port and a
    check that it is still alive; at the end, stops it and fails on any error it logged."""
    port = free_port()
    binds = {name: "" for name in ("mqtt", "amqp", "remoting")} | {protocol: f"127.0.0.1:{port}"}
    log = tmp_path / "gateway.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"),
                                 *(arg for name, bind in binds.items() for arg in (f"--{name}-bind", bind)),
                                 "--flush", "async"], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=dict(os.environ))

    def alive() -> None:
        assert proc.poll() is None, f"the gateway died (status {proc.returncode}): {log.read_text()[-2000:]}"

    try:
        deadline = time.monotonic() + 30
        while "gateway ready" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        yield port, alive
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text and "level=error" not in text, text[-3000:]
