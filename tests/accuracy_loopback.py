"""A loopback OpenAI-compatible chat endpoint that answers from a table, for driving the
real lm-eval path without a model.

Modes: right (every answer right), some_wrong (every other item wrong), malformed (200
with a body lm-eval cannot parse), slow (answers after the client's timeout), error500.
The table maps each test item's question to its right answer; the item is found in the
last user message (few-shot turns come before it).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "accuracy_tasks"
API_KEY = "loopback-key-0123456789"


def answer_table() -> dict[str, tuple[str, str]]:
    """question -> (right reply, wrong reply)."""
    table = {}
    for line in (TASKS_DIR / "arith_test.jsonl").read_text().splitlines():
        d = json.loads(line)
        n = int(d["answer"].rsplit("#### ", 1)[1])
        table[d["question"]] = (f"Adding them gives {n}.\n#### {n}",
                                f"Adding them gives {n + 1}.\n#### {n + 1}")
    for line in (TASKS_DIR / "mc_test.jsonl").read_text().splitlines():
        d = json.loads(line)
        wrong = next(x for x in d["choices"]["label"] if x != d["answerKey"])
        table[d["question"]] = (f"The answer is {d['answerKey']}", f"The answer is {wrong}")
    return table


class LoopbackEndpoint:
    def __init__(self, mode: str, delay_s: float = 0.0):
        self.mode, self.delay_s = mode, delay_s
        self.table = answer_table()
        self.order = {q: i for i, q in enumerate(self.table)}
        self.requests: list[dict] = []
        self.unauthorised = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                    outer.unauthorised += 1
                    return self._send(401, {"error": "unauthorised"})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": self.path})
                outer.requests.append(payload)
                if outer.mode == "error500":
                    return self._send(500, {"error": "internal"})
                if outer.mode == "slow":
                    time.sleep(outer.delay_s)
                last = next(m["content"] for m in reversed(payload["messages"])
                            if m["role"] == "user")
                question = next((q for q in outer.table if q in last), None)
                if question is None:
                    return self._send(400, {"error": "unknown item"})
                right, wrong = outer.table[question]
                text = wrong if outer.mode == "some_wrong" and outer.order[question] % 2 else right
                if outer.mode == "malformed":
                    return self._send(200, {"id": "x", "choices": [{"index": 0, "text": text}]})
                self._send(200, {"id": "cmpl-1", "object": "chat.completion",
                                 "model": payload.get("model"),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                           "total_tokens": 2}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
