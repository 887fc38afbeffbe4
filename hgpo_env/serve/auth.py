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
from pathlib import Path
from typing import Any

TOKEN_VARIABLE = "HGPO_SERVE_TOKEN"
"""Environment variable a server and its clients read the token from (when no file is given)."""
AUTH_CLOSE_CODE = 1008
"""WebSocket close code of a refused upgrade (policy violation)."""


def read_token(token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The token in ``token_file`` (stripped), else ``$HGPO_SERVE_TOKEN``, else None."""
    if token_file is not None:
        token = Path(token_file).read_text().strip()
        if not token:
            raise ValueError(f"the token file {token_file} is empty")
        return token
    return os.environ.get(TOKEN_VARIABLE) or None


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
    """Refuse to serve an address other machines can reach without a token, unless ``insecure``."""
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
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, scope: dict[str, Any]) -> bool:
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        return hmac.compare_digest(given, self._expected)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send(
                {"type": "websocket.close", "code": AUTH_CLOSE_CODE, "reason": "missing or wrong token"}
            )
        else:
            body = json.dumps({"detail": "missing or wrong bearer token"}).encode()
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
