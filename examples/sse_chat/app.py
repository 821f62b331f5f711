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

Every request is checked before anything is written or read: a session id is
1-64 of ``A-Z a-z 0-9 _ . : @ -``, a ``message_id`` 1-100 printable
characters (it becomes MSGIDs), the body a JSON object of strings, an event id
``0``/``<ms>``/``<ms>-<seq>``; anything else is answered 400 with
``{"error"}``. A ``/stream`` of a reply that neither exists nor is being
produced is answered 404 at once, and at most ``--max-streams`` streams are
served at a time (503 beyond). Logged request values are escaped (``repr``
of control characters), so a ``%0A`` cannot forge a log line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List
from urllib.parse import parse_qs, urlparse

import redis

from redis_mem import (
    RedisMemClient,
    ReplyStream,
    ReplyStreamError,
    ReplyStreamTimeout,
    check_reply_id,
    new_msgid,
    reply_stream_key,
    valid_event_id,
)

HERE = os.path.dirname(os.path.abspath(__file__))
KEY_TEMPLATE = "mem:{%s}"
STREAM_TTL = 300
#: A session id: it goes inside the key's hash tag, so never ``{`` or ``}``.
SESSION_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
#: The reply id is ``reply-<message_id>``: both are MSGIDs (at most 128 bytes).
MAX_MESSAGE_ID = 100
MAX_BODY = 1 << 20
MAX_MESSAGE = 64 << 10
#: Seconds a /stream waits without events before telling the page "no reply".
IDLE_TIMEOUT = 60


class BadRequest(ValueError):
    """What a request got wrong: answered 400 with it."""


def check_session(v: Any) -> str:
    if not isinstance(v, str) or not SESSION_ID.fullmatch(v):
        raise BadRequest("session must be 1-64 of A-Z a-z 0-9 _ . : @ -")
    return v


def check_message_id(v: Any) -> str:
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or len(v) > MAX_MESSAGE_ID or not v.isprintable():
        raise BadRequest(f"message_id must be a string of 1-{MAX_MESSAGE_ID} printable characters")
    try:
        check_reply_id(v)
        check_reply_id(f"reply-{v}")
    except ValueError as err:
        raise BadRequest(f"message_id: {err}") from None
    return v


def check_reply(v: Any) -> str:
    try:
        return check_reply_id(v)
    except (TypeError, ValueError) as err:
        raise BadRequest(f"reply: {err}") from None


def escaped(text: str) -> str:
    """``text`` with every non-printable character as its repr escape: safe to log."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def fake_reply_tokens(prompt: str, n: int) -> List[str]:
    """What the stand-in model answers to ``prompt``: ``n`` tokens (n >= 1),
    each one distinct, so a duplicated or a lost chunk shows."""
    head = f'You said "{prompt.strip()[:80]}". '
    return [head] + [f"Part {i} of {n - 1}. " for i in range(1, n)]


class App:
    def __init__(self, r: "redis.Redis", name: str, token_delay: float, tokens: int,
                 max_streams: int = 64) -> None:
        self.r = r
        self.streams = threading.BoundedSemaphore(max_streams)
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
            # Request values are input: escaped, so that none writes a line of its own.
            sys.stderr.write(f"[{app.name}] {self.address_string()} {escaped(format % args)}\n")

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            try:
                self._get()
            except BadRequest as err:
                self._json(400, {"error": str(err)})

        def _get(self) -> None:
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
                msgs = app.mem.get(KEY_TEMPLATE % check_session(q.get("session")))
                self._json(200, [{"role": m.role, "content": m.content, "msgid": m.msgid} for m in msgs])
            elif url.path == "/stream":
                self._stream(q)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if urlparse(self.path).path != "/chat":
                self._json(404, {"error": "not found"})
                return
            # Everything is checked before anything is written.
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._json(400, {"error": "bad Content-Length"})
                return
            if not 0 <= length <= MAX_BODY:
                self._json(413, {"error": f"a body is at most {MAX_BODY} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                session = check_session(body.get("session"))
                message = body.get("message")
                if not isinstance(message, str) or not message or len(message) > MAX_MESSAGE:
                    raise BadRequest(f"message must be a non-empty string of at most {MAX_MESSAGE} characters")
                message_id = check_message_id(body.get("message_id"))
            except (ValueError, UnicodeDecodeError) as err:  # BadRequest, or not JSON
                self._json(400, {"error": str(err) if isinstance(err, BadRequest) else "the body is not JSON"})
                return
            try:
                reply_id = app.start_reply(session, message, message_id)
            except redis.RedisError as err:
                self.log_message("POST /chat failed: %s", err)
                self._json(503, {"error": "the store is unavailable"})
                return
            self._json(200, {"reply_id": reply_id, "server": app.name})

        def _stream(self, q: Dict[str, str]) -> None:
            session, reply_id = check_session(q.get("session")), check_reply(q.get("reply"))
            # A reconnecting EventSource sends the last id it got as Last-Event-ID;
            # a page opened anew (a reload) passes the one it kept as ?after=.
            # Both are input: each checked (400: EventSource gives up on a non-200).
            try:
                header = self.headers.get("Last-Event-ID")
                from_query = valid_event_id(q.get("after"))
                after = valid_event_id(header) if header else from_query
            except ValueError as err:
                raise BadRequest(str(err)) from None
            key = reply_stream_key(KEY_TEMPLATE % session, reply_id)
            # A reply that neither has a stream nor is being produced (an
            # unknown id, or one whose stream expired): 404 now, not a held thread.
            if not app.r.exists(key, f"{key}:producer"):
                self._json(404, {"error": "no such reply (unknown, or its stream expired)"})
                return
            if not app.streams.acquire(blocking=False):
                self._json(503, {"error": "too many streams at once"})
                return
            try:
                self._send_stream(session, reply_id, after)
            finally:
                app.streams.release()

        def _send_stream(self, session: str, reply_id: str, after: str) -> None:
            self.log_message("stream %s after %s", reply_id, after)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            stream = ReplyStream(app.r, KEY_TEMPLATE % session, reply_id, ttl=STREAM_TTL)
            try:
                self.wfile.write(b"retry: 300\n\n")  # reconnect fast after a drop
                for event in stream.events(after=after, block=1000, idle_timeout=IDLE_TIMEOUT):
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
            except ReplyStreamError as gap:  # ReplyStreamGap: events lost, the page cannot resume
                self.wfile.write(f"event: failed\ndata: {json.dumps({'error': str(gap)})}\n\n".encode("utf-8"))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away: it resumes from its last id
            except redis.RedisError as err:
                self.log_message("stream %s failed: %s", reply_id, err)
                self.wfile.write(b'event: failed\ndata: {"error": "the store is unavailable"}\n\n')

    return Handler


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    p.add_argument("--name", help="this server's name, shown with each chunk (default host:port)")
    p.add_argument("--token-delay", type=float, default=0.15, help="seconds between the model's tokens")
    p.add_argument("--tokens", type=int, default=40, help="tokens in a reply")
    p.add_argument("--max-streams", type=int, default=64, help="/stream requests served at once (503 beyond)")
    args = p.parse_args(argv)
    r = redis.Redis.from_url(args.redis_url, decode_responses=True, socket_timeout=30)
    app = App(r, args.name or f"{args.host}:{args.port}", args.token_delay, max(1, args.tokens),
              max(1, args.max_streams))
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
