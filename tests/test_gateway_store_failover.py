"""The order of a gateway node's writes sent again through a failover (GatewayStore's
``through_failover``, gateway/cluster/failover_writes.py), against a scripted store link: what
waits goes again in the order it was first sent, new writes queue behind it, and the newest value of a key (a session) wins -- an
older one waiting, or failing after a newer one was sent, is never sent after it. The real
failovers are in test_replication_processes.py and test_cluster_mqtt.py."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.cluster.failover_writes import RETRY_S
from gateway.cluster.gateway_store import GatewayStore
from gateway.cluster.remote_store import RemoteStoreError


class ScriptedLink:
    def __init__(self) -> None:
        self.is_open = True
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class ScriptedRemote:
    """Each write is written down and answered when the test says."""

    msg_id_prefix = "P"

    def __init__(self) -> None:
        self.link = ScriptedLink()
        self.sent: list[bytes] = []
        self.answers: list[asyncio.Future[None]] = []

    def kv_put_sent(self, table: str, key: str, value: bytes) -> asyncio.Future[None]:
        self.sent.append(value)
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        return answer


def not_now() -> RemoteStoreError:
    return RemoteStoreError("store node answered 14: too few replicas in sync", retryable=True)


async def store() -> tuple[GatewayStore, ScriptedRemote]:
    remote = ScriptedRemote()

    async def reconnect() -> Any:
        raise OSError("not in these tests")

    gateway_store = GatewayStore(remote, reconnect)  # type: ignore[arg-type]
    gateway_store.linked.set()  # (as start() leaves it)
    return gateway_store, remote


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_newer_value_replaces_an_older_one_waiting_to_be_sent_again() -> None:
    gateway_store, remote = await store()
    first = gateway_store.kv_put_sent("sessions", "c1", b"S1")
    remote.answers[0].set_exception(not_now())
    await settle()
    second = gateway_store.kv_put_sent("sessions", "c1", b"S2")
    remote.answers[1].set_result(None)
    await asyncio.gather(first, second)
    await asyncio.sleep(RETRY_S * 2)
    assert remote.sent == [b"S1", b"S2"]  # S1 is never sent again, after S2


async def test_an_older_value_failing_after_a_newer_one_was_sent_is_not_sent_again() -> None:
    gateway_store, remote = await store()
    first = gateway_store.kv_put_sent("sessions", "c1", b"S1")
    second = gateway_store.kv_put_sent("sessions", "c1", b"S2")
    remote.answers[0].set_exception(not_now())
    remote.answers[1].set_result(None)
    await asyncio.gather(first, second)
    await asyncio.sleep(RETRY_S * 2)
    assert remote.sent == [b"S1", b"S2"]


async def test_writes_sent_again_keep_their_order_and_new_ones_wait_behind_them() -> None:
    gateway_store, remote = await store()
    a = gateway_store.kv_put_sent("sessions", "a", b"A")
    remote.answers[0].set_exception(not_now())
    await settle()
    b = gateway_store.kv_put_sent("sessions", "b", b"B")  # behind A, which waits
    assert remote.sent == [b"A"]
    await asyncio.sleep(RETRY_S * 1.5)
    assert remote.sent == [b"A", b"A", b"B"]
    for answer in remote.answers[1:]:
        answer.set_result(None)
    await asyncio.gather(a, b)


async def test_a_delete_is_the_newest_value_and_is_sent_again_through_a_failover() -> None:
    """A session deleted (MQTT clean start) while its last save waits to be sent again: the save
    is dropped, the delete goes in its place -- never the old session after it."""
    gateway_store, remote = await store()
    deletes: list[str] = []

    def kv_delete_sent(table: str, key: str) -> asyncio.Future[None]:
        deletes.append(key)
        remote.sent.append(b"DELETE " + key.encode())
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        remote.answers.append(answer)
        return answer

    remote.kv_delete_sent = kv_delete_sent  # type: ignore[attr-defined]
    table = gateway_store.table("sessions")
    table.put("c1", b"S1")
    remote.answers[0].set_exception(not_now())
    await settle()
    table.delete("c1")  # behind S1, which waits: S1 is dropped for it
    await asyncio.sleep(RETRY_S * 2)
    assert remote.sent == [b"S1", b"DELETE c1"]
    remote.answers[1].set_exception(not_now())  # the delete itself is sent again
    await asyncio.sleep(RETRY_S * 2)
    assert remote.sent == [b"S1", b"DELETE c1", b"DELETE c1"]
    remote.answers[2].set_result(None)


def test_a_wildcard_release_made_while_no_link_was_up_is_sent_on_the_next() -> None:
    """A persistent session unsubscribing during a failover: its release (one-way, dropped by
    the closed link) goes on the new link, or the store node would keep the durable hold."""
    from gateway.cluster.mqtt_node import RemoteWildcards

    class Remote:
        def __init__(self) -> None:
            self.sent: list[tuple] = []

        def filter_hold(self, topic_filter: str, holder: str, durable: bool) -> None:
            self.sent.append(("hold", topic_filter, holder, durable))

        def filter_release(self, topic_filter: str, holder: str) -> None:
            self.sent.append(("release", topic_filter, holder))

    class Store:
        connected = True
        remote = Remote()

    store = Store()
    wildcards = RemoteWildcards(store)  # type: ignore[arg-type]
    wildcards.hold("a/+", "c1", True)
    wildcards.hold("b/+", "c2", False)
    store.connected = False
    wildcards.release("a/+", "c1")
    store.remote, store.connected = Remote(), True
    wildcards.hold_again()
    assert store.remote.sent == [("release", "a/+", "c1"), ("hold", "b/+", "c2", False)]
    wildcards.hold_again()  # (sent once)
    assert store.remote.sent[2:] == [("hold", "b/+", "c2", False)]
