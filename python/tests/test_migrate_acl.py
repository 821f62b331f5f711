"""The migration under an ACL user an operator would give it: keys only
under the source and target prefixes, and (maybe) no RENAME. The temporary
key of a run matches the target's own prefix, and a user without RENAME
still gets a verified session (imported again into the target, then read
back), never a half-checked one."""

from __future__ import annotations

import json

import pytest
import redis

import redis_mem.migrate as mig
from redis_mem import RedisMemClient


def doc(*contents):
    return json.dumps({"conversation_history": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]})


@pytest.fixture
def acl_user(clean):
    made = []

    def make(name, *rules):
        admin = clean.client()
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rules)
        made.append(name)
        return clean.client(username=name, password="pw")

    yield make
    admin = clean.client()
    for name in made:
        admin.execute_command("ACL", "DELUSER", name)


@pytest.mark.parametrize("template", ["chat:<id>", "mem:{<id>}", "mem:<id>:history"])
def test_user_limited_to_the_target_prefix(clean, acl_user, template):
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob", "Hi Bob"))
    prefix = template.split("<id>")[0].rstrip("{")
    r = acl_user("migrator", "~user_memory_*", f"~{prefix}*", "+@all")
    dry = mig.migrate(r, target_template=template, dry_run=True)
    assert [(x.status, x.reason) for x in dry.results] == [(mig.WOULD_MOVE, "")]
    rep = mig.migrate(r, target_template=template, delete_source=True)
    assert [(x.status, x.reason, x.deleted) for x in rep.results] == [(mig.MOVED, "", True)]
    target = template.replace("<id>", "bob")
    assert [e.content for e in RedisMemClient(admin).get(target)] == ["I am Bob", "Hi Bob"]
    assert sorted(admin.keys("*")) == [target]  # no temporary key left


@pytest.mark.parametrize("replace", [False, True])
def test_user_without_rename(clean, acl_user, replace):
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob", "Hi Bob"))
    admin.set("user_memory_eve", doc("I am Eve"))
    if replace:
        RedisMemClient(admin).append("mem:{bob}", "user", "old")
    admin.expire("user_memory_bob", 500)
    r = acl_user("migrator", "~*", "+@all", "-rename", "-renamenx")
    rep = mig.migrate(r, replace=replace, delete_source=True)
    got = {x.source: (x.status, x.reason, x.replaced, x.deleted) for x in rep.results}
    assert got == {"user_memory_bob": (mig.MOVED, "", replace, True), "user_memory_eve": (mig.MOVED, "", False, True)}
    mem = RedisMemClient(admin)
    assert [e.content for e in mem.get("mem:{bob}")] == ["I am Bob", "Hi Bob"]
    assert 490 <= admin.ttl("mem:{bob}") <= 500
    assert sorted(admin.keys("*")) == ["mem:{bob}", "mem:{eve}"]


def test_user_without_rename_does_not_overwrite_a_session_that_appears(clean, acl_user):
    """No RENAMENX: the import into the target is MEM.IMPORT without REPLACE,
    which refuses a key that exists, as RENAMENX would."""
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob"))
    acl_user("migrator", "~*", "+@all", "-rename", "-renamenx")
    r = clean.client(decode_responses=False, username="migrator", password="pw")
    real_exists = r.exists

    def exists_then_appear(*keys):
        out = real_exists(*keys)
        if keys == (b"mem:{bob}",) and not real_exists(*keys):
            RedisMemClient(admin).append("mem:{bob}", "user", "written by the app meanwhile")
        return out

    r.exists = exists_then_appear  # type: ignore[method-assign]
    rep = mig.migrate(r)
    assert [(x.status, x.deleted) for x in rep.results] == [(mig.SKIPPED, False)]
    assert "appeared" in rep.results[0].reason
    assert [e.content for e in RedisMemClient(admin).get("mem:{bob}")] == ["written by the app meanwhile"]


def test_delete_source_without_multi_is_refused_before_anything_is_written(clean, acl_user):
    """Hostile pass 28 F1: without MULTI, redis-py's pipeline sent the DEL
    outside any transaction (the WATCH guard did nothing), then the run died
    on 'EXEC without MULTI' with no report."""
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob"))
    for denied in ("-multi", "-exec"):
        r = acl_user("migrator", "~*", "+@all", denied)
        for dry in (True, False):
            with pytest.raises(redis.exceptions.NoPermissionError, match="--delete-source needs MULTI and EXEC"):
                mig.migrate(r, delete_source=True, dry_run=dry)
        assert sorted(admin.keys("*")) == ["user_memory_bob"]
        # The connection that was refused is not left inside a transaction.
        assert r.ping() and r.get("user_memory_bob") is not None
    assert mig.main(["--port", str(clean.port), "--delete-source"]) == 0  # the admin may


def test_a_user_without_del_keeps_the_source_and_gets_its_session(clean, acl_user):
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob"))
    r = acl_user("migrator", "~*", "+@all", "-del")
    rep = mig.migrate(r, delete_source=True)
    res = rep.results[0]
    assert (res.status, res.deleted) == (mig.MOVED, False) and "ACL refused its guarded delete" in res.reason
    assert admin.exists("user_memory_bob") and RedisMemClient(admin).get("mem:{bob}")[0].content == "I am Bob"


@pytest.mark.parametrize("denied", ["-pttl", "-exists", "-type", "-persist", "-pexpire"])
def test_a_command_the_acl_refuses_fails_each_source_and_the_run_goes_on(clean, acl_user, denied):
    """Hostile pass 28 F2: the first NOPERM aborted the whole run."""
    admin = clean.client()
    admin.set("user_memory_bob", doc("I am Bob"))
    admin.set("user_memory_eve", doc("I am Eve"))
    r = acl_user("migrator", "~*", "+@all", denied)
    dry = mig.migrate(r, delete_source=True, dry_run=True)
    assert [x.status for x in dry.results] == [mig.FAILED, mig.FAILED]  # the dry run predicts it
    rep = mig.migrate(r, delete_source=True)
    assert [(x.source, x.status) for x in rep.results] == [
        ("user_memory_bob", mig.FAILED), ("user_memory_eve", mig.FAILED)]
    assert all("ACL refused" in x.reason and denied[1:] in x.reason.lower() for x in rep.results), rep.results
    assert admin.exists("user_memory_bob", "user_memory_eve") == 2
    assert [k for k in admin.keys("*") if not k.startswith("user_memory_")] == []
