"""Where an idle connection's bytes go: a gateway started in this process, N idle clients
opened by a child process (raw sockets: CONNECT with keep alive 600, then nothing), and the
gateway's growth measured twice -- RSS in one run, and in a run under tracemalloc the Python
allocations per allocation site and the live objects per type. A diagnostic, not a test.

    python -m loadtest.idle_memory [--protocol mqtt|amqp|remoting|bare] [--connections 2000]
                                   [--tracemalloc] [--top 25] [--full] [--subscribe] [--persistent]
                                   [--loop asyncio|uvloop] [--at-once]
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc
from collections import Counter
from pathlib import Path

import psutil

from gateway.config import Config
from gateway.server import Gateway, tune_gc

from loadtest import runner

# The child: opens the connections, says how many, holds them until its stdin closes.
_CLIENTS = {
    "mqtt": """
        from loadtest.clients.mqtt_wire import open_sessions
        s = open_sessions(PORT, [f"idle-{i}" for i in range(N)], keep_alive=600, timeout_s=120, subscribe=SUB,
                          clean=FRESH, concurrency=PARALLEL)
        socks = s.sockets
    """,
    "amqp": """
        from loadtest.clients.amqp_wire import Conn
        socks = []
        for i in range(N):
            c = Conn(PORT, 30.0)
            c.open_channel(1)
            socks.append(c)
    """,
    "remoting": """
        import socket
        socks = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(N)]
    """,
}
# the floor: asyncio's own transport under a protocol that keeps nothing (no gateway)
_CLIENTS["bare"] = _CLIENTS["remoting"]


def _child(protocol: str, port: int, n: int, subscribe: bool, persistent: bool = False,
           at_once: bool = False) -> subprocess.Popen:
    body = textwrap.dedent(_CLIENTS[protocol]).replace("PORT", str(port)).replace("N", str(n))
    body = body.replace("SUB", repr(("idle/commands", 1) if subscribe else None)).replace("FRESH", repr(not persistent))
    body = body.replace("PARALLEL", str(n if at_once else 24))
    code = body + "\nimport sys\nprint(len(socks), flush=True)\nsys.stdin.read()\n"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)


def _types() -> Counter:
    """Live GC-tracked objects per type name, with their shallow sizes (and their __dict__s')."""
    sizes: Counter = Counter()
    for o in gc.get_objects():
        name = type(o).__qualname__
        sizes[name, "count"] += 1
        sizes[name, "bytes"] += sys.getsizeof(o)
    return sizes


async def measure(protocol: str, n: int, trace: bool, top: int, full: bool = False, subscribe: bool = False,
                  persistent: bool = False, at_once: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        binds = {"mqtt_bind": "", "amqp_bind": "", "remoting_bind": ""}
        if protocol != "bare":
            binds[f"{protocol}_bind"] = "127.0.0.1:0"
        gw = Gateway(Config(data_dir=Path(tmp) / "data", **binds))  # type: ignore[arg-type]
        await gw.start()
        bare = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        tune_gc()
        try:
            port = bare.sockets[0].getsockname()[1] if protocol == "bare" else \
                next(lst.address[1] for lst in gw.listeners if lst.protocol == protocol)
            proc = psutil.Process()
            await asyncio.sleep(0.5)
            gc.collect()
            rss0 = proc.memory_info().rss
            if trace:  # (the types after the first snapshot, whose traces are tuples; before the second)
                tracemalloc.start(8)
                snap0 = tracemalloc.take_snapshot()
                types0 = _types()
            child = _child(protocol, port, n, subscribe, persistent, at_once)
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)  # type: ignore[union-attr]
            opened = int(line or 0)
            await asyncio.sleep(1.0)  # what the gateway allocates after CONNACK
            gc.collect()
            rss1 = proc.memory_info().rss
            print(f"protocol={protocol} connections={n} opened={opened}{' persistent' if persistent else ''}"
                  f"{' at_once' if at_once else ''} "
                  f"rss_kib_per_conn={(rss1 - rss0) / 1024 / max(opened, 1):.2f}"
                  + (" (under tracemalloc)" if trace else ""))
            if trace:
                types1 = _types()
                snap1 = tracemalloc.take_snapshot()
                tracemalloc.stop()
                _report(snap0, snap1, types0, types1, max(opened, 1), top, full)
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(30)
            await asyncio.sleep(0.5)
        finally:
            bare.close()
            await gw.stop()


def _report(snap0: tracemalloc.Snapshot, snap1: tracemalloc.Snapshot, types0: Counter, types1: Counter,
            n: int, top: int, full: bool) -> None:
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    snap0, snap1 = snap0.filter_traces(filters), snap1.filter_traces(filters)
    total = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    print(f"tracemalloc_bytes_per_conn={total / n:.0f}")
    print("-- by allocation site (bytes per connection) --")
    for stat in snap1.compare_to(snap0, "traceback")[:top]:
        if stat.size_diff / n < 4:
            break
        frames = [f"{_short(f.filename)}:{f.lineno}" for f in reversed(stat.traceback)]
        depth = len(frames) if full else 3
        where = frames[0] + (" <- " + " <- ".join(frames[1:depth]) if full or frames[0].startswith("asyncio/") else "")
        print(f"{stat.size_diff / n:8.0f} {stat.count_diff / n:6.2f}  {where}")
    print("-- live objects by type (per connection: count, shallow bytes) --")
    diff = Counter()
    for key in set(types1) | set(types0):
        diff[key] = types1[key] - types0[key]
    names = sorted({name for name, _ in diff}, key=lambda name: -diff[name, "bytes"])
    for name in names[:top]:
        if diff[name, "bytes"] / n < 4:
            break
        print(f"{diff[name, 'bytes'] / n:8.0f} {diff[name, 'count'] / n:6.2f}  {name}")


def _short(filename: str) -> str:
    root = str(Path(__file__).resolve().parent.parent) + "/"
    for marker in ("/site-packages/", "/lib/python3.11/", root):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def main() -> None:
    ap = runner.parser(__doc__, out=False)
    ap.add_argument("--protocol", choices=sorted(_CLIENTS), default="mqtt")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--full", action="store_true", help="the whole stack of each allocation site")
    ap.add_argument("--subscribe", action="store_true", help="mqtt: each client subscribes (QoS 1) after CONNACK")
    ap.add_argument("--persistent", action="store_true", help="mqtt: persistent sessions (clean session 0)")
    ap.add_argument("--at-once", action="store_true",
                    help="mqtt: every handshake started at once (as a generator opening N connections does), "
                         "not 24 at a time")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                    help="uvloop: its transports are C objects, and libuv's memory is not traced")
    args = ap.parse_args()
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as loop_runner:
        loop_runner.run(measure(args.protocol, args.connections, args.tracemalloc, args.top, args.full, args.subscribe,
                                args.persistent, args.at_once))


if __name__ == "__main__":
    main()
