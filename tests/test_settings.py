"""The environment settings shared by ``from_env()`` and the ``aioelect`` command, and the CLI package's shape.

The settings are read in one place: every ``AIOELECT_*`` name is defined
once, parsing is strict, errors name the variable and show no secret. The
CLI writes to ``os.environ`` in one function only and uses argparse's public
API only.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aioelect
from aioelect.wiring import _settings
from aioelect.wiring._settings import SECRET_VARIABLES, Settings, is_secret

PACKAGE = Path(aioelect.__file__).resolve().parent
PASSWORD = "s3cr#t:pw"


def _sources(under: Path) -> list[Path]:
    return sorted(under.rglob("*.py"))


def test_every_variable_is_read() -> None:
    env = {
        "AIOELECT_ETCD_ENDPOINTS": "127.0.0.1:2379,127.0.0.1:22379",
        "AIOELECT_MYSQL_DSN": "mysql://u:pw@127.0.0.1/db",
        "AIOELECT_POSTGRES_DSN": "postgresql://u:pw@127.0.0.1/db",
        "AIOELECT_FILE": "/run/lock/x.lock",
        "AIOELECT_NAME": "billing/cron",
        "AIOELECT_IDENTITY": "host-1",
        "AIOELECT_PASSWORD": PASSWORD,
        "AIOELECT_ETCD_USER": "elect",
        "AIOELECT_ETCD_CA": "/ca.pem",
        "AIOELECT_ETCD_CERT": "/cert.pem",
        "AIOELECT_ETCD_KEY": "/key.pem",
        "AIOELECT_ETCD_DEGRADE_TO_LOCAL": "yes",
    }
    settings = Settings.from_environ(env)
    assert settings == Settings(
        etcd_endpoints="127.0.0.1:2379,127.0.0.1:22379",
        mysql_dsn="mysql://u:pw@127.0.0.1/db",
        postgres_dsn="postgresql://u:pw@127.0.0.1/db",
        file="/run/lock/x.lock",
        name="billing/cron",
        identity="host-1",
        password=PASSWORD,
        etcd_user="elect",
        etcd_ca="/ca.pem",
        etcd_cert="/cert.pem",
        etcd_key="/key.pem",
        etcd_degrade_to_local=True,
    )
    assert settings.backend() == ("etcd", "127.0.0.1:2379,127.0.0.1:22379")
    with pytest.raises(AttributeError):
        settings.name = "other"  # type: ignore[misc]


def test_empty_means_unset_and_the_priority_is_the_factorys() -> None:
    assert Settings.from_environ({}) == Settings()
    assert Settings.from_environ({}).backend() is None
    blank = {"AIOELECT_ETCD_ENDPOINTS": "", "AIOELECT_NAME": "", "AIOELECT_ETCD_DEGRADE_TO_LOCAL": " "}
    assert Settings.from_environ(blank) == Settings()
    both = {"AIOELECT_FILE": "/x.lock", "AIOELECT_POSTGRES_DSN": "postgresql://u@h/db"}
    assert Settings.from_environ(both).backend() == ("postgres", "postgresql://u@h/db")
    assert Settings.from_environ({"AIOELECT_FILE": "/x.lock"}).backend() == ("file", "/x.lock")


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("TRUE", True), ("on", True), ("no", False), ("0", False)]
)
def test_the_degrade_flag_is_a_clear_yes_or_no(value: str, expected: bool) -> None:
    assert Settings.from_environ({"AIOELECT_ETCD_DEGRADE_TO_LOCAL": value}).etcd_degrade_to_local is expected


@pytest.mark.parametrize("value", ["2", "maybe", "tru", "1 0"])
def test_a_value_that_cannot_be_read_names_its_variable(value: str) -> None:
    env = {"AIOELECT_ETCD_DEGRADE_TO_LOCAL": value, "AIOELECT_PASSWORD": PASSWORD}
    with pytest.raises(ValueError, match="AIOELECT_ETCD_DEGRADE_TO_LOCAL") as info:
        Settings.from_environ(env)
    assert PASSWORD not in str(info.value)


def test_repr_shows_no_secret() -> None:
    settings = Settings.from_environ(
        {
            "AIOELECT_MYSQL_DSN": f"mysql://u:{PASSWORD}@127.0.0.1/db",
            "AIOELECT_POSTGRES_DSN": f"postgresql://u:{PASSWORD}@127.0.0.1/db",
            "AIOELECT_REDIS_URL": f"redis://u:{PASSWORD}@127.0.0.1/0",
            "AIOELECT_PASSWORD": PASSWORD,
            "AIOELECT_REDIS_SENTINEL_PASSWORD": PASSWORD,
            "AIOELECT_NAME": "n",
        }
    )
    shown = repr(settings)
    assert PASSWORD not in shown and "s3cr" not in shown
    assert "mysql://u:***@127.0.0.1/db" in shown and "password='***'" in shown and "name='n'" in shown


def test_secret_variables() -> None:
    assert set(SECRET_VARIABLES) == {
        "AIOELECT_HEALTH_URL",
        "AIOELECT_PASSWORD",
        "AIOELECT_REDIS_SENTINEL_PASSWORD",
        "AIOELECT_MYSQL_DSN",
        "AIOELECT_POSTGRES_DSN",
        "AIOELECT_REDIS_URL",
    }
    assert all(is_secret(variable) for variable in SECRET_VARIABLES)
    assert is_secret("AIOELECT_OTHER_DSN") and is_secret("AIOELECT_ETCD_PASSWORD") and is_secret("AIOELECT_OTHER_URL")
    for plain in ("AIOELECT_NAME", "AIOELECT_IDENTITY", "AIOELECT_ETCD_ENDPOINTS", "AIOELECT_FILE", "MY_DSN", "PATH"):
        assert not is_secret(plain), plain
    for client in ("PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGHOST", "MYSQL_PWD", "MYSQL_TEST_LOGIN_FILE"):
        assert is_secret(client), client
    assert is_secret("MARIADB_ROOT_PASSWORD") and is_secret("LIBMYSQL_ENABLE_CLEARTEXT_PLUGIN")
    assert not is_secret("PGDATA") and not is_secret("PAGER")


def test_each_variable_name_is_defined_once_in_the_package() -> None:
    """No module but ``_settings`` spells an ``AIOELECT_`` variable name in code (docstrings may name them)."""
    defined = {value for name, value in vars(_settings).items() if name.startswith("ENV_")}
    assert len(defined) == len([name for name in vars(_settings) if name.startswith("ENV_")])
    spelt: list[str] = []
    for path in _sources(PACKAGE):
        if path.name == "_settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if text.startswith("AIOELECT_") and text.isidentifier():
                spelt.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value}")
    assert spelt == []


def _environ_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` writes to ``os.environ`` (item assignment or deletion, or a mutating method), or putenv."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = list(node.targets) if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and is_environ(target.value):
                found.append((node.lineno, "item"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            mutating = ("setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__")
            if node.func.attr in mutating and is_environ(node.func.value):
                found.append((node.lineno, node.func.attr))
            if node.func.attr in ("putenv", "unsetenv"):
                found.append((node.lineno, node.func.attr))
    return found


def test_the_cli_writes_the_environment_in_one_function_only() -> None:
    """gRPC reads its settings only from the process environment: one function sets them, nothing else writes."""
    writers: set[str] = set()
    for path in _sources(PACKAGE / "cli"):
        tree = ast.parse(path.read_text(), str(path))
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for line, _ in _environ_writes(tree):
            inside = [f for f in functions if f.lineno <= line <= (f.end_lineno or f.lineno)]
            innermost = max(inside, key=lambda f: f.lineno).name if inside else "<module>"
            writers.add(f"{path.name}:{innermost}")
    assert writers == {"__init__.py:_configure_grpc"}


def test_the_cli_uses_argparses_public_api_only() -> None:
    private: list[str] = []
    for path in _sources(PACKAGE / "cli"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id == "argparse":
                    private.append(f"{path.name}:{node.lineno}: argparse.{node.attr}")
                elif node.attr in ("_actions", "_option_string_actions", "_subparsers", "_action_groups"):
                    private.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert private == []


def test_the_cli_is_a_package_of_small_modules() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in _sources(PACKAGE / "cli")}
    assert {"__init__.py", "_args.py", "_commands.py", "_supervisor.py", "_output.py"} <= set(sizes)
    assert max(sizes.values()) <= 400, sizes


def test_the_command_refuses_an_unreadable_variable_by_name(tmp_path: Path) -> None:
    """The command reads the same Settings: a variable it cannot read is a usage error (2) naming it, secret unshown."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env.update(PYTHONPATH=str(PACKAGE.parent), AIOELECT_ETCD_DEGRADE_TO_LOCAL="maybe", AIOELECT_PASSWORD=PASSWORD)
    argv = [sys.executable, "-m", "aioelect", "leader", "--file", str(tmp_path / "x.lock")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "AIOELECT_ETCD_DEGRADE_TO_LOCAL" in result.stderr and "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("kind", "leftover"),
    [("mysql", "AIOELECT_FILE"), ("etcd", "AIOELECT_MYSQL_DSN"), ("file", "AIOELECT_POSTGRES_DSN")],
)
def test_a_backend_named_without_its_variable_is_refused_by_the_command_and_from_env(
    tmp_path: Path, kind: str, leftover: str
) -> None:
    """AIOELECT_BACKEND names a backend whose variable is unset: both refuse, neither leads on the leftover one."""
    lock = tmp_path / "x.lock"
    values = {"AIOELECT_FILE": str(lock), "AIOELECT_MYSQL_DSN": "mysql://u@127.0.0.1:1/db"}
    values["AIOELECT_POSTGRES_DSN"] = "postgresql://u@127.0.0.1:1/db"
    environ = {"AIOELECT_BACKEND": kind, leftover: values[leftover], "AIOELECT_NAME": "t"}
    with pytest.raises(ValueError, match=f"AIOELECT_BACKEND={kind} but AIOELECT_.* is not set"):
        Settings.from_environ(environ).backend()
    with pytest.raises(ValueError, match=f"AIOELECT_BACKEND={kind} but AIOELECT_.* is not set"):
        aioelect.from_env(environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env.update(PYTHONPATH=str(PACKAGE.parent), **environ)
    marker = tmp_path / "ran"
    for command in (["run", "--no-wait", "--", "touch", str(marker)], ["leader"]):
        argv = [sys.executable, "-m", "aioelect", *command]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert f"AIOELECT_BACKEND={kind} but" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()
