"""Per-stage CPU cost of TideMQ's message path: py-spy samples of the gateway folded into stages.

    python -m loadtest.profile_stages [--profiles mqtt_fanin,amqp_confirm] [--seconds 8] [--rate 200]
                                      [--keep-raw DIR] [--detail N]
    python -m loadtest.profile_stages --fold FILE.raw --profile mqtt_fanin --us-per-msg 17.5 [--detail N]

For each profile, a fresh TideMQ (``loadtest.brokers``, as the benchmarks start it) runs the
benchmark's own scenario twice: once plain, for the broker's CPU microseconds per message
(``broker_cpu_us_per_msg`` of its line, see ``loadtest.harness.CpuSampler.us_per_msg``), and
once with ``py-spy record -f raw`` attached (py-spy pauses the process at each sample, which
costs throughput but not the shares). Profiles:

- mqtt_fanin: bench_mqtt's fan-in at QoS 1 (8 publishers -> 1 subscriber of bench/fanin/+,
  ``--flush async``).
- amqp_confirm: bench_amqp's publish_confirm (4 confirming publishers into one durable queue,
  ``--flush sync``).

Each sampled stack lands in exactly one stage: the innermost frame that a rule of the profile's
ordered table matches decides (rules are tried in order on each frame, from the leaf outwards);
a frame no rule matches (helpers, packets, the standard library) passes its sample on to its
caller; a stack nothing matches is "event loop/other". Stacks whose leaf is a thread-pool worker
waiting for work are not CPU (py-spy sometimes samples them as active) and are left out.
A stage's CPU us/msg is the plain run's us/msg times its share of the samples. The table is
Markdown, for BENCHMARKS.md; ``--detail N`` adds each stage's N heaviest deciding frames.

The stages (the rule tables below say exactly which files and functions):
- inbound decode: socket reads, protocols/mqtt's reader and sans-IO connection state machine
  (PUBLISHes in, PUBACKs out to the publishers, the subscriber's PUBACKs in); AMQP: the frame
  reader (compiled: counted in ``AMQPConnection._process_until_error``, which iterates it) and
  pamqp's decoding.
- inbound handling: gateway/mqtt's connection dispatch, inbound and message building, the
  ingest pipeline; AMQP: gateway/amqp (routing, to_store_message).
- store commit: store.put*, the committer (record assembly), commitlog append, dispatch and
  the consume-queue index write.
- delivery read: the queue cache, the cursor and the store's reads (index entries, records).
- delivery encode+write: gateway/mqtt's outbound (including settling the subscriber's PUBACK),
  protocols/mqtt's writer, the socket writes; AMQP publish: the confirm (basic.ack).
- event loop/other: asyncio's loop and everything no rule claims.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from loadtest import bench_mqtt, runner
from loadtest.brokers import Broker, raise_fd_limit, start_amqp_broker, start_broker
from loadtest.scenarios import amqp_scenarios

DECODE = "inbound decode"
INBOUND = "inbound handling"
COMMIT = "store commit"
READ = "delivery read"
ENCODE = "delivery encode+write"
CONFIRM = "confirm encode+write"
OTHER = "event loop/other"
PASS = ""  # a rule of this "stage" passes the frame's sample on to its caller


@dataclass(frozen=True, slots=True)
class Rule:
    """A frame whose file (as py-spy prints it: relative to its sys.path entry) matches ``path``
    and whose function (``Class.method``) matches ``func`` (None: any) belongs to ``stage``."""

    stage: str
    path: re.Pattern[str]
    func: re.Pattern[str] | None = None

    def matches(self, path: str, func: str) -> bool:
        return bool(self.path.search(path)) and (self.func is None or bool(self.func.search(func)))


def rule(stage: str, path: str, func: str | None = None) -> Rule:
    return Rule(stage, re.compile(path), re.compile(func) if func else None)


# The store's rules, for every profile. The read side first: store/store.py, store/log/commitlog.py,
# store/log/record.py and store/index/consumequeue.py serve both the put and the read path, told apart by function;
# what neither names (a queue lookup, say) passes on to its caller.
STORE_RULES = (
    rule(READ, r"^store/store\.py$", r"\.(_?get_now|_get_filtered|read_at|max_offset_now|min_offset_now|_min_offset)$"),
    rule(COMMIT, r"^store/store\.py$", r"\.(put_\w+|_submit)"),
    rule(READ, r"^store/read/(reads|readonly)\.py$"),
    rule(READ, r"^store/log/commitlog\.py$", r"\.(read|records)$"),
    rule(READ, r"^store/log/record\.py$", r"RecordView|decode_|peek_size"),
    rule(READ, r"^store/index/consumequeue\.py$", r"\.(entries|entry|first_offset\w*|_bisect)$"),
    rule(COMMIT, r"^store/index/consumequeue\.py$", r"\.(commit|new_batch|resolve|flush|trim_cache)$"),
    rule(COMMIT, r"^store/(write/(committer|durable|fsync_loop)|log/(commitlog|record|msgid)"
                 r"|index/(dispatcher|notify|keyindex)|rocks)\.py$"),
    rule(READ, r"^cache/"),
    rule(READ, r"^gateway/core/cursor\.py$"),
)

# Socket reads are the inbound side's; a write counts in the stage that makes it (its caller),
# except what the event loop finishes later when the socket buffer was full.
LOOP_RULES = (
    rule(DECODE, r"^(asyncio/selector_events|gateway/lean_tcp)\.py$", r"_read_ready"),
)

MQTT_RULES = (
    *STORE_RULES,
    rule(ENCODE, r"^gateway/mqtt/messages\.py$", r"^Delivery"),
    rule(INBOUND, r"^gateway/mqtt/messages\.py$"),
    rule(ENCODE, r"^gateway/mqtt/(outbound|push)\.py$"),
    rule(ENCODE, r"^protocols/mqtt/writer\.py$"),
    # the sans-IO connection's outbound half: packet ids, aliases, the send window, encoding
    rule(ENCODE, r"^protocols/mqtt/connection\.py$", r"\.(send|alias_out|alias_unsent|window|refusal)$"),
    rule(DECODE, r"^protocols/mqtt/(reader|codec|connection)\.py$"),
    # the connection's output (held back by the write-ahead rule in session_saves.py): the
    # stage that wrote, inbound's PUBACKs or the deliveries, is further out
    rule(PASS, r"^gateway/mqtt/(connection|session_saves)\.py$", r"\.(flush|write_now|send|send_packet|write)$"),
    rule(INBOUND, r"^gateway/mqtt/(inbound|ingest_gate|connection)\.py$"),
    rule(INBOUND, r"^gateway/core/ingest\.py$"),
    *LOOP_RULES,
    rule(ENCODE, r"^(asyncio/selector_events|gateway/lean_tcp)\.py$", r"_write_ready"),
)

AMQP_RULES = (
    *STORE_RULES,
    # the confirm: the put's callback, basic.ack's encoding and its write
    rule(CONFIRM, r"^gateway/amqp/connection\.py$", r"(stored|_publishes_done|\.send|\.flush)($|\.<locals>)"),
    rule(CONFIRM, r"^gateway/amqp/channel\.py$", r"\.confirm"),
    rule(CONFIRM, r"^protocols/amqp/frames\.py$", r"^method_frame$"),
    # pamqp encodes for the confirm and for the store (to_store_message re-encodes the
    # properties): its caller says which; its decoding is the inbound's
    rule(PASS, r"^pamqp/", r"(^|\.)(marshal|_marshal\w*|encode\w*)$"),
    rule(PASS, r"^pamqp/encode\.py$"),
    rule(PASS, r"^protocols/amqp/frames\.py$", r"^encode_properties$"),
    rule(DECODE, r"^pamqp/"),
    rule(DECODE, r"^protocols/amqp/(frames|reader|pamqp_guards)\.py$"),
    # the compiled reader (protocols/amqp/reader.py) has no Python frames: py-spy counts its
    # samples in the frame that iterates its events, which does little else itself
    rule(DECODE, r"^gateway/amqp/connection\.py$", r"\._process_until_error$"),
    rule(INBOUND, r"^gateway/amqp/"),
    rule(INBOUND, r"^gateway/core/ingest\.py$"),
    *LOOP_RULES,
    rule(CONFIRM, r"^(asyncio/selector_events|gateway/lean_tcp)\.py$", r"_write_ready"),
)

# A delivery out of a queue: taking messages (cursor, cache, store reads), framing basic.deliver
# and its content and writing them, and settling the consumer's acks (decoding them, the
# unacked bookkeeping, the committed offset).
SETTLE = "ack settle"
AMQP_DELIVERY_RULES = (
    rule(SETTLE, r"^store/store\.py$", r"\.(commit_offset\w*|save_offset\w*)$"),
    *STORE_RULES,
    rule(COMMIT, r"^gateway/amqp/(publishing|inbound|confirms)\.py$"),
    rule(CONFIRM, r"^gateway/amqp/channel\.py$", r"\.confirm"),
    rule(SETTLE, r"^gateway/amqp/channel\.py$", r"\.(_basic_ack|_settle|_tags|_pop_unacked|_basic_nack|_reject)$"),
    rule(SETTLE, r"^gateway/amqp/queues\.py$", r"\.(settle|save)$"),
    rule(SETTLE, r"^gateway/core/(group|delivery_counts)\.py$", r"\.(settled|save|committed|forget)$"),
    rule(READ, r"^gateway/amqp/queues\.py$", r"\.(take|peek|hand_out|_write_mark)$"),
    rule(READ, r"^gateway/amqp/messages\.py$"),
    rule(READ, r"^gateway/amqp/broker\.py$", r"\.view$"),
    rule(ENCODE, r"^gateway/amqp/channel\.py$", r"\.(deliver|can_deliver)$"),
    rule(ENCODE, r"^protocols/amqp/frames\.py$", r"^(deliver_frame|content_after_method|delivery|shortstr)$"),
    rule(ENCODE, r"^gateway/amqp/connection\.py$", r"\.(send|flush)$"),
    rule(ENCODE, r"^gateway/amqp/queues\.py$", r"\.pump$"),
    rule(ENCODE, r"^gateway/core/group\.py$", r"\.next_member$"),
    rule(PASS, r"^pamqp/", r"(^|\.)(marshal|_marshal\w*|encode\w*)$"),
    rule(DECODE, r"^pamqp/"),
    rule(DECODE, r"^protocols/amqp/(frames|reader|pamqp_guards)\.py$"),
    rule(DECODE, r"^gateway/amqp/connection\.py$", r"\._process_until_error$"),
    rule(INBOUND, r"^gateway/amqp/"),
    rule(INBOUND, r"^gateway/core/ingest\.py$"),
    *LOOP_RULES,
    rule(ENCODE, r"^(asyncio/selector_events|gateway/lean_tcp)\.py$", r"_write_ready"),
)

IDLE_LEAVES = (rule("idle", r"^concurrent/futures/thread\.py$", r"^_worker$"),)  # waiting for work

FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    what: str
    stages: tuple[str, ...]
    rules: tuple[Rule, ...]
    # (seconds, attach) -> broker, scenario; a scenario with an untimed set-up (a queue filled
    # first) calls attach() when its measured part starts, else the profiler attaches before it
    run: Callable[[float, Callable[[], None]], tuple[Broker, Callable[[], str]]]
    rate_key: str  # the scenario line's rate field
    other_key: str  # its field of the rest of the machine's CPU (other jobs: a noisy run)
    us_key: str = "broker_cpu_us_per_msg"  # its field of the broker's CPU per message (or delivery)
    attaches_itself: bool = False  # its scenario calls attach() after an untimed set-up


def mqtt_fanin(seconds: float, attach: Callable[[], None]) -> tuple[Broker, Callable[[], str]]:
    broker = start_broker("tidemq")
    plan = replace(bench_mqtt.FULL, fanin_seconds=seconds, drain_s=5.0, handshake_s=10.0)
    return broker, lambda: bench_mqtt.fanin(broker, plan, 1)


def mqtt_fanout(seconds: float, attach: Callable[[], None]) -> tuple[Broker, Callable[[], str]]:
    broker = start_broker("tidemq")
    plan = replace(bench_mqtt.FULL, fanout_seconds=seconds, drain_s=5.0, handshake_s=10.0)
    return broker, lambda: bench_mqtt.fanout(broker, plan)


def amqp_confirm(seconds: float, attach: Callable[[], None]) -> tuple[Broker, Callable[[], str]]:
    broker = start_amqp_broker("tidemq")
    plan = replace(amqp_scenarios.FULL, seconds=seconds, drain_s=5.0, handshake_s=10.0)
    return broker, lambda: amqp_scenarios.publish_confirm(broker, plan)


def amqp_consume(seconds: float, attach: Callable[[], None]) -> tuple[Broker, Callable[[], str]]:
    broker = start_amqp_broker("tidemq")
    plan = replace(amqp_scenarios.FULL, consume_messages=100_000, drain_s=5.0, handshake_s=10.0)
    return broker, lambda: amqp_scenarios.consume(broker, plan, on_filled=attach)


def amqp_fanout(seconds: float, attach: Callable[[], None]) -> tuple[Broker, Callable[[], str]]:
    broker = start_amqp_broker("tidemq")
    plan = replace(amqp_scenarios.FULL, seconds=seconds, drain_s=5.0, handshake_s=10.0)
    return broker, lambda: amqp_scenarios.fanout_topic(broker, plan)


PROFILES = {
    "mqtt_fanin": Profile("mqtt_fanin", "MQTT fan-in QoS 1, 8 publishers -> 1 subscriber, --flush async",
                          (DECODE, INBOUND, COMMIT, READ, ENCODE, OTHER), MQTT_RULES, mqtt_fanin, "msgs_per_s",
                          "other_cpu_pct"),
    "mqtt_fanout": Profile("mqtt_fanout", "MQTT fan-out QoS 1, 1 publisher -> 1,000 subscribers (per delivery)",
                           (DECODE, INBOUND, COMMIT, READ, ENCODE, OTHER), MQTT_RULES, mqtt_fanout,
                           "deliveries_per_s", "other_cpu_pct", "broker_cpu_us_per_delivery"),
    "amqp_confirm": Profile("amqp_confirm", "AMQP publish with confirms, 4 publishers -> 1 durable queue, --flush sync",
                            (DECODE, INBOUND, COMMIT, CONFIRM, OTHER), AMQP_RULES, amqp_confirm, "msgs_per_s",
                            "other_cpu"),
    "amqp_consume": Profile("amqp_consume", "AMQP consume, 100,000 prefilled persistent messages, 1 consumer, "
                            "prefetch 100, manual ack", (DECODE, SETTLE, READ, ENCODE, INBOUND, OTHER),
                            AMQP_DELIVERY_RULES, amqp_consume, "msgs_per_s", "other_cpu", attaches_itself=True),
    "amqp_fanout": Profile("amqp_fanout", "AMQP topic fan-out, 1 confirming publisher -> 100 queues (per delivery)",
                           (DECODE, INBOUND, COMMIT, CONFIRM, SETTLE, READ, ENCODE, OTHER), AMQP_DELIVERY_RULES,
                           amqp_fanout, "deliveries_per_s", "other_cpu", "broker_cpu_us_per_delivery"),
}


# -- folding ---------------------------------------------------------------------------------------
def parse_frame(text: str) -> tuple[str, str]:
    """``func (path:line)`` -> (path, func)."""
    m = FRAME.match(text)
    return (m["path"], m["func"]) if m else ("", text)


def python_leaf(frames: list[tuple[str, str]]) -> tuple[str, str]:
    """The innermost frame of Python code (a ``.py`` file, compiled or not): with ``--native``,
    C frames (libc, the interpreter, a lock wait) follow it."""
    return next((f for f in reversed(frames) if f[0].endswith(".py")), frames[-1])


def classify(frames: list[tuple[str, str]], rules: tuple[Rule, ...]) -> tuple[str, str]:
    """The stage of a stack (root first) and the frame that decided it."""
    for path, func in reversed(frames):
        stage = next((r.stage for r in rules if r.matches(path, func)), PASS)
        if stage != PASS:
            return stage, f"{func} ({path})"
    path, func = frames[-1]
    return OTHER, f"{func} ({path})"


@dataclass(slots=True)
class Folded:
    samples: Counter[str]  # stage -> samples
    deciders: dict[str, Counter[str]]  # stage -> deciding frame -> samples
    idle: int  # left out: not CPU

    @property
    def total(self) -> int:
        return sum(self.samples.values())


def fold(lines: list[str], rules: tuple[Rule, ...]) -> Folded:
    """Fold py-spy's raw output (``frame;frame;... count`` a line, root first) into stages."""
    samples: Counter[str] = Counter()
    deciders: dict[str, Counter[str]] = defaultdict(Counter)
    idle = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [parse_frame(f) for f in stack.split(";")]
        if any(r.matches(*python_leaf(frames)) for r in IDLE_LEAVES):
            idle += int(count)
            continue
        stage, decider = classify(frames, rules)
        samples[stage] += int(count)
        deciders[stage][decider] += int(count)
    return Folded(samples, dict(deciders), idle)


def table(folded: Folded, stages: tuple[str, ...], us_per_msg: float, detail: int = 0) -> list[str]:
    """The Markdown table: per stage, its samples, share and CPU us/msg (share x us_per_msg)."""
    total = max(1, folded.total)
    out = ["| stage | samples | share | CPU us/msg |", "| --- | ---: | ---: | ---: |"]
    for stage in stages:
        n = folded.samples.get(stage, 0)
        out.append(f"| {stage} | {n} | {100 * n / total:.1f} % | {us_per_msg * n / total:.2f} |")
    out.append(f"| total | {folded.total} | 100 % | {us_per_msg:.2f} |")
    for stage in stages if detail else ():
        for frame, n in folded.deciders.get(stage, Counter()).most_common(detail):
            out.append(f"# {stage}: {100 * n / total:.1f} % {frame}")
    return out


# -- running ---------------------------------------------------------------------------------------
def field(line: str, key: str) -> float:
    """A ``key=value`` number of a benchmark line; SystemExit when the line has none (an error line)."""
    m = re.search(rf"(?:^| ){re.escape(key)}=([0-9.]+)", line)
    if m is None:
        raise SystemExit(f"no {key} in the scenario's line: {line}")
    return float(m[1])


def py_spy_path(given: str | None) -> str:
    found = given or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install -e '.[bench]' (or --py-spy PATH)")
    return found


def plain_run(profile: Profile, seconds: float) -> str:
    broker, scenario = profile.run(seconds, lambda: None)
    try:
        return scenario()
    finally:
        broker.stop()


def profiled_run(profile: Profile, seconds: float, py_spy: str, rate: int, raw: Path, native: bool = False) -> str:
    spy: subprocess.Popen[bytes] | None = None

    def attach() -> None:
        nonlocal spy
        if spy is not None:
            return
        spy = subprocess.Popen([py_spy, "record", "-p", str(broker.pid), "-f", "raw", "-o", str(raw),
                                "-r", str(rate), *(["--native"] if native else [])], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attached before the first send
        if spy.poll() is not None:
            raise SystemExit(f"py-spy exited: {spy.stderr.read().decode(errors='replace') if spy.stderr else ''}")

    broker, scenario = profile.run(seconds, attach)
    try:
        if not profile.attaches_itself:
            attach()
        return scenario()
    finally:
        if spy is not None and spy.poll() is None:
            spy.send_signal(signal.SIGINT)  # py-spy writes the file on SIGINT
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        broker.stop()


def profile_once(profile: Profile, args: argparse.Namespace, py_spy: str, raw_dir: Path) -> list[str]:
    plain = plain_run(profile, args.seconds)
    us = field(plain, profile.us_key)
    raw = raw_dir / f"{profile.name}.raw"
    profiled = profiled_run(profile, args.seconds, py_spy, args.rate, raw, args.native)
    folded = fold(raw.read_text().splitlines(), profile.rules)
    head = (f"# profile={profile.name} ({profile.what}) seconds={args.seconds:g}: plain run "
            f"{profile.rate_key}={field(plain, profile.rate_key):.0f} {profile.us_key}={us:.2f} "
            f"other_cpu_pct={field(plain, profile.other_key):.0f}; "
            f"profiled run {profile.rate_key}={field(profiled, profile.rate_key):.0f} "
            f"{profile.us_key}={field(profiled, profile.us_key):.2f} "
            f"other_cpu_pct={field(profiled, profile.other_key):.0f} "
            f"samples={folded.total} idle_left_out={folded.idle} py_spy_rate={args.rate}")
    return [head, *table(folded, profile.stages, us, args.detail)]


def main() -> None:
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, from " + ",".join(PROFILES))
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the publishers send, each run")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true",
                        help="py-spy --native: compiled modules' functions appear as frames of their .py")
    parser.add_argument("--py-spy", help="the py-spy binary (default: on PATH or beside this Python)")
    parser.add_argument("--keep-raw", type=Path, metavar="DIR", help="keep py-spy's raw files here")
    parser.add_argument("--detail", type=int, default=0, metavar="N", help="each stage's N heaviest deciding frames")
    parser.add_argument("--fold", type=Path, metavar="FILE", help="instead: fold an existing raw file")
    parser.add_argument("--profile", choices=tuple(PROFILES), help="with --fold: whose rules")
    parser.add_argument("--us-per-msg", type=float, default=0.0, help="with --fold: the run's broker CPU us/msg")
    args = parser.parse_args()
    if args.fold:
        if not args.profile:
            parser.error("--fold needs --profile")
        profile = PROFILES[args.profile]
        folded = fold(args.fold.read_text().splitlines(), profile.rules)
        print(f"# profile={profile.name} file={args.fold} samples={folded.total} idle_left_out={folded.idle}")
        print("\n".join(table(folded, profile.stages, args.us_per_msg, args.detail)))
        return
    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown or not names:
        parser.error(f"unknown profile(s) {','.join(unknown)} (choose from {','.join(PROFILES)})")
    py_spy = py_spy_path(args.py_spy)
    raise_fd_limit()
    raw_dir = args.keep_raw or Path(tempfile.mkdtemp(prefix="tidemq-profile-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            print("\n".join(profile_once(PROFILES[name], args, py_spy, raw_dir)), flush=True)
    finally:
        if args.keep_raw is None:
            shutil.rmtree(raw_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
