"""The server side of TLS, for every TLS listener (MQTT's, gRPC's): the certificate chain and
private key of ``tls_cert_file`` and ``tls_key_file``, checked once with a ConfigError that
names the setting and the file (ssl's and grpcio's own errors name neither)."""

from __future__ import annotations

import ssl

from .config import Config, ConfigError


def tls_context(cfg: Config) -> ssl.SSLContext:
    """The server context of the TLS listener; a certificate or key that cannot be used is a
    ConfigError naming the setting and the file (ssl's own errors name neither)."""
    for name in ("tls_cert_file", "tls_key_file"):
        path = getattr(cfg, name)
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{name}: cannot read {path!r}: {exc.strerror or exc}") from None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"tls_cert_file {cfg.tls_cert_file!r} and tls_key_file {cfg.tls_key_file!r}: "
                          f"not a PEM certificate chain and its private key ({exc.reason or exc})") from None
    return ctx


def key_and_chain(cfg: Config) -> tuple[bytes, bytes]:
    """The PEM private key and certificate chain, as grpcio takes them; checked as ``tls_context``."""
    tls_context(cfg)
    with open(cfg.tls_key_file, "rb") as key, open(cfg.tls_cert_file, "rb") as chain:
        return key.read(), chain.read()
