import { RedisMemError } from "./errors.js";

/** One argument of a command. */
export type Arg = string | number | Buffer;

/** What RedisMem needs of a connection: send one command, get its reply. */
export interface Transport {
  send(args: Arg[]): Promise<unknown>;
}

/** The subset of an ioredis `Redis` / `Cluster` used here. */
export interface IoRedisLike {
  call(command: string, ...args: (string | Buffer)[]): Promise<unknown>;
}

/** The subset of a node-redis (`redis` / `@redis/client`) client used here. */
export interface NodeRedisLike {
  sendCommand(args: (string | Buffer)[]): Promise<unknown>;
}

/** The subset of a node-redis cluster client (`createCluster`) used here. */
export interface NodeRedisClusterLike {
  sendCommand(firstKey: string | Buffer | undefined, isReadonly: boolean | undefined, args: (string | Buffer)[]): Promise<unknown>;
  getSlotRandomNode(slot: number): unknown;
}

/** A client RedisMem accepts: node-redis (a client or a cluster), ioredis
 * (`Redis` or `Cluster`), or any Transport. */
export type AnyClient = NodeRedisLike | NodeRedisClusterLike | IoRedisLike | Transport;

/** The key a command is routed by on a cluster (undefined: none, any node). */
export function keyOf(args: (string | Buffer)[]): string | Buffer | undefined {
  const name = String(args[0]).toUpperCase();
  if (name === "MEM.COUNT" || name === "MEM.MODELS") return undefined;
  if (name === "XREAD") {
    const i = args.findIndex((a) => String(a).toUpperCase() === "STREAMS");
    return i >= 0 ? args[i + 1] : undefined;
  }
  if (name === "XINFO") return args[2];
  return args[1];
}

function str(a: Arg): string | Buffer {
  return typeof a === "number" ? String(a) : a;
}

function isIoRedis(c: object): c is IoRedisLike {
  // ioredis has call(name, ...args); its sendCommand takes a Command object.
  return typeof (c as { call?: unknown }).call === "function";
}

function errorOf(e: unknown, command: string): unknown {
  if (e instanceof RedisMemError) return e;
  // node-redis: SimpleError / BlobError / ErrorReply; ioredis: ReplyError.
  if (e instanceof Error && /Reply|SimpleError|BlobError/.test(e.constructor?.name ?? "")) {
    return new RedisMemError(e.message, command, { cause: e });
  }
  return e;
}

/** The transport for `client`: ioredis (has `call`), node-redis (has
 * `sendCommand(args[])`), or a Transport as is. */
export function transportOf(client: AnyClient): Transport {
  if (typeof (client as Transport).send === "function") {
    const t = client as Transport;
    return { send: (args) => t.send(args).catch((e: unknown) => { throw errorOf(e, String(args[0])); }) };
  }
  if (isIoRedis(client)) {
    return {
      send: (args) => {
        const [name, ...rest] = args.map(str);
        return client.call(String(name), ...rest).catch((e: unknown) => { throw errorOf(e, String(name)); });
      },
    };
  }
  if (typeof (client as NodeRedisClusterLike).getSlotRandomNode === "function") {
    const c = client as NodeRedisClusterLike;
    return {
      send: (args) => {
        const a = args.map(str);
        return c.sendCommand(keyOf(a), false, a).catch((e: unknown) => { throw errorOf(e, String(args[0])); });
      },
    };
  }
  if (typeof (client as NodeRedisLike).sendCommand === "function") {
    const c = client as NodeRedisLike;
    return {
      send: (args) => c.sendCommand(args.map(str)).catch((e: unknown) => { throw errorOf(e, String(args[0])); }),
    };
  }
  throw new TypeError("RedisMem: expected a node-redis client, an ioredis client or a Transport");
}
