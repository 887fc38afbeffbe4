"""Who may talk to an env server: one bearer token, checked on every route and WebSocket upgrade.

An env server on a cluster network is reachable by anything on it, and a session makes an env
(memory, CPU, files): so a server can require ``Authorization: Bearer <token>``, which OpenEnv's
own client sends with ``EnvClient(headers=...)``. The token is read from a file
(``--token-file``) or the ``HGPO_SERVE_TOKEN`` environment variable, never from the command line
(where ``ps`` shows it to every user of the machine). Clients (:class:`~hgpo_env.serve.client.RemoteEnv`,
the pool, the trainer, the TRL factory) take it the same way.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOKEN_VARIABLE = "HGPO_SERVE_TOKEN"
"""Environment variable a server and its clients read the token from (when no file is given)."""
AUTH_CLOSE_CODE = 1008
"""WebSocket close code of a refused upgrade (policy violation)."""


MIN_TOKEN_CHARS = 16
"""Shortest token a server accepts (guessing must not pay): what ``secrets.token_urlsafe(12)`` makes."""
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
"""A command that makes a good token."""


def read_token(token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The token in ``token_file``, else ``$HGPO_SERVE_TOKEN``, else None; both stripped and
    checked alike (one line, not blank). A token file others may read gets a warning on stderr."""
    if token_file is not None:
        path = Path(token_file)
        try:
            text = path.read_text()
        except OSError as error:
            raise ValueError(f"cannot read the token file {token_file}: {error.strerror or error}") from None
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(
                f"warning: the token file {token_file} is readable by other users (chmod 600 it)",
                file=sys.stderr,
            )
        return _checked(text, f"the token file {token_file}")
    text = os.environ.get(TOKEN_VARIABLE)
    return None if text is None or text == "" else _checked(text, f"${TOKEN_VARIABLE}")


def _checked(text: str, source: str) -> str:
    """``text`` stripped, refused when blank or of several lines (no header can carry those)."""
    token = text.strip()
    if not token:
        raise ValueError(f"{source} is empty")
    if any(c.isspace() for c in token):
        raise ValueError(f"{source} holds whitespace inside the token (several lines?): a token is one word")
    return token


def auth_headers(token: str | None) -> dict[str, str]:
    """The request headers that carry ``token`` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_bind(host: str, token: str | None, insecure: bool) -> None:
    """Refuse a token shorter than :data:`MIN_TOKEN_CHARS` (on any address: a loopback server
    is reachable by every user of the machine), and to serve an address other machines can reach
    without a token, unless ``insecure``."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"refusing a {len(token)}-character token: use at least {MIN_TOKEN_CHARS} ({MAKE_TOKEN})"
        )
    if token is None and not insecure and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {host} without a token: anything on that network could open "
            f"sessions. Give one (--token-file, or ${TOKEN_VARIABLE}), or say --insecure"
        )


class BearerAuth:
    """ASGI middleware: every HTTP request and WebSocket upgrade must carry the token.

    The comparison is constant-time. A refused request gets 401; a refused upgrade is closed
    before it is accepted (the client sees HTTP 403) with code :data:`AUTH_CLOSE_CODE`.
    """

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("BearerAuth needs a non-empty token")
        self.app = app
        self._expected = token.encode()

    def _allowed(self, scope: dict[str, Any]) -> bool:
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        scheme, _, credentials = given.partition(b" ")
        # HTTP auth schemes are case-insensitive (RFC 9110 11.1); the token is compared in constant time
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self._expected)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send(
                {"type": "websocket.close", "code": AUTH_CLOSE_CODE, "reason": "missing or wrong token"}
            )
        else:
            # closed after the answer: a stranger's connection never waits in keep-alive, counted
            await refuse_http(
                send,
                401,
                "missing or wrong bearer token",
                [(b"www-authenticate", b"Bearer"), (b"connection", b"close")],
            )


async def refuse_http(
    send: Any, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer an HTTP request with ``status`` and ``{"detail": detail}``, before any route sees it."""
    body = json.dumps({"detail": detail}).encode()
    start = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
