"""redis-mem-migrate: move the chat memory of the stores redis-mem replaces
into redis-mem sessions.

Sources (--from):
  user-memory      client-side `user_memory_*` JSON strings (below)
  langchain        langchain-community RedisChatMessageHistory lists,
                   `message_store:<session>` (--pattern)
  langchain-redis  langchain-redis per-message JSON documents,
                   `chat:<session>:<ULID>` (--prefix)
The LangChain sources become one session per session id, messages in order,
each with its LangChain type and fields in META and its id as MSGID (see
redis_mem.migrate_lc). Target names: --target-template with <session> (the
session id; for user-memory the key after the pattern's prefix, also
<suffix>) or <key> (the source key).

Every source: --dry-run (read and check, write nothing), a progress bar on
stderr (a terminal, or --progress), a report (text or --json), resumable
(--state FILE journals each finished session; a rerun skips what it lists,
and without one a session already imported is skipped as existing), and a
source that cannot be imported is reported failed and left untouched.
--delete-source deletes a source only after its import, and only if it did
not change meanwhile (WATCH).

user-memory in detail:
Before redis-mem, applications kept each user's memory as a JSON string:
    user_memory_<id> = {"conversation_history": [{"role", "content",
                        "timestamp"}...], "user_profile": {...}, "context": {...}}
This script finds those keys (SCAN MATCH <pattern> TYPE string) and turns each
into a session key (default `mem:{<suffix>}`) with MEM.IMPORT, which counts the
tokens, assigns ids, applies the caps and keeps `user_profile`, `context` and
any other member verbatim (they come back at the top level of
`MEM.GET key FORMAT JSON`).

A key that cannot be imported (not UTF-8, not JSON, not that shape) is
reported as failed and left untouched; a key whose target already exists is
skipped unless --replace. With --delete-source, a source is deleted only after
its import succeeded, and only if it did not change meanwhile (checked under
WATCH; a changed source is imported again). --dry-run reads and checks but
writes nothing.

Examples:
    redis-mem-migrate --url redis://localhost:6379/0 --dry-run
    redis-mem-migrate --host 10.0.0.5 --port 6379 --delete-source
    redis-mem-migrate --target-template 'chat:<suffix>' --json
    redis-mem-migrate --from langchain --state migrate.state
    redis-mem-migrate --from langchain-redis --prefix chat: --target-template 'mem:{<session>}'
Template placeholders: <suffix> (the key name after the pattern's literal
prefix, e.g. "42" for user_memory_42) and <key> (the whole source name).
Exit status: 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Union

import redis

from . import migrate_lc as lc

DEFAULT_PATTERN = "user_memory_*"
DEFAULT_TEMPLATE = "mem:{<suffix>}"
SOURCES = ("user-memory", "langchain", "langchain-redis")
MAX_ATTEMPTS = 3

MOVED = "moved"
WOULD_MOVE = "would_move"
SKIPPED = "skipped"
FAILED = "failed"


@dataclass
class KeyResult:
    source: str
    target: str
    status: str  # moved | would_move | skipped | failed
    reason: str = ""
    messages: int = 0  # messages in the session after import (or in the document)
    deleted: bool = False  # source deleted (--delete-source)


@dataclass
class Report:
    dry_run: bool
    results: List[KeyResult] = field(default_factory=list)

    def _with(self, status: str) -> List[KeyResult]:
        return [r for r in self.results if r.status == status]

    @property
    def moved(self) -> List[KeyResult]:
        return self._with(WOULD_MOVE if self.dry_run else MOVED)

    @property
    def skipped(self) -> List[KeyResult]:
        return self._with(SKIPPED)

    @property
    def failed(self) -> List[KeyResult]:
        return self._with(FAILED)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "moved": len(self.moved),
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "keys": [asdict(r) for r in self.results],
        }

    def render(self) -> str:
        lines = []
        for r in self.results:
            line = f"{r.status:10} {r.source} -> {r.target}"
            if r.status in (MOVED, WOULD_MOVE):
                line += f" ({r.messages} messages{', source deleted' if r.deleted else ''})"
            if r.reason:
                line += f": {r.reason}"
            lines.append(line)
        verb = "would move" if self.dry_run else "moved"
        lines.append(
            f"{verb} {len(self.moved)}, skipped {len(self.skipped)}, failed {len(self.failed)}"
            + (" (dry run: nothing written)" if self.dry_run else "")
        )
        return "\n".join(lines)


# --------------------------------------------------------------------------

def _b(v: Union[str, bytes]) -> bytes:
    return v if isinstance(v, bytes) else v.encode("utf-8")


def _show(v: bytes) -> str:
    return v.decode("utf-8", "backslashreplace")


def literal_prefix(pattern: str) -> str:
    """The part of a SCAN pattern before its first glob character."""
    for i, ch in enumerate(pattern):
        if ch in "*?[\\":
            return pattern[:i]
    return pattern


def target_name(source: bytes, pattern: str, template: str) -> bytes:
    prefix = _b(literal_prefix(pattern))
    suffix = source[len(prefix):] if prefix and source.startswith(prefix) else source
    return _b(template).replace(b"<suffix>", suffix).replace(b"<session>", suffix).replace(b"<key>", source)


def check_document(text: str) -> Dict[str, Any]:
    """Parses and checks the client-side memory shape; raises ValueError
    with the reason. (MEM.IMPORT checks again, authoritatively.)"""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("the document is not a JSON object")
    history = doc.get("conversation_history")
    if not isinstance(history, list):
        raise ValueError("conversation_history is missing or not an array")
    for i, m in enumerate(history):
        if not isinstance(m, dict):
            raise ValueError(f"conversation_history[{i}] is not an object")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise ValueError(f"conversation_history[{i}].role is not a non-empty string")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"conversation_history[{i}].content is not a string")
    return doc


def _reply_map(reply: Any) -> Dict[str, Any]:
    items: Any
    if isinstance(reply, dict):
        items = reply.items()
    else:
        items = zip(reply[0::2], reply[1::2])
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in items}


def _import(r: "redis.Redis", target: bytes, value: bytes, replace: bool,
            model: Optional[str], ttl: Optional[int]) -> Dict[str, Any]:
    args: List[Any] = ["MEM.IMPORT", target, value]
    if replace:
        args.append("REPLACE")
    if model:
        args += ["MODEL", model]
    if ttl is not None:
        args += ["TTL", ttl]
    return _reply_map(r.execute_command(*args))


def _delete_if_unchanged(r: "redis.Redis", source: bytes, value: bytes) -> Optional[bytes]:
    """Deletes `source` if it still holds `value`. Returns None when deleted,
    else the value it holds now (b"" if it is gone or not a string)."""
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(source)
            try:
                now = pipe.get(source)
            except redis.ResponseError:  # no longer a string
                return b""
            if now is None:
                return b""
            now = _b(now)
            if now != value:
                return now
            pipe.multi()
            pipe.delete(source)
            pipe.execute()
            return None
        except redis.WatchError:
            now = r.get(source)
            return b"" if now is None else _b(now)


def migrate_key(
    r: "redis.Redis",
    source: bytes,
    target: bytes,
    dry_run: bool = False,
    delete_source: bool = False,
    replace: bool = False,
    model: Optional[str] = None,
    ttl: Optional[int] = None,
) -> KeyResult:
    res = KeyResult(_show(source), _show(target), FAILED)
    if target == source:
        res.reason = "the target template maps the key onto itself"
        return res
    try:
        value = r.get(source)
    except redis.ResponseError as e:
        res.status, res.reason = SKIPPED, f"no longer a string key ({e})"
        return res
    if value is None:
        res.status, res.reason = SKIPPED, "source key disappeared"
        return res
    value = _b(value)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        res.reason = f"value is not valid UTF-8 ({e.reason} at byte {e.start})"
        return res
    try:
        doc = check_document(text)
    except ValueError as e:
        res.reason = str(e)
        return res
    if not replace and r.exists(target):
        res.status, res.reason = SKIPPED, "target key exists (use --replace)"
        return res
    if dry_run:
        res.status, res.messages = WOULD_MOVE, len(doc["conversation_history"])
        return res

    overwrite = replace
    for _attempt in range(MAX_ATTEMPTS):
        try:
            reply = _import(r, target, value, overwrite, model, ttl)
        except redis.ResponseError as e:
            msg = str(e)
            if msg.startswith("BUSYKEY") or "already exists" in msg:
                res.status, res.reason = SKIPPED, "target key exists (use --replace)"
            else:
                res.reason = f"MEM.IMPORT refused it: {msg}"
            return res
        res.status, res.messages = MOVED, int(reply.get("messages", 0))
        if not delete_source:
            return res
        now = _delete_if_unchanged(r, source, value)
        if now is None:
            res.deleted = True
            return res
        if now == b"":
            res.reason = "source vanished or changed type after import; nothing deleted"
            return res
        # The application wrote to the source meanwhile: import the new value
        # over the session this run just created, then try the delete again.
        value, overwrite = now, True
        try:
            check_document(value.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            res.reason = f"source changed to an invalid document after import ({e}); source kept"
            return res
    res.reason = "source kept changing during migration; source kept, session holds a recent copy"
    return res


def migrate_unit(
    r: "redis.Redis",
    unit: "lc.Unit",
    read: Callable[["redis.Redis", "lc.Unit"], Any],
    target: bytes,
    dry_run: bool = False,
    delete_source: bool = False,
    replace: bool = False,
    model: Optional[str] = None,
    ttl: Optional[int] = None,
) -> KeyResult:
    """One LangChain session (a list, or a group of documents) into `target`."""
    res = KeyResult(unit.session, _show(target), FAILED)
    if target in unit.keys:
        res.reason = "the target template maps the session onto one of its source keys"
        return res
    try:
        doc, snapshot = read(r, unit)
    except (ValueError, redis.ResponseError) as e:
        res.reason = str(e)
        return res
    if not doc["conversation_history"]:
        res.status, res.reason = SKIPPED, "no messages"
        return res
    if not replace and r.exists(target):
        res.status, res.reason = SKIPPED, "target key exists (use --replace)"
        return res
    if dry_run:
        res.status, res.messages = WOULD_MOVE, len(doc["conversation_history"])
        return res
    try:
        reply = _import(r, target, json.dumps(doc, ensure_ascii=False).encode(), replace, model, ttl)
    except redis.ResponseError as e:
        msg = str(e)
        if msg.startswith("BUSYKEY") or "already exists" in msg:
            res.status, res.reason = SKIPPED, "target key exists (use --replace)"
        else:
            res.reason = f"MEM.IMPORT refused it: {msg}"
        return res
    res.status, res.messages = MOVED, int(reply.get("messages", 0))
    if delete_source:
        with r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(*unit.keys)
                if lc.unchanged(pipe, snapshot):
                    pipe.multi()
                    pipe.delete(*unit.keys)
                    pipe.execute()
                    res.deleted = True
            except redis.WatchError:
                pass
        if not res.deleted:
            res.reason = "source changed during migration; source kept (run again with --replace)"
    return res


class Progress:
    """A progress bar on a terminal (stderr): sessions done of all, failed."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: Optional[bool] = None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = self.failed = 0

    def step(self, status: str) -> None:
        self.done += 1
        self.failed += status == FAILED
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(1, self.total)
        pct = 100 * self.done // max(1, self.total)
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {pct:3d}% "
                          f"{self.done}/{self.total} sessions, {self.failed} failed")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


class Journal:
    """--state FILE: one JSON line per finished source; a rerun skips those
    moved or skipped (failed ones are tried again)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.finished: Dict[str, Dict[str, Any]] = {}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by an interrupted run
                    if row.get("status") in (MOVED, SKIPPED):
                        self.finished[row["source"]] = row
                    else:
                        self.finished.pop(row.get("source"), None)
        self._f = open(path, "a", encoding="utf-8") if path else None

    def done_before(self, source: str) -> bool:
        return source in self.finished

    def record(self, res: KeyResult) -> None:
        if self._f is not None and res.status != WOULD_MOVE:
            self._f.write(json.dumps(asdict(res)) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def migrate(
    r: "redis.Redis",
    pattern: Optional[str] = None,
    target_template: str = DEFAULT_TEMPLATE,
    dry_run: bool = False,
    delete_source: bool = False,
    replace: bool = False,
    model: Optional[str] = None,
    ttl: Optional[int] = None,
    scan_count: int = 500,
    source: str = "user-memory",
    prefix: str = lc.DEFAULT_DOC_PREFIX,
    state: Optional[str] = None,
    progress: Optional[bool] = False,
    progress_stream: Optional[TextIO] = None,
) -> Report:
    """Migrates every session of `source` (see the module doc); returns the
    report. ``progress``: None = a bar when stderr is a terminal."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}")
    report = Report(dry_run=dry_run)
    work: List[Any] = []  # (name, run() -> KeyResult)
    if source == "user-memory":
        pattern = pattern or DEFAULT_PATTERN
        seen = set()
        for key in r.scan_iter(match=pattern, count=scan_count, _type="string"):
            key = _b(key)
            if key not in seen:  # SCAN may return a key twice
                seen.add(key)
                tgt = target_name(key, pattern, target_template)
                work.append((_show(key), lambda k=key, t=tgt: migrate_key(
                    r, k, t, dry_run, delete_source, replace, model, ttl)))
        work.sort(key=lambda w: w[0])
    else:
        if source == "langchain":
            pattern = pattern or lc.DEFAULT_LIST_PATTERN
            units, read = lc.find_lists(r, pattern, scan_count), lc.read_list
        else:
            pattern = prefix + "*"
            units, read = lc.find_documents(r, prefix, scan_count), lc.read_documents
        for u in units:
            tgt = _b(target_template).replace(b"<suffix>", _b(u.session)).replace(
                b"<session>", _b(u.session)).replace(b"<key>", u.keys[0])
            work.append((u.session, lambda u=u, t=tgt: migrate_unit(
                r, u, read, t, dry_run, delete_source, replace, model, ttl)))
    journal = Journal(state)
    bar = Progress(len(work), progress_stream, progress)
    try:
        for name, run in work:
            if journal.done_before(name):
                row = journal.finished[name]
                res = KeyResult(name, row.get("target", ""), SKIPPED, "finished in an earlier run (--state)",
                                row.get("messages", 0), row.get("deleted", False))
            else:
                res = run()
                journal.record(res)
            report.results.append(res)
            bar.step(res.status)
    finally:
        journal.close()
    report.results.sort(key=lambda x: x.source)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="redis-mem-migrate",
        description="Move user_memory_* JSON keys, LangChain message_store:* lists or langchain-redis "
                    "documents into redis-mem sessions (MEM.IMPORT).",
        epilog="Template placeholders: <session> (= <suffix>), <key>.",
    )
    p.add_argument("--from", dest="source", choices=SOURCES, default="user-memory",
                   help="the store to migrate from (default user-memory)")
    p.add_argument("--url", help="redis://[:password@]host:port/db (overrides --host/--port/--db)")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--password", default=os.environ.get("REDISCLI_AUTH"))
    p.add_argument("--pattern", default=None,
                   help=f"SCAN MATCH pattern (default {DEFAULT_PATTERN}; langchain: {lc.DEFAULT_LIST_PATTERN})")
    p.add_argument("--prefix", default=lc.DEFAULT_DOC_PREFIX,
                   help=f"langchain-redis key_prefix (default {lc.DEFAULT_DOC_PREFIX})")
    p.add_argument("--state", metavar="FILE", help="journal of finished sessions: a rerun resumes after them")
    p.add_argument("--progress", action="store_true", default=None,
                   help="progress bar on stderr even when it is not a terminal")
    p.add_argument("--target-template", default=DEFAULT_TEMPLATE,
                   help=f"session key name (default {DEFAULT_TEMPLATE})")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    p.add_argument("--delete-source", action="store_true", help="delete each source after its import")
    p.add_argument("--replace", action="store_true", help="overwrite existing target keys")
    p.add_argument("--model", help="MODEL for the imported sessions")
    p.add_argument("--ttl", type=int, help="TTL (seconds) for the imported sessions; 0 = none")
    p.add_argument("--scan-count", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    if not any(x in a.target_template for x in ("<suffix>", "<session>", "<key>")):
        p.error("--target-template must contain <session>, <suffix> or <key>")
    if a.ttl is not None and a.ttl < 0:
        p.error("--ttl must be >= 0")

    if a.url:
        r = redis.Redis.from_url(a.url)
    else:
        r = redis.Redis(host=a.host, port=a.port, db=a.db, password=a.password)
    try:
        report = migrate(
            r,
            pattern=a.pattern,
            target_template=a.target_template,
            dry_run=a.dry_run,
            delete_source=a.delete_source,
            replace=a.replace,
            model=a.model,
            ttl=a.ttl,
            scan_count=a.scan_count,
            source=a.source,
            prefix=a.prefix,
            state=a.state,
            progress=a.progress,
        )
    except redis.RedisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if a.json else report.render())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
