"""The counting behind the chaos script's lines (loadtest/chaos_tally.py): lost, duplicated,
flagged and unexplained repeats, and the unavailability after a fault."""

from __future__ import annotations

from loadtest.chaos_tally import Figures, Tally, summary_lines


def test_lost_counts_acknowledged_messages_never_delivered() -> None:
    tally = Tally()
    for n, at in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        tally.on_sent(n)
        tally.on_acked(n, at)
    tally.on_sent("d")  # sent, never acknowledged: delivered or not, it is not lost
    tally.on_delivered("a", False)
    tally.on_delivered("d", False)
    figures = tally.figures(fault_at=0.0, load_end=10.0)
    assert (figures.acked, figures.received, figures.lost) == (3, 1, 2)
    assert tally.missing() == {"b", "c"}


def test_repeats_are_duplicates_and_unflagged_ones_are_told_apart_by_the_publishers_retries() -> None:
    tally = Tally()
    tally.on_sent("once")
    tally.on_acked("once", 1.0)
    tally.on_sent("retried")
    tally.on_sent("retried")
    tally.on_acked("retried", 1.0)
    tally.on_delivered("once", False)
    tally.on_delivered("once", True)  # redelivered, flagged
    tally.on_delivered("once", False)  # a repeat without the flag, of a message sent once
    tally.on_delivered("retried", False)
    tally.on_delivered("retried", False)  # the publisher's own second PUBLISH
    figures = tally.figures(fault_at=0.0, load_end=10.0)
    assert figures.duplicated == 3
    assert figures.unflagged_duplicates == 2
    assert figures.unexplained_duplicates == 1


def test_unavailability_is_the_longest_silence_of_acknowledgements_after_the_fault() -> None:
    tally = Tally()
    for n, at in (("a", 9.0), ("b", 14.5), ("c", 12.25), ("d", 10.5)):
        tally.on_acked(n, at)
    tally.on_acked("a", 20.0)  # a second acknowledgement of "a" does not move its first
    assert tally.figures(fault_at=10.0, load_end=15.0).unavailable_s == 2.25  # c at 12.25, then b at 14.5
    assert tally.figures(fault_at=12.0, load_end=20.0).unavailable_s == 5.5  # silent after b: the load's end counts
    assert tally.figures(fault_at=15.0, load_end=20.0).unavailable_s is None


def test_the_line_is_the_documented_format() -> None:
    assert Figures(5, 4, 1, 2, 0, 0, 1.5).line("leader_kill9", "mqtt") == (
        "chaos fault=leader_kill9 protocol=mqtt acked=5 received=4 lost=1 duplicated=2 unavailable_s=1.50")
    assert Figures(0, 0, 0, 0, 0, 0, None).line("restart_all", "amqp").endswith("unavailable_s=never")


def test_the_summary_adds_up_the_rounds_of_each_fault_and_protocol() -> None:
    runs = [("leader_kill9", "mqtt", Figures(10, 10, 0, 2, 1, 0, 4.0)),
            ("leader_kill9", "amqp", Figures(7, 6, 1, 0, 0, 0, 2.5)),
            ("leader_kill9", "mqtt", Figures(5, 5, 0, 1, 1, 1, 3.0)),
            ("leader_kill9", "mqtt", Figures(4, 4, 0, 0, 0, 0, 6.0)),
            ("restart_all", "amqp", Figures(3, 3, 0, 0, 0, 0, None))]
    assert summary_lines(runs) == [
        "# summary fault=leader_kill9 protocol=mqtt rounds=3 acked=19 lost=0 duplicated=3 unflagged_duplicates=2 "
        "unavailable_s_median=4.00 unavailable_s_max=6.00",
        "# summary fault=leader_kill9 protocol=amqp rounds=1 acked=7 lost=1 duplicated=0 unflagged_duplicates=0 "
        "unavailable_s_median=2.50 unavailable_s_max=2.50",
        "# summary fault=restart_all protocol=amqp rounds=1 acked=3 lost=0 duplicated=0 unflagged_duplicates=0 "
        "unavailable_s_median=never unavailable_s_max=never"]
