"""The TideMQ gateway: configuration, CLI, and the asyncio servers of each protocol."""

from .native import install as _install_native

# Before any other module of the project is imported: which build of the message path runs
# (compiled, or interpreted with TIDEMQ_PURE_PYTHON=1); see gateway/native.py.
_install_native()

__version__ = "0.1.0"
