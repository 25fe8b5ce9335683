"""The load generator's subscriber-side counter (``loadtest.clients.mqtt_wire.PublishCounter``) counts
what the project's own codec says is in the stream, however reads split it: deliveries,
duplicates, the PUBACKs owed and the latencies. It has a fast path for runs of PUBLISHes of one
shape and a frame-by-frame path for everything else; both must agree with the codec."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from loadtest.clients.mqtt_wire import PAYLOAD_SIZE, STAMP, PublishCounter
from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.packets import MQTT_3_1_1, PingResp, PubAck, Publish

NOW_NS = 10**12
TOPICS = ("a/b", "bench/cluster/fanout", "t" * 150)  # the last one makes a two-byte remaining length

# Sequence numbers from a small range, so that runs overlap (duplicates), and past the first
# 65,536 the counter's marks start with.
sequence = st.one_of(st.integers(0, 60), st.integers(65_500, 65_600))
message = st.tuples(st.sampled_from(TOPICS), st.sampled_from((0, 1)), st.integers(0, 2), sequence,
                    st.integers(0, 10**9))
item = st.one_of(message, st.just("ping"))


def encoded(items: list) -> bytes:
    out = bytearray()
    packet_id = 0
    for it in items:
        if it == "ping":
            out += encode(PingResp(), MQTT_3_1_1)
            continue
        topic, qos, publisher, seq, sent_ns = it
        payload = STAMP.pack(publisher, seq, sent_ns).ljust(PAYLOAD_SIZE, b"\0")
        packet_id = packet_id % 65535 + 1
        out += encode(Publish(topic, payload, qos=qos, packet_id=packet_id if qos else None), MQTT_3_1_1)
    return bytes(out)


def expected(stream: bytes) -> tuple[int, int, bytes, list[int]]:
    reader = PacketReader(version=MQTT_3_1_1)
    reader.feed(stream)
    seen: Counter[tuple[int, int]] = Counter()
    acks = bytearray()
    latencies = []
    received = 0
    for packet in reader.packets():
        if not isinstance(packet, Publish):
            continue
        received += 1
        publisher, seq, sent_ns = STAMP.unpack_from(packet.payload)
        seen[publisher, seq] += 1
        latencies.append(NOW_NS - sent_ns)
        if packet.qos:
            acks += encode(PubAck(packet.packet_id), MQTT_3_1_1)
    duplicates = sum(n - 1 for n in seen.values())
    return received, duplicates, bytes(acks), sorted(latencies)


def segments(data: st.DataObject) -> list[bytes]:
    """Runs of one topic and QoS with consecutive sequence numbers (the fast path's case), each
    maybe followed by duplicates, gaps, other publishers and PINGRESPs."""
    out = []
    for _ in range(data.draw(st.integers(1, 6))):
        topic, qos, publisher, seq, sent = data.draw(message)
        out.append(encoded([(topic, qos, publisher, seq + i, sent + i) for i in range(data.draw(st.integers(1, 40)))]))
        out.append(encoded(data.draw(st.lists(item, max_size=3))))
    return out


@given(st.data())
def test_counts_what_the_codec_decodes_however_reads_split_the_stream(data: st.DataObject) -> None:
    parts = segments(data)
    stream = b"".join(parts)
    # reads that end where a segment ends (a run alone in the buffer) and anywhere else
    ends = [sum(map(len, parts[: i + 1])) for i in range(len(parts))]
    cuts = {end for end in ends if data.draw(st.booleans())}
    cuts.update(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=4)))
    cuts = sorted(cut for cut in cuts if 0 < cut < len(stream))
    counter = PublishCounter()
    acks = bytearray()
    counted = 0
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        counted += counter.feed(stream[start:end], NOW_NS, acks)
    received, duplicates, owed, latencies = expected(stream)
    assert (counted, counter.received, counter.duplicates) == (received, received, duplicates)
    assert bytes(acks) == owed
    assert sorted(counter.latencies) == latencies
    assert not counter.buffer


def test_a_run_read_again_counts_as_duplicates() -> None:
    stream = encoded([("a/b", 1, 0, seq, seq) for seq in range(100)])
    counter = PublishCounter()
    acks = bytearray()
    assert counter.feed(stream, NOW_NS, acks) == 100
    half = stream[: len(stream) // 2]
    assert counter.feed(half, NOW_NS, acks) == 50
    assert (counter.received, counter.duplicates, counter.unique) == (150, 50, 100)
    assert bytes(acks) == expected(stream)[2] + expected(half)[2]
