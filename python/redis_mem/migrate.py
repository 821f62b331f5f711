"""redis-mem-migrate: move the chat memory of the stores redis-mem replaces
into redis-mem sessions, losing nothing.

Sources (--from):
  user-memory      client-side `user_memory_<id>` JSON strings (below)
  langchain        langchain-community RedisChatMessageHistory lists,
                   `message_store:<id>`
  langchain-redis  langchain-redis per-message JSON documents,
                   `chat:<id>:<ULID>`
  external         the seed's orchestrator conversation ids,
                   `external:<system>:conversation:<id>` (dify, n8n, ...):
                   each becomes the session's external id (MEM.EXTSET) with
                   the source's remaining lifetime as its EX (100 years, the
                   longest, when the source has no expiry)
The LangChain sources become one session per session id, messages in order,
each with its LangChain type and fields in META and its id as MSGID (see
redis_mem.migrate_lc).

Target names: --target-template (default `mem:{<id>}`), where <id> is the
source key after the SOURCE PREFIX (--source-prefix; default user_memory_,
message_store:, chat: (= --prefix), or external:<system>:conversation:),
whatever --pattern selects: `--pattern user_memory_bob` moves
user_memory_bob to mem:{bob}. <session> and <suffix> are other names of
<id>; <key> is the whole source name. A key that does not start with the
prefix, or leaves an empty id, fails (it is never given a made-up name).

What it guarantees:
* Never overwrites a session it did not create in this run, unless
  --replace (the report marks each `replaced` target; a replaced session
  keeps the external ids the source has none for). Two sources mapping
  to one target: the second fails.
* Never drops messages. A history longer than the server's default caps
  (mem.max-messages / mem.max-tokens) is imported whole: MEM.IMPORT gets
  MAXMSGS / MAXTOKENS large enough (up to mem.max-messages-limit /
  mem.max-tokens-limit), and the report says the caps it set. Every import
  is read back (MEM.GET FORMAT JSON) and compared with the source, message
  by message; a session that would not hold every message fails and is not
  written (a history beyond the limits, messages older than mem.max-age,
  a tool result first without its call...). Or, with --overflow summarize,
  the oldest messages are folded into the session summary by an LLM
  (OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL, --langchain-model, or
  --extractive) so that the rest fits the default caps; the report says so.
* An assistant turn that only calls tools (`"content": null` with
  `tool_calls`, OpenAI's shape) is kept with content "", as LangChain and
  MEM.APPEND hold it; any other null content fails the session.
* Message members MEM.IMPORT does not read (`tool_calls`, `tool_call_id`,
  `name` of OpenAI-shaped histories, any other) move into the message's
  META (refused when META has the same name), which the module keeps, reads
  for tool groups and counts; the read-back compares META too.
* Timestamps: numbers are Unix time, seconds below 10^11 (fractions
  allowed), milliseconds otherwise; ISO 8601 strings (UTC when they carry no
  zone); all converted client-side to integer milliseconds (`ts`).
* Lifetimes: each session's key expires when its source would have (PTTL,
  rounded up to seconds), once; the session's TTL setting (what each later
  write refreshes) is the server's mem.ttl, or that lifetime when longer. A
  source without expiry gives a session without one; --ttl sets both.
* --dry-run runs exactly the real run's path (validation, the import, the
  read-back) into a temporary key beside the target, deleted at once:
  sources and targets are left as they are and its report predicts the
  real run's failures exactly. (The real run also imports into that
  temporary key, verifies it, then RENAMEs it onto the target, so a
  target never holds a half-checked session.) The temporary key is the
  target's name + `~redis-mem-migrate~<random>` (on a cluster node, a
  target without a hash tag is wrapped in one): an ACL user needs write
  access to the target's prefix and the source's, and MEM.* (a user
  without RENAME gets the verified copy imported again into the target
  and read back).
* --delete-source deletes a source only after its session was verified,
  and only if the source did not change meanwhile (WATCH; a changed source
  is imported again, over the session only while that still holds what
  the run placed: an application may already write to it; otherwise both
  are kept and the source is reported failed).
* Resumable: --state FILE journals each finished source; a rerun skips
  what it lists as moved (and, with --delete-source, deleted); skipped and
  failed sources are looked at again. A target that already holds exactly
  its source's history (an interrupted or concurrent run) is recognized,
  and its source deleted with --delete-source. Ctrl-C: exit 130. A progress bar on stderr (a terminal, or --progress).

The conversation ids (--from external) go into existing sessions or create
empty ones; migrate them after the histories (a history's target that
exists is otherwise skipped as existing).

Examples:
    redis-mem-migrate --url redis://localhost:6379/0 --dry-run
    redis-mem-migrate --host 10.0.0.5 --port 6379 --delete-source
    redis-mem-migrate --pattern 'user_memory_al*' --target-template 'chat:<id>' --json
    redis-mem-migrate --from langchain --state migrate.state
    redis-mem-migrate --from langchain-redis --prefix chat: --target-template 'mem:{<id>}'
    redis-mem-migrate --from external --delete-source
Exit status: 0 when nothing failed, 1 otherwise, 2 on a usage or connection error.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple, Union

import redis

from . import migrate_lc as lc
from ._replies import _server_ms
from .client import RedisMemClient
from .summarizing import Entry, NoSummarizer, checked_summary, default_summarizer, langchain_summarizer

__all__ = [
    "DEFAULT_PATTERN",
    "DEFAULT_TEMPLATE",
    "KeyResult",
    "Limits",
    "Report",
    "SOURCES",
    "check_document",
    "main",
    "migrate",
    "session_id_of",
    "target_name",
    "to_ms",
]

DEFAULT_PATTERN = "user_memory_*"
DEFAULT_PREFIX = "user_memory_"
DEFAULT_EXTERNAL_PATTERN = "external:*:conversation:*"
DEFAULT_TEMPLATE = "mem:{<id>}"
SOURCES = ("user-memory", "langchain", "langchain-redis", "external")
PLACEHOLDERS = ("<id>", "<session>", "<suffix>", "<key>")
_PLACEHOLDER = re.compile(b"<id>|<session>|<suffix>|<key>")
MAX_ATTEMPTS = 3
#: Role names the module accepts (bytes).
MAX_ROLE_BYTES = 64
MAX_MSGID_BYTES = 128
#: Tokens a message may carry beyond the bytes of its role, content and META
#: (OpenAI's per-message overhead, the per-tool-call overhead): a generous
#: bound, as every token of a BPE encoding covers at least one byte.
OVERHEAD_PER_MESSAGE = 64

MOVED = "moved"
WOULD_MOVE = "would_move"
SKIPPED = "skipped"
FAILED = "failed"


@dataclass
class KeyResult:
    """The outcome of one source (a key, a LangChain session, an external id)."""

    source: str
    target: str
    status: str  # moved | would_move | skipped | failed
    reason: str = ""
    #: Messages in the session after import (verified), or that a dry run verified.
    messages: int = 0
    #: Source deleted (--delete-source), after its session was verified.
    deleted: bool = False
    #: The target existed before this run and was overwritten (--replace).
    replaced: bool = False
    #: The session TTL set (seconds; 0 = none), None when not applicable.
    ttl: Optional[int] = None
    #: How a history longer than the server's default caps was kept whole,
    #: e.g. "imported whole: MAXMSGS 5000 MAXTOKENS 240000"; "" when the
    #: defaults held it.
    caps: str = ""
    #: Messages with neither ``ts`` nor ``timestamp``: MEM.IMPORT stamps them
    #: with the time of the migration (said, not silent).
    untimed: int = 0


@dataclass
class Report:
    """Every source's :class:`KeyResult`; ``render()`` / ``to_dict()``."""

    dry_run: bool
    results: List[KeyResult] = field(default_factory=list)
    #: Temporary keys an interrupted run left without expiry, removed (or,
    #: in a dry run, found) by this one.
    leftovers: List[str] = field(default_factory=list)

    def _with(self, status: str) -> List[KeyResult]:
        return [r for r in self.results if r.status == status]

    @property
    def moved(self) -> List[KeyResult]:
        """Moved (would move, in a dry run)."""
        return self._with(WOULD_MOVE if self.dry_run else MOVED)

    @property
    def skipped(self) -> List[KeyResult]:
        """Skipped (target exists, nothing to move, finished earlier)."""
        return self._with(SKIPPED)

    @property
    def failed(self) -> List[KeyResult]:
        """Failed: the source is left untouched."""
        return self._with(FAILED)

    @property
    def replaced(self) -> List[KeyResult]:
        """Moved over a session that existed before the run (--replace)."""
        return [r for r in self.moved if r.replaced]

    def to_dict(self) -> Dict[str, Any]:
        """The report as JSON-ready data (--json)."""
        return {
            "dry_run": self.dry_run,
            "moved": len(self.moved),
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "replaced": len(self.replaced),
            "leftovers": list(self.leftovers),
            "keys": [asdict(r) for r in self.results],
        }

    def render(self) -> str:
        """The report as text, one line per source and a total."""
        lines = []
        for r in self.results:
            line = f"{r.status:10} {r.source} -> {r.target}"
            if r.status in (MOVED, WOULD_MOVE):
                extra = [f"{r.messages} messages"]
                if r.caps:
                    extra.append(r.caps)
                if r.untimed:
                    extra.append(f"{r.untimed} without a timestamp, stamped with the migration's time")
                if r.ttl is not None:
                    extra.append(f"ttl {r.ttl}s" if r.ttl else "no ttl")
                if r.replaced:
                    extra.append("would replace the existing session" if self.dry_run
                                 else "REPLACED the existing session")
                if r.deleted:
                    extra.append("source deleted")
                line += f" ({', '.join(extra)})"
            if r.reason:
                line += f": {r.reason}"
            lines.append(line)
        if self.leftovers:
            lines.append(f"{'would remove' if self.dry_run else 'removed'} {len(self.leftovers)} temporary "
                         f"key(s) an interrupted run left: {', '.join(self.leftovers)}")
        verb = "would move" if self.dry_run else "moved"
        lines.append(
            f"{verb} {len(self.moved)}, skipped {len(self.skipped)}, failed {len(self.failed)}"
            + (f", replaced {len(self.replaced)}" if self.replaced else "")
            + (" (dry run: nothing written)" if self.dry_run else "")
        )
        return "\n".join(lines)


# --------------------------------------------------------------------------

def _b(v: Union[str, bytes]) -> bytes:
    return v if isinstance(v, bytes) else v.encode("utf-8")


def _s(v: Any) -> Any:
    return v.decode("utf-8") if isinstance(v, bytes) else v


_show = lc.show


def session_id_of(source: bytes, prefix: str) -> bytes:
    """The session id of a source key: what follows ``prefix``. Raises
    ValueError when the key does not start with it or nothing follows."""
    p = _b(prefix)
    if not source.startswith(p):
        raise ValueError(f"the key does not start with the source prefix {prefix!r} (see --source-prefix)")
    rest = source[len(p):]
    if not rest:
        raise ValueError(f"the key leaves an empty session id after the source prefix {prefix!r}")
    return rest


def target_name(source: bytes, session_id: bytes, template: str) -> bytes:
    """The target key: ``template`` with <id> / <session> / <suffix> = the
    session id and <key> = the source key."""
    # One pass: an id that itself holds "<key>" is not substituted again.
    return _PLACEHOLDER.sub(lambda m: source if m.group(0) == b"<key>" else session_id, _b(template))


def to_ms(v: Any) -> int:
    """A timestamp as Unix milliseconds: a number is seconds below 10^11
    (fractions allowed), milliseconds otherwise; a string a number or ISO
    8601 (UTC when it carries no zone). Raises ValueError."""
    if isinstance(v, bool):
        raise ValueError(f"not a timestamp: {v!r}")
    if isinstance(v, Decimal):  # a fraction, as JSON gave it (lc.load_exact)
        v = float(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            num = float(s)
        except ValueError:
            num = None
        if num is None:
            iso = s[:-1] + "+00:00" if s[-1:] in ("Z", "z") else s
            try:
                dt = datetime.fromisoformat(iso)
            except ValueError:
                raise ValueError(f"not a timestamp: {v!r}") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return (dt - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)
        v = num
    if isinstance(v, (int, float)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"not a timestamp: {v!r}")
        ms = v * 1000 if v < 1e11 else v
        return int(round(ms))
    raise ValueError(f"not a timestamp: {v!r}")


def check_document(text: str) -> Dict[str, Any]:
    """Parses and checks the client-side memory shape; raises ValueError
    with the reason. (The import, read back, is the authority.)"""
    try:
        doc = lc.load_exact(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("the document is not a JSON object")
    if "conversation_history" not in doc and ("user_profile" in doc or "context" in doc):
        # A user with a profile (or context) and no conversation yet: an
        # empty session holding them (it was refused, and so never moved).
        doc["conversation_history"] = []
    history = doc.get("conversation_history")
    if not isinstance(history, list):
        raise ValueError("conversation_history is missing or not an array")
    summary = doc.get("summary")
    if isinstance(summary, dict):
        # MEM.IMPORT keeps a summary's text, upto and time (its tokens it
        # counts again): any other member would be dropped, the source deleted.
        other = [k for k in summary if k not in SUMMARY_MEMBERS]
        if other:
            raise ValueError(f"summary has {other[0]!r}: a session's summary keeps only its content, upto and "
                             "time, so it would be lost")
        if "content" in summary and "text" in summary:
            raise ValueError("summary has both content and text: which to keep is the application's call")
        ts, stamp = summary.get("ts"), summary.pop("timestamp", None)
        if ts is not None and stamp is not None and _ms_or_none(ts) != _ms_or_none(stamp):
            raise ValueError("summary has both ts and timestamp, at different times: which to keep is the "
                             "application's call")
        when = ts if ts is not None else stamp
        if when is not None:  # as a message's time: seconds below 10^11
            try:
                summary["ts"] = to_ms(when)
            except ValueError as e:
                raise ValueError(f"summary: {e}") from None
    return doc


#: Members of a summary that MEM.IMPORT reads or can recount (tokens).
SUMMARY_MEMBERS = frozenset({"content", "text", "upto", "ts", "timestamp", "tokens"})


@dataclass
class Limits:
    """The server's caps and limits (CONFIG GET mem.*; the module's
    defaults when CONFIG is refused)."""

    max_messages: int = 30
    max_tokens: int = 80000
    max_messages_limit: int = 100000
    max_tokens_limit: int = 10000000
    max_age: int = 0
    max_message_bytes: int = 4194304
    ttl: int = 86400

    @classmethod
    def read(cls, r: "redis.Redis") -> "Limits":
        """Reads them once from the server."""
        out = cls()
        try:
            got = r.config_get("mem.*")
        except redis.ResponseError:
            return out
        conf = {_s(k): _s(v) for k, v in got.items()}
        for name in ("max_messages", "max_tokens", "max_messages_limit", "max_tokens_limit",
                     "max_age", "max_message_bytes", "ttl"):
            val = conf.get("mem." + name.replace("_", "-"))
            if val is not None:
                try:
                    setattr(out, name, int(val))
                except ValueError:
                    pass
        return out


#: Members of a message that MEM.IMPORT reads; it ignores any other.
MESSAGE_MEMBERS = frozenset({"role", "content", "meta", "id", "ts", "timestamp", "msgid", "tokens"})

#: (role, content, meta) of a message the session must hold.
Expected = Tuple[str, str, Optional[Dict[str, Any]]]


def untimed(history: List[Any]) -> int:
    """Messages with neither ``ts`` nor ``timestamp`` (before
    :func:`prepare_history`, which converts them)."""
    return sum(1 for m in history if isinstance(m, dict) and m.get("ts") is None and m.get("timestamp") is None)


def prepare_history(history: List[Any], limits: Limits) -> List[Expected]:
    """Checks each message as the module will and converts its timestamp
    to integer ms (``ts``), in place. Members MEM.IMPORT does not read
    (``tool_calls``, ``tool_call_id``, ``name`` of OpenAI-shaped histories)
    move into the message's META, which the module keeps and which its tool
    rule and counting read (they were dropped). Returns what the session
    must hold. Raises ValueError with the reason."""
    expected: List[Expected] = []
    for i, m in enumerate(history):
        if not isinstance(m, dict):
            raise ValueError(f"conversation_history[{i}] is not an object")
        role, content = m.get("role"), m.get("content")
        if content is None and _calls_tools(m):
            # OpenAI's shape of a turn that only calls tools: content null.
            # Kept as "" (what LangChain and MEM.APPEND give such a turn).
            content = m["content"] = ""
        if not isinstance(role, str) or not role:
            raise ValueError(f"conversation_history[{i}].role is not a non-empty string")
        if not isinstance(content, str):
            raise ValueError(f"conversation_history[{i}].content is not a string")
        try:
            nbytes = len(role.encode("utf-8")), len(content.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"conversation_history[{i}] holds a lone surrogate (\\ud800-\\udfff escape): "
                             "not valid UTF-8") from None
        if nbytes[0] > MAX_ROLE_BYTES:
            raise ValueError(f"conversation_history[{i}].role is over {MAX_ROLE_BYTES} bytes")
        if nbytes[1] > limits.max_message_bytes:
            raise ValueError(f"conversation_history[{i}].content is {nbytes[1]} bytes, over "
                             f"mem.max-message-bytes ({limits.max_message_bytes})")
        if "meta" in m and m["meta"] is not None and not isinstance(m["meta"], dict):
            raise ValueError(f"conversation_history[{i}].meta is not an object")
        for k in [k for k in m if k not in MESSAGE_MEMBERS and m[k] is None]:
            del m[k]  # carries nothing (MEM.IMPORT leaves null members out too)
        others = [k for k in m if k not in MESSAGE_MEMBERS]
        if others:
            merged = dict(m.get("meta") or {})
            for k in others:
                if k in merged:
                    raise ValueError(f"conversation_history[{i}] has {k!r} both as a member and in its meta")
                merged[k] = m.pop(k)
            m["meta"] = merged
        if m.get("msgid") is not None and (not isinstance(m["msgid"], str)
                                           or len(m["msgid"].encode("utf-8", "surrogatepass")) > MAX_MSGID_BYTES):
            raise ValueError(f"conversation_history[{i}].msgid is not a string of at most {MAX_MSGID_BYTES} bytes")
        ts = m.get("ts")
        stamp = m.pop("timestamp", None)
        if ts is not None and stamp is not None and _ms_or_none(ts) != _ms_or_none(stamp):
            raise ValueError(f"conversation_history[{i}] has both ts and timestamp, at different times: "
                             "which to keep is the application's call")
        try:
            if ts is not None and not isinstance(ts, bool) and isinstance(ts, int):
                m["ts"] = to_ms(ts) if ts < 1e11 else ts
            elif ts is not None:
                m["ts"] = to_ms(ts)
            elif stamp is not None:
                m["ts"] = to_ms(stamp)
        except ValueError as e:
            raise ValueError(f"conversation_history[{i}]: {e}") from None
        expected.append((role, content, m.get("meta") or None))
    return expected


def _ms_or_none(v: Any) -> Optional[int]:
    try:
        return to_ms(v)
    except ValueError:
        return None


def _calls_tools(message: Dict[str, Any]) -> bool:
    """Whether the message carries tool calls (``tool_calls``, a non-empty
    list of objects), as a member or in its META: MEM.IMPORT's rule."""
    meta = message.get("meta")
    calls = message.get("tool_calls")
    if calls is None and isinstance(meta, dict):
        calls = meta.get("tool_calls")
    return isinstance(calls, list) and len(calls) > 0 and all(isinstance(c, dict) for c in calls)


def _encode(doc: Dict[str, Any]) -> bytes:
    try:
        return lc.dump_exact(doc).encode("utf-8")
    except RecursionError:
        raise ValueError("cannot be encoded: nested too deeply") from None
    except UnicodeEncodeError:
        raise ValueError("the document holds a lone surrogate (a \\ud800-\\udfff escape): not valid UTF-8") from None
    except ValueError as e:  # NaN/Infinity are refused by allow_nan? (kept) / circular
        raise ValueError(f"cannot be encoded: {e}") from None


def _reply_map(reply: Any) -> Dict[str, Any]:
    items: Any
    if isinstance(reply, dict):
        items = reply.items()
    else:
        items = zip(reply[0::2], reply[1::2])
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in items}


def _hash_tag(key: bytes) -> Optional[bytes]:
    start = key.find(b"{")
    if start < 0:
        return None
    end = key.find(b"}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1:end]


def _scratch_key(target: bytes, cluster: bool = False) -> bytes:
    """A temporary key that starts with the target's name (so an ACL key
    pattern that lets the user write the target, ``~mem:*``, lets it write
    this one) and, on a cluster node, is in the target's slot (a target
    without a hash tag is then wrapped in one)."""
    tail = b"~redis-mem-migrate~" + uuid.uuid4().hex.encode()
    if not cluster or _hash_tag(target) is not None or b"{" in target or b"}" in target:
        return target + tail
    return b"{" + target + b"}" + tail


#: The key expiry of a temporary key whose session has none (ms): should the
#: run die (kill -9) before it is renamed or deleted, it goes by itself.
SCRATCH_LIFETIME_MS = 86_400_000


def _mortal(r: "redis.Redis", scratch: bytes) -> None:
    """Gives the temporary key an expiry when its session has none (the
    session's TTL setting is untouched; the target is PERSISTed)."""
    if int(r.pttl(scratch)) == -1:
        r.pexpire(scratch, SCRATCH_LIFETIME_MS)


#: The name of a temporary key: the target's, this tail, 32 hex digits.
_SCRATCH_TAIL = re.compile(rb"~redis-mem-migrate~[0-9a-f]{32}\Z")

#: A temporary key without expiry idle this long (s) is a dead run's: a live
#: run gives its key an expiry one round trip after making it.
LEFTOVER_IDLE_S = 60


def _leftovers(r: "redis.Redis", dry_run: bool, count: int) -> List[str]:
    """Removes the temporary keys that a run killed between its import and
    its PEXPIRE (or its PERSIST and RENAME) left without expiry; the ones
    with an expiry go by themselves."""
    found = []
    for key in r.scan_iter(match=b"*~redis-mem-migrate~*", count=count, _type="redis-mem"):
        key = _b(key)
        if not _SCRATCH_TAIL.search(key) or int(r.pttl(key)) != -1:
            continue
        try:
            idle = int(r.object("idletime", key) or 0)
        except redis.ResponseError:  # an LFU maxmemory-policy has no idle time
            continue
        if idle >= LEFTOVER_IDLE_S:
            found.append(_show(key))
            if not dry_run:
                r.unlink(key)
    return found


def _cluster_enabled(r: "redis.Redis") -> bool:
    try:
        return bool(int(r.info("cluster").get("cluster_enabled", 0)))
    except (redis.ResponseError, ValueError, TypeError):
        return False


def _history(r: "redis.Redis", key: bytes) -> List[Tuple[Any, Any, Any]]:
    doc = json.loads(_s(r.execute_command("MEM.GET", key, "FORMAT", "JSON")))
    return [(m.get("role"), m.get("content"), m.get("ts")) for m in doc.get("conversation_history") or []]


def _copy_onto(run: "_Run", res: "KeyResult", scratch: bytes, target: bytes, args: List[Any], replace: bool) -> bool:
    """For a user who may not RENAME: the verified session in ``scratch`` is
    imported again into ``target`` (its FORMAT JSON: settings, caps, ids,
    summary; REPLACE only when replacing, so that a target that appeared
    meanwhile is refused as RENAMENX would) and read back against it."""
    r = run.r
    placed = _placed(r, scratch)
    if placed is None:  # its expiry (the source's) passed meanwhile
        res.status, res.reason = SKIPPED, _LIFETIME_ENDED
        return False
    doc = placed[0]
    maxage = ["MAXAGE", run.maxage] if run.maxage is not None else []
    try:
        r.execute_command("MEM.IMPORT", target, doc, *(["REPLACE"] if replace else []), *args, *maxage)
    except redis.ResponseError as e:
        if "BUSYKEY" in str(e):
            res.status, res.reason = SKIPPED, _TARGET_APPEARED
        else:
            res.status, res.reason = FAILED, f"MEM.IMPORT into the target refused it (no RENAME permission): {e}"
        return False
    if _history(r, target) != _history(r, scratch):
        # Left as it is: an application may have written to it already.
        res.status, res.reason = FAILED, "the target reads back different from the verified import (an " \
            "application may have written to it since): left as it is, the source kept"
        return False
    return True


def ttl_of(r: "redis.Redis", keys: Sequence[bytes]) -> Optional[int]:
    """The remaining lifetime of a source (its longest-lived key), in whole
    seconds rounded up; 0 when one has no expiry; None when all are gone."""
    best: Optional[int] = None
    for k in keys:
        p = int(r.pttl(k))
        if p == -2:
            continue
        if p == -1:
            return 0
        sec = max(1, math.ceil(p / 1000))
        best = sec if best is None else max(best, sec)
    return best


@dataclass
class _Run:
    """What one migration run shares: options, the server's limits, and the
    targets it created (target -> source)."""

    r: "redis.Redis"
    dry_run: bool
    delete_source: bool
    replace: bool
    model: Optional[str]
    ttl: Optional[int]
    maxage: Optional[int]
    limits: Limits
    created: Dict[bytes, str] = field(default_factory=dict)
    #: What each target this run placed held then (its FORMAT JSON): a
    #: source that changed is imported again over it only while it still does.
    placed: Dict[bytes, Optional[Tuple[bytes, int]]] = field(default_factory=dict)
    #: "whole" (raise the caps) or "summarize" (fold what is over the
    #: default caps into the session summary with ``summarize_fn``).
    overflow: str = "whole"
    summarize_fn: Optional[Callable[[Optional[str], Sequence[Any]], str]] = None
    #: Whether the server is a cluster node (temporary keys in the target's slot).
    cluster: Optional[bool] = None


def _caps(run: _Run, n: int, doc_bytes: int) -> Tuple[List[Any], str]:
    """MEM.IMPORT options that keep a history of n messages whole."""
    lim = run.limits
    args: List[Any] = []
    if n > lim.max_messages:
        if n > lim.max_messages_limit:
            raise ValueError(f"{n} messages are more than mem.max-messages-limit ({lim.max_messages_limit}) lets "
                             "a session hold: raise it (CONFIG SET mem.max-messages-limit) to import it whole")
        args += ["MAXMSGS", n]
    bound = doc_bytes + OVERHEAD_PER_MESSAGE * n
    if bound > lim.max_tokens:
        args += ["MAXTOKENS", min(bound, lim.max_tokens_limit)]
    caps = ("imported whole: " + " ".join(str(a) for a in args)) if args else ""
    if run.maxage is not None:
        args += ["MAXAGE", run.maxage]
    return args, caps


def _verify(run: _Run, key: bytes, expected: List[Expected], summary: Any = None) -> str:
    """'' when the session at ``key`` holds exactly ``expected`` (roles,
    contents and metas, in order) and, given the imported document's
    ``summary``, its text and time, else what differs."""
    raw = run.r.execute_command("MEM.GET", key, "FORMAT", "JSON")
    doc = lc.load_exact(_s(raw))
    if isinstance(summary, dict):
        got = doc.get("summary")
        if not isinstance(got, dict) or got.get("content") != summary.get("content", summary.get("text")) or (
                summary.get("ts") is not None and got.get("ts") != summary["ts"]):
            return "the summary reads back different from the source; nothing written"
    got = [(m.get("role"), m.get("content"), m.get("meta") or None) for m in doc.get("conversation_history") or []]
    if len(got) != len(expected):
        lead = 0
        while lead < len(expected) and expected[lead][0] == "tool":
            lead += 1
        why = f"the session would hold {len(got)} of {len(expected)} messages"
        if lead and len(got) == len(expected) - lead:
            why += f" (the module drops the {lead} leading tool result(s) without their call)"
        elif run.limits.max_age or run.maxage:
            why += " (messages older than MAXAGE / mem.max-age are evicted: --maxage 0 keeps them)"
        return why + "; nothing written"
    for i, (g, e) in enumerate(zip(got, expected)):
        # As text: true is not 1, and every digit of a number counts.
        if lc.dump_exact(g) != lc.dump_exact(e):
            return f"message {i + 1} reads back different from the source; nothing written"
    return ""


def _require_module(r: "redis.Redis") -> None:
    """Raises when the server has no redis-mem module (every source would
    otherwise fail, one line each, with "unknown command 'MEM.IMPORT'")."""
    try:
        r.execute_command("MEM.INFO", b"{redis-mem-migrate}:probe")
    except redis.ResponseError as e:  # NOPERM and the like: the imports will say
        if "unknown command" in str(e).lower():
            raise redis.ResponseError("the server has no redis-mem module (MEM.* are unknown commands): load it "
                                      "(--loadmodule libredis_mem.so, or MODULE LOAD) and run again") from None


def _require_transactions(r: "redis.Redis") -> None:
    """--delete-source deletes a source under WATCH and MULTI/EXEC, so one an
    application wrote meanwhile is kept. redis-py sends MULTI, DEL and EXEC
    together: for a user who may not run MULTI the DEL would run unguarded
    and EXEC then fail. Raises, before anything is written, when this user
    may not run MULTI or EXEC (an empty transaction, on a connection of its
    own that is closed after: one left inside MULTI would queue every
    later command)."""
    pool = r.connection_pool
    try:
        conn = pool.get_connection()
    except TypeError:  # redis-py 5 wants a command name
        conn = pool.get_connection("MULTI")
    try:
        for command in ("MULTI", "EXEC"):
            conn.send_command(command)
            try:
                conn.read_response()
            except (redis.exceptions.NoPermissionError, redis.exceptions.ExecAbortError) as e:
                raise redis.exceptions.NoPermissionError(
                    f"--delete-source needs MULTI and EXEC (a source is deleted only if unchanged, under WATCH): "
                    f"{e}. Grant them (+multi +exec +watch), or run without --delete-source; nothing was written"
                ) from None
    finally:
        conn.disconnect()
        pool.release(conn)


def _place(run: _Run, res: KeyResult, source_name: str, target: bytes, value: bytes,
           expected: List[Expected], ttl: Optional[int]) -> bool:
    """Imports ``value`` into a temporary key, verifies it, then (real run)
    renames it onto ``target``. Sets ``res``; True when the target now holds
    the verified session (or would, in a dry run)."""
    r = run.r
    owner = run.created.get(target)
    if owner is not None and owner != source_name:
        res.status, res.reason = FAILED, f"{_show(target)} is already the target of {owner} in this run"
        return False
    ours = owner == source_name
    # An existing target is compared, once the source is imported, with
    # what the import made: only the very same session is taken as moved.
    existing = False
    if not ours and r.exists(target):
        if not run.replace:
            existing = True
        else:
            # --replace replaces sessions only: a key of another type is an
            # application's data, or a source of this very run (a target
            # template whose names match the pattern), never ours to overwrite.
            kind = _b(r.type(target))
            if kind != b"redis-mem" and kind != b"none":
                res.status, res.reason = FAILED, f"target key holds a {_show(kind)}, not a redis-mem session: " \
                    "not replaced (--replace replaces sessions only)"
                return False
            res.replaced = kind == b"redis-mem"
    try:
        caps_args, res.caps = _caps(run, len(expected), len(value))
    except ValueError as e:
        res.status, res.reason = FAILED, str(e)
        return False
    args: List[Any] = []
    if run.model:
        args += ["MODEL", run.model]
    expire_s = 0
    if ttl is not None:
        if run.ttl is not None or ttl == 0:
            args += ["TTL", ttl]  # --ttl, or no expiry at the source: the session's setting
        else:
            # The source's remaining lifetime is when it would have expired,
            # not how long each later write keeps the session: the key gets
            # it once (below), and the session's TTL setting is what the
            # import gives it (the server's mem.ttl, or the document's own),
            # or that lifetime when longer (it became each write's TTL: 60 s
            # left made a session expire a minute after every turn).
            expire_s = min(ttl, MAX_TTL_S)
        res.ttl = ttl
    sent = lc.load_exact(_s(value))  # the document as imported
    if run.cluster is None:
        run.cluster = _cluster_enabled(r)
    scratch = _scratch_key(target, run.cluster)
    try:
        try:
            reply = _reply_map(r.execute_command("MEM.IMPORT", scratch, value, *args, *caps_args))
            if "MAXTOKENS" in caps_args:
                # The token cap was a bound (bytes + overhead): now that the
                # module counted them, import again with the cap it needs.
                i = caps_args.index("MAXTOKENS")
                total = int(reply.get("total_tokens", 0))
                if total < caps_args[i + 1] and int(reply.get("messages", 0)) == len(expected):
                    if total <= run.limits.max_tokens:
                        del caps_args[i:i + 2]
                    else:
                        caps_args[i + 1] = total
                    r.execute_command("MEM.IMPORT", scratch, value, "REPLACE", *args, *caps_args)
                    shown = caps_args[:caps_args.index("MAXAGE")] if "MAXAGE" in caps_args else caps_args
                    res.caps = ("imported whole: " + " ".join(str(a) for a in shown)) if shown else ""
            if expire_s:
                setting = int(_reply_map(r.execute_command("MEM.INFO", scratch)).get("ttl") or 0)
                if setting and expire_s > setting:
                    setting = expire_s
                    r.execute_command("MEM.IMPORT", scratch, value, "REPLACE", *args, "TTL", setting, *caps_args)
                args += ["TTL", setting]  # what later imports of this session keep
        except redis.ResponseError as e:
            msg = str(e)
            if "unknown option" in msg and res.caps:
                msg = (f"this module's MEM.IMPORT has no MAXMSGS/MAXTOKENS (SPEC v3), so the {len(expected)} "
                       "messages would be cut to the default caps: upgrade the module")
            else:
                msg = f"MEM.IMPORT refused it: {msg}"
                if isinstance(e, redis.exceptions.NoPermissionError):
                    msg += f" (the run imports into the temporary key {_show(scratch)} first: let the user write it)"
            res.status, res.reason = FAILED, msg
            return False
        _mortal(r, scratch)
        why = _verify(run, scratch, expected, sent.get("summary"))
        if why:
            res.status, res.reason = FAILED, why
            return False
        res.messages = len(expected)
        if res.caps and run.overflow == "summarize" and not _fold(run, res, scratch, expected, args):
            return False
        if ttl == 0:
            # Off before it becomes the target (a user who may not PERSIST
            # fails here, with nothing written; the dry run finds it too).
            r.persist(scratch)
        elif expire_s:
            r.pexpire(scratch, expire_s * 1000)  # RENAME keeps it
        if existing:
            # What the target is, read once: compared, and kept as what the
            # run placed (a write after this read is seen by the next guard).
            try:
                made, there = _placed(r, scratch), _placed(r, target)
            except redis.ResponseError:  # not a session (WRONGTYPE)
                made = there = None
            if made is None or there is None or not _same_session(made, there, sent):
                res.status, res.reason = SKIPPED, _TARGET_EXISTS
                return False
            # An earlier run (interrupted between its RENAME and its delete,
            # or a concurrent one) moved this very session.
            res.status, res.reason = SKIPPED, "the target already holds exactly this session (an earlier " \
                "or concurrent run moved it)" + ("; --delete-source deletes the source" if run.delete_source
                                                 and not run.dry_run else "")
            run.created[target] = source_name
            run.placed[target] = there
            if ttl == 0 and not run.dry_run and there[1] != -1:
                # The earlier run died between its RENAME and its PERSIST.
                r.persist(target)
                run.placed[target] = _placed(r, target)
            return True
        if res.replaced and not ours and not _keep_target_ids(r, res, scratch, target):
            return False
        if run.dry_run:
            res.status = WOULD_MOVE
            run.created[target] = source_name
            return True
        placing = _placed(r, scratch)
        if placing is None:  # its expiry (the source's) passed meanwhile
            res.status, res.reason = SKIPPED, _LIFETIME_ENDED
            return False
        try:
            if ours:
                if not _replace_placed(run, res, scratch, target):
                    return False
            elif res.replaced:
                r.rename(scratch, target)
            elif not r.renamenx(scratch, target):
                res.status, res.reason = SKIPPED, _TARGET_APPEARED
                return False
        except redis.exceptions.NoPermissionError:
            # ACL without RENAME / RENAMENX: import the verified copy again
            # (not over a session already placed: that needs the guarded RENAME).
            if ours:
                res.status, res.reason = FAILED, "the source changed after this run moved it; importing it " \
                    "again over the session needs RENAME: both kept as they are"
                return False
            if _placed(r, scratch) is None:  # its expiry (the source's) passed meanwhile
                res.status, res.reason = SKIPPED, _LIFETIME_ENDED
                return False
            if not _copy_onto(run, res, scratch, target, args, res.replaced):
                return False
            if expire_s:
                r.pexpire(target, expire_s * 1000)
            r.unlink(scratch)
            placing = _placed(r, target)
        except redis.ResponseError as e:
            if "crossslot" in str(e).lower() or isinstance(e, redis.exceptions.ClusterCrossSlotError):
                res.status, res.reason = FAILED, "the target's temporary key falls in another slot (its name " \
                    "has braces that are no hash tag): choose a --target-template with a hash tag"
                return False
            if "no such key" not in str(e).lower():
                raise
            # The source's last moments passed while it was moved: the
            # session expired with them, as the source did.
            res.status, res.reason = SKIPPED, _LIFETIME_ENDED
            return False
        scratch = b""
        run.created[target] = source_name
        run.placed[target] = placing
        res.status = MOVED
        return True
    finally:
        if scratch:
            r.unlink(scratch)


_TARGET_EXISTS = "target key exists (use --replace, which overwrites it: merge by hand what the session holds " \
    "and the source lacks)"

_TARGET_APPEARED = "target key appeared during the migration (use --replace, which overwrites it: it may be " \
    "an application's new session)"

_LIFETIME_ENDED = "the source's lifetime ended during the migration (so did its session)"

_BOTH_CHANGED = ("the source changed after this run moved it, and so did the session (an application wrote to it, "
                 "or changed its expiry): both kept as they are, the source's change not imported; merge them "
                 "by hand (--replace would overwrite what the application wrote)")

#: The longest TTL a session takes (MEM.IMPORT's TTL: 100 years).
MAX_TTL_S = 3_153_600_000


def _expiry_at(r: "redis.Redis", key: bytes) -> int:
    """A key's expiry as an absolute time in ms (PEXPIRETIME: -1 none, -2 no key)."""
    return int(r.execute_command("PEXPIRETIME", key))


def _placed(r: "redis.Redis", key: bytes) -> Optional[Tuple[bytes, int]]:
    """What a session is, to tell later whether anyone changed it: its
    FORMAT JSON and its expiry (an absolute time, -1 for none); None when
    the key is gone."""
    # MEM.GET of a missing key answers an empty session: the expiry says
    # whether it is there (-2: gone), read after it.
    doc = r.execute_command("MEM.GET", key, "FORMAT", "JSON")
    at = _expiry_at(r, key)
    if at == -2 or doc is None:
        return None
    return _b(doc), at


def _same_session(scratch: Tuple[bytes, int], target: Tuple[bytes, int], sent: Dict[str, Any]) -> bool:
    """Whether the target (FORMAT JSON, expiry) is the session the import
    made in scratch: the same document, as text (true is not 1, every digit
    counts), but for what each run makes up: the times of the messages the
    source left untimed (``sent``, the imported document, says which) and
    a TTL setting and an expiry that are no shorter than this run's (the
    earlier run's count from the same source's expiry)."""
    def doc(text: bytes) -> Any:
        return lc.load_exact(_s(text))
    try:
        mine, theirs = doc(scratch[0]), doc(target[0])
    except (ValueError, TypeError):
        return False
    untimed = [i for i, m in enumerate(sent.get("conversation_history") or [])
               if isinstance(m, dict) and m.get("ts") is None]
    sent_summary = sent.get("summary")
    untimed_summary = isinstance(sent_summary, dict) and sent_summary.get("ts") is None
    settings = []
    mine_meta = mine.get("redis_mem") if isinstance(mine, dict) else None
    no_ids = isinstance(mine_meta, dict) and not mine_meta.get("external")
    for d in (mine, theirs):
        meta = d.get("redis_mem") if isinstance(d, dict) else None
        if no_ids and isinstance(meta, dict):
            # External ids the source does not carry: --from external put
            # them there (its documented order: after the histories).
            meta.pop("external", None)
        settings.append(meta.pop("ttl", None) if isinstance(meta, dict) else None)
        summary = d.get("summary") if isinstance(d, dict) else None
        if untimed_summary and isinstance(summary, dict):
            summary.pop("ts", None)
            summary.pop("timestamp", None)
        history = (d.get("conversation_history") or []) if isinstance(d, dict) else []
        # Counted from the end: a summary may have folded the oldest.
        offset = len(history) - len(sent.get("conversation_history") or [])
        for m in (history[offset + i] for i in untimed if 0 <= offset + i < len(history)):
            if isinstance(m, dict):
                m.pop("ts", None)
                m.pop("timestamp", None)
    if lc.dump_exact(mine) != lc.dump_exact(theirs):
        return False
    my_ttl, their_ttl = settings
    if their_ttl != 0 and (my_ttl == 0 or not isinstance(their_ttl, int) or not isinstance(my_ttl, int)
                           or their_ttl < my_ttl):
        return False
    my_at, their_at = scratch[1], target[1]
    # Seconds rounded up on both sides: the earlier run's expiry may be up to 1 s before this one's.
    return their_at == -1 or (my_at != -1 and their_at >= my_at - 1000)


def _external_ids(r: "redis.Redis", key: bytes) -> Dict[str, Dict[str, Any]]:
    """A session's external ids, system -> {"id", "expires" (absolute ms)},
    from its FORMAT JSON ({} when it has none or is not a session)."""
    try:
        doc = json.loads(_s(r.execute_command("MEM.GET", key, "FORMAT", "JSON")))
    except (redis.ResponseError, ValueError, TypeError):
        return {}
    meta = doc.get("redis_mem") if isinstance(doc, dict) else None
    ids = meta.get("external") if isinstance(meta, dict) else None
    return ids if isinstance(ids, dict) else {}


def _keep_target_ids(r: "redis.Redis", res: KeyResult, scratch: bytes, target: bytes) -> bool:
    """--replace overwrites the target's history, not what the source never
    had: the external ids the target holds for systems the import lacks (put
    there by --from external or the application) go into ``scratch`` before
    it takes the target's place (the dry run too: it meets the same refusals),
    each until its own expiry (rounded up to the second, as MEM.EXTSET takes
    it) or the key's, which stays the source's: MEM.EXTSET would have kept
    the whole session alive as long as the id. False (``res`` failed) when
    the user may not run MEM.EXTSET."""
    theirs = _external_ids(r, target)
    if not theirs:
        return True
    mine = _external_ids(r, scratch)
    key_at = _expiry_at(r, scratch)
    if key_at == -2:
        return True  # its lifetime (the source's) ended: MEM.EXTSET would make a new one
    now_ms = _server_ms(r)
    kept = []
    for system, entry in sorted(theirs.items()):
        if system in mine or not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        expires = entry.get("expires")
        left_ms = expires - now_ms if isinstance(expires, int) else 0
        if left_ms <= 0:
            continue  # expired as this run read it
        try:
            r.execute_command("MEM.EXTSET", scratch, system, entry["id"], "EX",
                              min(math.ceil(left_ms / 1000), EXT_TTL_MAX_S))
        except redis.exceptions.NoPermissionError as e:
            res.status, res.reason = FAILED, f"--replace keeps the replaced session's {system} id, and this " \
                f"user may not run MEM.EXTSET ({e}): the target left as it is"
            return False
        kept.append(system)
    if key_at > 0:
        r.pexpireat(scratch, key_at)
    if kept:
        note = "kept the replaced session's external ids (" + ", ".join(kept) + ")"
        res.reason = f"{res.reason}; {note}" if res.reason else note
    return True


def _replace_placed(run: _Run, res: KeyResult, scratch: bytes, target: bytes) -> bool:
    """Renames ``scratch`` onto the session this run placed at ``target``
    (its source changed after the move) only while the target holds exactly
    what the run placed, under WATCH: an application may already write to
    the new session, and a plain RENAME dropped what it wrote."""
    placed = run.placed.get(target)
    with run.r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(target)
            now = _placed(pipe, target)
            if now is None:
                res.status, res.reason = FAILED, "the source changed after this run moved it, and the session " \
                    "is gone (deleted or expired since): the source kept, not imported again"
                return False
            if now != placed:
                res.status, res.reason = FAILED, _BOTH_CHANGED
                return False
            pipe.multi()
            pipe.rename(scratch, target)
            pipe.execute()
        except redis.WatchError:
            res.status, res.reason = FAILED, _BOTH_CHANGED
            return False
    return True


def _fold(run: _Run, res: KeyResult, scratch: bytes, expected: List[Expected], args: List[Any]) -> bool:
    """--overflow summarize: the verified whole session in ``scratch`` gets
    its oldest messages folded into its summary (``summarize_fn``) so that
    the rest fits the server's default caps, then is imported again with
    those caps and verified (the summary, and every message kept)."""
    r, lim = run.r, run.limits
    entries = RedisMemClient(r).get(scratch)
    threshold = max(1, math.ceil(lim.max_messages * 0.8) - 1)
    keep, used = 0, 0
    for e in reversed(entries):
        if keep >= threshold or used + e.tokens > lim.max_tokens // 2:
            break
        keep, used = keep + 1, used + e.tokens
    check = RedisMemClient(r).summarize_check(scratch, keep=max(1, keep))
    folded = [e for e in entries if not e.is_summary and e.id <= check.upto]
    if not folded:
        res.status, res.reason = FAILED, "the history is over the caps but nothing can be summarized (tool groups)"
        return False
    kept = len(expected) - len(folded)
    res.caps = f"{len(folded)} oldest messages summarized into the session summary, {kept} kept"
    if run.dry_run:
        res.messages = kept
        return True
    if run.summarize_fn is None:
        res.status, res.reason = FAILED, "--overflow summarize needs an LLM (see --help)"
        return False
    try:
        # The source's own summary goes into the new one (it replaces it).
        previous = next((e.content for e in entries if e.is_summary), None)
        text = checked_summary(run.summarize_fn(previous, [Entry(e.id, e.role, e.content, e.ts, e.meta)
                                                           for e in folded]))
    except Exception as e:
        res.status, res.reason = FAILED, f"the summary failed ({e}); nothing written"
        return False
    mem = RedisMemClient(r)
    mem.summarize(scratch, check.upto, text)
    doc = lc.load_exact(_s(r.execute_command("MEM.GET", scratch, "FORMAT", "JSON")))
    settings = doc.get("redis_mem")
    if isinstance(settings, dict):  # back to the server's default caps
        settings["maxmsgs"], settings["maxtokens"] = lim.max_messages, lim.max_tokens
    maxage = ["MAXAGE", run.maxage] if run.maxage is not None else []
    try:
        r.execute_command("MEM.IMPORT", scratch, _encode(doc), "REPLACE", *args, *maxage)
    except redis.ResponseError as e:
        res.status, res.reason = FAILED, f"MEM.IMPORT refused the summarized session: {e}"
        return False
    _mortal(r, scratch)
    why = _verify(run, scratch, expected[len(folded):])
    back = mem.get(scratch)
    if not why and not (back and back[0].is_summary and back[0].content == text):
        why = "the summary reads back different; nothing written"
    if why:
        res.status, res.reason = FAILED, why
        return False
    res.messages = kept
    return True


def _delete_if_unchanged(r: "redis.Redis", source: bytes, value: bytes, at: int) -> Optional[bytes]:
    """Deletes `source` if it still holds `value` and expires at `at`
    (PEXPIRETIME: an application's PERSIST or EXPIRE is a change the session
    must follow). Returns None when deleted, else the value it holds now
    (b"" if it is gone or not a string)."""
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
            if now != value or _expiry_at(pipe, source) != at:
                return now
            pipe.multi()
            pipe.delete(source)
            pipe.execute()
            return None
        except redis.WatchError:
            now = r.get(source)
            return b"" if now is None else _b(now)


#: A guarded delete the server refused (NOPERM for WATCH or DEL; EXECABORT
#: when a queued command was refused): nothing was deleted.
_REFUSED_DELETE = (redis.exceptions.NoPermissionError, redis.exceptions.ExecAbortError)


def _kept_by_acl(res: KeyResult, err: redis.RedisError) -> KeyResult:
    """The session is in place and verified; the ACL refused WATCH or DEL of
    the source, which is kept."""
    res.reason = f"source kept: the ACL refused its guarded delete ({err})"
    return res


def _document(value: bytes, limits: Limits) -> Tuple[bytes, List[Expected], int]:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"value is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    doc = check_document(text)
    stamped = untimed(doc["conversation_history"])
    expected = prepare_history(doc["conversation_history"], limits)
    return _encode(doc), expected, stamped


def migrate_key(run: _Run, source: bytes, target: bytes) -> KeyResult:
    """One ``user_memory_*`` key into ``target``."""
    r = run.r
    name = _show(source)
    res = KeyResult(name, _show(target), FAILED)
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
    at = _expiry_at(r, source)
    ttl = run.ttl if run.ttl is not None else ttl_of(r, [source])
    if ttl is None:  # expired between GET and PTTL: not given a new lifetime (mem.ttl)
        res.status, res.reason = SKIPPED, "source key expired or was deleted during the migration"
        return res
    for _attempt in range(MAX_ATTEMPTS):
        try:
            doc_bytes, expected, res.untimed = _document(value, run.limits)
        except ValueError as e:
            res.status, res.reason = FAILED, str(e) if not res.messages else (
                f"source changed to an invalid document after import ({e}); source kept")
            return res
        if not _place(run, res, name, target, doc_bytes, expected, ttl):
            return res
        if run.dry_run or not run.delete_source:
            return res
        try:
            now = _delete_if_unchanged(r, source, value, at)
        except _REFUSED_DELETE as e:
            return _kept_by_acl(res, e)
        if now is None:
            res.deleted = True
            return res
        if now == b"":
            res.reason = "source vanished or changed type after import; nothing deleted"
            return res
        # The application wrote to the source meanwhile: import the new value
        # over the session this run just created (while no one wrote to
        # that: _replace_placed), then try the delete again.
        value = now
        at = _expiry_at(r, source)
        if run.ttl is None:
            now_ttl = ttl_of(r, [source])
            ttl = ttl if now_ttl is None else now_ttl
    res.reason = "source kept changing during migration; source kept, session holds a recent copy"
    return res


def migrate_unit(run: _Run, unit: "lc.Unit", read: Callable[["redis.Redis", "lc.Unit"], Any],
                 target: bytes) -> KeyResult:
    """One LangChain session (a list, or a group of documents) into `target`."""
    r = run.r
    res = KeyResult(unit.session, _show(target), FAILED)
    if target in unit.keys:
        res.reason = "the target template maps the session onto one of its source keys"
        return res
    try:
        doc, snapshot = read(r, unit)
        expiries = {k: _expiry_at(r, k) for k in unit.keys}
        res.untimed = untimed(doc["conversation_history"])
        expected = prepare_history(doc["conversation_history"], run.limits)
        value = _encode(doc)
    except (ValueError, redis.ResponseError) as e:
        res.reason = str(e)
        return res
    if not doc["conversation_history"]:
        res.status, res.reason = SKIPPED, "no messages"
        return res
    ttl = run.ttl if run.ttl is not None else ttl_of(r, unit.keys)
    if ttl is None:
        res.status, res.reason = SKIPPED, "source keys expired or were deleted during the migration"
        return res
    if not _place(run, res, unit.session, target, value, expected, ttl):
        return res
    if run.delete_source and not run.dry_run:
        with r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(*unit.keys)
                documents = read is lc.read_documents
                same_expiry = all(_expiry_at(pipe, k) == at for k, at in expiries.items())
                if lc.unchanged(pipe, snapshot) and same_expiry and not (documents and lc.new_documents(pipe, unit)):
                    pipe.multi()
                    pipe.delete(*unit.keys)
                    pipe.execute()
                    res.deleted = True
            except redis.WatchError:
                pass
            except _REFUSED_DELETE as e:
                return _kept_by_acl(res, e)
            except redis.ResponseError as e:
                if "crossslot" not in str(e).lower() and not isinstance(e, redis.exceptions.ClusterCrossSlotError):
                    raise
                res.reason = "source kept: its keys are in several slots of the cluster, so they cannot be " \
                    "deleted together only if unchanged; delete them by hand"
                return res
        # A document written between that look and the delete: said, not lost in silence.
        late = lc.new_documents(r, unit) if res.deleted and read is lc.read_documents else []
        if late:
            res.status, res.reason = FAILED, f"moved, its documents deleted, but {len(late)} message " \
                f"document(s) written meanwhile ({_show(late[0])}...) are not in the session: move them by hand " \
                "(a rerun with --replace would put them in the session's place)"
            return res
        if not res.deleted:
            res.reason = "source changed during migration; source kept, the session holds it as it was " \
                "before: compare them before a rerun with --replace (it overwrites the session, what an " \
                "application wrote to it since included)"
    return res


#: MEM.EXTSET's longest EX (100 years).
EXT_TTL_MAX_S = 3_153_600_000


def migrate_external(run: _Run, source: bytes, system: str, target: bytes) -> KeyResult:
    """One ``external:<system>:conversation:<id>`` key into the session's
    external ids (MEM.EXTSET target system value EX <remaining lifetime>)."""
    r = run.r
    res = KeyResult(_show(source), _show(target) + f" [{system}]", FAILED)
    try:
        value = r.get(source)
    except redis.ResponseError as e:
        res.reason = f"not a string key ({e})"
        return res
    if value is None:
        res.status, res.reason = SKIPPED, "source key disappeared"
        return res
    value = _b(value)
    try:
        cid = value.decode("utf-8")
    except UnicodeDecodeError as e:
        res.reason = f"value is not valid UTF-8 ({e.reason} at byte {e.start})"
        return res
    if not cid:
        res.reason = "empty conversation id"
        return res
    at = _expiry_at(r, source)
    ttl = run.ttl if run.ttl is not None else ttl_of(r, [source])
    if ttl is None:
        res.status, res.reason = SKIPPED, "source key disappeared"
        return res
    # No expiry at the source: the longest MEM.EXTSET keeps (mem.ext-ttl, a
    # day by default, would drop an id the source kept for good).
    ex: List[Any] = ["EX", ttl or EXT_TTL_MAX_S]
    res.ttl = ttl
    if not ttl:
        res.reason = "the source had no expiry: the id expires in 100 years, the longest MEM.EXTSET keeps"
    key_exists = bool(r.exists(target))
    if key_exists:
        try:
            held = _s(r.execute_command("MEM.EXTGET", target, system))
        except redis.ResponseError as e:
            res.reason = f"the target is not a redis-mem session ({e})"
            return res
        if held is not None and held != cid and not run.replace:
            res.status, res.reason = SKIPPED, f"the session already holds another {system} id (use --replace)"
            return res
        res.replaced = held is not None and held != cid
    if run.cluster is None:
        run.cluster = _cluster_enabled(r)
    scratch = _scratch_key(target, run.cluster)
    try:
        r.execute_command("MEM.EXTSET", scratch, system, cid, *ex)
        ok = _s(r.execute_command("MEM.EXTGET", scratch, system)) == cid
    except redis.ResponseError as e:
        res.reason = f"MEM.EXTSET refused it: {e}"
        return res
    finally:
        r.unlink(scratch)
    if not ok:
        res.reason = "the id reads back different; nothing written"
        return res
    res.messages = 0
    if run.dry_run:
        res.status = WOULD_MOVE
        return res
    r.execute_command("MEM.EXTSET", target, system, cid, *ex)
    if _s(r.execute_command("MEM.EXTGET", target, system)) != cid:
        res.reason = "the id reads back different from the source; source kept"
        return res
    res.status = MOVED
    if run.delete_source:
        try:
            res.deleted = _delete_if_unchanged(r, source, value, at) is None
        except _REFUSED_DELETE as e:
            return _kept_by_acl(res, e)
        if not res.deleted:
            res.reason = "source changed during migration; source kept"
    return res


class Progress:
    """A progress bar on a terminal (stderr): sessions done of all, failed."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: Optional[bool] = None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = self.failed = 0

    def step(self, status: str) -> None:
        """One more source finished with ``status``."""
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
    moved (and, with --delete-source, deleted). Skipped and failed ones are
    looked at again: a source skipped as "target key exists (use
    --replace)" is moved by a rerun with --replace, one moved without
    --delete-source is deleted by a rerun with it."""

    def __init__(self, path: Optional[str], delete_source: bool = False, scope: str = ""):
        self.path = path
        self.delete_source = delete_source
        # What a row's source name means: the kind of source, its prefix and
        # the target template (a LangChain session id alone named sessions
        # of another store or app as finished).
        self.scope = scope
        self.finished: Dict[str, Dict[str, Any]] = {}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by an interrupted run
                    if row.get("scope") != scope:
                        continue  # another kind of source's, or an earlier release's: looked at again
                    if row.get("status") == MOVED:
                        self.finished[row["source"]] = row
                    else:
                        self.finished.pop(row.get("source"), None)
        self._f = open(path, "a", encoding="utf-8") if path else None

    def done_before(self, source: str) -> bool:
        """Whether an earlier run finished ``source``."""
        row = self.finished.get(source)
        # A source journaled deleted and found again was written anew since:
        # it is looked at again, not skipped as finished.
        return row is not None and not self.delete_source and not row.get("deleted")

    def record(self, res: KeyResult) -> None:
        """Journals a finished source."""
        if self._f is not None and res.status != WOULD_MOVE:
            self._f.write(json.dumps({**asdict(res), "scope": self.scope}) + "\n")
            self._f.flush()

    def close(self) -> None:
        """Closes the journal file."""
        if self._f is not None:
            self._f.close()


def _failed(name: str, target: str, reason: str) -> Callable[[], KeyResult]:
    return lambda: KeyResult(name, target, FAILED, reason)


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
    source_prefix: Optional[str] = None,
    maxage: Optional[int] = None,
    systems: Sequence[str] = ("dify", "n8n"),
    overflow: str = "whole",
    summarize_fn: Optional[Callable[[Optional[str], Sequence[Any]], str]] = None,
) -> Report:
    """Migrates every session of ``source`` (see the module doc) and returns
    the report. ``pattern`` selects source keys (SCAN MATCH); the session id
    is the key after ``source_prefix`` (default per source; ``prefix`` for
    langchain-redis). ``ttl``: None carries each source's remaining TTL.
    ``maxage``: MAXAGE for the sessions (None: the server's). ``systems``:
    the orchestrators of ``source="external"``. ``overflow``: a history over
    the server's default caps is imported ``"whole"`` (the caps raised) or,
    with ``"summarize"``, its oldest messages are folded into the session
    summary by ``summarize_fn(previous, entries) -> text``. ``progress``:
    None = a bar when stderr is a terminal."""
    if overflow not in ("whole", "summarize"):
        raise ValueError('overflow must be "whole" or "summarize"')
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}")
    if not any(ph in target_template for ph in PLACEHOLDERS):
        raise ValueError("the target template must contain <id> (or <session>, <suffix>, <key>)")
    pool = getattr(r, "connection_pool", None)
    kw = dict(getattr(pool, "connection_kwargs", {}) or {})
    if kw.get("decode_responses") and pool is not None:
        # Source values may not be UTF-8: read them as bytes, on a pool of
        # our own with the caller's connection settings.
        kw["decode_responses"] = False
        raw = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kw))
        try:
            return migrate(raw, pattern, target_template, dry_run, delete_source, replace, model, ttl, scan_count,
                           source, prefix, state, progress, progress_stream, source_prefix, maxage, systems,
                           overflow, summarize_fn)
        finally:
            raw.close()
    _require_module(r)
    if delete_source:
        _require_transactions(r)
    run = _Run(r, dry_run, delete_source, replace, model, ttl, maxage, Limits.read(r), overflow=overflow,
               summarize_fn=summarize_fn)
    report = Report(dry_run=dry_run)
    report.leftovers = _leftovers(r, dry_run, scan_count)
    work: List[Tuple[str, Callable[[], KeyResult]]] = []
    if source in ("user-memory", "external"):
        if source == "user-memory":
            pattern = pattern or (source_prefix + "*" if source_prefix else DEFAULT_PATTERN)
            sp = DEFAULT_PREFIX if source_prefix is None else source_prefix
        else:
            pattern = pattern or DEFAULT_EXTERNAL_PATTERN
            sp = ""
        seen = set()
        for key in r.scan_iter(match=pattern, count=scan_count):
            key = _b(key)
            if key in seen:  # SCAN may return a key twice
                continue
            seen.add(key)
            name = _show(key)
            try:
                if source == "user-memory":
                    sid = session_id_of(key, sp)
                else:
                    parts = key.split(b":", 3)
                    if len(parts) != 4 or parts[0] != b"external" or parts[2] != b"conversation" or not parts[3]:
                        raise ValueError("not an external:<system>:conversation:<id> key")
                    system = _show(parts[1])
                    if system not in systems:
                        continue  # another system's key: not asked for
                    sid = session_id_of(key, source_prefix) if source_prefix else parts[3]
            except ValueError as e:
                work.append((name, _failed(name, "", str(e))))
                continue
            # Every key asked for is reported: one that is not a JSON string
            # (a hash, a RedisJSON document) is a failure, not skipped in
            # silence; a session of the module (moved already) or a key gone
            # since the scan is not a source.
            try:
                kind = _show(_b(r.type(key)))
            except redis.exceptions.NoPermissionError as e:
                work.append((name, _failed(name, "", f"the ACL refused TYPE: {e}")))
                continue
            if kind in ("redis-mem", "none"):
                continue
            if kind != "string":
                work.append((name, _failed(name, "", f"a {kind} key, not a JSON string: not migrated")))
                continue
            tgt = target_name(key, sid, target_template)
            if source == "user-memory":
                work.append((name, functools.partial(migrate_key, run, key, tgt)))
            else:
                work.append((name, functools.partial(migrate_external, run, key, system, tgt)))
        work.sort(key=lambda w: w[0])
    else:
        if source == "langchain":
            sp = source_prefix if source_prefix is not None else lc.DEFAULT_LIST_PREFIX
            pattern = pattern or sp + "*"
            units, read = lc.find_lists(r, pattern, scan_count, prefix=sp), lc.read_list
        else:
            sp = source_prefix if source_prefix is not None else prefix
            pattern = pattern or sp.replace("*", r"\*") + "*"
            units, read = lc.find_documents(r, sp, scan_count, pattern=pattern), lc.read_documents
        for u in units:
            if u.error and not u.session:
                work.append((_show(u.keys[0]), _failed(_show(u.keys[0]), "", u.error)))
                continue
            tgt = target_name(u.keys[0], u.sid or _b(u.session), target_template)
            work.append((u.session, functools.partial(migrate_unit, run, u, read, tgt)))
    journal = Journal(state, delete_source and not dry_run,
                      scope=f"{source} {source_prefix if source_prefix is not None else prefix} {target_template}")
    bar = Progress(len(work), progress_stream, progress)
    try:
        for name, job in work:
            if journal.done_before(name):
                row = journal.finished[name]
                res = KeyResult(name, row.get("target", ""), SKIPPED, "finished in an earlier run (--state)",
                                row.get("messages", 0), row.get("deleted", False))
            else:
                try:
                    res = job()
                except redis.exceptions.NoPermissionError as e:
                    # One source's key (or a command) the ACL refuses: that
                    # source fails, the run goes on. Whatever the job wrote
                    # is verified or a temporary key it deleted.
                    res = KeyResult(name, "", FAILED, f"the ACL refused a command the migration needs: {e}")
                journal.record(res)
            report.results.append(res)
            bar.step(res.status)
    finally:
        journal.close()
    report.results.sort(key=lambda x: x.source)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``redis-mem-migrate`` console script."""
    p = argparse.ArgumentParser(
        prog="redis-mem-migrate",
        description="Move user_memory_* JSON keys, LangChain message_store:* lists, langchain-redis "
                    "documents or the seed's external:<system>:conversation:<id> keys into redis-mem "
                    "sessions, verified, losing nothing.",
        epilog="Target template placeholders: <id> (the key after the source prefix; = <session>, <suffix>), "
               "<key> (the source key).",
    )
    p.add_argument("--from", dest="source", choices=SOURCES, default="user-memory",
                   help="the store to migrate from (default user-memory)")
    p.add_argument("--url", help="redis://[:password@]host:port/db (overrides --host/--port/--db)")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--password", default=os.environ.get("REDISCLI_AUTH"))
    p.add_argument("--pattern", default=None,
                   help=f"SCAN MATCH pattern selecting the sources (default <source prefix>*; external: "
                        f"{DEFAULT_EXTERNAL_PATTERN})")
    p.add_argument("--source-prefix", default=None,
                   help=f"what precedes the session id in a source key (default {DEFAULT_PREFIX}; langchain: "
                        f"{lc.DEFAULT_LIST_PREFIX}; langchain-redis: --prefix; external: "
                        "external:<system>:conversation:)")
    p.add_argument("--prefix", default=lc.DEFAULT_DOC_PREFIX,
                   help=f"langchain-redis key_prefix (default {lc.DEFAULT_DOC_PREFIX})")
    p.add_argument("--systems", default="dify,n8n",
                   help="external: the orchestrators to migrate (default dify,n8n)")
    p.add_argument("--state", metavar="FILE", help="journal of finished sessions: a rerun resumes after them")
    p.add_argument("--progress", action="store_true", default=None,
                   help="progress bar on stderr even when it is not a terminal")
    p.add_argument("--target-template", default=DEFAULT_TEMPLATE,
                   help=f"session key name (default {DEFAULT_TEMPLATE})")
    p.add_argument("--dry-run", action="store_true",
                   help="run every check and the import into a temporary key (deleted at once); "
                        "sources and targets unchanged")
    p.add_argument("--delete-source", action="store_true",
                   help="delete each source once its session is verified")
    p.add_argument("--replace", action="store_true",
                   help="overwrite sessions that exist before the run (the report lists them)")
    p.add_argument("--model", help="MODEL for the imported sessions")
    p.add_argument("--ttl", type=int,
                   help="TTL (seconds) for every imported session, 0 = none (default: the source's remaining TTL)")
    p.add_argument("--maxage", type=int, help="MAXAGE (seconds) for the sessions, 0 = none (default: the server's)")
    p.add_argument("--overflow", choices=("whole", "summarize"), default="whole",
                   help="a history over the server's default caps: imported whole (caps raised, the default) or "
                        "its oldest messages summarized into the session summary by an LLM (OPENAI_BASE_URL / "
                        "OPENAI_API_KEY / OPENAI_MODEL, --langchain-model, or --extractive)")
    p.add_argument("--langchain-model", default=None, help="--overflow summarize: e.g. openai:gpt-4o-mini")
    p.add_argument("--extractive", action="store_true",
                   help="--overflow summarize without an LLM: offline extractive summaries (lossy)")
    p.add_argument("--scan-count", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    if not any(x in a.target_template for x in PLACEHOLDERS):
        p.error("--target-template must contain <id> (or <session>, <suffix>, <key>)")
    if a.ttl is not None and a.ttl < 0:
        p.error("--ttl must be >= 0")
    if a.maxage is not None and a.maxage < 0:
        p.error("--maxage must be >= 0")

    fn = None
    if a.overflow == "summarize" and not a.dry_run:
        try:
            if a.langchain_model:
                try:
                    from langchain.chat_models import init_chat_model
                except ImportError as e:
                    raise NoSummarizer("--langchain-model needs LangChain: "
                                       f"pip install 'redis-mem[langchain]' ({e})") from e
                fn = langchain_summarizer(init_chat_model(a.langchain_model))
            else:
                fn = default_summarizer(allow_extractive=a.extractive)
        except NoSummarizer as e:
            print(f"redis-mem-migrate: error: {e}", file=sys.stderr)
            return 2
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
            source_prefix=a.source_prefix,
            maxage=a.maxage,
            systems=[s for s in a.systems.split(",") if s],
            overflow=a.overflow,
            summarize_fn=fn,
        )
    except redis.RedisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nredis-mem-migrate: interrupted. Every source finished so far is verified in its target"
              + (" and journaled in " + a.state if a.state else "") + "; the one in progress was left as it was "
              "(its temporary key deleted). Run the same command again to continue: a target that already holds "
              "exactly its source's history counts as moved.", file=sys.stderr)
        return 130
    print(json.dumps(report.to_dict(), indent=2) if a.json else report.render())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
