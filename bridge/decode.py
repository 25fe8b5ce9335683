"""Device streams as columns, for Spark jobs over the ``tidemq`` source: JSON payloads decoded
into a struct with an ``error`` column instead of a failed job (``decode_json``), and MQTT topic
levels mapped to columns with a template like ``devices/{device}/telemetry`` (``topic_columns``;
``format_topic`` builds topics the other way). Pure functions from DataFrame to DataFrame (or
to a Column), built from Spark SQL expressions only: no Python UDF, nothing per row in Python.

Templates are MQTT topic filters whose capturing levels are named: ``{name}`` matches one level
and makes it a column, ``+`` matches one level, a final ``#`` the rest (and the parent level, as
in MQTT); a template that starts with a wildcard does not match ``$`` topics. Its filter
(``topic_filter``) is what to subscribe to, e.g. the source's ``topicFilter`` option.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    StringType,
    StructField,
    StructType,
    _parse_datatype_string,
)

from protocols.mqtt.topics import TopicError, validate_topic_filter

_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CORRUPT = "_tidemq_corrupt"  # from_json puts an undecodable record here
_PARSED = "_tidemq_parsed"  # the parsed struct while decode_json builds its columns
SNIPPET = 80  # characters of an undecodable payload quoted in its error


def _levels(template: str) -> list[tuple[str, str | None]]:
    """(level, captured column name or None) per level, the template checked."""
    out: list[tuple[str, str | None]] = []
    for level in template.split("/"):
        found = _NAME.fullmatch(level)
        if found:
            out.append(("+", found.group(1)))
        elif "{" in level or "}" in level:
            raise ValueError(f"topic template {template!r}: {{name}} must be a whole level, named like a column")
        else:
            out.append((level, None))
    names = [n for _, n in out if n]
    if len(set(names)) != len(names):
        raise ValueError(f"topic template {template!r} names a level twice")
    try:
        validate_topic_filter("/".join(level for level, _ in out))
    except TopicError as exc:
        raise ValueError(f"topic template {template!r}: {exc}") from None
    return out


def level_names(template: str) -> list[str]:
    """The column names a template captures, in order: ``devices/{device}/telemetry`` -> ``["device"]``."""
    return [name for _, name in _levels(template) if name]


def topic_filter(template: str) -> str:
    """The MQTT filter a template matches: ``devices/{device}/telemetry`` -> ``devices/+/telemetry``."""
    return "/".join(level for level, _ in _levels(template))


def topic_columns(df: DataFrame, template: str, column: str = "topic") -> DataFrame:
    """``df`` with a string column per ``{name}`` of ``template``, from the levels of ``column``;
    null in all of them where the topic does not match the template."""
    levels = _levels(template)
    taken = [n for _, n in levels if n and n in df.columns]
    if taken:
        raise ValueError(f"topic_columns: the DataFrame already has column(s) {', '.join(taken)}")
    parts = F.split(F.col(column), "/", -1)
    count = F.size(parts)
    if levels[-1][0] == "#":
        fixed = levels[:-1]
        matched = count >= F.lit(len(fixed))  # "a/#" matches "a" too
    else:
        fixed = levels
        matched = count == F.lit(len(fixed))
    for i, (level, _) in enumerate(fixed):
        if level != "+":
            matched = matched & (F.element_at(parts, i + 1) == F.lit(level))
    if levels[0][0] in ("+", "#"):
        matched = matched & ~F.col(column).startswith("$")
    # an empty level ("devices//telemetry") matches "+" in MQTT; as a value it is ""
    captured = {name: F.when(matched, F.element_at(parts, i + 1)) for i, (_, name) in enumerate(levels) if name}
    return df.withColumns(captured)


def format_topic(template: str) -> Column:
    """A topic column from a template whose ``{name}`` levels are columns:
    ``format_topic("alerts/{device}")`` is ``concat("alerts/", device)``. A level value that is
    not a valid topic level (``+``, ``#``, ``/``) makes an invalid topic, which the sink reports."""
    parts: list[Column] = []
    for i, level in enumerate(template.split("/")):
        if i:
            parts.append(F.lit("/"))
        found = _NAME.fullmatch(level)
        parts.append(F.col(found.group(1)).cast("string") if found else F.lit(level))
    return F.concat(*parts)


def decode_json(df: DataFrame, schema: StructType | str, column: str = "payload", into: str = "data",
                error: str = "error", required: tuple[str, ...] = ()) -> DataFrame:
    """``df`` with ``into``, the JSON object in ``column`` (binary or string) parsed with
    ``schema`` (a StructType or DDL such as ``"temp double, ts double"``), and ``error``: null
    when decoded, else why not -- no payload, empty, not UTF-8, not JSON, not a JSON object, a
    field of the wrong type, or a ``required`` field missing -- with ``into`` null then.
    Fields not in the schema are ignored; absent ones are null (unless required)."""
    if isinstance(schema, str):
        parsed = _parse_datatype_string(schema)
        if not isinstance(parsed, StructType):
            raise TypeError(f"decode_json: the schema must be a struct, not {parsed.simpleString()}")
        schema = parsed
    missing = [name for name in required if name not in schema.fieldNames()]
    if missing:
        raise ValueError(f"decode_json: required field(s) {', '.join(missing)} not in the schema")
    raw = F.col(column)
    text = raw.cast("string")
    with_corrupt = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
    parsed_json = F.from_json(text, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    value = F.col(_PARSED)  # parsed once, as a column of its own
    snippet = F.substring(text, 1, SNIPPET)
    why = F.when(raw.isNull(), F.lit("no payload"))
    if isinstance(df.schema[column].dataType, StringType):
        utf8 = F.lit(True)
    else:
        utf8 = F.is_valid_utf8(raw)
    why = why.when(~utf8, F.lit("payload is not UTF-8"))
    why = why.when(F.trim(text) == "", F.lit("empty payload"))
    corrupt = value.getField(_CORRUPT).isNotNull()
    why = why.when(corrupt & F.get_json_object(text, "$").isNull(),
                   F.concat(F.lit("payload is not JSON: "), snippet))
    why = why.when(corrupt & ~F.ltrim(text).startswith("{"), F.concat(F.lit("payload is not a JSON object: "), snippet))
    for f in schema.fields:  # which field does not fit (top level)
        path = "$." + f.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f.name) else f"$['{f.name}']"
        given = F.get_json_object(text, path)
        why = why.when(corrupt & value.getField(f.name).isNull() & given.isNotNull(),
                       F.concat(F.lit(f"field {f.name} is not {f.dataType.simpleString()}: "),
                                F.substring(given, 1, SNIPPET)))
    why = why.when(corrupt, F.concat(F.lit(f"payload does not fit {schema.simpleString()}: "), snippet))
    for name in required:
        why = why.when(value.getField(name).isNull(), F.lit(f"missing field {name}"))
    fields = schema.fieldNames()
    decoded = F.struct(*[value.getField(n).alias(n) for n in fields])
    return df.withColumn(_PARSED, parsed_json).withColumn(error, why).withColumn(
        into, F.when(F.col(error).isNull(), decoded)).drop(_PARSED)
