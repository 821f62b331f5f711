// The top-level README's TypeScript lines (plus REDIS_URL for the tests; `npm test` runs them).
import { createClient } from "redis";
import { RedisMem } from "redis-mem";

const mem = new RedisMem(await createClient({ url: process.env["REDIS_URL"], RESP: 3 }).connect());
await mem.append("mem:{alice}", "user", "Book the 8pm table", { msgId: "turn-42/user" });
const context = await mem.get("mem:{alice}", { budget: 4000 });
console.log(JSON.stringify(context.map((m) => [m.role, m.content, m.msgId])));
process.exit(0);
