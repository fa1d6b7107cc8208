"""How the PostgreSQL backend encrypts its connections: libpq's ``sslmode`` rules, resolved once.

This module owns the TLS plan of :mod:`aioelect.backends.sql.postgres`: which
attempts a connection makes (plaintext, TLS, in libpq's order for each
``sslmode``), with which certificates, and when a failed attempt is followed
by the next. It guarantees that a mode that verifies never connects without a
verified certificate, and that a file named but missing is a ValueError.
"""

from __future__ import annotations

import os
import ssl as _ssl
from dataclasses import dataclass

__all__ = ["SSL_MODES", "TLS_FILES", "Tls", "no_tls", "resolve_tls", "transport_fix"]

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: The DSN parameters naming certificate files.
TLS_FILES = ("sslrootcert", "sslcert", "sslkey")


@dataclass(frozen=True)
class Tls:
    """How every connection is encrypted, resolved once with libpq's rules.

    ``attempts`` are tried in order: ``False`` is plaintext, a context is TLS.
    ``prefer`` tries TLS and falls back to plaintext when the server has no
    TLS or the TLS attempt fails; ``allow`` tries plaintext first and TLS when
    the server refuses it; the other modes make one attempt.
    """

    mode: str
    attempts: tuple[_ssl.SSLContext | bool, ...]
    #: Every connection is encrypted (no plaintext attempt at all).
    encrypted: bool
    #: The server's certificate chain is verified on every TLS attempt.
    verified: bool


def _home_file(name: str) -> str | None:
    """``~/.postgresql/<name>`` if it exists (libpq's default location), else None."""
    path = os.path.join(os.path.expanduser("~"), ".postgresql", name)
    return path if os.path.exists(path) else None


def _given_file(option: str, value: str | None) -> str | None:
    if value is not None and value != "" and not os.path.isfile(value):
        raise ValueError(f"{option} file {value!r} does not exist")
    return value or None


def resolve_tls(tls: dict[str, str], ssl: _ssl.SSLContext | str | None, host: str) -> Tls:
    """The TLS plan of libpq for the DSN's ``tls`` parameters, the ``ssl`` argument and the PG* variables.

    As libpq: sslmode from ``ssl``, the DSN or ``PGSSLMODE``, default
    ``prefer``; sslrootcert, sslcert and sslkey from the DSN, ``PGSSLROOTCERT``,
    ``PGSSLCERT``, ``PGSSLKEY`` or ``~/.postgresql/`` (root.crt,
    postgresql.crt, postgresql.key). A root certificate makes every TLS
    attempt verify the chain (so ``require`` verifies as ``verify-ca`` does);
    ``verify-full`` also checks the host name; ``sslrootcert=system`` uses the
    system's CAs and needs ``verify-full``. Stricter than libpq: a file named
    that does not exist is a ValueError, and a root certificate named in the
    DSN or ``PGSSLROOTCERT`` without any sslmode means ``verify-full``.
    """
    if isinstance(ssl, _ssl.SSLContext):
        return Tls("context", (ssl,), encrypted=True, verified=ssl.verify_mode != _ssl.CERT_NONE)
    mode = ssl if ssl is not None else tls.get("sslmode") or os.environ.get("PGSSLMODE") or None
    if mode is not None and mode not in SSL_MODES:
        raise ValueError(f"sslmode must be one of {', '.join(SSL_MODES)}, not {mode!r}")
    given_root = tls.get("sslrootcert") or os.environ.get("PGSSLROOTCERT") or None
    if mode is None:
        mode = "verify-full" if given_root else "prefer"
    if mode == "disable" or host.startswith("/"):  # libpq never uses TLS on a Unix socket
        return Tls(mode, (False,), encrypted=host.startswith("/"), verified=host.startswith("/"))
    context = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = _ssl.TLSVersion.TLSv1_2
    if given_root == "system":
        if mode != "verify-full":
            raise ValueError(f"sslrootcert=system needs sslmode=verify-full, not {mode!r}")
        context.load_default_certs()
        root: str | None = "system"
    else:
        root = _given_file("sslrootcert", given_root) or _home_file("root.crt")
        if root is None and mode in ("verify-ca", "verify-full"):
            raise ValueError(
                f"sslmode={mode} needs a root certificate: sslrootcert=PATH (or PGSSLROOTCERT, "
                "~/.postgresql/root.crt), or sslrootcert=system for the system's CAs"
            )
        if root is not None:
            try:
                context.load_verify_locations(cafile=root)
            except (OSError, _ssl.SSLError) as exc:
                raise ValueError(f"cannot load the root certificate {root!r}: {exc}") from None
    context.check_hostname = mode == "verify-full"
    context.verify_mode = _ssl.CERT_REQUIRED if root is not None else _ssl.CERT_NONE
    cert = _given_file("sslcert", tls.get("sslcert") or os.environ.get("PGSSLCERT")) or _home_file("postgresql.crt")
    key = _given_file("sslkey", tls.get("sslkey") or os.environ.get("PGSSLKEY")) or _home_file("postgresql.key")
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, _ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client certificate: {exc}") from None
    verified = root is not None
    if mode == "allow":
        return Tls(mode, (False, context), encrypted=False, verified=verified)
    if mode == "prefer":
        return Tls(mode, (context, False), encrypted=False, verified=verified)
    return Tls(mode, (context,), encrypted=True, verified=verified)


def no_tls(exc: BaseException) -> bool:
    """asyncpg's answer to a server that said no to TLS (a bare ConnectionError)."""
    return type(exc) is ConnectionError and "rejected SSL upgrade" in str(exc)


def transport_fix(plan: Tls) -> str:
    """What to change so that ``plan`` encrypts and verifies, for the transport warning."""
    fix = (
        "use sslmode=verify-full with sslrootcert=PATH, or sslrootcert=system"
        if plan.mode in ("disable", "allow", "prefer")
        else "give sslrootcert=PATH so the server's certificate is verified"
    )
    if plan.mode == "prefer":
        fix = "sslmode=prefer falls back to plaintext when TLS fails or is not offered; " + fix
    return fix
