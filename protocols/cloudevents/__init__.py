"""CloudEvents 1.0, sans-IO: the context attributes (checked, and carried as ``ce-`` message
properties), the JSON event format (structured and batch content modes) and the HTTP protocol
binding's binary mode. What the gateway's ingest endpoint reads and the rules' webhook target
writes, in one place."""

from .attributes import (
    PROPERTY_PREFIX,
    REQUIRED,
    SPEC_VERSION,
    CloudEventError,
    attribute_text,
    check_attributes,
    from_properties,
    to_properties,
)
from .http_binding import BATCH, STRUCTURED, Envelope, binary_headers, from_http, header_value
from .json_format import is_json_type, structured_document

__all__ = ["BATCH", "PROPERTY_PREFIX", "REQUIRED", "SPEC_VERSION", "STRUCTURED", "CloudEventError", "Envelope",
           "attribute_text", "binary_headers", "check_attributes", "from_http", "from_properties", "header_value",
           "is_json_type", "structured_document", "to_properties"]
