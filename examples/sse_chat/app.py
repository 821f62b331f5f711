"""A chat page whose replies survive a dropped connection: Server-Sent Events
served from a redis-mem ReplyStream (the seed's stream buffer).

    python examples/sse_chat/app.py --port 8000 --redis-url redis://localhost:6379/0
    python examples/sse_chat/app.py --port 8001 --redis-url redis://localhost:6379/0   # a second node

Open http://localhost:8000/ and send a message: a slow stand-in model (no
LLM needed) streams its reply token by token. Reload the page mid-reply, or
stop this process while a second one serves the same Redis behind your load
balancer: the page picks up where it was, from the last event id it saw
(SSE ``Last-Event-ID``), with no restart and no chunk twice. When the reply
ends it is the session's assistant message, stored once (MSGID = the reply
id), next to the user's message.

Stdlib only (http.server) plus the redis-mem package. Routes:

- ``GET /``: the page (index.html beside this file);
- ``POST /chat`` ``{"session", "message", "message_id"}``: stores the user's
  message (MSGID ``message_id``: a POST sent again is stored once), starts
  the reply in a background thread, answers ``{"reply_id"}``;
- ``GET /stream?session=&reply=&after=``: the reply as SSE, from the event
  after ``Last-Event-ID`` (the header a reconnecting EventSource sends) or
  ``after``; events ``chunk`` (``{"text", "server"}``), then ``end`` or
  ``failed``; every event's ``id:`` is its stream id;
- ``GET /history?session=``: the session's messages (MEM.GET) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List
from urllib.parse import parse_qs, urlparse

import redis

from redis_mem import RedisMemClient, ReplyStream, ReplyStreamGap, ReplyStreamTimeout, new_msgid, valid_event_id

HERE = os.path.dirname(os.path.abspath(__file__))
KEY_TEMPLATE = "mem:{%s}"
STREAM_TTL = 300


def fake_reply_tokens(prompt: str, n: int) -> List[str]:
    """What the stand-in model answers to ``prompt``: ``n`` tokens (n >= 1),
    each one distinct, so a duplicated or a lost chunk shows."""
    head = f'You said "{prompt.strip()[:80]}". '
    return [head] + [f"Part {i} of {n - 1}. " for i in range(1, n)]


class App:
    def __init__(self, r: "redis.Redis", name: str, token_delay: float, tokens: int) -> None:
        self.r = r
        self.mem = RedisMemClient(r)
        self.name = name
        self.token_delay = token_delay
        self.tokens = tokens
        with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
            self.page = f.read().encode("utf-8")

    def start_reply(self, session: str, message: str, message_id: str) -> str:
        key = KEY_TEMPLATE % session
        self.mem.append(key, "user", message, msgid=message_id or None)
        # The reply id follows from the user's message id: the same POST sent
        # again gets the same reply (and its stream), not a second one.
        reply_id = f"reply-{message_id}" if message_id else new_msgid()
        stream = ReplyStream(self.r, key, reply_id, ttl=STREAM_TTL)
        # One producer per reply, whichever process the POST reached: a guard
        # key of this example's own, in the stream's slot.
        if self.r.set(f"{stream.stream_key}:producer", self.name, nx=True, ex=STREAM_TTL):
            threading.Thread(target=self._produce, args=(stream, message), daemon=True).start()
        return reply_id

    def _produce(self, stream: ReplyStream, message: str) -> None:
        """The stand-in for a model call streaming its tokens."""
        try:
            for token in fake_reply_tokens(message, self.tokens):
                time.sleep(self.token_delay)
                stream.write(token)
            stream.finish(meta={"model": "sse-chat-stand-in", "server": self.name})
        except Exception as err:  # noqa: BLE001 - the reader is told, the server goes on
            stream.error(f"{type(err).__name__}: {err}")


def make_handler(app: App) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "redis-mem-sse-chat"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            sys.stderr.write(f"[{app.name}] {self.address_string()} {format % args}\n")

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/":
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(app.page)))
                self.end_headers()
                self.wfile.write(app.page)
            elif url.path == "/healthz":
                self._json(200, {"ok": True, "server": app.name})
            elif url.path == "/history":
                msgs = app.mem.get(KEY_TEMPLATE % q.get("session", ""))
                self._json(200, [{"role": m.role, "content": m.content, "msgid": m.msgid} for m in msgs])
            elif url.path == "/stream":
                self._stream(q)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if urlparse(self.path).path != "/chat":
                self._json(404, {"error": "not found"})
                return
            body: Dict[str, Any] = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            session, message = str(body.get("session") or ""), str(body.get("message") or "")
            if not session or not message:
                self._json(400, {"error": "session and message are needed"})
                return
            reply_id = app.start_reply(session, message, str(body.get("message_id") or ""))
            self._json(200, {"reply_id": reply_id, "server": app.name})

        def _stream(self, q: Dict[str, str]) -> None:
            session, reply_id = q.get("session", ""), q.get("reply", "")
            if not session or not reply_id:
                self._json(400, {"error": "session and reply are needed"})
                return
            # A reconnecting EventSource sends the last id it got as Last-Event-ID;
            # a page opened anew (a reload) passes the one it kept as ?after=.
            try:
                after = valid_event_id(self.headers.get("Last-Event-ID") or q.get("after"))
            except ValueError as err:
                self._json(400, {"error": str(err)})  # EventSource gives up on a non-200
                return
            self.log_message("stream %s after %s", reply_id, after)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            stream = ReplyStream(app.r, KEY_TEMPLATE % session, reply_id, ttl=STREAM_TTL)
            try:
                self.wfile.write(b"retry: 300\n\n")  # reconnect fast after a drop
                for event in stream.events(after=after, block=1000, idle_timeout=60):
                    if event.type == "chunk":
                        data = {"text": event.text, "server": app.name}
                        name = "chunk"
                    elif event.type == "end":
                        data = {"message_id": event.message_id, "server": app.name}
                        name = "end"
                    else:
                        data = {"error": event.text, "server": app.name}
                        name = "failed"  # not "error": EventSource's own event
                    self.wfile.write(f"id: {event.id}\nevent: {name}\ndata: {json.dumps(data)}\n\n".encode("utf-8"))
            except ReplyStreamTimeout:
                self.wfile.write(b'event: failed\ndata: {"error": "no reply"}\n\n')
            except ReplyStreamGap as gap:  # behind by more than MAXLEN: the page cannot resume
                self.wfile.write(f"event: failed\ndata: {json.dumps({'error': str(gap)})}\n\n".encode("utf-8"))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away: it resumes from its last id

    return Handler


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    p.add_argument("--name", help="this server's name, shown with each chunk (default host:port)")
    p.add_argument("--token-delay", type=float, default=0.15, help="seconds between the model's tokens")
    p.add_argument("--tokens", type=int, default=40, help="tokens in a reply")
    args = p.parse_args(argv)
    r = redis.Redis.from_url(args.redis_url, decode_responses=True, socket_timeout=30)
    app = App(r, args.name or f"{args.host}:{args.port}", args.token_delay, max(1, args.tokens))
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(app))
    httpd.daemon_threads = True
    print(f"sse_chat: {app.name} on http://{args.host}:{args.port}/ (Redis {args.redis_url})", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
