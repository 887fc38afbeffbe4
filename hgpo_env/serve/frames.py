"""Bad WebSocket frames get an error reply and the session goes on.

OpenEnv's ``/ws`` loop answers a frame that is not JSON with an error, but a frame it cannot
read at all ends the session: a binary frame, JSON that is not an object (an array, ``null``),
JSON nested deeper than Python's parser recurses, a number longer than Python converts. This ASGI
middleware reads every frame before the loop does and answers those itself, in the loop's own
error format (``{"type": "error", "data": {"message", "code"}}``), so only frames the loop can
take reach it.
"""

from __future__ import annotations

import json
from typing import Any

from openenv.core.env_server.types import WSErrorCode, WSErrorResponse


def frame_problem(message: dict[str, Any]) -> tuple[str, str] | None:
    """``(code, message)`` for a ``websocket.receive`` event the session loop cannot take."""
    text = message.get("text")
    if text is None:
        return WSErrorCode.INVALID_JSON, "binary frames are not accepted: send JSON text"
    try:
        parsed = json.loads(text)
    except RecursionError:
        return WSErrorCode.INVALID_JSON, "Invalid JSON: nested too deeply"
    except ValueError as error:  # JSONDecodeError, and numbers past Python's digit limit
        return WSErrorCode.INVALID_JSON, f"Invalid JSON: {error}"
    if not isinstance(parsed, dict):
        return WSErrorCode.VALIDATION_ERROR, f"a message is a JSON object, got {type(parsed).__name__}"
    return None


class FrameGuard:
    """ASGI middleware for the WebSocket routes: answers unreadable frames, passes the rest on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def checked_receive() -> dict[str, Any]:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                problem = frame_problem(message)
                if problem is None:
                    return message
                code, text = problem
                reply = WSErrorResponse(data={"message": text, "code": code})
                await send({"type": "websocket.send", "text": reply.model_dump_json()})

        await self.app(scope, checked_receive, send)
