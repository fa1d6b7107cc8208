"""The ``aioelect`` command over TLS, its Prometheus metrics, and its secrets: real processes, real servers.

Every process started here is killed at teardown (the ``Spawner`` of
test_cli.py), and every wait is bounded.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest

from .harness import Certificates, EtcdServer, MariaDBServer, free_port
from .test_cli import ROOT, Lines, Spawner, cli, wait_until
from .test_security_etcd import PASSWORD, start_tls_etcd

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def tls_etcd(certs: Certificates) -> Iterator[EtcdServer]:
    server = start_tls_etcd(certs)
    yield server
    server.cleanup()


def tls_options(server: EtcdServer, certs: Certificates, name: str) -> list[str]:
    return [
        "--etcd",
        f"https://{server.endpoint}",
        "--etcd-ca",
        certs.ca,
        "--etcd-cert",
        certs.client_cert,
        "--etcd-key",
        certs.client_key,
        "--etcd-user",
        "root",
        "--name",
        name,
        "--ttl",
        "2",
    ]


def scrape(port: int) -> str | None:
    """The metrics page on 127.0.0.1:port, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text: str = reply.read().decode()
            return text
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def is_leader(page: str | None) -> float | None:
    """The value of ``aioelect_is_leader`` on a metrics page (None: not there)."""
    match = re.search(r"^aioelect_is_leader\{[^}]*\} (\S+)$", page or "", re.MULTILINE)
    return float(match.group(1)) if match else None


# --- metrics -----------------------------------------------------------------------------------


def test_run_exposes_prometheus_metrics(spawner: Spawner, tmp_path: Path) -> None:
    lock = str(tmp_path / "leader.lock")
    lines = Lines(tmp_path / "ran.txt")
    ports = {"m-a": free_port(), "m-b": free_port()}
    backend = ["--file", lock, "--name", "metrics", "--poll-interval", "0.05"]
    leader = spawner.run_cmd(*backend, "--identity", "m-a", "--metrics-port", str(ports["m-a"]), out=lines.path)
    wait_until("m-a to run CMD", lambda: bool(lines.of("m-a", "start")), 15)
    follower = spawner.run_cmd(*backend, "--identity", "m-b", "--metrics-port", str(ports["m-b"]), out=lines.path)
    wait_until("both metrics pages", lambda: all(scrape(p) is not None for p in ports.values()), 15)
    wait_until("the leader's gauge at 1", lambda: is_leader(scrape(ports["m-a"])) == 1.0, 10)
    page = scrape(ports["m-a"])
    assert page is not None
    assert 'aioelect_is_leader{backend="file",name="metrics"} 1.0' in page
    assert re.search(
        r'^aioelect_transitions_total\{backend="file",name="metrics",reason="acquired"\} 1\.0$', page, re.M
    )
    assert "aioelect_acquire_wait_seconds_count" in page and "process_cpu_seconds_total" in page
    assert is_leader(scrape(ports["m-b"])) == 0.0
    # The leader stops: the follower's gauge goes to 1.
    leader.send_signal(signal.SIGTERM)
    assert spawner.wait(leader) == 128 + signal.SIGTERM
    wait_until("the follower's gauge at 1", lambda: is_leader(scrape(ports["m-b"])) == 1.0, 15)
    wait_until("m-b to run CMD", lambda: bool(lines.of("m-b", "start")), 10)
    follower.send_signal(signal.SIGTERM)
    spawner.wait(follower)


def test_metrics_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("run", "--file", str(tmp_path / "l.lock"), "--metrics-port", str(port), "--", "true")
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_metrics_without_prometheus_client_is_a_clear_error(tmp_path: Path) -> None:
    # Simulates an installation without the extra: the import of prometheus_client fails as it would.
    shadow = tmp_path / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'prometheus_client'\")\n")
    result = cli(
        "run",
        "--file",
        str(tmp_path / "l.lock"),
        "--metrics-port",
        str(free_port()),
        "--",
        "true",
        PYTHONPATH=f"{shadow.parent}:{ROOT}",
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'aioelect[prometheus]'" in result.stderr
    assert "Traceback" not in result.stderr and "campaigning" not in result.stderr  # refused before campaigning


def test_bad_metrics_port_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("run", "--file", str(tmp_path / "l.lock"), "--metrics-port", "70000", "--", "true")
    assert result.returncode == 2 and "1 to 65535" in result.stderr


# --- TLS ---------------------------------------------------------------------------------------


def test_run_and_leader_over_tls_with_a_password(
    tls_etcd: EtcdServer, certs: Certificates, spawner: Spawner, tmp_path: Path
) -> None:
    name = f"/cli-tls/{secrets.token_hex(4)}"
    lines = Lines(tmp_path / "ran.txt")
    options = tls_options(tls_etcd, certs, name)
    proc = spawner.run_cmd(*options, "--identity", "tls-runner", out=lines.path, AIOELECT_PASSWORD=PASSWORD)
    wait_until("CMD to run under TLS leadership", lambda: bool(lines.of("tls-runner", "start")), 20)
    # The same through the environment, as a deployment would configure it.
    shown = cli(
        "leader",
        "--json",
        AIOELECT_ETCD_ENDPOINTS=f"https://{tls_etcd.endpoint}",
        AIOELECT_ETCD_CA=certs.ca,
        AIOELECT_ETCD_CERT=certs.client_cert,
        AIOELECT_ETCD_KEY=certs.client_key,
        AIOELECT_ETCD_USER="root",
        AIOELECT_PASSWORD=PASSWORD,
        AIOELECT_NAME=name,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"leader": "tls-runner", "handover": None}
    proc.send_signal(signal.SIGTERM)
    assert spawner.wait(proc) == 128 + signal.SIGTERM
    assert cli("leader", *options, AIOELECT_PASSWORD=PASSWORD).returncode == 1  # resigned: nobody leads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--etcd-ca": "other"}, "does not accept"),
        ({"--etcd-cert": None, "--etcd-key": None}, "requires a client certificate"),
        ({"password": PASSWORD + "-wrong"}, "rejected the credentials"),
        ({"--etcd": "plain", "--etcd-ca": None, "--etcd-cert": None, "--etcd-key": None}, "requires TLS"),
    ],
    ids=["wrong-ca", "no-client-cert", "wrong-password", "plain-http"],
)
def test_refused_tls_setups_exit_3_at_once(
    tls_etcd: EtcdServer, certs: Certificates, change: dict[str, str | None], message: str
) -> None:
    options = tls_options(tls_etcd, certs, "/cli-tls/refused")
    password = change.pop("password", None) or PASSWORD
    for flag, value in change.items():
        at = options.index(flag)
        if value is None:
            del options[at : at + 2]
        else:
            options[at + 1] = {"other": certs.other_ca, "plain": tls_etcd.endpoint}[value]
    for command in (["leader"], ["run", "--", "true"]):
        result = cli(*command[:1], *options, "--timeout", "5", *command[1:], AIOELECT_PASSWORD=password, timeout=30)
        assert result.returncode == 3, result.stderr
        assert message in result.stderr
        assert PASSWORD not in result.stderr + result.stdout


def test_tls_options_are_checked(tls_etcd: EtcdServer, certs: Certificates, tmp_path: Path) -> None:
    missing = cli("leader", "--etcd", tls_etcd.endpoint, "--name", "/t", "--etcd-ca", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    alone = cli("leader", "--etcd", tls_etcd.endpoint, "--name", "/t", "--etcd-cert", certs.client_cert)
    assert alone.returncode == 2 and "go together" in alone.stderr
    wrong_backend = cli("leader", "--file", str(tmp_path / "l.lock"), "--etcd-ca", certs.ca)
    assert wrong_backend.returncode == 2 and "--etcd-ca applies to etcd only" in wrong_backend.stderr


def test_password_never_appears_in_output_help_or_errors(
    tls_etcd: EtcdServer, certs: Certificates, spawner: Spawner, tmp_path: Path
) -> None:
    options = tls_options(tls_etcd, certs, f"/cli-tls/{secrets.token_hex(4)}")
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD + "\n")
    outputs: list[str] = []
    results = [
        cli("--help", AIOELECT_PASSWORD=PASSWORD),
        cli("run", "--help", AIOELECT_PASSWORD=PASSWORD),
        cli("leader", "-v", *options, AIOELECT_PASSWORD=PASSWORD),
        cli("leader", "-v", *options, "--password-file", str(password_file)),
        cli("leader", "-v", *options, AIOELECT_PASSWORD=PASSWORD + "-wrong"),
        cli("leader", "-v", *options[:-4], AIOELECT_PASSWORD=PASSWORD),  # no --name: refused, a name is required
        cli("leader", "--etcd-user", "root", "--file", "x", AIOELECT_PASSWORD=PASSWORD),  # usage error
    ]
    assert [r.returncode for r in results] == [0, 0, 1, 1, 3, 2, 2], [r.stderr for r in results]
    outputs.extend(r.stdout + r.stderr for r in results)
    lines = Lines(tmp_path / "ran.txt")
    proc = spawner.run_cmd(*options, "-v", "--identity", "pw", out=lines.path, mode="once", AIOELECT_PASSWORD=PASSWORD)
    assert spawner.wait(proc, timeout=20) == 0
    outputs.append(spawner.stdout(proc) + spawner.stderr(proc))
    text = "\n".join(outputs)
    assert "rejected the credentials" in text and "leadership acquired" in text  # the runs did say things...
    assert PASSWORD not in text  # ...and never the password


# --- secrets kept from CMD ------------------------------------------------------------------------

#: CMD that dumps its environment (JSON) to argv[1].
DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def test_cmd_does_not_inherit_aioelects_secrets(mariadb: MariaDBServer, tmp_path: Path) -> None:
    secret = f"Env-{secrets.token_hex(6)}"
    mariadb.create_user("cli_env", secret)
    environment = {
        "AIOELECT_MYSQL_DSN": f"mysql://cli_env@127.0.0.1:{mariadb.port}/{mariadb.database}",
        "AIOELECT_POSTGRES_DSN": f"postgresql://cli_env:{secret}@127.0.0.1:1/unused",
        "AIOELECT_REDIS_URL": f"redis://cli_env:{secret}@127.0.0.1:1/0",
        "AIOELECT_PASSWORD": secret,
        "AIOELECT_NAME": f"env-{secrets.token_hex(4)}",
        "UNRELATED_SETTING": "kept",
    }
    dump = tmp_path / "env.json"
    result = cli("run", "--", sys.executable, "-c", DUMP_ENV, str(dump), **environment)
    assert result.returncode == 0, result.stderr
    seen = json.loads(dump.read_text())
    secret_names = ("AIOELECT_PASSWORD", "AIOELECT_MYSQL_DSN", "AIOELECT_POSTGRES_DSN", "AIOELECT_REDIS_URL")
    leaked = sorted(k for k in seen if k in secret_names)
    assert leaked == [], f"CMD got aioelect's secrets: {leaked}"
    assert not [k for k, v in seen.items() if secret in v], "the password reached CMD's environment"
    assert seen["UNRELATED_SETTING"] == "kept" and seen["AIOELECT_NAME"] == environment["AIOELECT_NAME"]
    assert seen["AIOELECT_TOKEN"] and seen["AIOELECT_IDENTITY"]

    # Handed over only when asked for by name, and never silently.
    asked = cli("run", "-q", "--pass-secret", "AIOELECT_PASSWORD", "--", sys.executable, "-c", DUMP_ENV, str(dump),
                **environment)  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    seen = json.loads(dump.read_text())
    assert seen.get("AIOELECT_PASSWORD") == secret and "AIOELECT_MYSQL_DSN" not in seen
    # -q prints warnings only: the hand-over is one of them, without the secret itself.
    assert "--pass-secret" in asked.stderr and "AIOELECT_PASSWORD" in asked.stderr and secret not in asked.stderr

    refused = cli("run", "--pass-secret", "HOME", "--", "true", **environment)
    assert refused.returncode == 2 and "--pass-secret" in refused.stderr


def test_cmd_does_not_inherit_the_database_clients_secrets(tmp_path: Path) -> None:
    """libpq's and the MySQL client's variables (passwords, password files) stay with aioelect unless asked for."""
    secret = f"Client-{secrets.token_hex(6)}"
    clients = {
        "PGPASSWORD": secret,
        "PGPASSFILE": str(tmp_path / "pgpass"),
        "PGSERVICEFILE": str(tmp_path / "pg_service.conf"),
        "PGHOST": "db.example",
        "MYSQL_PWD": secret,
        "MYSQL_TEST_LOGIN_FILE": str(tmp_path / "mylogin.cnf"),
        "MARIADB_ROOT_PASSWORD": secret,
    }
    dump = tmp_path / "env.json"
    lock = str(tmp_path / "l.lock")
    result = cli("run", "--file", lock, "--", sys.executable, "-c", DUMP_ENV, str(dump), UNRELATED="kept", **clients)
    assert result.returncode == 0, result.stderr
    seen = json.loads(dump.read_text())
    assert sorted(set(clients) & set(seen)) == [] and seen["UNRELATED"] == "kept"
    asked = cli("run", "-q", "--file", lock, "--pass-secret", "PGPASSWORD", "--", sys.executable, "-c", DUMP_ENV,
                str(dump), **clients)  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    seen = json.loads(dump.read_text())
    assert seen.get("PGPASSWORD") == secret and "MYSQL_PWD" not in seen
    assert "--pass-secret" in asked.stderr and secret not in asked.stderr


# --- identities written by other clients -------------------------------------------------------------

HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\nfake line\r\x7f\u202e\x85end"


def _raw_controls(text: str) -> list[str]:
    """Control and other non-printable characters in ``text``, the newlines that end lines excepted."""
    return [c for line in text.split("\n") for c in line if not c.isprintable()]


def test_identities_written_by_other_clients_are_printed_escaped(
    etcd: EtcdServer, spawner: Spawner, tmp_path: Path
) -> None:
    name = f"/cli-escape/{secrets.token_hex(4)}"
    grant = etcd.etcdctl("lease", "grant", "60", check=True).stdout.split()[1]
    # Another client's candidate key, as election.go writes it: {prefix}/{lease id in hex} = identity.
    etcd.etcdctl("put", "--lease", grant, f"{name}/{grant}", HOSTILE, check=True)
    try:
        options = ["--etcd", etcd.endpoint, "--name", name]
        plain = cli("leader", *options)
        assert plain.returncode == 0, plain.stderr
        assert _raw_controls(plain.stdout) == [] and plain.stdout.count("\n") == 1, repr(plain.stdout)
        assert "\\x1b[2J" in plain.stdout and "\\n" in plain.stdout, repr(plain.stdout)
        as_json = cli("leader", "--json", *options)
        assert _raw_controls(as_json.stdout) == [], repr(as_json.stdout)
        assert json.loads(as_json.stdout) == {"leader": HOSTILE, "handover": None}  # JSON keeps the value exact

        watchers = [spawner.start("observe", *options), spawner.start("observe", "--json", *options)]
        wait_until("both observers to print the leader", lambda: all(spawner.stdout(w) for w in watchers), 20)
        for watcher in watchers:
            watcher.send_signal(signal.SIGINT)
            assert spawner.wait(watcher) == 0
            out = spawner.stdout(watcher)
            assert _raw_controls(out) == [] and out.count("\n") == 1, repr(out)
            assert _raw_controls(spawner.stderr(watcher)) == []
    finally:
        etcd.etcdctl("lease", "revoke", grant)


# --- DSNs shown redacted by text ---------------------------------------------------------------------

PASSWORD_PARTS = ("Alpha1", "Bravo2", "Charlie3", "Delta4", "Echo5", "4321")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a server that hangs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["mysql", "postgres", "redis"])
def test_no_part_of_a_dsn_password_is_ever_printed(kind: str, silent_port: int) -> None:
    scheme = {"mysql": "mysql", "postgres": "postgresql", "redis": "redis"}[kind]
    awkward = "Alpha1#Bravo2@Charlie3?Delta4/Echo5"
    dsns = [
        f"{scheme}://someone:{awkward}@127.0.0.1:{silent_port}/db",  # raw
        f"{scheme}://someone:{quote(awkward, safe='')}@127.0.0.1:{silent_port}/db",  # percent-encoded: times out
        # Digits first: a lenient parser reads someone:4321 as host and port and drops the rest as a fragment...
        f"{scheme}://someone:4321#Bravo2@Charlie3?Delta4/Echo5@127.0.0.1:{free_port()}/db",
        # ...or, here, connects to 127.0.0.1:{silent_port}, a server that hangs: the timeout message.
        f"{scheme}://127.0.0.1:{silent_port}#Bravo2@Charlie3?Delta4/Echo5@127.0.0.1:{free_port()}/db",
    ]
    variable = {"mysql": "AIOELECT_MYSQL_DSN", "postgres": "AIOELECT_POSTGRES_DSN", "redis": "AIOELECT_REDIS_URL"}[kind]

    def failing(dsn: str, command: list[str]) -> str:
        head, tail = command[:1], command[1:]
        given = {"env": {variable: dsn}} if head == ["observe"] else {"args": [f"--{kind}", dsn]}
        result = cli(*head, *given.get("args", []), "--name", "n", "--timeout", "2", "-v", *tail, timeout=30,
                     **given.get("env", {}))  # fmt: skip
        assert result.returncode in (2, 3), result.stderr
        assert "Traceback" not in result.stderr
        return result.stdout + result.stderr

    def misspelt(dsn: str) -> str:
        result = cli("leader", f"--{kind}-dsn", dsn, "--name", "n")  # argparse's own error quotes the arguments
        assert result.returncode == 2 and "unrecognized arguments" in result.stderr, result.stderr
        return result.stdout + result.stderr

    # The commands are independent and mostly wait out their timeouts: run them side by side.
    with ThreadPoolExecutor(max_workers=8) as pool:
        commands = (["leader"], ["observe"], ["run", "--", "true"])
        runs = [pool.submit(failing, dsn, command) for dsn in dsns for command in commands]
        runs += [pool.submit(misspelt, dsn) for dsn in dsns]
        outputs = [run.result() for run in runs]
    text = "\n".join(outputs)
    shown = [part for part in PASSWORD_PARTS if part in text]
    assert shown == [], f"parts of the password were printed: {shown}\n{text}"


def test_a_ca_file_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    """A CA file that exists but holds no certificate: exit 2 with its name, no traceback."""
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    for query in (f"ssl-ca={garbage}", f"ssl_mode=VERIFY_CA&ssl_ca={garbage}"):
        result = cli("leader", "--mysql", f"mysql://u@127.0.0.1:1/db?{query}", "--name", "t", "--timeout", "2")
        assert result.returncode == 2, result.stderr
        assert "cannot load the ssl-ca file" in result.stderr and str(garbage) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
