"""A throwaway certificate authority (``openssl``) for the TLS tests: server, client and an unrelated CA."""

from __future__ import annotations

import os
import shutil
import tempfile

from .binaries import require_binary
from .processes import run_bounded

__all__ = ["Certificates"]


class Certificates:
    """A throwaway CA with a server certificate (for ``127.0.0.1``/``localhost``) and a client certificate.

    All files are PEM in :attr:`directory`: ``ca.pem``, ``server.pem``,
    ``server-key.pem``, ``client.pem``, ``client-key.pem``, and a second,
    unrelated CA ``other-ca.pem`` for "wrong CA" tests. Keys are unencrypted
    and world-readable so that servers running as another user can read them.
    """

    def __init__(self, directory: str | None = None, *, client_cn: str = "aioelect-client") -> None:
        self.directory = directory or tempfile.mkdtemp(prefix="aioelect-certs-")
        self.client_cn = client_cn
        d = self.directory
        self.ca = os.path.join(d, "ca.pem")
        self.ca_key = os.path.join(d, "ca-key.pem")
        self.other_ca = os.path.join(d, "other-ca.pem")
        self.server_cert = os.path.join(d, "server.pem")
        self.server_key = os.path.join(d, "server-key.pem")
        self.client_cert = os.path.join(d, "client.pem")
        self.client_key = os.path.join(d, "client-key.pem")
        openssl = require_binary("openssl")
        log = os.path.join(d, "openssl.log")

        def run(*args: str) -> None:
            run_bounded([openssl, *args], log_path=log, timeout=60.0, what="openssl")

        for cert, key, cn in ((self.ca, self.ca_key, "aioelect-test-ca"), (self.other_ca, None, "unrelated-ca")):
            run(
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", f"/CN={cn}", "-keyout", key or os.path.join(d, "other-ca-key.pem"), "-out", cert,
                # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a CA needs its key usage.
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            )  # fmt: skip
        # Strict verification also wants the issuer's key identifier and a key usage on every certificate.
        leaf = "authorityKeyIdentifier=keyid,issuer\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        ext = os.path.join(d, "server.ext")
        with open(ext, "w") as f:
            f.write(leaf + "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        client_ext = os.path.join(d, "client.ext")
        with open(client_ext, "w") as f:
            # serverAuth too: the "misnamed server" tests serve this certificate from a server.
            f.write(leaf + "extendedKeyUsage=clientAuth,serverAuth\n")
        for cert, key, cn, extfile in (
            (self.server_cert, self.server_key, "127.0.0.1", ext),
            (self.client_cert, self.client_key, client_cn, client_ext),
        ):
            csr = cert + ".csr"
            run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", key, "-out", csr)
            sign = ["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial"]
            sign += ["-days", "2", "-out", cert, "-extfile", extfile]
            run(*sign)
        for name in os.listdir(d):
            os.chmod(os.path.join(d, name), 0o644)
        os.chmod(d, 0o755)

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
