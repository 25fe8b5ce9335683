"""The inbound side of an AMQP connection (``Inbound``, a component it owns): a client's
publishes checked against its permissions, routed (publishing.py), put to the store in one
submission per read through the ingest path (core/ingest.py), then confirmed (confirms.py) or
returned; a transactional channel's publishes kept until tx.commit stores them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pamqp import commands

from protocols.amqp.frames import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    INTERNAL_ERROR,
    NO_ROUTE,
    PRECONDITION_FAILED,
    AMQPError,
    ContentReceived,
    channel_error,
    connection_error,
)
from protocols.amqp.relay_identity import producer, without_origin
from store import InvalidMessageError, MessageTooLargeError, StoreError

from ..core.ingest import Items, PutPipeline, Refused
from .permissions import publish_refusal
from .publishing import Routed, route_publish

if TYPE_CHECKING:
    from .channel import Channel
    from .connection import AMQPConnection

log = logging.getLogger("tidemq.amqp")

# what each publish put to the store waits for: its channel, its confirm sequence number (None
# when the channel does not confirm) and whether to nack it (a reject-publish queue refused it)
Accepted = tuple["Channel", "int | None", bool]
Number = tuple[bytes, int, bool]  # a relayed publish's producer id, sequence number, and whether it is sent again


class Inbound:
    __slots__ = ("broker", "connection", "puts")

    def __init__(self, connection: AMQPConnection) -> None:
        self.connection = connection
        self.broker = connection.broker
        # the ingest path; it pauses the connection's reading while too many puts are on their way
        self.puts = PutPipeline(connection.broker.store, connection.read_pauses, listener="amqp",
                                watcher=connection.tracer)

    @property
    def pending(self) -> int:
        """Publishes submitted to the store and not stored yet."""
        return self.puts.pending

    def receive(self, events: list[ContentReceived]) -> None:
        """Publishes read together: routed and stored in one group commit (a transactional
        channel's wait for its tx.commit)."""
        self._store(events, in_commit=False, on_done=None)

    def commit(self, channel: Channel, method: commands.Tx.Commit) -> None:
        """tx.commit's publishes: stored in one group commit, then tx.commit-ok (a commit the
        store did not take closes the channel)."""
        publishes, channel.tx_publishes = channel.tx_publishes, []
        connection = self.connection

        def committed(error: BaseException | None) -> None:
            if channel.closing:
                return  # closed meanwhile (a publish of the commit was refused)
            if error is not None:
                connection.fail(channel_error(INTERNAL_ERROR, f"commit not stored: {error}", channel.number, method))
            else:
                channel.reply(commands.Tx.CommitOk())
            connection.flush()
        self._store(publishes, in_commit=True, on_done=committed)

    def _store(self, events: list[ContentReceived], *, in_commit: bool,
               on_done: Callable[[BaseException | None], None] | None) -> None:
        connection = self.connection
        broker = self.broker
        relay = connection.relay if not in_commit else None  # (a transaction is not kept through a failover)
        items = []
        accepted: list[Accepted] = []
        methods = []
        holding: list[Routed | None] = []  # those with places in reject-publish queues, until stored
        numbers: list[Number | None] = []  # a relayed connection's: each publish's number (relay_identity.py)
        producers: dict[tuple[int, int], bytes] = {}  # (generation, channel) -> its producer id, made once a read
        for event in events:
            channel = connection.channels.get(event.channel)
            if channel is None:
                if event.channel not in connection.closing_channels:
                    connection.fail(connection_error(CHANNEL_ERROR, f"channel {event.channel} is not open", event.channel))
                continue
            m = event.method
            refusal = None if in_commit else publish_refusal(connection, m.exchange, m.routing_key)
            if refusal is not None:  # the user's permissions (gateway/auth/authorize.py)
                connection.fail(channel_error(ACCESS_REFUSED, refusal, event.channel, m))
                continue
            if channel.tx and not in_commit:
                channel.tx_publishes.append(event)
                continue
            origin = None
            if relay is not None:
                event, origin = without_origin(event)
            try:
                routed = route_publish(broker, channel, event)
            except AMQPError as exc:
                connection.fail(exc)
                continue
            if routed.returned:
                channel.send_return(NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key, event.raw_properties, event.body)
            confirms = channel.confirms
            if routed.message is None:  # nothing to store: confirmed at once
                if confirms is not None:
                    self._confirm(channel, [confirms.next_seq()], ok=not routed.refused_by_some)
                continue
            seq = confirms.next_seq() if confirms is not None else None
            items.append((routed.message, routed.targets))
            accepted.append((channel, seq, routed.refused_by_some))
            methods.append(m)
            holding.append(routed if routed.places else None)
            if relay is not None and seq is not None:
                token, generation = relay
                of = (origin[0] if origin is not None else generation, channel.number)
                name = producers.get(of)
                if name is None:
                    name = producers[of] = producer(token, *of)
                numbers.append((name, origin[1], True) if origin is not None else (name, seq, False))
            else:
                numbers.append(None)
        if not items:
            if on_done is not None:
                on_done(None)
            return
        if relay is None or not any(numbers):
            self._submit(items, accepted, methods, holding, on_done, None)
            return
        failed: set[int] = set()  # channels a refused publish closed: their later publishes are not stored
        fresh: list[int] = []
        for i, number in enumerate(numbers):  # a publish sent again is looked for alone (it comes first)
            if number is None or not number[2]:
                fresh.append(i)
            elif self._still_open(accepted[i][0], holding[i], failed) and self._submit(
                    [items[i]], [accepted[i]], [methods[i]], [holding[i]], None, number):
                failed.add(accepted[i][0].number)
        for numbered in (True, False):  # new numbers in one put; publishes without one in another
            chosen = [i for i in fresh if (numbers[i] is not None) is numbered
                      and self._still_open(accepted[i][0], holding[i], failed)]
            if chosen:
                self._submit([items[i] for i in chosen], [accepted[i] for i in chosen], [methods[i] for i in chosen],
                             [holding[i] for i in chosen], None,
                             [number for i in chosen if (number := numbers[i]) is not None] if numbered else None)

    @staticmethod
    def _still_open(channel: Channel, held: Routed | None, failed: set[int]) -> bool:
        """False (the publish's places given back) when a refused publish closed its channel."""
        if channel.number not in failed:
            return True
        if held is not None:
            held.give_places_back()
        return False

    def _submit(self, items: Items, accepted: list[Accepted], methods: list[commands.Basic.Publish],
                holding: list[Routed | None], on_done: Callable[[BaseException | None], None] | None,
                number: Number | list[Number] | None) -> bool:
        """``items`` to the store (one put; relayed publishes: one numbered publish sent again, or
        new publishes numbered one by one), confirmed when stored; True when the store refused
        one of them (its channel is closed)."""
        connection = self.connection

        def stored(fut: asyncio.Future, refused: Refused) -> None:
            for routed in holding:  # (stored: counted as ready from now on)
                if routed is not None:
                    routed.give_places_back()
            error = StoreError("cancelled") if fut.cancelled() else fut.exception()
            kept, stored_items = accepted, items
            if refused:
                kept = [a for i, a in enumerate(accepted) if i not in refused]
                stored_items = [item for i, item in enumerate(items) if i not in refused]
            self._done(kept, {q for _, targets in stored_items for q in targets}, error)
            if on_done is not None:
                on_done(error)

        try:
            if number is None:
                # a message the store refuses (larger than max_message_size with its properties
                # and queue list) closes its channel alone; its neighbours are stored
                refused = self.puts.submit(items, stored, groups=[c.number for c, _, _ in accepted])
            elif isinstance(number, list):
                fut, refused = self.broker.store.put_numbered_nowait(
                    items, [(producer, seq) for producer, seq, _ in number], groups=[c.number for c, _, _ in accepted])
                self.puts.track(fut, [item for i, item in enumerate(items) if i not in refused], refused, stored)
            else:
                refused = {}
                try:
                    fut = self.broker.store.put_batch_nowait(items, producer=(number[0], number[1]), resent=number[2])
                except (InvalidMessageError, MessageTooLargeError) as exc:
                    refused = {0: exc}
                    fut = asyncio.get_running_loop().create_future()
                    fut.set_result([])
                self.puts.track(fut, [] if refused else items, refused, stored)
        except StoreError as exc:  # the store takes nothing now (closing, failed)
            for routed in holding:
                if routed is not None:
                    routed.give_places_back()
            self._done(accepted, set(), exc)
            if on_done is not None:
                on_done(exc)
            return False
        for i in sorted(refused):
            channel = accepted[i][0]
            connection.fail(channel_error(PRECONDITION_FAILED, str(refused[i]), channel.number, methods[i]))
        self.broker.stats.messages_received += len(items) - len(refused)
        return bool(refused)

    def _done(self, accepted: list[Accepted], store_queues: set[str], error: BaseException | None) -> None:
        """Publishes stored (or not: ``error``): confirmed in order, per channel."""
        if error is not None:
            log.error("amqp publish not stored peer=%s count=%d error=%s", self.connection.peer, len(accepted), error)
        by_channel: dict[Channel, tuple[list[int], list[int]]] = {}  # -> (acks, nacks)
        for channel, seq, refused_by_some in accepted:
            if seq is not None:
                by_channel.setdefault(channel, ([], []))[refused_by_some or error is not None].append(seq)
        for channel, (acks, nacks) in by_channel.items():
            self._confirm(channel, acks, ok=True)
            self._confirm(channel, nacks, ok=False)
        if error is None:
            self.broker.stored(store_queues)
        self.connection.publishes_stored()

    @staticmethod
    def _confirm(channel: Channel, seqs: list[int], ok: bool) -> None:
        confirms = channel.confirms
        if not seqs or channel.closing or confirms is None:
            return
        for method in confirms.methods(seqs, ok):
            channel.reply(method)
