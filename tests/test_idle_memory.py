"""What an idle connection holds (issue 21: idle connections <= 2 KiB each): object graphs,
not process sizes. An MQTT client that only connected has no inbound or outbound component,
no timer handle of its own, no tables of its own and a transport without a dict; they appear
when it publishes or subscribes, and work then. The deadlines wheel that replaced the per-connection timers runs
every deadline, in order, once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika

from gateway.amqp.channel import NOTHING
from gateway.deadlines import Deadlines
from gateway.lean_tcp import LeanTransport
from gateway.mqtt.session import NO_ENTRIES, NO_IDS
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway


async def test_an_idle_mqtt_client_holds_no_components_and_gets_them_on_first_use(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        idle = PahoClient(mqtt_port(gw), "idle-1")
        other = PahoClient(mqtt_port(gw), "idle-2")
        await idle.connect()
        await other.connect()
        try:
            conn = gw.mqtt.connections["idle-1"]
            session = conn.session
            assert conn._inbound is None and conn._delivery is None
            assert not hasattr(conn, "__dict__")  # slots
            # the plain listener's lean transport: no dict, no extra-info table, no write buffer
            assert isinstance(conn.transport, LeanTransport) and not hasattr(conn.transport, "__dict__")
            assert not hasattr(conn.transport, "_extra") and conn.transport._buffer is None
            assert isinstance(conn._timer, set)  # a slot of the deadlines wheel, no TimerHandle
            assert not conn.read_pauses.reasons and not isinstance(conn.read_pauses.reasons, set)
            for table in (session.subscriptions, session.cursors, session.inflight, session.shared_done):
                assert table is NO_ENTRIES
            assert session.awaiting_release is NO_IDS

            # first use: a subscription makes the outbound side, a QoS 2 publish the inbound one
            await idle.subscribe("idle/t", qos=1)
            assert conn._delivery is not None and conn._inbound is None
            assert session.subscriptions is not NO_ENTRIES and session.cursors is not NO_ENTRIES
            await other.publish("idle/t", b"to the idle one", qos=1)
            [got] = await idle.receive(1)
            assert got.payload == b"to the idle one"
            await idle.publish("idle/t", b"from the idle one", qos=2)
            [echo] = await idle.receive(1)
            assert echo.payload == b"from the idle one"
            assert conn._inbound is not None
            assert NO_ENTRIES == {} and NO_IDS == frozenset()  # the shared empties stayed empty
        finally:
            await idle.disconnect()
            await other.disconnect()


async def test_an_idle_amqp_connection_owns_no_empty_sets(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        try:
            channel = await connection.channel()
            [conn] = gw.amqp.connections
            assert conn.closing_channels is NOTHING and conn.exclusive_queues is NOTHING
            assert all(c._tx_tags is NOTHING for c in conn.channels.values())
            queue = await channel.declare_queue("", exclusive=True)  # the first: its own set
            assert conn.exclusive_queues == {queue.name}
            assert NOTHING == frozenset()
        finally:
            await connection.close()


class _Owner:
    def __init__(self, name: str, log: list[str], wheel: Deadlines, victim: _Owner | None = None) -> None:
        self.name, self.log, self.wheel, self.victim = name, log, wheel, victim
        self.slot: set | None = None

    def deadline_reached(self) -> None:
        self.log.append(self.name)
        if self.victim is not None:  # one deadline cancels another of the same tick
            Deadlines.cancel(self.victim.slot, self.victim)


async def test_deadlines_run_once_in_order_and_cancelled_ones_never() -> None:
    wheel = Deadlines()
    log: list[str] = []
    try:
        late, cancelled = _Owner("late", log, wheel), _Owner("cancelled", log, wheel)
        victim = _Owner("victim", log, wheel)
        killer = _Owner("killer", log, wheel, victim=victim)
        late.slot = wheel.later(0.3, late)
        cancelled.slot = wheel.later(0.1, cancelled)
        killer.slot = wheel.later(0.05, killer)
        victim.slot = wheel.later(0.05, victim)
        wheel.cancel(cancelled.slot, cancelled)
        await asyncio.sleep(0.6)
        # killer and victim share a tick: whichever runs first, victim runs at most once, and
        # only if it ran before killer cancelled it
        assert log[-1] == "late" and log.count("late") == 1 and "cancelled" not in log
        assert log[0] in ("killer", "victim") and log.count("killer") == 1 and log.count("victim") <= 1
        assert not wheel._slots and not wheel._ticks and wheel._handle is None  # nothing left
    finally:
        wheel.close()
