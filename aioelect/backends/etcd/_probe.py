"""Why a connection to etcd failed, when gRPC cannot say: a TLS handshake and an HTTP/2 preface of our own.

gRPC reports every failed connection as UNAVAILABLE with terse details
("Socket closed", "Unwrap failed"), alike for a dying server and a refused
certificate. :func:`diagnose_tls` tells them apart with plain sockets.
Guarantees: it names a failure that can never go away as configured (an
untrusted or refused certificate, TLS on one side only) and returns None for
all else (refused, reset, timed out: transient); every step is bounded by
its ``timeout``; it sends nothing but a handshake and an HTTP/2 preface.
"""

from __future__ import annotations

import socket
import ssl

from ._endpoints import Endpoint
from ._tls import EtcdTLS

__all__ = ["diagnose_tls"]

# An HTTP/2 client preface and an empty SETTINGS frame: any gRPC server answers with its own SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_h2(sock: socket.socket) -> bool:
    """True if the peer answers an HTTP/2 preface with a SETTINGS frame, as gRPC servers do."""
    sock.sendall(_H2_PREFACE)
    data = b""
    while len(data) < 4:
        chunk = sock.recv(9 - len(data))
        if not chunk:
            return False
        data += chunk
    return data[3] == 0x04


def _client_cert_refused(reason: str) -> bool:
    reason = reason.upper()
    return "ALERT" in reason and any(t in reason for t in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED"))


def diagnose_tls(endpoint: Endpoint, tls: EtcdTLS | None, timeout: float) -> str | None:
    """Why a connection to ``endpoint`` can never work as configured, found by a handshake of our own; else None.

    gRPC reports every failed connection as UNAVAILABLE with terse details
    ("Socket closed", "Unwrap failed"), alike for a dying server and a
    refused certificate. A refused certificate, a server that does not speak
    TLS (or that requires it) will never work and must not be retried; all
    else (refused connection, timeout, reset) returns None: transient.
    Blocking, each step bounded by ``timeout``: run it in a thread.
    """
    address = (endpoint.host, endpoint.port)
    where = f"etcd at {endpoint}"

    def plain_h2() -> bool:
        try:
            with socket.create_connection(address, timeout=timeout) as raw:
                return _speaks_h2(raw)
        except OSError:
            return False

    if tls is None:
        if plain_h2():
            return None
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        try:
            with socket.create_connection(address, timeout=timeout) as raw, insecure.wrap_socket(raw):
                pass
        except ssl.SSLError as exc:
            if "ALERT" not in str(exc.reason).upper():
                return None
        except OSError:
            return None
        return (
            f"{where} requires TLS: use https:// endpoints (with ca_file, and cert_file/key_file if it "
            "runs with --client-cert-auth)"
        )

    try:
        context = tls.context()
    except ValueError as exc:  # a file changed since construction
        return str(exc)
    trust = f"ca_file {tls.ca_file}" if tls.ca_file else "the system CAs"
    try:
        with socket.create_connection(address, timeout=timeout) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=endpoint.host) as conn:
                    # TLS 1.3: the server judges our certificate after the handshake, and says so on the first read.
                    _speaks_h2(conn)
                    return None
            except ssl.SSLCertVerificationError as exc:
                return (
                    f"TLS: {where} presented a certificate that {trust} does not accept "
                    f"({exc.verify_message}); check ca_file and that the certificate names {endpoint.host}"
                )
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, BrokenPipeError):
                pass  # closed on us: does it speak plain HTTP/2 instead? See below.
            except ssl.SSLError as exc:
                reason = str(exc.reason or exc)
                if _client_cert_refused(reason):
                    if tls.cert_file is None:
                        return (
                            f"TLS: {where} requires a client certificate (it runs with --client-cert-auth): "
                            f"pass cert_file and key_file ({reason})"
                        )
                    return (
                        f"TLS: {where} refused our client certificate {tls.cert_file} ({reason}): it must be "
                        "signed by a CA in etcd's --trusted-ca-file"
                    )
                if "ALERT" in reason.upper():
                    return f"TLS: {where} refused the handshake ({reason})"
    except OSError:
        return None  # refused, unreachable, timed out: nothing to say about TLS
    if plain_h2():
        return (
            f"TLS: {where} does not speak TLS (it answered in plain HTTP/2): use http:// endpoints, "
            "without ca_file/cert_file/key_file"
        )
    return None
