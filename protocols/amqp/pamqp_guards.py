"""Where pamqp's codec is wrong for a server, replaced (``install``, run once by ``frames`` on
import) in pamqp's own dispatch, so that every AMQP decode and encode goes through them: the
reader's, the gateway's, the tests'. Two decoders that never return on hostile input, and one
encoder that loses data:

- ``ContentHeader._get_flags`` re-reads the first flag word for as long as its continuation
  bit is set, that is for ever. Basic has 14 properties, one word holds them all: a continued
  flag word is refused (ValueError: the frame does not decode, 502 syntax-error).
- ``decode.field_array`` decodes elements until its declared length is reached; once the data
  runs out each further element is ``None`` from no bytes, for ever. The same loop here refuses
  an array longer than the data left; everything pamqp decoded before it decodes the same.
- ``encode.encode_table_value`` writes a float as a 32-bit 'f': a double a client sent (pika,
  py-amqp write 'd') lost its precision, or failed to encode beyond float32's range, when the
  gateway wrote a table again (a dead letter's headers). Floats are written as 'd' here.
"""

from __future__ import annotations

from pamqp import common, decode, encode
from pamqp import header as pheader

CONTINUED = 0x0001


def content_header_flags(data: bytes) -> tuple[int, int]:
    """(bytes consumed, flags) of a content header's property flags, as pamqp reads them."""
    consumed, flags = decode.short_int(data)
    if flags & CONTINUED:
        raise ValueError("property flags continued past basic's 14 properties")
    return consumed, flags


def field_array(value: bytes) -> tuple[int, list[common.FieldValue]]:
    try:
        length = common.Struct.integer.unpack(value[0:4])[0]
        offset = 4
        data = []
        end = offset + length
        while offset < end:
            if offset >= len(value):
                raise ValueError("field array longer than its data")
            consumed, result = decode.embedded_value(value[offset:])
            offset += consumed
            data.append(result)
        return offset, data
    except TypeError:
        raise ValueError("Could not unpack data") from None


_pamqp_table_value = encode.encode_table_value


def table_value(value: common.FieldValue) -> bytes:
    if isinstance(value, float):
        return b"d" + encode.double(value)
    return _pamqp_table_value(value)


def install() -> None:
    # (the patch is the point)
    pheader.ContentHeader._get_flags = staticmethod(content_header_flags)  # type: ignore[method-assign]
    decode.METHODS["array"] = field_array
    decode.TABLE_MAPPING[b"A"] = field_array
    encode.encode_table_value = table_value
