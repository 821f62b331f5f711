#!/usr/bin/env python3
"""Move client-side `user_memory_*` JSON keys into redis-mem sessions.

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
    python migrate_user_memory.py --url redis://localhost:6379/0 --dry-run
    python migrate_user_memory.py --host 10.0.0.5 --port 6379 --delete-source
    python migrate_user_memory.py --target-template 'chat:<suffix>' --json
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
from typing import Any, Dict, List, Optional, Sequence, Union

import redis

DEFAULT_PATTERN = "user_memory_*"
DEFAULT_TEMPLATE = "mem:{<suffix>}"
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
    return _b(template).replace(b"<suffix>", suffix).replace(b"<key>", source)


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


def migrate(
    r: "redis.Redis",
    pattern: str = DEFAULT_PATTERN,
    target_template: str = DEFAULT_TEMPLATE,
    dry_run: bool = False,
    delete_source: bool = False,
    replace: bool = False,
    model: Optional[str] = None,
    ttl: Optional[int] = None,
    scan_count: int = 500,
) -> Report:
    """Migrates every string key matching `pattern`; returns the report."""
    report = Report(dry_run=dry_run)
    seen = set()
    for source in r.scan_iter(match=pattern, count=scan_count, _type="string"):
        source = _b(source)
        if source in seen:  # SCAN may return a key twice
            continue
        seen.add(source)
        target = target_name(source, pattern, target_template)
        report.results.append(
            migrate_key(r, source, target, dry_run, delete_source, replace, model, ttl)
        )
    report.results.sort(key=lambda x: x.source)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description="Move user_memory_* JSON keys into redis-mem sessions (MEM.IMPORT).",
        epilog="Template placeholders: <suffix>, <key>.",
    )
    p.add_argument("--url", help="redis://[:password@]host:port/db (overrides --host/--port/--db)")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--password", default=os.environ.get("REDISCLI_AUTH"))
    p.add_argument("--pattern", default=DEFAULT_PATTERN, help=f"SCAN MATCH pattern (default {DEFAULT_PATTERN})")
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
    if "<suffix>" not in a.target_template and "<key>" not in a.target_template:
        p.error("--target-template must contain <suffix> or <key>")
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
        )
    except redis.RedisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if a.json else report.render())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
