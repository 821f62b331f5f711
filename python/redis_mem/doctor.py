"""``redis-mem doctor``: why did the conversation forget? Facts about the
server (every master of a cluster) and the sessions named, one finding a
line, each with its fix.

    redis-mem doctor [--url redis://localhost:6379/0] [--cluster] [--json] [session ...]

A session is a key (an argument with ``:`` or ``{``, e.g. ``mem:{alice}``)
or a session id (``alice``, made a key with ``--key-template``, default
``mem:{%s}``). Exit status: 0 when no finding is a warning or an error, 1
when one is, 2 when the server cannot be reached or the arguments are wrong.

What each check answers (the seed's troubleshooting list):

* "the AI does not remember the last sentence": the session exists (or not),
  its key and TTL, messages and tokens against the summarize threshold and
  the caps, messages evicted with no summary covering them (MEM.INFO
  ``evicted``), summaries the caps dropped (``summaries_dropped``), the
  summarizers subscribed, ``notify-keyspace-events``.
* "it forgets after a while": the TTL left, the last summary, evictions,
  ``maxmemory-policy``, persistence (AOF / RDB).
* "memory lost with several replicas": every master is checked, the role of
  the node asked, persistence.
* "token use jumps": the model and whether its count is exact (MEM.MODELS),
  the encodings built and their memory.
* "Dify/n8n always treat it as the first question": the external ids and
  their remaining lifetimes (MEM.INFO ``external_ttl``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

import redis

from ._replies import _server_ms, _text, _to_map
from .client import RedisMemClient
from .summarizer import EVENT

__all__ = ["Finding", "diagnose", "main", "OK", "INFO", "WARNING", "ERROR"]

OK, INFO, WARNING, ERROR = "ok", "info", "warning", "error"
LEVELS = (OK, INFO, WARNING, ERROR)
#: The module's name in MODULE LIST.
MODULE_NAME = "mem"
DEFAULT_KEY_TEMPLATE = "mem:{%s}"


@dataclass(frozen=True)
class Finding:
    """One line of the report. ``level``: ok, info, warning or error;
    ``subject``: ``server <host:port>`` or the session key; ``fix``: what to
    do ("" when nothing)."""

    level: str
    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        """The finding as one line of the text report: ``LEVEL subject: message -> fix: ...``."""
        text = f"{self.level.upper():7} {self.subject}: {self.message}"
        return f"{text} -> fix: {self.fix}" if self.fix else text


def _dur(ms: float) -> str:
    """A duration for people: 1d 2h, 3h 4m, 5m 6s, 7.2s."""
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    return f"{m}m {s}s"


def _mb(n: int) -> str:
    return f"{n / 1_000_000:.1f} MB"


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _config(r: "redis.Redis", name: str) -> str:
    reply = r.config_get(name) or {}
    return str(_text(next(iter(reply.values()), "")) or "")


def _raw_info(r: "redis.Redis", section: str) -> Dict[str, str]:
    """INFO <section>, its text parsed here (redis-py's own parsing turns
    `a=1,b=2` values into dicts and guesses number types). A client of its
    own on ``r``'s pool, so ``r``'s reply callbacks stay as they are."""
    raw_client = redis.Redis(connection_pool=r.connection_pool)
    raw_client.set_response_callback("INFO", lambda resp, **_kw: resp)
    raw = raw_client.execute_command("INFO", section)
    out: Dict[str, str] = {}
    for line in str(_text(raw)).splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def _denied(e: BaseException) -> bool:
    """Whether ``e`` is the ACL refusing a command to this user."""
    return isinstance(e, redis.exceptions.NoPermissionError) or "no permissions" in str(e).lower()


def _not_allowed(rep: "_Report", subject: str, what: str, command: str) -> None:
    rep.add(INFO, subject, f"{what} not checked: this user may not run {command} (ACL)",
            f"run the doctor as a user with +{command.lower().replace(' ', '|')}, or check it by hand")


def _module_from_info(r: "redis.Redis") -> Optional[Tuple[bool, str]]:
    """(loaded, version) from INFO modules (``module:name=mem,ver=...``),
    None when INFO is refused too."""
    try:
        modules = _raw_info(r, "modules")
    except redis.RedisError as e:
        if _denied(e):
            return None
        raise
    for k, v in modules.items():
        if k.startswith("module"):
            fields = dict(kv.split("=", 1) for kv in v.split(",") if "=" in kv)
            if fields.get("name") == MODULE_NAME:
                return True, fields.get("ver", "?")
    return False, "?"


class _Report:
    def __init__(self) -> None:
        self.findings: List[Finding] = []

    def add(self, level: str, subject: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(level, subject, message, fix))


# -- the server -----------------------------------------------------------------


def _node_name(r: "redis.Redis") -> str:
    kw = r.connection_pool.connection_kwargs
    if kw.get("path"):
        return str(kw["path"])
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def check_server(r: "redis.Redis", rep: _Report, db: int = 0, cluster: bool = False) -> Tuple[bool, int]:
    """The server checks of one node. Returns (module loaded, summarizers
    subscribed to mem.threshold in ``db``)."""
    subject = f"server {_node_name(r)}"
    try:
        server = _raw_info(r, "server")
    except redis.RedisError as e:
        rep.add(ERROR, subject, f"cannot be reached: {e}",
                "check --url (host, port, password, TLS) and that redis-server is running")
        return False, 0
    role = _raw_info(r, "replication").get("role", "?")
    rep.add(OK, subject, f"redis {server.get('redis_version', '?')}, role {role}"
            + (", cluster master" if cluster else ""))
    if role != "master":
        rep.add(INFO, subject, "this node is a replica: it holds the master's sessions read-only",
                "point applications and summarizers at the master (--url of the master)")

    # Module loaded, its version: MODULE LIST, else (a user without it, e.g.
    # +@read +info) INFO modules.
    loaded = False
    version = "?"
    try:
        for mod in r.execute_command("MODULE", "LIST") or []:
            m = _to_map(mod)
            if _text(m.get("name")) == MODULE_NAME:
                loaded, version = True, str(_text(m.get("ver")))
    except redis.RedisError as e:
        if not _denied(e):
            raise
        got = _module_from_info(r)
        if got is None:
            _not_allowed(rep, subject, "whether the module is loaded", "MODULE LIST")
            got = (True, "?")  # unknown: the session checks say what they find
        else:
            rep.add(INFO, subject, "this user may not run MODULE LIST: the module was looked up in INFO modules")
        loaded, version = got
    mem: Dict[str, str] = {}
    if loaded:
        try:
            mem = _raw_info(r, "mem")
        except redis.RedisError as e:
            if not _denied(e):
                raise
        rep.add(OK, subject, f"redis-mem module loaded: version {version}, build {mem.get('mem_build', '?')}, "
                f"{mem.get('mem_sessions', '?')} sessions")
    else:
        rep.add(ERROR, subject, "the redis-mem module is not loaded: MEM.* commands are unknown here",
                "loadmodule /path/to/libredis_mem.so in redis.conf (or --loadmodule), then restart")

    try:
        _config_checks(r, rep, subject)
    except redis.RedisError as e:
        if not _denied(e):
            raise
        _not_allowed(rep, subject, "notify-keyspace-events, persistence and maxmemory-policy", "CONFIG GET")
    _encoding_checks(rep, subject, loaded, mem)
    try:
        subs = _summarizer_checks(r, rep, subject, db)
    except redis.RedisError as e:
        if not _denied(e):
            raise
        _not_allowed(rep, subject, "summarizers subscribed", "PUBSUB NUMSUB")
        subs = 0
    return loaded, subs


def _config_checks(r: "redis.Redis", rep: _Report, subject: str) -> None:
    # notify-keyspace-events: the summarizer listens on __keyevent@<db>__:mem.threshold,
    # which needs module events (d, or A) and keyevent channels (E).
    flags = _config(r, "notify-keyspace-events")
    missing = ("" if "d" in flags or "A" in flags else "d") + ("" if "E" in flags else "E")
    if missing:
        rep.add(WARNING, subject,
                f"notify-keyspace-events is {repr(flags) if flags else 'empty'}, lacking {missing!r}: "
                "no mem.threshold event reaches a summarizer (only its SCAN sweep finds sessions due, "
                "every --sweep-interval)",
                f"CONFIG SET notify-keyspace-events {flags + missing} and notify-keyspace-events in redis.conf "
                "(redis-mem-summarizer sets it at start, but a restart without it in redis.conf loses it)")
    else:
        rep.add(OK, subject, f"notify-keyspace-events {flags!r} carries mem.threshold (d, E)")

    # Persistence.
    aof = _config(r, "appendonly") == "yes"
    save = _config(r, "save").strip()
    if aof:
        fsync = _config(r, "appendfsync")
        rep.add(OK, subject, f"persistence: AOF on (appendfsync {fsync})" + (f", RDB save {save!r}" if save else ""))
        if fsync == "no":
            rep.add(INFO, subject, "appendfsync no: a machine crash loses what the OS had not written yet",
                    "CONFIG SET appendfsync everysec")
    elif save:
        rep.add(WARNING, subject, f"persistence: RDB snapshots only (save {save!r}): a crash or kill loses every "
                "message since the last snapshot",
                "CONFIG SET appendonly yes (and appendonly yes, appendfsync everysec in redis.conf)")
    else:
        rep.add(WARNING, subject, "no persistence (appendonly no, save ''): a restart loses every session",
                "CONFIG SET appendonly yes (and appendonly yes, appendfsync everysec in redis.conf)")

    # maxmemory-policy.
    policy = _config(r, "maxmemory-policy")
    maxmemory = int(_config(r, "maxmemory") or 0)
    limit = f"maxmemory {_mb(maxmemory)}" if maxmemory else "maxmemory 0: no limit now"
    if policy.startswith("allkeys-"):
        rep.add(WARNING, subject, f"maxmemory-policy {policy} ({limit}) evicts any key, sessions included, "
                "when memory is short: whole conversations vanish",
                "CONFIG SET maxmemory-policy noeviction (writes then fail loudly with OOM), or keep sessions "
                "on a server of their own")
    elif policy.startswith("volatile-"):
        rep.add(WARNING, subject, f"maxmemory-policy {policy} ({limit}) evicts keys with a TTL, and sessions "
                "have one (mem.ttl): whole conversations vanish when memory is short",
                "CONFIG SET maxmemory-policy noeviction, or keep sessions on a server of their own")
    else:
        rep.add(OK, subject, f"maxmemory-policy {policy} ({limit}) never evicts sessions")


def _encoding_checks(rep: _Report, subject: str, loaded: bool, mem: Dict[str, str]) -> None:
    # Encodings built and their memory.
    if loaded and mem:
        built = [e for e in mem.get("mem_encodings_loaded", "").split(",") if e]
        parts, failed = [], []
        for name in mem.get("mem_encodings", "").split(","):
            fields = dict(kv.split("=", 1) for kv in mem.get(f"mem_encoding_{name}", "").split(",") if "=" in kv)
            if fields.get("state") == "failed":
                failed.append(name)
            elif name in built:
                parts.append(f"{name} {_mb(int(fields.get('memory_bytes', 0) or 0))}")
        total = int(mem.get("mem_module_memory_bytes", 0) or 0)
        rep.add(INFO, subject, f"encodings built: {', '.join(parts) or 'none yet'}; module memory {_mb(total)} "
                "(outside maxmemory)")
        if failed:
            rep.add(WARNING, subject, f"encodings that failed to build: {', '.join(failed)} (their models' "
                    "commands are refused)", "see the server log; restart the server to build them again")


def _summarizer_checks(r: "redis.Redis", rep: _Report, subject: str, db: int) -> int:
    # Summarizers subscribed (keyspace events are node-local: one per master).
    channel = f"__keyevent@{db}__:{EVENT}"
    numsub = r.execute_command("PUBSUB", "NUMSUB", channel)
    if numsub and isinstance(numsub[0], tuple):  # a client whose callback made (channel, n) pairs
        numsub = [x for pair in numsub for x in pair]
    subs = int(_to_map(numsub).get(channel, 0))
    numpat = int(r.execute_command("PUBSUB", "NUMPAT"))
    if subs:
        rep.add(OK, subject, f"{subs} summarizer(s) subscribed to {channel}")
    else:
        rep.add(INFO, subject, f"no summarizer subscribed to {channel} ({numpat} pattern subscription(s)): "
                "summaries are made only by an agent middleware summarizing inline",
                "run redis-mem-summarizer --url <this server> (--cluster for every master), unless your agents "
                "summarize inline (RedisMemMiddleware without summary_service)")
    return subs


# -- a session --------------------------------------------------------------------


def check_session(r: "redis.Redis", key: str, rep: _Report, subscribers: int) -> None:
    """The checks of the session ``key`` on the node ``r`` that owns it."""
    kind = str(_text(r.type(key)))
    if kind == "none":
        rep.add(ERROR, key, "does not exist: it expired (its TTL ran out), was deleted, was evicted by "
                "maxmemory-policy, was lost in a restart without persistence, or was never written under this name",
                "check the name the app uses (mem:{<thread_id>}), raise the TTL (TTL on MEM.APPEND, mem.ttl), "
                "and see the server findings (maxmemory-policy, persistence)")
        return
    if kind != "redis-mem":
        rep.add(ERROR, key, f"is a {kind}, not a redis-mem session",
                "the app writes another kind of key here: migrate it (redis-mem-migrate) or use another name")
        return
    mem = RedisMemClient(r)
    info = mem.info(key)
    if info is None:  # deleted between TYPE and MEM.INFO
        rep.add(ERROR, key, "does not exist (it vanished while being checked)")
        return
    now = _server_ms(r)  # leases, summaries and expiries are on the server's clock

    pttl = int(r.pttl(key))
    if pttl < 0:
        rep.add(INFO, key, f"exists, {info.messages} messages; no expiry (TTL 0): it stays until deleted")
    else:
        rep.add(OK, key, f"exists, {info.messages} messages; expires in {_dur(pttl)} "
                f"(its TTL setting {info.ttl}s, renewed by each write)")

    # Model and whether its count is exact.
    model = mem.models(info.model)
    if model.exact:
        rep.add(OK, key, f"model {info.model}: counted exactly with {info.encoding}")
    else:
        rep.add(INFO, key, f"model {info.model}: counted with {info.encoding}, an approximation (no public "
                "tokenizer): the provider may count more or fewer tokens",
                "store the provider's counts (MEM.APPEND TOKENS; the middleware does for such models), or map the "
                "model in mem.models")
    if model.entry is None:
        rep.add(INFO, key, f"model {info.model} is not in the model table: window unknown, summarize threshold at "
                "mem.summarize-fallback-tokens", "add it to mem.models (name=encoding:window)")

    # Messages and tokens against the threshold and the caps.
    check = mem.summarize_check(key)
    rep.add(OK if not check.summarize else INFO, key,
            f"{check.messages} messages, {check.total_tokens} tokens; summarize at {check.threshold_messages} "
            f"messages or {check.threshold_tokens} tokens; caps {info.maxmsgs} messages, {info.maxtokens} tokens")
    at_cap = info.messages >= info.maxmsgs or info.total_tokens >= info.maxtokens * 0.95

    # A live lease (a summarizer at work), as MEM.INFO reports it: the doctor
    # only reads.
    lease_left: Optional[int] = info.lease_ttl or None
    if lease_left is not None:
        rep.add(INFO, key, f"a summarizer holds its lease for {_dur(lease_left)} more (until {_utc(now + lease_left)})")

    if check.summarize and lease_left is None:
        if subscribers:
            rep.add(WARNING, key, f"over its summarize threshold and no summary is running ({subscribers} "
                    "summarizer(s) subscribed on its node)",
                    "look at the summarizers' logs (LLM errors, leases); the caps evict what is not summarized")
        else:
            rep.add(WARNING, key, "over its summarize threshold, no summary running, and no summarizer subscribed "
                    "on its node: the caps will evict messages no summary covers",
                    "run redis-mem-summarizer (or an agent middleware that summarizes inline)")
    if at_cap:
        rep.add(WARNING if not info.summary_upto else INFO, key,
                f"at its caps ({info.messages}/{info.maxmsgs} messages, {info.total_tokens}/{info.maxtokens} "
                "tokens): each append evicts the oldest messages",
                "summarize (redis-mem-summarizer) or raise the caps (MAXMSGS / MAXTOKENS)")

    # Evicted without a summary (SPEC v3).
    if info.evicted is None:
        rep.add(INFO, key, "this module's MEM.INFO has no 'evicted' field: messages lost to the caps cannot be "
                "counted", "upgrade the redis-mem module (SPEC v3)")
    elif info.evicted > 0:
        rep.add(WARNING, key, f"the caps or MAXAGE removed {info.evicted} messages that no summary covers",
                "run a summarizer (redis-mem-summarizer) / raise the caps (MAXMSGS, MAXTOKENS, MAXAGE)")
    else:
        rep.add(OK, key, "no message was evicted without a summary")
    # Summaries the caps evicted (what they covered is gone with them).
    if info.summaries_dropped:
        rep.add(WARNING, key, f"the caps dropped {info.summaries_dropped} summaries: what they covered is lost",
                "raise the caps (MAXTOKENS) or summarize earlier (a lower summarize threshold), so a summary "
                "fits beside the recent messages")

    # The last summary.
    if info.summary_ts:
        covered = f", {info.summarized} messages summarized in all" if info.summarized is not None else ""
        rep.add(OK, key, f"last summary {_utc(info.summary_ts)} ({_dur(max(0, now - info.summary_ts))} ago), "
                f"covering messages up to id {info.summary_upto}{covered}")
    elif info.summary_upto:
        rep.add(OK, key, f"summarized up to message id {info.summary_upto}")
    else:
        rep.add(OK, key, "no summary yet")

    # Attributes: the seed's session context (SessionContext) and the other members.
    # Their own lifetimes: FORMAT JSON's redis_mem.attribute_expires (Unix ms; SPEC v3).
    names = sorted(mem.attrget(key, raw=True))
    try:
        attr_expires: Dict[str, Any] = mem.get_json(key, last=0).get("redis_mem", {}).get("attribute_expires") or {}
    except redis.ResponseError:
        attr_expires = {}
    parts = [f"{n} ({_dur(max(0, int(attr_expires[n]) - now))} left)" if n in attr_expires else n
             for n in names]
    rep.add(OK, key, f"attributes: {', '.join(parts)}" if names else "no attributes (no session context set, "
            "or its lifetime ended)")

    # External ids (Dify, n8n, ...).
    ttls = info.external_ttl
    if info.external or ttls:
        names = sorted(set(info.external) | set(ttls or {}))
        parts = []
        for name in names:
            left = (ttls or {}).get(name)
            parts.append(name if left is None else f"{name} ({'no expiry' if left < 0 else _dur(left) + ' left'})")
        rep.add(OK, key, f"external conversation ids: {', '.join(parts)}")
    else:
        rep.add(INFO, key, "no external conversation id (Dify/n8n): an orchestrator asked with this session starts "
                "a new conversation", "ConversationIds(...).remember() / MEM.EXTSET after the orchestrator's first "
                "answer, if you use one")


# -- the whole run --------------------------------------------------------------


def _nodes(client: Any) -> List["redis.Redis"]:
    """A plain client per master (one for a plain server)."""
    if not hasattr(client, "get_primaries"):
        return [client]
    return [redis.Redis(host=n.host, port=n.port, **_auth(client)) for n in client.get_primaries()]


def _auth(cluster: Any) -> Dict[str, Any]:
    """What a plain client on one of ``cluster``'s nodes needs of its settings."""
    kw = cluster.get_connection_kwargs() if hasattr(cluster, "get_connection_kwargs") else {}
    return {k: v for k, v in kw.items() if k in ("username", "password", "ssl", "socket_timeout",
                                                 "socket_connect_timeout")}


def _session_key(arg: str, template: str) -> str:
    return arg if (":" in arg or "{" in arg) else template % arg


def diagnose(client: Any, sessions: Sequence[str] = (), key_template: str = DEFAULT_KEY_TEMPLATE,
             db: Optional[int] = None) -> List[Finding]:
    """Every finding about the server (each master of a ``RedisCluster``)
    and the sessions named (keys or session ids)."""
    rep = _Report()
    cluster = hasattr(client, "get_primaries")
    if db is None:
        db = 0 if cluster else int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
    nodes = _nodes(client)
    subs: Dict[str, int] = {}
    loaded: Dict[str, bool] = {}
    for node in nodes:
        ok, n = check_server(node, rep, db, cluster)
        loaded[_node_name(node)], subs[_node_name(node)] = ok, n
    for arg in sessions:
        key = _session_key(arg, key_template)
        if cluster:
            owner = client.get_node_from_key(key)
            found = [n for n in nodes if _node_name(n) == f"{owner.host}:{owner.port}"]
            # Else a master the first listing did not have (a failover meanwhile).
            node = found[0] if found else redis.Redis(host=owner.host, port=owner.port, **_auth(client))
        else:
            node = client
        name = _node_name(node)
        if not loaded.get(name, False):
            rep.add(ERROR, key, f"not checked: the module is not loaded on {name}")
            continue
        try:
            check_session(node, key, rep, subs.get(name, 0))
        except redis.RedisError as e:
            rep.add(ERROR, key, f"could not be checked: {e}",
                    "the module's commands are in no ACL category (+@read does not grant them): give the "
                    "doctor's user +mem.info +mem.models +mem.summarize_check +mem.attrget +mem.get "
                    "+time" if _denied(e) else "")
    return rep.findings


def exit_code(findings: Sequence[Finding]) -> int:
    """0 when no finding is a warning or an error, else 1."""
    return 1 if any(f.level in (WARNING, ERROR) for f in findings) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``redis-mem`` console script (subcommand ``doctor``)."""
    p = argparse.ArgumentParser(prog="redis-mem", description="redis-mem tools")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="why did it forget: facts about the server and sessions, with fixes",
                       description=__doc__.split("\n\n")[0])
    d.add_argument("sessions", nargs="*", metavar="session",
                   help="session keys (mem:{alice}) or ids (alice, made a key with --key-template)")
    d.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    d.add_argument("--cluster", action="store_true",
                   help="the URL is a cluster node: check every master (detected when not given)")
    d.add_argument("--key-template", default=DEFAULT_KEY_TEMPLATE, help="the key of a session id (mem:{%%s})")
    d.add_argument("--json", action="store_true", help="a JSON list of {level, subject, message, fix}")
    a = p.parse_args(argv)
    if "%s" not in a.key_template:
        p.error("--key-template must contain %s")
    try:
        client: Any = redis.Redis.from_url(a.url, socket_connect_timeout=5, socket_timeout=30)
        cluster = a.cluster
        if not cluster:
            cluster = _raw_info(client, "cluster").get("cluster_enabled") == "1"
        if cluster:
            from redis.cluster import RedisCluster

            client.close()
            # A cluster has database 0 only: the URL's /0, if any, is left out.
            parts = urlsplit(a.url)
            client = RedisCluster.from_url(urlunsplit(parts._replace(path="")), socket_connect_timeout=5,
                                           socket_timeout=30)
        findings = diagnose(client, a.sessions, a.key_template)
    except redis.RedisError as e:
        print(f"redis-mem doctor: {a.url}: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps([asdict(f) for f in findings], ensure_ascii=False, indent=1))
    else:
        for f in findings:
            print(f.line())
        worst = [f for f in findings if f.level in (WARNING, ERROR)]
        print(f"{len(worst)} finding(s) to fix" if worst else "healthy: nothing to fix")
    return exit_code(findings)


if __name__ == "__main__":
    sys.exit(main())
