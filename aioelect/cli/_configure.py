"""The backend the ``aioelect`` command uses: its options laid over the environment's :class:`Settings`.

A backend named on the command line replaces the environment's; every
other option given replaces the variable of the same meaning. Guarantees:
bad or contradictory options raise :class:`UsageError` naming the option;
every password met (``AIOELECT_PASSWORD``, ``--password-file``, the
password of each DSN in the environment or on the command line) is
registered with :data:`aioelect.cli._output.secrets` before anything can
print it; a supervisor never degrades to leading without etcd.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import anyio

from ..core._config import parse_dsn, redact_dsn
from ..core._elector import Elector
from ..core._errors import BackendMisconfigured, BackendUnavailable, ElectionError
from ..wiring._settings import (
    BACKEND_OPTION_VARIABLES,
    BACKEND_VARIABLES,
    ENV_BACKEND,
    ENV_ETCD_DEGRADE_TO_LOCAL,
    ENV_ETCD_ENDPOINTS,
    ENV_ETCD_USER,
    ENV_FILE,
    ENV_MYSQL_DSN,
    ENV_POSTGRES_DSN,
    ENV_REDIS_URL,
    Settings,
    file_mode,
)
from ._output import secrets
from ._status import BackendError, UsageError
from ._supervisor import stop_timeout_for

__all__ = ["Config", "configure", "first_contact"]

log = logging.getLogger("aioelect.cli")


@dataclass
class Config:
    """A backend chosen from options and environment, ready to build electors."""

    kind: str
    target: str | list[str]
    #: Where the backend is, for messages (never with a password).
    where: str
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Elector:
        """Build an elector; raise :class:`UsageError` or :class:`BackendError`."""
        from ..wiring._factory import new

        kwargs: dict[str, Any] = {self.kind: self.target, **self.options}
        try:
            return new(**kwargs)
        except ImportError as exc:
            raise BackendError(str(exc)) from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except TypeError as exc:
            text = str(exc)
            if "unexpected keyword argument" not in text:
                raise
            for option in self.options:
                if repr(option) in text:
                    flag = "--" + option.replace("_", "-")
                    raise UsageError(f"{flag} does not apply to the {self.kind} backend") from None
            raise UsageError(f"the {self.kind} backend rejected an option: {text}") from None


def _with_password(dsn: str, password: str) -> str:
    """``dsn`` with its password replaced by ``password`` (URL-quoted)."""
    parts = urlsplit(dsn)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hostport}"))


def _read_password(args: argparse.Namespace, settings: Settings) -> str | None:
    if args.password_file is not None:
        try:
            with open(args.password_file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read --password-file {args.password_file}: {exc.strerror}") from None
        password = text.rstrip("\r\n")
        if not password:
            raise UsageError(f"--password-file {args.password_file} is empty")
        return password
    return settings.password


def _whole(seconds: float) -> float | int:
    return int(seconds) if float(seconds).is_integer() else seconds


def _choose_backend(args: argparse.Namespace, settings: Settings) -> tuple[str, str]:
    given = [kind for kind, _ in BACKEND_VARIABLES if getattr(args, kind) is not None]
    if len(given) > 1:
        raise UsageError("give only one of " + ", ".join("--" + kind for kind in given))
    named = settings.backend_kind
    if given:
        kind = given[0]
        value: str = getattr(args, kind)
        if named is not None and named != kind:
            log.warning("%s=%s ignored: --%s given on the command line replaces it", ENV_BACKEND, named, kind)
        return kind, value
    if named in ("local", "memory"):
        raise UsageError(
            f"{ENV_BACKEND}={named}: the aioelect command needs an election between processes, and the {named} "
            "backend has none (every instance would lead and run CMD at once); unset it and give --etcd, --mysql, "
            "--postgres, --redis or --file (or their variables)"
        )
    try:
        found = settings.backend()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if found is None:
        raise UsageError(
            "no backend configured: give --etcd, --mysql, --postgres, --redis or --file "
            f"(or set {ENV_ETCD_ENDPOINTS}, {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL} or {ENV_FILE})"
        )
    return found


def configure(args: argparse.Namespace, settings: Settings) -> Config:
    """Choose the backend and its options from ``args``, then ``settings``."""
    kind, value = _choose_backend(args, settings)
    if not value.strip():
        raise UsageError(f"--{kind} needs a value")
    password = _read_password(args, settings)
    secrets.add(password)
    options: dict[str, Any] = {}
    for flag in ("name", "identity"):
        if getattr(args, flag) == "":
            raise UsageError(f"--{flag} must not be empty")
    name = args.name or settings.name
    if name is not None:
        options["name"] = name
    identity = args.identity or settings.identity
    if identity is not None:
        options["identity"] = identity
    if args.ttl is not None:
        if kind != "etcd":
            raise UsageError(f"--ttl applies to etcd only, not to the {kind} backend")
        if not float(args.ttl).is_integer():
            raise UsageError(
                f"--ttl must be a whole number of seconds (etcd leases have whole-second TTLs), not {args.ttl:g}"
            )
        options["ttl"] = _whole(args.ttl)
    if getattr(args, "lease", None) is not None:
        if kind not in ("mysql", "postgres", "redis"):
            raise UsageError(
                f"--lease applies to the SQL and Redis backends only, not to the {kind} backend (etcd: --ttl)"
            )
        options["lease"] = _whole(args.lease) if kind != "redis" else args.lease
    if args.poll_interval is not None:
        if kind == "etcd":  # a flag is explicit: refused where it means nothing (a variable is only logged)
            raise UsageError("--poll-interval does not apply to the etcd backend: etcd watches the election")
        options["poll_interval"] = args.poll_interval
    # The portable timing options, flags over variables (AIOELECT_LEASE...): as in the library, the factory uses
    # those the backend has and logs each other one at WARNING.
    for option in ("renew_deadline", "check_interval", "check_timeout", "connect_timeout"):
        seconds = getattr(args, option, None)
        if seconds is not None:
            options[option] = seconds
    for option, seconds in settings.timing.items():
        if not (option == "lease" and ("ttl" in options or "lease" in options)):
            options.setdefault(option, seconds)
    options.update(_backend_flags(args, settings, kind))
    if getattr(args, "command", None) in ("run", "shards"):
        # CMD is the leader's work: after a loss the lock is released only once CMD is stopped.
        # The grace given: one chosen from the safety margin (none given) raises it once chosen (choose_grace).
        options["stop_timeout"] = stop_timeout_for(args.grace or 0.0)
    for flag in ("etcd_user", "etcd_ca", "etcd_cert", "etcd_key"):
        if getattr(args, flag) is not None and kind != "etcd":
            raise UsageError(f"--{flag.replace('_', '-')} applies to etcd only, not to the {kind} backend")
    etcd_user = args.etcd_user or settings.etcd_user

    for dsn in (
        settings.mysql_dsn,
        settings.postgres_dsn,
        settings.redis_url,
    ):  # scrubbed even when another backend is chosen
        secrets.add_dsn(dsn)
    target: str | list[str]
    if kind == "etcd":
        endpoints = [e.strip() for e in value.split(",") if e.strip()]
        if not endpoints:
            raise UsageError("--etcd needs at least one endpoint host:port")
        target, where = endpoints, ",".join(endpoints)
        # A supervisor must never fall back to "always leader": every instance would run CMD.
        options["degrade_to_local"] = False
        if settings.etcd_degrade_to_local:
            log.warning(
                "%s ignored: the aioelect command never leads without etcd (every instance would run CMD)",
                ENV_ETCD_DEGRADE_TO_LOCAL,
            )
        if etcd_user is not None:
            options["username"] = etcd_user
        if password is not None:
            if etcd_user is None:
                raise UsageError(f"a password for etcd needs --etcd-user (or {ENV_ETCD_USER})")
            options["password"] = password
        for path, option in (
            (args.etcd_ca or settings.etcd_ca, "ca_file"),
            (args.etcd_cert or settings.etcd_cert, "cert_file"),
            (args.etcd_key or settings.etcd_key, "key_file"),
        ):
            if path is not None:
                options[option] = path
    elif kind in ("mysql", "postgres", "redis"):
        secrets.add_dsn(value)
        where = redact_dsn(value)
        schemes = {"mysql": ("mysql", "mariadb"), "postgres": ("postgresql", "postgres"), "redis": ("redis", "rediss")}
        try:
            # redis+sentinel:// and redis+cluster:// name several hosts: the Redis backend parses those itself.
            if kind != "redis" or "+" not in value.partition("://")[0]:
                parse_dsn(value, *schemes[kind])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        target = _with_password(value, password) if password is not None else value
    else:
        target, where = value, value
    return Config(kind, target, where, options)


def _backend_flags(args: argparse.Namespace, settings: Settings, kind: str) -> dict[str, Any]:
    """The backend's own options (those of :data:`BACKEND_OPTION_VARIABLES`): each flag given over its variable.

    A flag that means nothing to ``kind`` is refused; a variable that means nothing to it is logged at WARNING.
    """
    options, ignored = settings.backend_options(kind)
    for variable in ignored:
        log.warning("%s is set but means nothing to the %s backend: ignored", variable, kind)
    for _, dest, by_kind, _ in BACKEND_OPTION_VARIABLES:
        # Fencing (the backends' default) gives CMD a token, and records full identities (MySQL names no
        # holder without it); a MySQL DSN without a database is then refused, naming --no-fencing.
        flag = "--no-fencing" if dest == "fencing" else "--" + dest.replace("_", "-")
        value: Any = (False if args.no_fencing else None) if dest == "fencing" else getattr(args, dest, None)
        if value is None:
            continue
        if kind not in by_kind:
            if dest == "fencing" and kind == "redis":
                raise UsageError("--no-fencing does not apply to the redis backend: its token costs nothing")
            backends = " and ".join(by_kind)
            raise UsageError(
                f"{flag} applies to the {backends} backend{'s' if len(by_kind) > 1 else ''} only, "
                f"not to the {kind} backend"
            )
        if dest == "file_mode":
            try:
                value = file_mode(str(value), flag)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        options[by_kind[kind]] = value
    return options


async def first_contact(elector: Elector, config: Config, timeout: float) -> str | None:  # noqa: ASYNC109
    """Ask who leads, bounded: the first contact with the server."""
    try:
        with anyio.fail_after(timeout):
            return await elector.leader()
    except TimeoutError:
        raise BackendError(f"{config.kind} at {config.where} did not answer within {timeout:g}s") from None
    except BackendUnavailable as exc:
        raise BackendError(str(exc)) from None
    except BackendMisconfigured as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise BackendError(f"{config.kind} at {config.where} is unreachable: {exc}") from None
    except ElectionError as exc:
        raise BackendError(str(exc)) from None
