"""TLS to etcd: which files, checked once, and the gRPC credentials read from them for each new channel.

Guarantees: the server's certificate is always verified (against
``ca_file``, else the system's CA bundle, never gRPC's bundled roots); a
missing, unreadable or unparsable file, an encrypted key or a certificate
without its key is a ValueError when the options are built, not a late
surprise; renewed files are read again for every new channel.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

import grpc

from ...core._errors import PermanentBackendError

__all__ = ["EtcdTLS"]


def _no_passphrase() -> str:
    raise ValueError("the private key is encrypted; gRPC needs an unencrypted PEM key")


# Where distributions keep their CA bundle, after OpenSSL's own default (which honours SSL_CERT_FILE).
_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


@dataclass(frozen=True)
class EtcdTLS:
    """TLS to etcd: the server verified against ``ca_file`` (else the system CAs), optional client certificate.

    Files are checked when this is built (:meth:`load`) and read again for
    each new gRPC channel, so renewed certificates are used from the next
    reconnect on.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def load(cls, ca_file: str | None, cert_file: str | None, key_file: str | None) -> EtcdTLS:
        """Check the files (exist, parse, key matches certificate); raise ValueError saying which is wrong."""
        paths: dict[str, str | None] = {}
        for option, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if value is not None:
                if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                    raise ValueError(f"{option} must be a file path")
                value = os.fspath(value)
                if not os.path.isfile(value):
                    raise ValueError(f"{option} {value!r} does not exist or is not a file")
            paths[option] = value
        tls = cls(**paths)
        if (tls.cert_file is None) != (tls.key_file is None):
            raise ValueError("cert_file and key_file go together: pass both (a PEM certificate and its key) or neither")
        tls.context()  # parses every file now: a bad one is a ValueError at construction, not a late surprise
        return tls

    def context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` equivalent to the gRPC credentials (used to diagnose failed handshakes)."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ca_file {self.ca_file!r} holds no usable PEM CA certificate: {exc}") from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the client certificate {self.cert_file!r}: {exc}") from None
        context.set_alpn_protocols(["h2"])
        return context

    def _roots(self) -> bytes | None:
        if self.ca_file is not None:
            return _read(self.ca_file, "ca_file")
        # gRPC would use its own bundled roots; the system's are what users expect and manage.
        for path in (ssl.get_default_verify_paths().cafile, *_CA_BUNDLES):
            if path and os.path.isfile(path):
                return _read(path, "the system CA bundle")
        return None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files as they are now; ElectionError if one cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._roots(),
            private_key=_read(self.key_file, "key_file") if self.key_file is not None else None,
            certificate_chain=_read(self.cert_file, "cert_file") if self.cert_file is not None else None,
        )

    def describe(self) -> str:
        parts = [f"ca_file={self.ca_file}" if self.ca_file else "system CAs"]
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        return "TLS (" + ", ".join(parts) + ")"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise PermanentBackendError(f"cannot read {what} {path!r}: {exc.strerror}") from None
