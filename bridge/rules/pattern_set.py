"""Many named patterns matched at once (``PatternSet``). Each pattern is split into branches
(one per way through its ``$or`` lists); a branch is indexed by up to two fields it needs
(exact values and equals-ignore-case in hash tables, prefixes and suffixes by length, numeric
ranges and CIDR blocks in sorted tables of bounds). An event reads each indexed field once, and
only the patterns of branches whose indexed fields all hit are tested in full. Hits are bits
of one integer: a branch owns two adjacent bits, one per anchor (both for a branch of one), so
the branches whose anchors all hit are the bits of ``hits & (hits >> 1)``."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .matchers import (
    MISSING,
    Cidr,
    Exact,
    Exists,
    IgnoreCase,
    Matcher,
    Numeric,
    Prefix,
    Suffix,
    address_value,
    leaf_values,
    objects_in,
)
from .pattern_parser import FieldNode, ObjectNode
from .patterns import CompiledPattern, compile_pattern

MAX_BRANCHES = 16  # a pattern whose $or lists multiply to more is tested against every event
ANCHORS = 2  # fields indexed per branch

Collect = Callable[[Any], int]  # a leaf value -> the bits of the anchors it hits


def _path_values(event: Any, path: tuple[str, ...]) -> list[Any]:
    """The leaf values at ``path``, objects in lists along the way and lists at the end
    flattened as the matchers see them."""
    current = [event]
    for key in path:
        nxt: list[Any] = []
        for node in current:
            for obj in (node,) if type(node) is dict else objects_in(node) if type(node) is list else ():
                if key in obj:
                    nxt.append(obj[key])
        if not nxt:
            return nxt
        current = nxt
    return leaf_values(current)


@dataclass(frozen=True, slots=True)
class Anchor:
    """A field a branch needs, as the index looks it up; ``rank``: how selective (lower: more)."""

    path: tuple[str, ...]
    matchers: tuple[Matcher, ...]
    rank: int


def _rank(matchers: tuple[Matcher, ...]) -> int | None:
    """How selective a field's matchers are as an index key (None: not usable: exists:false
    matches an absent field, which no lookup of a value finds)."""
    worst = 0
    for m in matchers:
        if isinstance(m, Exists) and not m.present:
            return None
        rank = (0 if isinstance(m, (Exact, IgnoreCase)) else 1 if isinstance(m, (Prefix, Suffix))
                else 2 if isinstance(m, (Numeric, Cidr)) else 3)
        worst = max(worst, rank)
    return worst


def branches(node: ObjectNode) -> list[list[FieldNode]] | None:
    """The AND-ed leaf fields of each way through the pattern's $or lists (None: more than
    MAX_BRANCHES ways)."""
    ways: list[list[FieldNode]] = [[]]
    for _, child in node.fields:
        if isinstance(child, FieldNode):
            for way in ways:
                way.append(child)
            continue
        inner = branches(child)
        if inner is None:
            return None
        ways = [way + extra for way in ways for extra in inner]
        if len(ways) > MAX_BRANCHES:
            return None
    if node.alternatives:
        options: list[list[FieldNode]] = []
        for alternative in node.alternatives:
            inner = branches(alternative)
            if inner is None:
                return None
            options.extend(inner)
        ways = [way + extra for way in ways for extra in options]
        if len(ways) > MAX_BRANCHES:
            return None
    return ways


def anchors(fields: list[FieldNode], shared: Mapping[tuple[Any, ...], int]) -> list[Anchor]:
    """Up to ANCHORS of a branch's fields, the most selective: first those that fewest other
    branches test the same way (``shared``: a value every rule asks for, such as one event
    type, selects no rule in particular), then by the kind of their matchers. A field that only
    asks for a value to be there (anything-but, wildcard, exists:true) is taken only when
    nothing better is; an exact value no other branch asks for is taken alone."""
    ranked = [Anchor(f.path, f.matchers, rank) for f in fields if (rank := _rank(f.matchers)) is not None]
    ranked.sort(key=lambda a: (shared.get(_anchor_key(a), 0), a.rank))
    good = [a for a in ranked if a.rank < 3]
    if len(good) > 1 and good[0].rank == 0 and good[1].rank == 2 and shared.get(_anchor_key(good[0]), 0) <= 1:
        return good[:1]  # (a value no other branch asks for, beside a range: the range adds more hits than it saves)
    return good[:ANCHORS] if good else ranked[:1]


def _anchor_key(anchor: Anchor) -> tuple[Any, ...]:
    return (anchor.path, anchor.matchers)


def _index_decides(way: list[FieldNode], chosen: list[Anchor]) -> bool:
    """Whether the index's hits are the whole test of a pattern of one branch: every field is
    indexed, by a lookup that is exactly its matchers (no field that only asks for a value to
    be there), and the fields cannot be met in different elements of one list of objects (one
    field, or fields of the event's top level), which the pattern would refuse."""
    return (len(chosen) == len(way) and all(a.rank < 3 for a in chosen)
            and (len(way) == 1 or all(len(a.path) == 1 for a in chosen)))


class _FieldIndex:
    """The anchors on one field, by what their matchers accept (each anchor as its bits);
    ``compile`` makes the function that answers the bits of the anchors a leaf value hits."""

    def __init__(self, path: tuple[str, ...]) -> None:
        self.path = path
        self.strings: dict[str, int] = {}
        self.numbers: dict[int | float, int] = {}
        self.constants: dict[str, int] = {}  # true, false, null (apart: True == 1 in Python)
        self.folded: dict[str, int] = {}
        self.prefixes: dict[tuple[int, bool], dict[str, int]] = {}  # by (length, ignore case)
        self.suffixes: dict[tuple[int, bool], dict[str, int]] = {}
        self.ranges: list[tuple[tuple[float, bool, float, bool], int]] = []
        self.networks: dict[int, list[tuple[tuple[float, bool, float, bool], int]]] = {4: [], 6: []}
        self.present = 0  # hit by any leaf value

    def add(self, bits: int, anchor: Anchor) -> None:
        for m in anchor.matchers:
            if isinstance(m, Exact):
                for v in m.values:
                    if type(v) is str:
                        _add_bits(self.strings, v, bits)
                    elif type(v) in (int, float):
                        _add_bits(self.numbers, v, bits)
                    else:
                        _add_bits(self.constants, _constant_key(v), bits)
            elif isinstance(m, IgnoreCase):
                for t in m.texts:
                    _add_bits(self.folded, t.casefold(), bits)
            elif isinstance(m, (Prefix, Suffix)):
                text = m.text.casefold() if m.ignore_case else m.text
                table = self.prefixes if isinstance(m, Prefix) else self.suffixes
                _add_bits(table.setdefault((len(text), m.ignore_case), {}), text, bits)
            elif isinstance(m, Numeric):
                self.ranges.extend((interval, bits) for interval in m.intervals)
            elif isinstance(m, Cidr):
                first, last = int(m.network.network_address), int(m.network.broadcast_address)
                self.networks[m.network.version].append(((first, True, last, True), bits))
            else:
                self.present |= bits

    def only_strings(self) -> bool:
        """Every anchor here is an exact string (the common case: one lookup per value)."""
        return not (self.numbers or self.constants or self.folded or self.prefixes or self.suffixes or self.ranges
                    or self.networks[4] or self.networks[6] or self.present)

    def compile(self) -> Collect:
        strings, numbers, constants, folded = self.strings, self.numbers, self.constants, self.folded
        prefixes = tuple((length, ignore, table) for (length, ignore), table in self.prefixes.items())
        suffixes = tuple((length, ignore, table) for (length, ignore), table in self.suffixes.items())
        in_range = _range_lookup(self.ranges)
        in_network = {version: _range_lookup(ranges) for version, ranges in self.networks.items() if ranges}
        present = self.present
        text_tables = bool(folded or prefixes or suffixes or in_network)

        def collect(v: Any) -> int:
            tv = type(v)
            out = present
            if tv is str:
                out |= strings.get(v, 0)
                if not text_tables:
                    return out
                if folded:
                    out |= folded.get(v.casefold(), 0)
                for length, ignore, table in prefixes:
                    out |= table.get((v.casefold() if ignore else v)[:length], 0)
                for length, ignore, table in suffixes:
                    text = v.casefold() if ignore else v
                    if length <= len(text):
                        out |= table.get(text[len(text) - length:], 0)
                if in_network:
                    address = address_value(v)
                    if address is not None:
                        lookup = in_network.get(address[0])
                        if lookup is not None:
                            out |= lookup(address[1])
            elif tv is int or tv is float:
                out |= numbers.get(v, 0)
                if in_range is not None:
                    out |= in_range(v)
            else:
                out |= constants.get(_constant_key(v), 0)
            return out
        return collect


def _add_bits(table: dict[Any, int], key: Any, bits: int) -> None:
    table[key] = table.get(key, 0) | bits


def _constant_key(v: object) -> str:
    return "true" if v is True else "false" if v is False else "null"


def _range_table(ranges: list[tuple[tuple[float, bool, float, bool], int]]
                 ) -> tuple[list[float], list[int]] | None:
    """The bounds of ``ranges``, sorted, and the bits of the ranges holding each bound (a point)
    and each open gap between two bounds, precomputed (a range's own bounds are among them, so
    a gap is wholly inside a range or wholly outside): answer ``2j`` is the gap below
    ``bounds[j]``, ``2j + 1`` the bound itself."""
    if not ranges:
        return None
    bounds = sorted({b for (lo, _, hi, _), _ in ranges for b in (lo, hi) if math.isfinite(b)})
    count = len(bounds)
    answers = [0] * (2 * count + 1)
    for (lo, lo_in, hi, hi_in), bits in ranges:
        for j, b in enumerate(bounds):
            if (b > lo or (lo_in and b == lo)) and (b < hi or (hi_in and b == hi)):
                answers[2 * j + 1] |= bits
        for j in range(count + 1):
            left = bounds[j - 1] if j else -math.inf
            right = bounds[j] if j < count else math.inf
            if lo <= left and right <= hi:
                answers[2 * j] |= bits
    return bounds, answers


def _range_lookup(ranges: list[tuple[tuple[float, bool, float, bool], int]]
                  ) -> Callable[[float], int] | None:
    """A number -> the bits of the ranges holding it, by bisection over ``_range_table``."""
    table = _range_table(ranges)
    if table is None:
        return None
    bounds, frozen = table
    count = len(bounds)
    search = bisect.bisect_left

    def lookup(v: float) -> int:
        if v != v:  # NaN: in no range
            return 0
        i = search(bounds, v)
        if i < count and bounds[i] == v:
            return frozen[2 * i + 1]
        return frozen[2 * i]
    return lookup


def _generate_collector(indexes: list[_FieldIndex], always: int) -> Callable[[dict[str, Any]], int]:
    """One function that reads every indexed field of an event once and returns the bits of the
    anchors its values hit (and ``always``): generated as straight-line Python (field names as literals made by
    ``repr``, tables bound by name), objects read level by level at any depth, so that the
    common case -- a string or a number in nested objects -- costs dictionary lookups and no
    call. Lists of values or objects, and the string operators other than exact values, go
    through each index's general ``collect``."""
    namespace: dict[str, Any] = {"MISSING": MISSING, "path_values": _path_values, "leaf_values": leaf_values}
    lines = ["def collect_hits(event):", f"    hits = {always}"]
    tree: _PathTree = {}
    for n, index in enumerate(indexes):
        namespace[f"C{n}"] = index.compile()
        node = tree
        for depth, key in enumerate(index.path):
            ending, node = node.setdefault(key, ([], {}))
            if depth == len(index.path) - 1:
                ending.append((n, index))
    _level_lines(tree, "event", 0, "    ", lines, namespace)
    lines.append("    return hits")
    exec(compile("\n".join(lines), "<pattern_set collector>", "exec"), namespace)
    return namespace["collect_hits"]


# a level of the indexed fields' paths: key -> (the indexes whose path ends there, the next level)
_PathTree = dict[str, tuple[list[tuple[int, "_FieldIndex"]], "_PathTree"]]


def _level_lines(tree: _PathTree, obj: str, depth: int, indent: str, lines: list[str],
                 namespace: dict[str, Any]) -> None:
    """The collector's code for the fields of ``tree`` in the dict named ``obj``; below, each
    object is read the same way and a list of objects by ``path_values``."""
    get = f"get{depth}"
    lines.append(f"{indent}{get} = {obj}.get")
    for key, (ending, below) in tree.items():
        var = f"v{len(lines)}"
        lines.append(f"{indent}{var} = {get}({key!r}, MISSING)")
        for n, index in ending:
            lines += _field_lines(n, index, var, indent, namespace)
        if below:
            lines.append(f"{indent}if type({var}) is dict:")
            _level_lines(below, var, depth + 1, indent + "    ", lines, namespace)
            lines.append(f"{indent}elif type({var}) is list:")
            for n, rest in _paths_below(below, ()):
                path = f"K{n}_{depth}"  # (the path from this level: index n has one per level)
                namespace[path] = rest
                lines += [f"{indent}    for x in path_values({var}, {path}):", f"{indent}        hits |= C{n}(x)"]


def _paths_below(tree: _PathTree, at: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """Each index under ``tree``, with its path from there."""
    out = []
    for key, (ending, below) in tree.items():
        out += [(n, (*at, key)) for n, _ in ending]
        out += _paths_below(below, (*at, key))
    return out


MEMO_SIZE = 4096  # string values remembered per field (cleared when full)


class _StringMemo:
    """A field's string values -> the bits of the anchors they hit, remembered: telemetry repeats its
    values (device ids, sites, statuses), and prefix, suffix, case-folded and CIDR lookups of a
    string cost more than one dictionary lookup."""

    def __init__(self, collect: Collect) -> None:
        self.known: dict[str, int] = {}
        self._collect = collect

    def __call__(self, value: str) -> int:
        if len(self.known) >= MEMO_SIZE:
            self.known.clear()
        found = self.known[value] = self._collect(value)
        return found


def _field_lines(n: int, index: _FieldIndex, var: str, indent: str, namespace: dict[str, Any]) -> list[str]:
    """The code that adds what the value in ``var`` (a field's value, or MISSING) hits: a
    string is one lookup (the exact table, or the memo), a number the exact table and the
    ranges; lists, null and booleans go through the field's general collect."""
    simple_strings = not (index.folded or index.prefixes or index.suffixes or index.networks[4]
                          or index.networks[6] or index.present)
    out = ["t = type(" + var + ")", "if t is str:"]
    if simple_strings:
        if index.strings:
            namespace[f"S{n}"] = index.strings.get
            out.append(f"    hits |= S{n}({var}, 0)")
        else:
            out.append("    pass")
    else:
        memo = _StringMemo(namespace[f"C{n}"])
        namespace[f"M{n}"], namespace[f"F{n}"] = memo.known.get, memo
        out += [f"    h = M{n}({var})", "    if h is None:", f"        h = F{n}({var})", "    hits |= h"]
    out.append("elif t is int or t is float:")
    if not index.present:
        body = []
        if index.numbers:
            namespace[f"N{n}"] = index.numbers.get
            body.append(f"    hits |= N{n}({var}, 0)")
        table = _range_table(index.ranges)
        if table is not None:  # (``_range_lookup`` inline: no call per number)
            namespace[f"B{n}"], namespace[f"A{n}"] = table
            namespace["bisect_left"] = bisect.bisect_left
            body += [f"    if {var} == {var}:",  # (NaN is in no range)
                     f"        i = bisect_left(B{n}, {var})",
                     f"        hits |= A{n}[2 * i + 1] if i < {len(table[0])} and B{n}[i] == {var} else A{n}[2 * i]"]
        out += body or ["    pass"]
    else:
        out.append(f"    hits |= C{n}({var})")
    out += ["elif t is list:",
            f"    for y in leaf_values({var}):",
            f"        hits |= C{n}(y)",
            f"elif {var} is not MISSING and t is not dict:",
            f"    hits |= C{n}({var})"]
    return [indent + line for line in out]


class PatternSet:
    """Named patterns; ``match(event)`` names those that match, in the order they were added."""

    def __init__(self, patterns: Mapping[str, CompiledPattern | str | Mapping[str, Any]] | None = None) -> None:
        self._patterns: dict[str, CompiledPattern] = {}
        self._match: Callable[[Any], list[str]] | None = None
        for name, pattern in (patterns or {}).items():
            self.add(name, pattern)

    def add(self, name: str, pattern: CompiledPattern | str | Mapping[str, Any]) -> CompiledPattern:
        """Add (or replace) ``name``; a pattern not yet compiled is (PatternError if bad)."""
        compiled = pattern if isinstance(pattern, CompiledPattern) else compile_pattern(pattern)
        self._patterns.pop(name, None)
        self._patterns[name] = compiled
        self._match = None
        return compiled

    def remove(self, name: str) -> None:
        del self._patterns[name]
        self._match = None

    def __len__(self) -> int:
        return len(self._patterns)

    def __contains__(self, name: object) -> bool:
        return name in self._patterns

    def names(self) -> Iterable[str]:
        return iter(self._patterns)

    def match(self, event: Any) -> list[str]:
        """The names of the patterns ``event`` (a decoded event, normally a dict) matches."""
        if self._match is None:
            self._match = self._build()
        return self._match(event)

    def _build(self) -> Callable[[Any], list[str]]:
        names = list(self._patterns)
        tests: list[Callable[[Any], bool] | None] = [p.check for p in self._patterns.values()]  # None: decided
        fields: dict[tuple[str, ...], _FieldIndex] = {}
        ordinal_of: list[int] = []  # branch b (bits 2b and 2b + 1) -> its pattern's ordinal, in order
        always = 0  # the bits of the patterns tested against every event
        ways_of = [branches(pattern.tree) for pattern in self._patterns.values()]
        shared: dict[tuple[Any, ...], int] = {}  # how many branches test a field the same way
        for ways in ways_of:
            for way in ways or []:
                for f in way:
                    key = (f.path, f.matchers)
                    shared[key] = shared.get(key, 0) + 1
        for ordinal, ways in enumerate(ways_of):
            for way in ways if ways is not None else [[]]:
                chosen = anchors(way, shared)
                shift = 2 * len(ordinal_of)
                ordinal_of.append(ordinal)
                if not chosen:
                    always |= 3 << shift
                    break
                if ways is not None and len(ways) == 1 and _index_decides(way, chosen):
                    tests[ordinal] = None
                own = (3,) if len(chosen) == 1 else (1, 2)
                for bits, anchor in zip(own, chosen):
                    fields.setdefault(anchor.path, _FieldIndex(anchor.path)).add(bits << shift, anchor)
        collect_hits = _generate_collector(list(fields.values()), always)
        firsts = int("01" * len(ordinal_of), 2) if ordinal_of else 0  # the lower bit of every branch

        def match(event: Any) -> list[str]:
            if type(event) is not dict:
                event = {}
            hits = collect_hits(event)
            whole = hits & (hits >> 1) & firsts  # the branches whose anchors all hit
            out: list[str] = []
            last = -1
            while whole:
                low = whole & -whole
                whole ^= low
                ordinal = ordinal_of[low.bit_length() >> 1]
                if ordinal != last:  # (a pattern's branches are next to each other)
                    last = ordinal
                    test = tests[ordinal]
                    if test is None or test(event):
                        out.append(names[ordinal])
            return out
        return match
