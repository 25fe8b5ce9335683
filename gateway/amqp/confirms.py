"""Publisher confirms of one channel (confirm.select): the sequence numbers of its publishes and
the basic.ack / basic.nack that settle them, one ``multiple`` where a run continues the last."""

from __future__ import annotations

from pamqp import commands


class Confirms:
    __slots__ = ("confirmed", "published")

    def __init__(self) -> None:
        self.published = 0  # the last publish's sequence number
        self.confirmed = 0  # the highest sequence number confirmed

    def next_seq(self) -> int:
        self.published += 1
        return self.published

    def methods(self, seqs: list[int], ok: bool) -> list[commands.Basic.Ack | commands.Basic.Nack]:
        """basic.ack (``ok``) or basic.nack of ``seqs`` (ascending, not empty): one with
        ``multiple`` when they are contiguous and follow the last confirmed, else one each."""
        if len(seqs) > 1 and seqs == list(range(seqs[0], seqs[-1] + 1)) and seqs[0] == self.confirmed + 1:
            methods: list = [commands.Basic.Ack(seqs[-1], True) if ok else commands.Basic.Nack(seqs[-1], True, False)]
        else:
            methods = [commands.Basic.Ack(seq) if ok else commands.Basic.Nack(seq, False, False) for seq in seqs]
        self.confirmed = max(self.confirmed, seqs[-1])
        return methods
