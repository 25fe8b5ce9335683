"""The AMQP load generator's frame scanner (``loadtest.clients.amqp_wire.Conn.scan``) reads the send-time
stamp of every delivery (bench_amqp's latency scenario) however reads split the stream: the
one-step path (deliver, header and body complete in the buffer) and the frame-by-frame path
must both count each message once, with its latency, and find the duplicates."""

import itertools
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from loadtest.clients.amqp_wire import Conn
from loadtest.clients.stamps import PAYLOAD_SIZE, STAMP, StampLog

NOW_NS = 10**12
# (channel, publisher, sequence, sent ns); small sequence ranges make duplicates
delivery = st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 40), st.integers(0, 10**9))


def encoded(deliveries: list[tuple[int, int, int, int]], confirms: list[bool]) -> bytes:
    out = bytearray()
    for tag, (channel, publisher, seq, sent_ns) in enumerate(deliveries, 1):
        body = STAMP.pack(publisher, seq, sent_ns).ljust(PAYLOAD_SIZE, b"\x07")
        out += pframe.marshal(commands.Basic.Deliver(consumer_tag="ctag-1", delivery_tag=tag, exchange="",
                                                     routing_key="bench.latency"), channel)
        out += pframe.marshal(ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=2)), channel)
        out += pframe.marshal(ContentBody(body), channel)
        if tag - 1 < len(confirms):  # a publisher confirm in between, as on a shared connection
            out += pframe.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=confirms[tag - 1]), 1)
    return bytes(out)


@contextmanager
def scanner() -> Iterator[Conn]:
    """A Conn to a 127.0.0.1 listener that never answers, past a handshake it does not do: only
    its scanner is used."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with patch.object(Conn, "_handshake", lambda self, product: None):
            conn = Conn(listener.getsockname()[1], 1.0)
        try:
            yield conn
        finally:
            conn.sock.close()


@given(st.data())
def test_reads_every_stamp_once_however_reads_split_the_stream(data: st.DataObject) -> None:
    deliveries = data.draw(st.lists(delivery, min_size=1, max_size=30))
    stream = encoded(deliveries, data.draw(st.lists(st.booleans(), max_size=10)))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=8))))
    with scanner() as c:
        c.stamps = StampLog()
        got = 0
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            c.inbuf += stream[start:end]
            got += c.scan(NOW_NS)
    seen = Counter((publisher, seq) for _, publisher, seq, _ in deliveries)
    assert got == c.delivered == c.stamps.received == len(deliveries)
    assert c.stamps.duplicates == sum(n - 1 for n in seen.values())
    assert sorted(c.stamps.latencies) == sorted(NOW_NS - sent for *_, sent in deliveries)
    assert not c.inbuf


@given(st.lists(st.integers(1, 60), min_size=1, max_size=8), st.sampled_from([0, 1, 25]))
def test_acks_cover_each_delivery_once_in_the_pattern_asked(reads: list[int], every: int) -> None:
    """``Conn.acks``: per read (one multiple ack), per delivery, or a multiple ack every N."""
    with scanner() as c:
        acked: list[tuple[int, bool]] = []
        received = 0
        for count in reads:
            received += count
            c.last_tag[1] = received
            out = c.acks(every)
            for pos in range(0, len(out), 21):  # a basic.ack frame is 21 bytes
                _, _, method = pframe.unmarshal(out[pos:pos + 21])
                acked.append((method.delivery_tag, method.multiple))
        if every == 1:
            assert acked == [(tag, False) for tag in range(1, received + 1)]
        elif every == 0:
            assert [tag for tag, _ in acked] == list(itertools.accumulate(reads)) and all(m for _, m in acked)
        else:
            assert acked == [(tag, True) for tag in range(every, received + 1, every)]
