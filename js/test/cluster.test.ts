// Cluster clients (node-redis createCluster, ioredis Cluster) on a real
// 3-master cluster of servers with the module: one key per session, routed by
// its slot; MEM.COUNT/MEM.MODELS (no key) on any node; reply streams in the
// session's slot.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createCluster } from "redis";
import { Cluster } from "ioredis";
import { RedisMem, RedisMemError, ReplyStream } from "../src/index.js";
import { startCluster } from "./server.js";

let cluster: Awaited<ReturnType<typeof startCluster>>;
before(async () => { cluster = await startCluster(); });
after(async () => { await cluster.stop(); });

const KINDS: Array<{ name: string; open(): Promise<{ mem: RedisMem; reader: RedisMem; close(): Promise<void> }> }> = [
  {
    name: "node-redis createCluster RESP3",
    async open() {
      const mk = async () => {
        const c = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })), RESP: 3 });
        await c.connect();
        return c;
      };
      const a = await mk(); const b = await mk();
      return { mem: new RedisMem(a), reader: new RedisMem(b), close: async () => { a.destroy(); b.destroy(); } };
    },
  },
  {
    name: "ioredis Cluster",
    async open() {
      const mk = (): Cluster => new Cluster(cluster.nodes.map((n) => ({ host: "127.0.0.1", port: n.port })));
      const a = mk(); const b = mk();
      return { mem: new RedisMem(a), reader: new RedisMem(b), close: async () => { a.disconnect(); b.disconnect(); } };
    },
  },
];

for (const kind of KINDS) {
  describe(kind.name, () => {
    let mem: RedisMem;
    let reader: RedisMem;
    let close: () => Promise<void>;
    before(async () => { ({ mem, reader, close } = await kind.open()); });
    after(async () => { await close(); });

    it("sessions on every master; every command routed by its key", async () => {
      const keys = Array.from({ length: 12 }, (_, i) => `mem:{${kind.name.length}-user-${i}}`);
      const slots = new Set<string>();
      for (const k of keys) {
        const r = await mem.append(k, "user", `hello ${k}`, { msgId: "m1" });
        assert.deepEqual([r.id, r.messages, r.duplicate], [1, 1, false]);
        assert.equal((await mem.append(k, "user", `hello ${k}`, { msgId: "m1" })).duplicate, true);
        await mem.appendBatch(k, [{ role: "assistant", content: "hi" }]);
        await mem.attrSet(k, "user_profile", { k });
        await mem.extSet(k, "n8n", "c1");
        assert.deepEqual((await mem.get(k)).map((m) => m.content), [`hello ${k}`, "hi"]);
        assert.equal((await mem.info(k))!.messages, 2);
        assert.deepEqual(await mem.attrGet(k, "user_profile"), { k });
        assert.equal(await mem.extGet(k, "n8n"), "c1");
        assert.equal((await mem.getJson(k))["total_tokens"], (await mem.info(k))!.totalTokens);
        slots.add(String(await mem.send(["CLUSTER", "KEYSLOT", k])));
      }
      assert.ok(slots.size > 3);
      assert.ok((await mem.count("gpt-4o", "hello")) > 0);
      assert.equal((await mem.models("gpt-4o")).encoding, "o200k_base");
      await assert.rejects(mem.get(keys[0]!, { last: -1 }), (e: unknown) => e instanceof RedisMemError && e.code === "ERR");
    });

    it("a reply stream in the session's slot, read from another connection", async () => {
      for (const key of [`mem:{cl-alice-${kind.name.length}}`, `chat:cl-bob-${kind.name.length}`]) {
        const s = new ReplyStream(mem, key);
        await s.write("Hel");
        await s.write("lo");
        await s.finish();
        const chunks: string[] = [];
        for await (const c of new ReplyStream(reader, key, { replyId: s.replyId }).chunks("0", { block: 100 })) chunks.push(c);
        assert.deepEqual(chunks, ["Hel", "lo"]);
        assert.deepEqual((await mem.get(key)).map((m) => [m.content, m.msgId]), [["Hello", s.replyId]]);
      }
    });
  });
}
