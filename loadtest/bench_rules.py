"""Event pattern matching: events per second of one core matching decoded telemetry events (the
CloudEvent view rules see, bridge/rules/events.py) against 100 rules of mixed operators, through
the indexed ``PatternSet`` and, for comparison, by testing every compiled pattern in turn.

    python -m loadtest.bench_rules [--events N] [--pool P] [--repeat R] [--rules K]

Lines (CPU time of this process, best of R passes of N events cycling through P distinct ones:
an engine matches an event just after decoding it, while it is in the CPU's cache; a list of
50,000 prebuilt events would measure memory misses rather than matching):

    rules scenario=match rules=100 events_per_s=... matches_per_event=...
    rules scenario=decode_and_match rules=100 events_per_s=...   json.loads of the payload too
    rules scenario=match_unindexed rules=100 events_per_s=...    every pattern tested in turn
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from bridge.rules import PatternSet, compile_pattern
from loadtest import runner

SITES = ["berlin", "Lyon", "osaka", "Austin", "porto", "Nairobi", "lima", "Perth"]
STATUSES = ["ok", "ok", "ok", "ok", "degraded", "fault", "maintenance"]
DEVICES = 500


def telemetry(i: int, rng: random.Random) -> dict[str, Any]:
    """One event as a rule sees it: CloudEvent attributes, the extensions, the MQTT user
    properties and the JSON payload of a device's reading."""
    device = f"dev-{rng.randrange(DEVICES):04d}"
    line = f"line{rng.randrange(12)}"
    topic = f"factory/{line}/{device}/telemetry"
    return {
        "specversion": "1.0", "id": f"0A0000010000{i:016X}", "source": f"/mqtt/clients/{device}",
        "type": "tidemq.mqtt.message", "time": "2026-11-29T10:00:00.000Z", "subject": topic,
        "datacontenttype": "application/json", "protocol": "mqtt", "topic": topic, "clientid": device,
        "qos": 1, "topiclevels": topic.split("/"),
        "properties": {"site": rng.choice(SITES), "fw": f"1.{rng.randrange(6)}.{rng.randrange(10)}"},
        "data": {
            "device": device, "seq": i, "temp": round(rng.gauss(24, 8), 2), "humidity": rng.randrange(10, 95),
            "battery": rng.randrange(0, 101), "status": rng.choice(STATUSES),
            "ip": f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(256)}",
            "location": {"lat": round(rng.uniform(-60, 60), 4), "lon": round(rng.uniform(-170, 170), 4)},
            "alarms": rng.sample(["overheat", "door", "vibration", "power"], rng.randrange(0, 3)),
        },
    }


def mixed_rules(count: int, rng: random.Random) -> dict[str, dict[str, Any]]:
    """``count`` rules cycling through the operators, each with its own values, as a fleet's
    rules look: per device and per line, thresholds, site and firmware filters, address
    blocks, absent fields, $or."""
    def device() -> str:
        return f"dev-{rng.randrange(DEVICES):04d}"

    makers: list[Callable[[int], dict[str, Any]]] = [
        lambda k: {"data": {"device": [device()], "temp": [{"numeric": [">", rng.randrange(20, 35)]}]}},
        lambda k: {"subject": [{"prefix": f"factory/line{rng.randrange(12)}/"}], "data": {"status": ["fault"]}},
        lambda k: {"data": {"temp": [{"numeric": [">=", rng.randrange(35, 45), "<", 60]}]}},
        lambda k: {"data": {"battery": [{"numeric": ["<", rng.randrange(2, 15)]}],
                            "status": [{"anything-but": ["ok"]}]}},
        lambda k: {"topic": [{"wildcard": f"factory/line{rng.randrange(12)}/*/telemetry"}],
                   "data": {"humidity": [{"numeric": [">", rng.randrange(85, 95)]}]}},
        lambda k: {"properties": {"site": [{"equals-ignore-case": rng.choice(SITES).upper()}]},
                   "data": {"alarms": [rng.choice(["overheat", "door", "vibration"])]}},
        lambda k: {"data": {"ip": [{"cidr": f"10.{rng.randrange(4)}.{rng.randrange(256)}.0/24"}]}},
        lambda k: {"data": {"status": [{"anything-but": {"prefix": "o"}}], "device": [{"suffix": f"{k % 100:02d}"}]}},
        lambda k: {"type": ["tidemq.mqtt.message"], "properties": {"fw": [{"prefix": f"1.{rng.randrange(6)}."}]},
                   "data": {"location": {"lat": [{"numeric": [">", rng.randrange(40, 58)]}]}}},
        lambda k: {"$or": [{"data": {"temp": [{"numeric": ["<", rng.randrange(-10, 5)]}]}},
                           {"data": {"alarms": ["power"], "battery": [{"numeric": ["<", rng.randrange(5, 20)]}]}}]},
        lambda k: {"clientid": [device()], "data": {"error": [{"exists": False}]}},
        lambda k: {"source": [{"prefix": {"equals-ignore-case": f"/MQTT/CLIENTS/DEV-00{rng.randrange(10)}"}}]},
    ]
    return {f"rule-{k:03d}": makers[k % len(makers)](k) for k in range(count)}


def best_rate(run: Callable[[], None], events: int, repeat: int) -> float:
    """Events per CPU second of the fastest of ``repeat`` passes (the machine is shared)."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return events / min(times)


def main() -> None:
    parser = runner.parser(__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--pool", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rules", type=int, default=100)
    args = parser.parse_args()
    rng = random.Random(33)
    pool = [telemetry(i, rng) for i in range(args.pool)]
    events = [pool[i % len(pool)] for i in range(args.events)]
    payloads = [json.dumps(e["data"]).encode() for e in pool]
    rules = mixed_rules(args.rules, rng)
    patterns = PatternSet(rules)
    compiled = [(name, compile_pattern(rule).matches) for name, rule in rules.items()]

    indexed = [patterns.match(e) for e in pool]
    if indexed != [[name for name, matches in compiled if matches(e)] for e in pool]:
        raise SystemExit("rules: the indexed PatternSet and the patterns one by one disagree")
    matched = sum(len(m) for m in indexed) / len(pool)
    match = patterns.match

    def run_indexed() -> None:
        for e in events:
            match(e)

    def run_decoded() -> None:
        loads = json.loads
        for i, e in enumerate(events):
            view = dict(e)
            view["data"] = loads(payloads[i % len(payloads)])
            match(view)

    few = events[:len(events) // 10]

    def run_each() -> None:
        for e in few:
            for _, matches in compiled:
                matches(e)

    with runner.Lines(args.out) as lines:
        rate = best_rate(run_indexed, len(events), args.repeat)
        lines.emit(f"rules scenario=match rules={len(rules)} events_per_s={rate:.0f} matches_per_event={matched:.2f}")
        rate = best_rate(run_decoded, len(events), args.repeat)
        lines.emit(f"rules scenario=decode_and_match rules={len(rules)} events_per_s={rate:.0f}")
        rate = best_rate(run_each, len(few), 1)
        lines.emit(f"rules scenario=match_unindexed rules={len(rules)} events_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
