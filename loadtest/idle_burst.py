"""Idle MQTT connections as an outside generator measures them: a ``python -m gateway serve``
process on its defaults (MQTT only), N clients whose handshakes all start at once (asyncio, raw
CONNECT with keep alive 600, then nothing), and the process's RSS read from outside before and
2 s after the last CONNACK. A diagnostic beside ``loadtest.idle_memory`` (which runs the gateway
in its own process, 24 handshakes at a time).

    python -m loadtest.idle_burst [--connections 10000] [--version 4|5] [--concurrency N]
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from loadtest import runner
from loadtest.brokers import free_port
from protocols.mqtt.packets import Connect
from protocols.mqtt.writer import encode

ROOT = Path(__file__).resolve().parent.parent


async def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def measure(n: int, version: int, concurrency: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--data-dir", data_dir, "--mqtt-bind", f"127.0.0.1:{port}",
             "--amqp-bind", "", "--remoting-bind", "", "--metrics-bind", ""],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        writers: list[asyncio.StreamWriter] = []
        try:
            await _wait_listening(port)
            await asyncio.sleep(1.0)
            process = psutil.Process(gateway.pid)
            before = process.memory_info().rss
            gate = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with gate:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writers.append(writer)
                    writer.write(encode(Connect(f"idle-{i}", version=version, clean_start=True, keep_alive=600), version))
                    head = await reader.readexactly(2)
                    await reader.readexactly(head[1])  # (CONNACK: short, one length byte)

            started = time.monotonic()
            await asyncio.gather(*(one(i) for i in range(n)))
            connected_s = time.monotonic() - started
            await asyncio.sleep(2.0)
            after = process.memory_info().rss
            return (f"idle_burst version={version} connections={n} concurrency={concurrency} "
                    f"connect_s={connected_s:.1f} rss_kib_per_conn={(after - before) / 1024 / n:.2f}")
        finally:
            for writer in writers:
                writer.close()
            gateway.kill()
            gateway.wait()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def main() -> None:
    ap = runner.parser(__doc__, out=False)
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--version", type=int, choices=(4, 5), default=4, help="MQTT 3.1.1 (4) or 5.0 (5)")
    ap.add_argument("--concurrency", type=int, default=0, help="handshakes at a time (0: all at once)")
    args = ap.parse_args()
    print(asyncio.run(measure(args.connections, args.version, args.concurrency or args.connections)), flush=True)


if __name__ == "__main__":
    main()
