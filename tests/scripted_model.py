"""A scripted chat model behind an OpenAI-compatible endpoint on 127.0.0.1, for the tests that
drive a real harness: it stands in for the LLM, which cannot be downloaded here.

It answers ``POST /v1/chat/completions`` (streamed or not) with a command for our envs' prompts:
an admissible action drawn from a generator seeded by the rollout and the prompt, or, one time in
five, a command no env admits. A rollout is numbered by when its session (verifiers'
``X-Session-ID`` header, a fresh UUID each run) first calls, so a group's rollouts differ and every
run plays the same ones: seeding by the UUID itself made one group in twenty end with equal returns.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INVALID = "fly away"


def scripted_reply(session: str, prompt: str) -> str:
    """The reply to ``prompt`` in rollout ``session``: an action in our envs' response format, or
    where a compaction asks for a summary, one observation of the steps leaving."""
    rng = random.Random(f"{session}\n{prompt}")
    if "<summary> </summary>" in prompt:
        leaving = re.findall(r"^\[Step \d+\] Observation: (.+)$", prompt, re.MULTILINE)
        return f"<think>scripted</think>\n<summary>{rng.choice(leaving)}</summary>"
    actions = re.findall(r"^- (.+)$", prompt, re.MULTILINE)
    action = INVALID if not actions or rng.random() < 0.2 else rng.choice(actions)
    return f"<think>scripted</think>\n<action>{action}</action>"


class _Server(ThreadingHTTPServer):
    """Numbers the sessions in the order they first call."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._rollouts: dict[str, int] = {}
        self._lock = threading.Lock()

    def rollout(self, session: str) -> int:
        with self._lock:
            return self._rollouts.setdefault(session, len(self._rollouts))


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][-1]["content"]
        prompt = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        reply = scripted_reply(str(self.server.rollout(self.headers.get("X-Session-ID", ""))), prompt)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(reply.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        head = {"id": "scripted", "created": 0, "model": body.get("model", "scripted")}
        if body.get("stream"):
            chunks = [
                {"index": 0, "delta": {"role": "assistant", "content": reply}, "finish_reason": None},
                {"index": 0, "delta": {}, "finish_reason": "stop"},
            ]
            events = [{**head, "object": "chat.completion.chunk", "choices": [c]} for c in chunks]
            events.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(data.encode(), "text/event-stream")
        else:
            message = {"role": "assistant", "content": reply}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            answer = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            self._send(json.dumps(answer).encode(), "application/json")

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet: pytest shows failures, not requests
        pass


@contextlib.contextmanager
def scripted_model() -> Iterator[str]:
    """Serve the scripted model on a free port of 127.0.0.1; yields its base URL (``.../v1``)."""
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
