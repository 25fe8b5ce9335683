"""protocols/cloudevents as a codec (hypothesis): any valid attributes survive binary mode (as
strings, which binary modes carry), structured mode (with their types) and the ``ce-`` message
properties; what the attribute checks refuse."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.cloudevents import (
    CloudEventError,
    attribute_text,
    binary_headers,
    check_attributes,
    from_http,
    from_properties,
    structured_document,
    to_properties,
)

RESERVED = {"specversion", "id", "source", "type", "time", "datacontenttype", "data", "data_base64"}
text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
extensions = st.dictionaries(st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True).filter(lambda n: n not in RESERVED),
                             st.one_of(text, st.booleans(), st.integers(-(2**31), 2**31 - 1)), max_size=5)


def event(id_: str, source: str, ext: dict) -> dict:
    return {"specversion": "1.0", "id": id_, "source": source, "type": "com.example.t", **ext}


@given(text, text, extensions, st.binary(max_size=64))
def test_binary_mode_carries_every_attribute_as_its_canonical_string(id_: str, source: str, ext: dict,
                                                                     body: bytes) -> None:
    attributes = event(id_, source, ext)
    headers = binary_headers(attributes, "application/octet-stream")
    [envelope] = from_http(headers["Content-Type"], headers, body)
    assert envelope.attributes == {**{k: attribute_text(v) for k, v in attributes.items()},
                                   "datacontenttype": "application/octet-stream"}
    assert envelope.data == body


@given(text, text, extensions, st.one_of(st.binary(max_size=64), st.dictionaries(text, st.integers(), max_size=3)))
def test_structured_mode_keeps_the_attributes_types_and_the_data(id_: str, source: str, ext: dict, data) -> None:
    attributes = event(id_, source, ext)
    if isinstance(data, bytes):
        content_type, body = "application/octet-stream", data
    else:
        content_type, body = "application/json", json.dumps(data).encode()
    document = structured_document(attributes, content_type, body)
    [envelope] = from_http("application/cloudevents+json", {}, json.dumps(document).encode())
    assert envelope.attributes == {**attributes, "datacontenttype": content_type}
    assert envelope.data == body if isinstance(data, bytes) else json.loads(envelope.data) == data


@given(text, text, extensions)
def test_the_ce_properties_give_back_the_attributes(id_: str, source: str, ext: dict) -> None:
    attributes = event(id_, source, ext)
    assert from_properties(dict(to_properties(attributes))) == {k: attribute_text(v) for k, v in attributes.items()}


@pytest.mark.parametrize("attributes, reason", [
    ({"specversion": "1.0", "id": "1", "source": "/s"}, "required attribute type is missing"),
    ({"specversion": "1.0", "id": "", "source": "/s", "type": "t"}, "attribute id: an empty string"),
    ({"specversion": "1.0", "id": 1, "source": "/s", "type": "t"}, "attribute id: a string"),
    ({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "n": 2**31}, "signed 32-bit"),
    ({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "n": 1.5}, "not float"),
    ({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "x-y": "1"}, "lower-case letters"),
    ({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "time": "2026-02-30T00:00:00Z"}, "time"),
    ({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "subject": True}, "attribute subject: a string"),
])
def test_attributes_the_specification_refuses(attributes: dict, reason: str) -> None:
    with pytest.raises(CloudEventError, match=reason):
        check_attributes(attributes)
