"""The lookup's pure parts: the consistent-hash ring (balance, minimal movement), membership
(epoch, expiry, settling, views), the owner table's replace semantics, and the lookup link's
remoting codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.api import LocalRegistry, LookupOptions
from lookup.link import (
    LookupCode,
    LookupLinkError,
    decode_reply,
    decode_request,
    error_command,
    reply_command,
    request_command,
)
from lookup.ring import Membership, Ring, view_digest
from lookup.table import OwnerTable
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FrameReader, encode

node_names = st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
                      min_size=2, max_size=10, unique=True)


# -- ring ---------------------------------------------------------------------------------
def test_owner_is_the_slot_owner_and_the_same_on_every_node() -> None:
    a, b = Ring(["n1", "n2", "n3"]), Ring(["n3", "n1", "n2"])
    for i in range(2000):
        key = f"sensors/{i}/temp"
        assert a.owner(key) == b.owner(key) == a.owner_of_slot(a.slot(key))
    assert Ring([]).owner("x") is None


@settings(max_examples=40)
@given(node_names)
def test_virtual_nodes_balance_the_slots(nodes: list[str]) -> None:
    ring = Ring(nodes, vnodes=160)
    mean = ring.slots / len(nodes)
    for node, count in ring.slot_counts().items():
        assert abs(count - mean) / mean < 0.35, (node, count, mean)


def test_more_virtual_nodes_balance_better() -> None:
    nodes = [f"gw-{i}" for i in range(8)]

    def spread(vnodes: int) -> float:
        counts = Ring(nodes, vnodes=vnodes).slot_counts().values()
        return (max(counts) - min(counts)) / (16384 / len(nodes))

    assert spread(160) < 0.5 < spread(1)


@settings(max_examples=30)
@given(node_names, st.text(min_size=1, max_size=12))
def test_a_joining_node_takes_only_about_one_nth(nodes: list[str], new: str) -> None:
    if new in nodes:
        return
    before, after = Ring(nodes), Ring([*nodes, new])
    moved = before.moved_slots(after)
    assert all(after.owner_of_slot(s) == new for s in moved)  # nothing moves between old nodes
    share = len(moved) / before.slots
    expected = 1 / (len(nodes) + 1)
    assert 0.6 * expected < share < 1.5 * expected


@settings(max_examples=30)
@given(node_names)
def test_a_leaving_node_gives_away_only_its_own_slots(nodes: list[str]) -> None:
    gone = nodes[0]
    before, after = Ring(nodes), Ring(nodes[1:])
    moved = before.moved_slots(after)
    assert all(before.owner_of_slot(s) == gone for s in moved)
    assert len(moved) == before.slot_counts()[gone]


def test_ring_parameters_are_checked() -> None:
    with pytest.raises(ValueError):
        Ring(["a"], vnodes=0)
    with pytest.raises(ValueError):
        Ring(["a"]).moved_slots(Ring(["a"], slot_bits=10))


# -- membership ---------------------------------------------------------------------------
def test_membership_epoch_counts_every_change() -> None:
    m = Membership("a", "i1", now=0.0, node_ttl=3.0, settle=1.0, vnodes=8, slot_bits=8)
    assert m.members == {"a"}
    epoch = m.epoch
    assert m.heartbeat("b", "i1", 0.5)  # joins
    assert m.epoch == epoch + 1 and m.members == {"a", "b"}
    assert not m.heartbeat("b", "i1", 1.0)  # the same incarnation again: no change
    assert m.epoch == epoch + 1
    view = m.view
    assert m.heartbeat("b", "i2", 1.2)  # restarted: a change, a new view, the same ring
    assert m.epoch == epoch + 2 and m.view != view and m.members == {"a", "b"}
    assert not m.heartbeat("a", "other", 1.3)  # nobody renames this node's incarnation


def test_membership_expires_silent_nodes_and_settles() -> None:
    m = Membership("a", "i", now=0.0, node_ttl=3.0, settle=1.0)
    m.heartbeat("b", "i", 0.0)
    m.heartbeat("c", "i", 0.0)
    assert m.settling(0.5) and not m.settling(1.0)
    m.heartbeat("b", "i", 2.5)
    assert m.expire(2.9) == []
    assert m.expire(3.0) == ["c"]  # silent for node_ttl; this node itself never expires
    assert m.members == {"a", "b"} and m.settling(3.5) and not m.settling(4.0)
    assert m.expire(100.0) == ["b"] and m.members == {"a"}
    assert m.leave("a", 100.0) is False


def test_view_digest_names_members_incarnations_and_ring() -> None:
    one = view_digest({"a": "1", "b": "2"}, 160, 14)
    assert one == view_digest({"b": "2", "a": "1"}, 160, 14)
    assert one != view_digest({"a": "1", "b": "3"}, 160, 14)
    assert one != view_digest({"a": "1", "b": "2"}, 100, 14)
    assert one != view_digest({"a": "1"}, 160, 14)


def test_options_refuse_a_ttl_within_one_heartbeat() -> None:
    with pytest.raises(ValueError):
        LookupOptions(heartbeat_s=1.0, node_ttl_s=1.0)


# -- owner table and local registry -------------------------------------------------------
def test_owner_table_takeover_and_offline() -> None:
    t = OwnerTable()
    assert t.online("c", "a") is None
    assert t.online("c", "a") is None  # the same node again is no takeover
    assert t.online("c", "b") == "a"
    t.offline("c", "a")  # the old node's late offline does not remove the new session
    assert t.where("c") == "b"
    t.offline("c", "b")
    assert t.where("c") is None


def test_owner_table_replace_is_a_nodes_whole_registration() -> None:
    t = OwnerTable()
    t.online("c1", "a")
    t.online("c2", "a")
    t.online("c3", "b")
    t.replace("a", ["c2", "c3", "c4"])  # c3 is b's now: it stays b's
    assert [t.where(c) for c in ("c1", "c2", "c3", "c4")] == [None, "a", "b", "a"]
    t.replace("a", [])
    assert t.list_clients("", 10) == [("c3", "b")] and len(t) == 1


def test_owner_table_retain_drops_lost_slots_and_dead_nodes() -> None:
    t = OwnerTable()
    for i in range(10):
        t.online(f"c{i}", "a" if i % 2 else "b")
    t.retain(lambda key: key[-1] in "01234", frozenset({"a"}))
    assert t.list_clients("", 100) == [("c1", "a"), ("c3", "a")]
    t.replace("b", ["c0"])  # b comes back and re-registers
    t.replace("a", ["c3"])  # and a's re-registration replaces what the retained index holds of a
    assert t.list_clients("", 100) == [("c0", "b"), ("c3", "a")]


def test_local_registry_counts_interests() -> None:
    """(The Redis lookup's: the interests it re-registers.)"""
    r = LocalRegistry()
    assert r.add_interest("q") and not r.add_interest("q")
    assert not r.remove_interest("q") and r.remove_interest("q")
    assert not r.remove_interest("q") and r.interests == {}


# -- the lookup link ----------------------------------------------------------------------
def test_lookup_codes_are_private() -> None:
    rocketmq = {code.value for code in RequestCode}
    assert not rocketmq & {code.value for code in LookupCode}
    assert all(30_200 <= code < 30_300 for code in LookupCode)  # the store link has 30,100-30,199


def test_lookup_requests_travel_as_remoting_frames() -> None:
    request = {"op": "batch", "node": "gw-1", "view": "v", "ops": [["online", "dev-ü"], ["add", "a/+/b"]]}
    command = request_command(request, opaque=7)
    assert command.code == LookupCode.BATCH
    [received] = FrameReader().feed(encode(command))
    assert decode_request(received) == request
    reply = reply_command(received, {"results": [["ok", None], ["ok", None]]})
    [back] = FrameReader().feed(encode(reply))
    assert back.is_response and back.opaque == 7
    assert decode_reply(back) == {"results": [["ok", None], ["ok", None]]}
    failed = error_command(received, ResponseCode.SYSTEM_ERROR, "boom")
    with pytest.raises(LookupLinkError, match="boom"):
        decode_reply(failed)
    with pytest.raises(ValueError):
        request_command({"op": "nope"}, 1)
    received.body = b"[1]"
    with pytest.raises(LookupLinkError):
        decode_request(received)
