"""loadtest/profile_stages.py's folding: each sampled stack lands in exactly one stage, decided by
its innermost frame a rule claims; pass-through frames defer to their callers; idle thread-pool
waits are left out."""

from loadtest.profile_stages import AMQP_RULES, COMMIT, CONFIRM, DECODE, ENCODE, INBOUND, MQTT_RULES, OTHER, READ, fold

LOOP = "_run_module_as_main (<frozen runpy>:198);BaseEventLoop._run_once (asyncio/base_events.py:1922);Handle._run (asyncio/events.py:80)"
READ_READY = "_SelectorSocketTransport._read_ready__data_received (asyncio/selector_events.py:1009)"


def stack(*frames: str, count: int = 1) -> str:
    return ";".join((LOOP, *frames)) + f" {count}"


def test_innermost_claimed_frame_decides_and_every_sample_counts_once() -> None:
    lines = [
        # decoding a PUBLISH under the gateway's connection: the reader is innermost
        stack(READ_READY, "MQTTConnection.data_received (gateway/mqtt/connection.py:109)",
              "PacketReader.packets (protocols/mqtt/reader.py:80)", "_fast_decode (protocols/mqtt/reader.py:413)",
              count=5),
        # a record read under the delivery: store/log/record.py's RecordView is the read side
        stack("Delivery.pump (gateway/mqtt/outbound.py:300)", "QueueCache.read (cache/queue_cache.py:200)",
              "read_entries (store/read/reads.py:40)", "RecordView.__init__ (store/log/record.py:202)", count=3),
        # record assembly under the committer: the same file, the commit side
        stack("GroupCommitter._commit (store/write/committer.py:150)", "assemble (store/log/record.py:148)", count=7),
        # a socket write passes through the connection's output to whoever wrote
        stack("Inbound._stored (gateway/mqtt/inbound.py:101)", "MQTTConnection.flush (gateway/mqtt/connection.py:223)",
              "MQTTConnection.write_now (gateway/mqtt/connection.py:233)",
              "_SelectorSocketTransport.write (asyncio/selector_events.py:1057)", count=2),
        stack("Delivery.pump (gateway/mqtt/outbound.py:290)", "MQTTConnection.flush (gateway/mqtt/connection.py:223)",
              "_SelectorSocketTransport.write (asyncio/selector_events.py:1057)", count=4),
        stack("EpollSelector.select (selectors.py:468)", count=1),
        # not CPU: a thread-pool worker waiting for work
        "Thread._bootstrap (threading.py:1002);_worker (concurrent/futures/thread.py:81) 9",
    ]
    folded = fold(lines, MQTT_RULES)
    assert dict(folded.samples) == {DECODE: 5, READ: 3, COMMIT: 7, INBOUND: 2, ENCODE: 4, OTHER: 1}
    assert folded.total == 22
    assert folded.idle == 9


def test_amqp_property_encoding_counts_where_it_is_called_from() -> None:
    marshal = "BasicProperties.marshal (pamqp/base.py:120)"
    lines = [
        stack(READ_READY, "route_publish (gateway/amqp/publishing.py:30)", "to_store_message (gateway/amqp/messages.py:60)",
              marshal, count=6),
        stack("AMQPConnection._publishes_done (gateway/amqp/connection.py:470)",
              "method_frame (protocols/amqp/frames.py:268)", "Frame.marshal (pamqp/base.py:90)", count=2),
        stack(READ_READY, "FrameReader.events (protocols/amqp/frames.py:160)",
              "BasicProperties.unmarshal (pamqp/base.py:140)", count=3),
    ]
    folded = fold(lines, AMQP_RULES)
    assert dict(folded.samples) == {INBOUND: 6, CONFIRM: 2, DECODE: 3}


def test_native_stacks_fold_by_their_python_frames() -> None:
    """With ``--native``, C frames follow the innermost Python one: a thread-pool worker waiting
    in its queue's lock is still idle, and the compiled delivery core's frames (named after
    their .py) and a socket write's libc frames count where the Python rules say."""
    lines = [
        ("Thread._bootstrap (threading.py:1002);_worker (concurrent/futures/thread.py:81);"
         "_queue_SimpleQueue_get_impl (_queuemodule.c:253);PyThread_acquire_lock_timed (libpython3.11.so.1.0) 9"),
        stack("MQTTBroker._pump_woken (gateway/mqtt/broker.py:363)", "pump (gateway/mqtt/push.py:188)",
              "Pusher__deliver_batch (gateway/mqtt/push.py:300)", "Py_DECREF (object.h:537)", count=4),
        stack("pump (gateway/mqtt/push.py:188)", "MQTTConnection.flush (gateway/mqtt/connection.py:233)",
              "_SelectorSocketTransport.write (asyncio/selector_events.py:1057)", "sock_send (socketmodule.c:4207)",
              "send (libc.so.6)", count=3),
    ]
    folded = fold(lines, MQTT_RULES)
    assert dict(folded.samples) == {ENCODE: 7}
    assert folded.idle == 9


def test_the_lean_transports_reads_and_late_writes_fold_as_asyncios() -> None:
    """gateway/lean_tcp.py carries the plain MQTT listener: its socket reads are decoding, a
    write passes through to the stage that made it, the loop's late writes are encoding."""
    read_ready = "LeanTransport._read_ready (gateway/lean_tcp.py:110)"
    lines = [
        stack(read_ready, "socket.recv (socketmodule.c:3800)", count=2),
        stack("Inbound._stored (gateway/mqtt/inbound.py:101)", "MQTTConnection.write_now (gateway/mqtt/connection.py:233)",
              "LeanTransport.write (gateway/lean_tcp.py:140)", count=3),
        stack("LeanTransport._write_ready (gateway/lean_tcp.py:165)", count=5),
    ]
    folded = fold(lines, MQTT_RULES)
    assert dict(folded.samples) == {DECODE: 2, INBOUND: 3, ENCODE: 5}
