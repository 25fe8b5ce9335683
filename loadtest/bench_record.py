"""Record codec micro-benchmark: microseconds per message of the store's record encoding and
decoding, for whichever build runs (compiled, or ``TIDEMQ_PURE_PYTHON=1`` interpreted).

    python -m loadtest.bench_record [--messages N] [--repeat R]

Lines (CPU time, best of R repetitions, each over N messages of 64 B):

    record_prepare queues=1 us_per_msg=...   PreparedMessage: encode_static + slots (+ properties)
    record_assemble queues=1 us_per_msg=...  assemble(): one framed record with its offsets and CRC
    record_decode queues=1 us_per_msg=...    RecordView + stored_message over the records read back
    record_properties us_per_msg=...         encode_properties + decode_properties of 3 pairs
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tests.builds import is_compiled, select_from_environment

select_from_environment()  # before store: the build TIDEMQ_PURE_PYTHON selects (tests/builds.py)

from store.log import record as R
from store.write.batching import PreparedMessage
from store.messages import Message
from store.read.reads import stored_message

from loadtest import runner

MAX_SIZE = 4 << 20
PROPS = {"TAGS": "tag-a", "content-type": "application/octet-stream", "x-trace": "0123456789abcdef"}


def best(run: Callable[[], None], messages: int, repeat: int) -> float:
    """CPU microseconds per message of the fastest of ``repeat`` runs (the machine is shared:
    the process's CPU time does not count the time other processes hold the cores)."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return min(times) / messages * 1e6


def queue_cases(nq: int, messages: int, repeat: int) -> list[str]:
    """prepare, assemble and decode of ``messages`` messages of 64 B to ``nq`` queues each."""
    body = os.urandom(64)
    names = [[f"bench/q{i % 1000}", f"bench/other{i % 7}"][:nq] for i in range(messages)]
    msgs = [Message("bench", body) for _ in range(messages)]

    def prepare() -> None:
        for m, q in zip(msgs, names):
            PreparedMessage(m, q, MAX_SIZE)

    prepared = [PreparedMessage(m, q, MAX_SIZE) for m, q in zip(msgs, names)]
    offsets = [[i] * nq for i in range(messages)]
    records: list[bytes] = []

    def assemble() -> None:
        records.clear()
        append = records.append
        asm = R.assemble
        for p, o in zip(prepared, offsets):
            append(asm(p.size, p.static, p.slots, o, p.body, p.born, 1_700_000_000_000, p.flag))

    us_prepare = best(prepare, messages, repeat)
    us_assemble = best(assemble, messages, repeat)
    log = b"".join(records)
    sizes = [len(r) for r in records]

    def decode() -> None:
        at = 0
        for size in sizes:
            stored_message(R.RecordView(log, at), "0A000001", at, "bench/q0", 0, 0)
            at += size

    us_decode = best(decode, messages, repeat)
    return [f"record_prepare queues={nq} us_per_msg={us_prepare:.3f}",
            f"record_assemble queues={nq} us_per_msg={us_assemble:.3f}",
            f"record_decode queues={nq} us_per_msg={us_decode:.3f}"]


def cases(messages: int, repeat: int) -> list[str]:
    lines = queue_cases(1, messages, repeat) + queue_cases(2, messages, repeat)

    def properties() -> None:
        for _ in range(messages):
            R.decode_properties(R.encode_properties(PROPS))

    lines.append(f"record_properties us_per_msg={best(properties, messages, repeat):.3f}")
    return lines


def main() -> None:
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    build = "compiled" if is_compiled(R) else "interpreted"
    for line in cases(args.messages, args.repeat):
        print(f"{line} build={build}", flush=True)


if __name__ == "__main__":
    main()
