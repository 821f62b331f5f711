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

/** A client RedisMem accepts: node-redis, ioredis, or any Transport. */
export type AnyClient = NodeRedisLike | IoRedisLike | Transport;

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
  if (typeof (client as NodeRedisLike).sendCommand === "function") {
    const c = client as NodeRedisLike;
    return {
      send: (args) => c.sendCommand(args.map(str)).catch((e: unknown) => { throw errorOf(e, String(args[0])); }),
    };
  }
  throw new TypeError("RedisMem: expected a node-redis client, an ioredis client or a Transport");
}
