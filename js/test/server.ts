// A real redis-server with the module, started by the tests on a free
// loopback port (REDIS_MEM_MODULE: the module; default the release build).
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createClient } from "redis";
import { Redis } from "ioredis";
import { RedisMem } from "../src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
// build-test/test -> js -> repository root
export const REPO = resolve(here, "..", "..", "..");
export const MODULE = process.env["REDIS_MEM_MODULE"] ?? join(REPO, "target", "release", "libredis_mem.so");

function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = typeof a === "object" && a ? a.port : 0;
      s.close(() => ok(port));
    });
  });
}

export interface Server {
  port: number;
  url: string;
  stop(): Promise<void>;
}

async function startOnce(extra: string[] = [], fixedPort?: number): Promise<Server> {
  if (!existsSync(MODULE)) throw new Error(`module not found: ${MODULE} (set REDIS_MEM_MODULE)`);
  const port = fixedPort ?? await freePort();
  const dir = mkdtempSync(join(tmpdir(), "redis-mem-js-"));
  const proc: ChildProcess = spawn(
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
      "--loadmodule", MODULE, ...extra],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let log = "";
  await new Promise<void>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`redis-server did not start:\n${log}`)), 20000);
    const onData = (d: Buffer): void => {
      log += d.toString();
      if (log.includes("Ready to accept connections")) { clearTimeout(timer); ok(); }
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    proc.once("exit", (code) => { clearTimeout(timer); fail(new Error(`redis-server exited ${code}:\n${log}`)); });
  });
  proc.stdout!.resume();
  proc.stderr!.resume();
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    stop: () => new Promise<void>((ok) => {
      if (proc.exitCode !== null) { rmSync(dir, { recursive: true, force: true }); ok(); return; }
      proc.removeAllListeners("exit");
      proc.once("exit", () => { rmSync(dir, { recursive: true, force: true }); ok(); });
      proc.kill("SIGTERM");
    }),
  };
}

/** Starts a server, retrying when another process took the free port first. */
export async function startServer(extra: string[] = [], port?: number): Promise<Server> {
  let err: unknown;
  for (let i = 0; i < 3; i++) {
    try { return await startOnce(extra, port); } catch (e) { err = e; }
  }
  throw err;
}

/** A 3-master Redis Cluster of servers with the module (redis-cli --cluster create). */
export async function startCluster(): Promise<{ nodes: Server[]; stop(): Promise<void> }> {
  const nodes: Server[] = [];
  const stop = async (): Promise<void> => { await Promise.all(nodes.map((n) => n.stop())); };
  try {
    for (let i = 0; i < 3; i++) {
      nodes.push(await startServer(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]));
    }
    await promisify(execFile)("redis-cli", ["--cluster", "create", ...nodes.map((n) => `127.0.0.1:${n.port}`),
      "--cluster-replicas", "0", "--cluster-yes"]);
    for (const n of nodes) {
      for (let t = 0; ; t++) {
        const { stdout } = await promisify(execFile)("redis-cli", ["-p", String(n.port), "CLUSTER", "INFO"]);
        if (stdout.includes("cluster_state:ok")) break;
        if (t > 100) throw new Error(`cluster not ok on ${n.port}: ${stdout}`);
        await new Promise((ok) => setTimeout(ok, 100));
      }
    }
    return { nodes, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** A client kind the tests run on. */
export interface ClientKind {
  name: string;
  /** The protocol its replies come in. */
  resp: 2 | 3;
  open(url: string, port: number): Promise<{ mem: RedisMem; close(): Promise<void> }>;
}

export const CLIENTS: ClientKind[] = [
  {
    name: "node-redis RESP2",
    resp: 2,
    async open(url) {
      const c = createClient({ url, RESP: 2 });
      await c.connect();
      return { mem: new RedisMem(c), close: async () => { c.destroy(); } };
    },
  },
  {
    name: "node-redis RESP3",
    resp: 3,
    async open(url) {
      const c = createClient({ url, RESP: 3 });
      await c.connect();
      return { mem: new RedisMem(c), close: async () => { c.destroy(); } };
    },
  },
  {
    name: "ioredis RESP2",
    resp: 2,
    async open(_url, port) {
      const c = new Redis({ port, host: "127.0.0.1", lazyConnect: true });
      await c.connect();
      return { mem: new RedisMem(c), close: async () => { c.disconnect(); } };
    },
  },
];
