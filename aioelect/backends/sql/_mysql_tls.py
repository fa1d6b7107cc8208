"""How the MySQL backend encrypts its connections: the TLS a DSN's query asks for, in MySQL's ``ssl-mode`` terms.

This module owns the TLS parsing of :mod:`aioelect.backends.sql.mysql`, as
:mod:`aioelect.backends.sql._postgres_tls` does for PostgreSQL: a mode that
verifies never connects without a verified certificate, and a missing file,
an unknown key or a contradiction is a ValueError that names it.
"""

from __future__ import annotations

import os
import ssl

__all__ = ["tls_context", "tls_from_query"]


def tls_context(
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    verify_identity: bool = True,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client TLS context: server verified against ``ca`` (or the system CAs), optional client certificate.

    ``verify=False`` encrypts without verifying the server (MySQL's
    ``ssl-mode=REQUIRED``); ``verify_identity=False`` verifies the chain but
    not the host name. Missing or unreadable files raise ValueError.
    """
    for option, path in (("ssl-ca", ca), ("ssl-cert", cert), ("ssl-key", key)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{option} file {path!r} does not exist")
    if key is not None and cert is None:
        raise ValueError("ssl-key needs ssl-cert")
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the ssl-ca file {ca!r}: {exc}") from None
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif not verify_identity:
        context.check_hostname = False
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client certificate: {exc}") from None
    return context


_MYSQL_TLS_KEYS = ("ssl-mode", "ssl-ca", "ssl-cert", "ssl-key")
_MYSQL_SSL_MODES = ("DISABLED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")


def tls_from_query(query: dict[str, str]) -> ssl.SSLContext | None:
    """The TLS context a MySQL DSN's query asks for, or None for a plaintext connection.

    Read, each in MySQL's spelling (``ssl-mode``) or PyMySQL's and
    SQLAlchemy's (``ssl_mode``): ``ssl-mode`` (DISABLED, REQUIRED, VERIFY_CA,
    VERIFY_IDENTITY, any case; VERIFY_IDENTITY when only files are given),
    ``ssl-ca``, ``ssl-cert``, ``ssl-key``. Any other key, a key given in both
    spellings, ``PREFERRED`` (it falls back to plaintext without a word and
    never verifies the server) and ``DISABLED`` together with files are
    ValueErrors that name the key.
    """
    found: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for given, value in query.items():
        canonical = given.replace("_", "-")
        if canonical not in _MYSQL_TLS_KEYS:
            accepted = ", ".join(f"{k} (or {k.replace('-', '_')})" for k in _MYSQL_TLS_KEYS)
            raise ValueError(f"unsupported DSN parameter {given!r}; accepted: {accepted}")
        if canonical in found:
            raise ValueError(
                f"DSN parameter {canonical} is given in both spellings ({spelled[canonical]} and {given}): keep one"
            )
        found[canonical] = value
        spelled[canonical] = given
    mode = found.get("ssl-mode", "").upper()
    ca, cert, key = found.get("ssl-ca"), found.get("ssl-cert"), found.get("ssl-key")
    if mode == "PREFERRED":
        raise ValueError(
            "ssl-mode=PREFERRED is refused: it falls back to plaintext when the server offers no TLS, and it never "
            "verifies the server; use VERIFY_IDENTITY (with ssl-ca for a private CA), or REQUIRED (encrypted, "
            "server not verified) or DISABLED to say what you give up"
        )
    if mode and mode not in _MYSQL_SSL_MODES:
        raise ValueError(f"ssl-mode must be one of {', '.join(_MYSQL_SSL_MODES)}, not {found['ssl-mode']!r}")
    if mode == "DISABLED":
        if ca or cert or key:
            raise ValueError("ssl-mode=DISABLED contradicts ssl-ca, ssl-cert and ssl-key: remove one or the other")
        return None
    if not mode and not (ca or cert or key):
        return None
    mode = mode or "VERIFY_IDENTITY"
    return tls_context(ca=ca, cert=cert, key=key, verify=mode != "REQUIRED", verify_identity=mode == "VERIFY_IDENTITY")
