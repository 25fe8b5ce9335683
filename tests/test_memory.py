"""Memory the message path keeps: messages freed as soon as they are delivered (no reference
cycles left for the cyclic GC, which the gateway runs rarely), and RocksDB's memory bounded by
the configured budget. No timing and no process-size assertions: object graphs and options."""

from __future__ import annotations

import asyncio
import gc
import platform
import subprocess
import sys
from pathlib import Path

import aio_pika
import psutil
import pytest

from gateway.config import Config, ConfigError, load_config
from gateway.mqtt.messages import Delivery, DeliveryMemo
from store import Message, MessageStore, StoredMessage
from store.index.consumequeue import ConsumeQueueIndex
from store.rocks import ARENA_BLOCK_BYTES, RocksMemory, fix_mmap_threshold
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

MESSAGES = 300


def cyclic_garbage(*kinds: type) -> list[object]:
    """Objects of ``kinds`` that only the cyclic GC would free (unreachable, in a cycle)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, kinds)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_delivered_messages_leave_no_cyclic_garbage(data_dir: Path) -> None:
    """One MQTT publish stream read by an MQTT QoS 1 subscriber and an AMQP consumer bound to
    amq.topic: once delivered and acknowledged, no StoredMessage (nor the MQTT Delivery made
    from it) is left in a reference cycle. Each one that was (a message and its Delivery
    pointing at each other) lived until a full collection: at the gateway's GC thresholds,
    hundreds of MiB under a steady load (issue 23.5). The gateway's memo of Deliveries keeps
    none of them alive."""
    # a queue cache of a few messages: delivered messages leave it at once
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", queue_cache_bytes=4096) as gw:
        amqp_port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        sub = PahoClient(mqtt_port(gw), "mem-sub")
        pub = PahoClient(mqtt_port(gw), "mem-pub")
        gc.collect()
        gc.disable()
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue("mem-amqp", durable=True)
            await queue.bind("amq.topic", "mem.#")
            await sub.connect()
            await sub.subscribe("mem/#", qos=1)
            await pub.connect()
            for i in range(MESSAGES):
                await pub.publish(f"mem/{i % 3}", b"x" * 64, qos=1)
            assert len(await sub.receive(MESSAGES)) == MESSAGES
            got = 0
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    got += 1
                    if got == MESSAGES:
                        break
            await asyncio.sleep(0.5)  # the last PUBACKs and basic.acks reach the gateway
            # freed by reference counting alone (the cyclic GC is off), but for the queue
            # caches' windows; the MQTT gateway's memo of Deliveries keeps no more than those
            alive = sum(1 for o in gc.get_objects() if isinstance(o, StoredMessage))
            assert len(gw.mqtt.deliveries) <= alive < MESSAGES
            leaked = cyclic_garbage(StoredMessage, Delivery)
            assert not leaked, f"{len(leaked)} messages in reference cycles, e.g. {leaked[0]!r:.300}"
        finally:
            gc.enable()
            await sub.disconnect()
            await pub.disconnect()
            await connection.close()


def test_the_delivery_memo_keeps_one_delivery_per_live_message_object() -> None:
    """One Delivery per message object while it lives (every reader of a cached message gets
    it), none for another object read from the same record, and none left once it is freed
    (by reference counting: the memo neither keeps the message nor makes a cycle with it)."""
    memo = DeliveryMemo()
    record = {"msg_id": "m", "position": 0, "size": 1, "topic": "t", "key": "", "body": b"x", "born_timestamp": 0,
              "store_timestamp": 0, "raw_properties": b"", "raw_queues": b"", "queue_count": 0}
    first, again = StoredMessage(**record), StoredMessage(**record)
    gc.disable()
    try:
        delivery = memo(first)
        assert memo(first) is delivery and memo(again) is not delivery and len(memo) == 2
        del first
        assert len(memo) == 1
        del again
        assert len(memo) == 0
    finally:
        gc.enable()


def options_file(db_dir: Path) -> dict[str, str]:
    """name -> value of the newest OPTIONS file RocksDB wrote for a database (every section)."""
    newest = max(db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    pairs = (line.strip().partition("=") for line in newest.read_text().splitlines())
    return {name: value for name, sep, value in pairs if sep}


async def test_rocksdb_memory_is_bounded_by_the_configured_budget(data_dir: Path) -> None:
    """rocksdb_cache_bytes and rocksdb_write_buffer_bytes reach both databases: one shared block
    cache of that capacity, memtables sized from the budget, and the index and bloom-filter
    blocks of table files held in the cache, not beside it (where they grew with the data)."""
    config = Config(data_dir=data_dir, rocksdb_cache_bytes=3 << 20, rocksdb_write_buffer_bytes=16 << 20)
    store = await MessageStore.open(config.store_options())
    try:
        entries = 0
        for _ in range(4):  # four table files of 25,000 index entries each
            await store.put_batch([(Message(f"mem/{i % 100}", b"x"), [f"mem/{i % 100}"]) for i in range(25_000)])
            store.index.flush()
            entries += 25_000
        for db in (store.index.db, store.meta.db):
            assert db.property_int_value("rocksdb.block-cache-capacity") == 3 << 20
        # (one cache: what the index put in it shows in meta's figure too)
        assert store.meta.db.property_int_value("rocksdb.block-cache-usage") > 0
        # a bloom filter alone costs 10 bits per entry; kept outside the cache it would show here
        assert store.index.db.property_int_value("rocksdb.estimate-table-readers-mem") < entries * 10 // 8 // 2
    finally:
        await store.close()
    index, meta = options_file(data_dir / "index"), options_file(data_dir / "meta")
    assert (index["write_buffer_size"], meta["write_buffer_size"]) == (str(4 << 20), str(2 << 20))
    for options in (index, meta):
        assert options["max_write_buffer_number"] == "2"
        assert options["arena_block_size"] == str(ARENA_BLOCK_BYTES)
        assert options["cache_index_and_filter_blocks"] == "true"


def test_a_missing_name_reads_a_filter_partition_not_the_whole_filter(tmp_path: Path) -> None:
    """A lookup of a queue name the index lacks (every new queue's first put) asks the bloom
    filter of each table. 500,000 rows compacted into one table give a filter of ~610 KiB,
    larger than a shard of the block cache (512 KiB), so it never stayed cached: every miss
    read the whole filter again (1,000,000 random queues ran at 4,000-9,000 msgs/s). Bytes
    read per miss, not time, are what is checked: a partition and an index block, a few KiB."""
    rows = 500_000
    index = ConsumeQueueIndex(tmp_path / "index", cache_entries=16, memory=RocksMemory(1 << 20, 16 << 20))
    try:
        for i in range(rows):
            index.resolve(f"present/{i}")
        index.commit(index.new_batch(), 0)
        # trimmed, the cache no longer holds every queue: a name it lacks is looked up
        index.trim_cache()
        index.flush()
        index.db.compact_range(None, None)  # one table file below level 0 (level 0 stays pinned)
        assert index.lookup(f"present/{rows // 2}") is not None  # trimmed away, found in the table
        misses = 200
        before = psutil.Process().io_counters().read_chars
        for i in range(misses):
            assert index.lookup(f"absent/{i}") is None
        read = psutil.Process().io_counters().read_chars - before
    finally:
        index.close()
    assert read < misses * (64 << 10), f"{read // misses} bytes read per missing name"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the mmap threshold is glibc's")
def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert fix_mmap_threshold()


def test_rocksdb_budget_below_the_minimum_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="rocksdb_cache_bytes"):
        load_config(env={"TIDEMQ_ROCKSDB_CACHE_BYTES": "1000"})
    with pytest.raises(ConfigError, match="rocksdb_write_buffer_bytes"):
        load_config(env={"TIDEMQ_ROCKSDB_WRITE_BUFFER_BYTES": "1000"})


# In a thread of its own (so in a malloc arena of its own, as RocksDB's compaction thread is):
# 64 MiB of 1 KiB blocks, all freed but the last, which keeps glibc from shrinking the arena.
ARENA_LEFT_BEHIND = """
import ctypes, sys, threading
from store.rocks import release_free_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def anon_kib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1])

def work():
    blocks = [libc.malloc(1024) for _ in range(65536)]
    for b in blocks:
        ctypes.memset(b, 1, 1024)
    for b in blocks[:-1]:
        libc.free(b)

t = threading.Thread(target=work)
t.start()
t.join()
before = anon_kib()
assert release_free_memory()
print(before - anon_kib())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_a_thread_freed_goes_back_to_the_system_on_glibc() -> None:
    """What the store's periodic release does for the memory RocksDB's compactions free: without
    it, the 64 MiB this thread freed stay resident (about 0 returned)."""
    done = subprocess.run([sys.executable, "-c", ARENA_LEFT_BEHIND], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=60, check=True)
    assert int(done.stdout) > 48 << 10  # KiB returned, of 64 MiB freed


async def test_the_store_releases_free_memory_on_its_interval(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, memory_release_interval_s=0.05)
    store = await MessageStore.open(config.store_options())
    try:
        for _ in range(100):
            if store.memory_release_latency.count >= 2:
                break
            await asyncio.sleep(0.05)
        assert store.memory_release_latency.count >= 2
    finally:
        await store.close()


def test_a_negative_memory_release_interval_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="memory_release_interval"):
        load_config(env={"TIDEMQ_MEMORY_RELEASE_INTERVAL_S": "-1"})
