"""HTTP/1.1 for a client that POSTs and reads the answers on a keep-alive connection, sans-IO:
the request's bytes (``request.py``) and the answers read from the bytes that come back
(``response.py``)."""

from .request import RequestHead
from .response import Answer, ResponseError, ResponseReader

__all__ = ["Answer", "RequestHead", "ResponseError", "ResponseReader"]
