"""common/java_hash.py: Java's ``String.hashCode``, the tags code of every consume-queue entry, the
subscription filter of remoting consumers and the sharding key's hash. Stored entries keep their
code, so the one implementation must give what the store's own gave for every tag it accepted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocols.java_hash import string_hash
from gateway.remoting.ordering import consistent_hash, sharding_queue
from protocols.remoting.tags import subscription_codes
from store import tag_hash

# any code point, lone surrogates (U+D800-U+DFFF, which Python strings may hold) often
every_char = st.one_of(st.characters(exclude_categories=()),
                       st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()))


def texts(min_size: int = 0, max_size: int = 30) -> st.SearchStrategy[str]:
    """Strings of ``every_char`` (joined lists: ``st.text`` leaves lone surrogates out)."""
    return st.lists(every_char, min_size=min_size, max_size=max_size).map("".join)


def _java_definition(s: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a signed 32-bit int."""
    raw = s.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
    h = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


def _store_tag_hash_before(tags: str | None) -> int:
    """The store's own tag hash before it used common/java_hash.py: the code of every
    consume-queue entry written so far (strict UTF-16: a lone surrogate raised)."""
    if not tags:
        return 0
    h = 0
    raw = tags.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def test_string_hash_is_java_string_hash_code() -> None:
    assert string_hash("TagA") == 2598919  # 84*31^3 + 97*31^2 + 103*31 + 65
    assert string_hash("") == 0
    assert string_hash("hello world") == 1794106052
    assert string_hash("polygenelubricants") == -(2**31)  # wraps to Integer.MIN_VALUE
    assert string_hash("\u4e2d\u6587") == 0x4E2D * 31 + 0x6587


def test_surrogates_hash_as_java_code_units() -> None:
    """Java hashes UTF-16 code units: a character outside the BMP is two, a lone surrogate one."""
    assert string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00
    assert string_hash("\ud83d\ude00") == string_hash("\U0001f600")  # the same two code units
    assert string_hash("\ud800") == 0xD800  # "\uD800".hashCode() in Java
    assert string_hash("a\udc00") == 97 * 31 + 0xDC00
    assert string_hash("\udfff\ud800x") == (0xDFFF * 31 + 0xD800) * 31 + ord("x")
    assert tag_hash("\ud800") == 0xD800
    assert subscription_codes("\ud800 || TagA") == {0xD800, 2598919}


@given(texts())
def test_string_hash_matches_its_definition(text: str) -> None:
    assert string_hash(text) == _java_definition(text)


@given(st.one_of(st.none(), texts()))
def test_stored_tag_codes_do_not_change(tags: str | None) -> None:
    """Every tag the store hashed before hashes the same; the ones it refused (a lone surrogate:
    UnicodeEncodeError) now get Java's code instead of failing the put or the recovery."""
    try:
        before = _store_tag_hash_before(tags)
    except UnicodeEncodeError:
        assert tags is not None and any(0xD800 <= ord(c) <= 0xDFFF for c in tags)
        assert tag_hash(tags) == _java_definition(tags)
    else:
        assert tag_hash(tags) == before


JAVA_TRIM = "".join(map(chr, range(0x21)))
plain_tags = texts(1, 20).filter(
    lambda t: t == t.strip(JAVA_TRIM) and "||" not in t and t != "*")


@given(plain_tags)
def test_subscriptions_select_the_codes_the_store_keeps(tag: str) -> None:
    assert subscription_codes(tag) == {tag_hash(tag)} == {_java_definition(tag)}


@given(texts(max_size=20), st.integers(1, 64))
def test_sharding_keys_hash_as_java_does(key: str, queues: int) -> None:
    """An ordered message's queue is Guava's consistentHash of the key's ``hashCode``."""
    assert sharding_queue(key, queues) == consistent_hash(_java_definition(key), queues)
