"""The server's options in one place: each field's default, its command-line flag and help, and
the checks that refuse settings which could serve nothing. Importable without the serve extra,
so ``python -m hgpo_env serve --help`` works before it is installed."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def _option(default: Any, help_text: str, **flag: Any) -> Any:
    return field(default=default, metadata={"help": help_text, **flag})


@dataclass(frozen=True)
class ServerOptions:
    """How :func:`hgpo_env.serve.server.serve` serves; the command line's ``--flag`` for each field."""

    host: str = _option(
        "127.0.0.1", "address to bind; one other machines reach needs a token (or --insecure)"
    )
    port: int = _option(8000, "TCP port")
    token: str | None = _option(None, "the bearer token every request must carry", cli=False)
    insecure: bool = _option(False, "serve a non-loopback address without a token (a trusted network only)")
    allow: tuple[str, ...] = _option(
        (),
        "an env argument clients may set at reset, within bounds if given (repeat it)",
        metavar="KEY[=LOW..HIGH]",
    )
    allow_origins: tuple[str, ...] = _option(
        (),
        "a browser origin (https://host:port) whose WebSocket upgrades are accepted; browsers' others "
        "are refused (repeat it)",
        flag="--allow-origin",
        metavar="ORIGIN",
    )
    ssl_certfile: str | None = _option(None, "serve https and wss with this certificate (PEM)")
    ssl_keyfile: str | None = _option(None, "the certificate's private key (PEM), if not in --ssl-certfile")
    max_sessions: int = _option(64, "concurrent episodes at most")
    session_timeout: float | None = _option(None, "reclaim sessions idle this long (s)")
    keep_alive: float = _option(5.0, "close idle HTTP connections after this long (s)")
    request_timeout: float = _option(
        10.0, "close a connection whose request headers are not complete this long after they start (s)"
    )
    max_pending_per_address: int = _option(
        32,
        "connections one client address may hold for over a second before their request headers "
        "are complete; at the cap its oldest is closed",
    )
    send_timeout: float = _option(30.0, "drop a WebSocket whose replies have waited this long unread (s)")
    shutdown_grace: float = _option(
        10.0,
        "on SIGTERM or SIGINT, give open sessions this long to close whatever the clients do, then "
        "cancel them; the process exits 5 s later at the latest (s)",
    )
    limit_concurrency: int | None = _option(None, "answer 503 beyond this many connections and tasks at once")
    http_sessions: bool = _option(
        False, "also serve OpenEnv's HTTP /reset, /step, /state and /mcp routes (outside --max-sessions)"
    )
    threads: bool = _option(False, "step sessions in threads (for envs that wait on Java engines)")

    def problem(self) -> str | None:
        """One line for settings that could serve nothing, else None."""
        if not 0 < self.port < 2**16:
            return f"--port {self.port}: a TCP port is 1 to 65535"
        if self.ssl_keyfile and not self.ssl_certfile:
            return "--ssl-keyfile needs --ssl-certfile"
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                return f"{_flag(name)} {path}: no such file"
        for name in ("max_sessions", "limit_concurrency", "max_pending_per_address"):
            value = getattr(self, name)
            if value is not None and value < 1:
                return f"{_flag(name)} {value}: it must be at least 1"
        for name in ("session_timeout", "keep_alive", "request_timeout", "send_timeout", "shutdown_grace"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                return f"{_flag(name)} {value}: it must be a positive number of seconds"
        return None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field (``--max-sessions`` for ``max_sessions``), with its default and help."""
        for f in fields(cls):
            if not f.metadata.get("cli", True):
                continue
            options: dict[str, Any] = {"help": f.metadata["help"], "dest": f.name}
            if f.type == "bool":
                options["action"] = "store_true"
            elif f.type == "tuple[str, ...]":
                options.update(action="append", metavar=f.metadata["metavar"])
            else:
                options.update(default=f.default, type=_parse(f.type))
            parser.add_argument(_flag(f.name), **options)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **extra: Any) -> ServerOptions:
        """The options the parsed command line holds (``extra``: fields it has no flag for)."""
        values = {
            f.name: tuple(getattr(args, f.name) or ())
            if f.type == "tuple[str, ...]"
            else getattr(args, f.name)
            for f in fields(cls)
            if f.metadata.get("cli", True)
        }
        return cls(**values, **extra)


def _flag(name: str) -> str:
    own = next(f.metadata.get("flag") for f in fields(ServerOptions) if f.name == name)
    return own or "--" + name.replace("_", "-")


def _parse(annotation: str) -> Any:
    """The converter of a field annotated ``int``, ``float | None``, ... (annotations are text here)."""
    return {"str": str, "int": int, "float": float}[annotation.split(" | ")[0]]
