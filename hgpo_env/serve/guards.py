"""Requests a server refuses before its routes see them: oversized HTTP bodies, browser upgrades.

* :class:`BodyLimit`: FastAPI reads a request body whole before validating it, so a 100 MB POST
  costs hundreds of MB and comes back as a 100 MB validation error. Every route's body is capped
  (the Task API's are a few bytes): a larger one gets 413 without being read past the cap.
* :class:`OriginCheck`: a web page the operator opens may open WebSockets to a loopback server
  (browsers send no token, but a tokenless server asks for none) and fill its sessions. Browsers
  always send ``Origin``; OpenEnv's and this project's clients never do. An upgrade with an
  ``Origin`` not in ``--allow-origin`` is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hgpo_env.serve.auth import AUTH_CLOSE_CODE, refuse_http

MAX_BODY_BYTES = 2**20
"""Largest HTTP request body any route takes."""


class BodyLimit:
    """ASGI middleware: HTTP request bodies above ``max_bytes`` get 413; the rest reach the app whole."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = f"request body over {self.max_bytes} bytes"
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await refuse_http(send, 413, too_big)
            return
        chunks, size = [], 0
        while True:  # a body without a length (chunked) is counted as it comes
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await refuse_http(send, 413, too_big)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


class OriginCheck:
    """ASGI middleware: a WebSocket upgrade that carries an ``Origin`` (a browser's) must name one
    of ``allowed``; it is closed before acceptance otherwise (the client sees HTTP 403)."""

    def __init__(self, app: Any, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = {origin.rstrip("/").lower() for origin in allowed}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            origin = dict(scope.get("headers") or ()).get(b"origin")
            if origin is not None and origin.decode("latin-1").rstrip("/").lower() not in self.allowed:
                reason = "cross-origin upgrade refused (the server's --allow-origin)"
                await send({"type": "websocket.close", "code": AUTH_CLOSE_CODE, "reason": reason})
                return
        await self.app(scope, receive, send)
