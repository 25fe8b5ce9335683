"""Rules at work: events per second one rule delivers from a backlog of matched events, to a local
aiohttp webhook (its own process, keep-alive; an event a request, and in the opt-in batched
mode, up to 100 a request) and to a TideMQ topic (republished through the MQTT publish path),
with what was lost and what came out of order.

    python -m loadtest.bench_rules_targets [--events N] [--out FILE]

The events (JSON, numbered) are stored while the rule is paused, then it is resumed and timed
(wall clock) until it has delivered them all. Lines:

    rules scenario=webhook events_per_s=... lost=... out_of_order=... events=...
    rules scenario=webhook_batched events_per_s=... lost=... out_of_order=... events=...
    rules scenario=topic events_per_s=... lost=... out_of_order=... events=...
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.server import Gateway
from loadtest import runner
from protocols.mqtt.packets import Publish

SLICE = 1000  # events stored per publish call


def serve_webhook(port_out: Any) -> None:
    """The webhook's process: counts the events, the distinct ones and those out of order."""
    from aiohttp import web

    seen: set[int] = set()
    state = {"last": -1, "out_of_order": 0, "count": 0}

    def take(n: int) -> None:
        state["count"] += 1
        if n < state["last"] and n not in seen:
            state["out_of_order"] += 1
        state["last"] = max(state["last"], n)
        seen.add(n)

    async def events(request: web.Request) -> web.Response:
        document = json.loads(await request.read())
        if request.content_type == "application/cloudevents-batch+json":
            for event in document:
                take(event["data"]["n"])
        else:
            take(document["n"])
        return web.Response(status=204)

    async def reset(request: web.Request) -> web.Response:
        seen.clear()
        state.update(last=-1, out_of_order=0, count=0)
        return web.json_response({})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**state, "distinct": len(seen)})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/events", events)
        app.router.add_get("/stats", stats)
        app.router.add_post("/reset", reset)
        app_runner = web.AppRunner(app, access_log=None)
        await app_runner.setup()
        site = web.TCPSite(app_runner, "127.0.0.1", 0)
        await site.start()
        port_out.put(app_runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def backlog(gw: Gateway, events: int) -> None:
    assert gw.mqtt is not None
    for start in range(0, events, SLICE):
        await gw.mqtt.publish([Publish("bench/rules", json.dumps({"n": n}).encode(), 1, False)
                               for n in range(start, min(start + SLICE, events))], "bench")


async def timed(gw: Gateway, name: str, events: int) -> float:
    """Resume the paused rule; seconds until it delivered every event."""
    assert gw.rules is not None
    engine = gw.rules.engine
    started = time.perf_counter()
    await engine.set_paused(name, False)
    while engine.get(name)["delivered"] < events:  # type: ignore[index]
        await asyncio.sleep(0.01)
    return time.perf_counter() - started


async def run(events: int, lines: runner.Lines) -> None:
    ports: Any = multiprocessing.Queue()
    hook = multiprocessing.Process(target=serve_webhook, args=(ports,), daemon=True)
    hook.start()
    url = f"http://127.0.0.1:{ports.get(timeout=30)}"
    try:
        with tempfile.TemporaryDirectory() as data:
            gw = Gateway(Config(data_dir=Path(data), mqtt_bind="127.0.0.1:0", amqp_bind="", remoting_bind="",
                                metrics_bind=""))
            await gw.start()
            try:
                assert gw.rules is not None and gw.store is not None
                engine = gw.rules.engine
                await engine.create("webhook", {"sources": ["bench/#"], "paused": True,
                                                "targets": [{"type": "webhook", "url": url + "/events"}]})
                await engine.create("webhook_batched", {
                    "sources": ["bench/#"], "paused": True,
                    "targets": [{"type": "webhook", "url": url + "/events", "mode": "batched", "batch_size": 100}]})
                await engine.create("topic", {"sources": ["bench/#"], "paused": True,
                                              "targets": [{"type": "topic", "topic": "out/all"}]})
                await backlog(gw, events)
                seconds = await timed(gw, "webhook", events)
                stats = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(url + "/stats").read()))
                lines.emit(f"rules scenario=webhook events_per_s={events / seconds:.0f} "
                           f"lost={events - stats['distinct']} out_of_order={stats['out_of_order']} events={events}")
                await asyncio.to_thread(lambda: urllib.request.urlopen(url + "/reset", data=b"").read())
                seconds = await timed(gw, "webhook_batched", events)
                stats = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(url + "/stats").read()))
                lines.emit(f"rules scenario=webhook_batched events_per_s={events / seconds:.0f} "
                           f"lost={events - stats['distinct']} out_of_order={stats['out_of_order']} events={events}")
                seconds = await timed(gw, "topic", events)
                got = []
                offset = 0
                while True:
                    result = gw.store.get_now("t:out/all", offset, 1000)
                    if not result.messages:
                        break
                    got += [json.loads(m.body)["n"] for m in result.messages]
                    offset = result.next_offset
                out_of_order = sum(1 for a, b in zip(got, got[1:]) if b < a)
                lines.emit(f"rules scenario=topic events_per_s={events / seconds:.0f} "
                           f"lost={events - len(set(got))} out_of_order={out_of_order} events={events}")
            finally:
                await gw.stop()
    finally:
        hook.kill()
        hook.join()


def main() -> None:
    parser = runner.parser(__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    with runner.Lines(args.out) as lines:
        asyncio.run(run(args.events, lines))


if __name__ == "__main__":
    main()
