// The README's example runs, as published (importing "redis-mem" by name).
import { after, before, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startServer, type Server } from "./server.js";

const here = dirname(fileURLToPath(import.meta.url));
let server: Server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

it("examples/quickstart.ts", async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [join(here, "..", "examples", "quickstart.js")], {
    env: { ...process.env, REDIS_URL: server.url },
  });
  const lines = stdout.trim().split("\n");
  assert.match(lines[0]!, /^2 \d+ \d+ true$/);
  assert.deepEqual(lines.slice(1), [
    "system: You are a helpful travel assistant.",
    "user: Book the 8pm table",
    "2 gpt-4o 128000",
    "BUSYKEY",
  ]);
});

it("examples/readme_twin.ts (the top-level README's lines)", async () => {
  const run = (): Promise<{ stdout: string }> => promisify(execFile)(process.execPath, [join(here, "..", "examples", "readme_twin.js")], {
    env: { ...process.env, REDIS_URL: server.url },
  });
  const expected = JSON.stringify([["user", "Book the 8pm table", "turn-42/user"]]);
  assert.equal((await run()).stdout.trim(), expected);
  assert.equal((await run()).stdout.trim(), expected); // run twice: the MSGID stores it once
});

it("examples/reply_stream.ts", async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [join(here, "..", "examples", "reply_stream.js")], {
    env: { ...process.env, REDIS_URL: server.url },
  });
  assert.deepEqual(stdout.trim().split("\n"), ["chunk:lo end:", "assistant Hello true"]);
});

it("examples/agent_middleware.ts (two turns, the second given the first from Redis)", async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [join(here, "..", "examples", "agent_middleware.js")], {
    env: { ...process.env, REDIS_URL: server.url },
  });
  assert.deepEqual(stdout.trim().split("\n"), [
    "It is 22C in Paris (I was given 4 messages).",
    "It is 22C in Rome (I was given 8 messages).",
    "user assistant tool assistant user assistant tool assistant",
  ]);
});
