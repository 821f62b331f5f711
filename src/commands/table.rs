//! Every MEM.* command, declared once: its registration (name, entry point,
//! flags, ACL category; the key position follows from `access`), its
//! `COMMAND DOCS` (summary, complexity, arity, arguments, key spec) and the
//! options its parser takes (the tokens of `args`). A data table: `ALL` is
//! what `lib.rs` registers.

use crate::declare::{
    entry, flag, integer, key, one_of, option, option_of, optional, string, unix_time, Access::*,
    Arg, CommandDecl,
};

/// MEM.APPEND's and MEM.APPENDBATCH's (and MEM.IMPORT's) settings options.
const SETTINGS: [Arg; 5] = [
    option("MODEL", string("name")),
    option("TTL", integer("seconds")),
    option("MAXTOKENS", integer("n")),
    option("MAXMSGS", integer("n")),
    option("MAXAGE", integer("seconds")),
];

/// MEM.SUMMARIZE_CHECK's and MEM.SUMMARIZE_BEGIN's window and KEEP.
const WINDOW: Arg = one_of(
    "window",
    &[
        option("MODEL", string("name")),
        option("CONTEXT", integer("tokens")),
    ],
);
const KEEP: Arg = option("KEEP", integer("n"));

pub static APPEND: CommandDecl = CommandDecl {
    name: "mem.append",
    entry: entry!(crate::commands::append),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Appends a message to a session, counts its tokens, trims to the caps, refreshes the TTL and reports whether to summarize.",
    complexity: "O(N) in the size of the content (tokenizing), plus O(M) for M evicted messages.",
    arity: -4,
    access: ReadUpdate,
    args: &[
        key(),
        string("role"),
        string("content"),
        option("TS", unix_time("ms")),
        option("META", string("json")),
        SETTINGS[0],
        SETTINGS[1],
        SETTINGS[2],
        SETTINGS[3],
        SETTINGS[4],
        option("MSGID", string("id")),
        option("TOKENS", integer("n")),
    ],
};

pub static APPEND_BATCH: CommandDecl = CommandDecl {
    name: "mem.appendbatch",
    entry: entry!(crate::commands::append_batch),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Appends several messages (a JSON array of {role, content, ts?, meta?, msgid?, tokens?}) in one atomic step, as consecutive MEM.APPENDs.",
    complexity: "O(N) in the size of the contents (tokenizing), plus O(M) for M evicted messages.",
    arity: -3,
    access: ReadUpdate,
    args: &[
        key(),
        string("messages"),
        SETTINGS[0],
        SETTINGS[1],
        SETTINGS[2],
        SETTINGS[3],
        SETTINGS[4],
    ],
};

pub static GET: CommandDecl = CommandDecl {
    name: "mem.get",
    entry: entry!(crate::commands::get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the session's summary and messages, oldest first, optionally the newest, those after an id, or those fitting a token budget.",
    complexity: "O(N) for N messages returned.",
    arity: -2,
    access: Read,
    args: &[
        key(),
        option("LAST", integer("n")),
        option("AFTER", integer("id")),
        option("BUDGET", integer("tokens")),
        option_of("FORMAT", "format", &[flag("RESP"), flag("JSON")]),
    ],
};

pub static SUMMARIZE_CHECK: CommandDecl = CommandDecl {
    name: "mem.summarize_check",
    entry: entry!(crate::commands::summarize_check),
    flags: "readonly",
    acl: "mem",
    summary: "Reports whether the session meets its summarization threshold and which messages a summary should cover.",
    complexity: "O(N) for N messages.",
    arity: -2,
    access: Read,
    args: &[key(), WINDOW, KEEP],
};

pub static SUMMARIZE_BEGIN: CommandDecl = CommandDecl {
    name: "mem.summarize_begin",
    entry: entry!(crate::commands::summarize_begin),
    flags: "write deny-oom",
    acl: "mem",
    summary: "A summarizer's start: the MEM.SUMMARIZE_CHECK answer plus a time-limited lease, granted to one worker at a time when the session meets its threshold.",
    complexity: "O(N) for N messages.",
    arity: -3,
    // Its reply is MEM.SUMMARIZE_CHECK's map.
    access: ReadUpdate,
    args: &[key(), integer("lease-ms"), WINDOW, KEEP],
};

pub static SUMMARIZE: CommandDecl = CommandDecl {
    name: "mem.summarize",
    entry: entry!(crate::commands::summarize),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Replaces the summary and every message up to an id with a new summary (refused while another worker's lease is live).",
    complexity: "O(N) in the size of the summary (tokenizing), plus O(M) for M replaced messages.",
    arity: -4,
    access: ReadUpdate,
    args: &[
        key(),
        integer("upto"),
        string("summary"),
        option("LEASE", integer("token")),
    ],
};

pub static EXT_SET: CommandDecl = CommandDecl {
    name: "mem.extset",
    entry: entry!(crate::commands::ext_set),
    flags: "write deny-oom",
    acl: "mem",
    summary:
        "Stores an external orchestrator's conversation id for the session, with its own expiry.",
    complexity: "O(log N) for N external ids.",
    arity: -4,
    access: Update,
    args: &[
        key(),
        string("system"),
        string("conversation_id"),
        option("EX", integer("seconds")),
    ],
};

pub static EXT_GET: CommandDecl = CommandDecl {
    name: "mem.extget",
    entry: entry!(crate::commands::ext_get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns an external orchestrator's conversation id, or nil when unknown or expired.",
    complexity: "O(log N) for N external ids.",
    arity: 3,
    access: Read,
    args: &[key(), string("system")],
};

pub static IMPORT: CommandDecl = CommandDecl {
    name: "mem.import",
    entry: entry!(crate::commands::import),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Creates a session from a JSON document (MEM.GET FORMAT JSON or the client-side user_memory shape).",
    complexity: "O(N) in the size of the document.",
    arity: -3,
    access: Overwrite,
    args: &[
        key(),
        string("json"),
        optional(flag("REPLACE")),
        SETTINGS[0],
        SETTINGS[1],
        SETTINGS[2],
        SETTINGS[3],
        SETTINGS[4],
    ],
};

pub static INFO: CommandDecl = CommandDecl {
    name: "mem.info",
    entry: entry!(crate::commands::info),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the session's counts, settings and ids, or nil when the key does not exist.",
    complexity: "O(1) (O(N) for N external ids).",
    arity: 2,
    access: Read,
    args: &[key()],
};

pub static ATTR_SET: CommandDecl = CommandDecl {
    name: "mem.attrset",
    entry: entry!(crate::commands::attr_set),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Stores a JSON value under a name beside the history (user_profile, context, ...), returned at the top level of MEM.GET FORMAT JSON; creates the session and refreshes its TTL.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: 4,
    access: Update,
    args: &[key(), string("name"), string("json")],
};

pub static ATTR_GET: CommandDecl = CommandDecl {
    name: "mem.attrget",
    entry: entry!(crate::commands::attr_get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns an attribute's JSON text (nil when absent), or without a name a map of every attribute.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: -2,
    access: Read,
    args: &[key(), optional(string("name"))],
};

pub static ATTR_DEL: CommandDecl = CommandDecl {
    name: "mem.attrdel",
    entry: entry!(crate::commands::attr_del),
    flags: "write",
    acl: "mem",
    summary: "Removes an attribute; returns 1 when it was set, else 0.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: 3,
    access: Update,
    args: &[key(), string("name")],
};

pub static COUNT: CommandDecl = CommandDecl {
    name: "mem.count",
    entry: entry!(crate::commands::count),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the tokens of a text under the model's encoding (with ROLE, of a message as MEM.APPEND counts it: 3 + role + text).",
    complexity: "O(N) in the size of the text.",
    arity: -3,
    access: Keyless,
    args: &[
        string("model"),
        string("text"),
        option("ROLE", string("role")),
    ],
};

pub static MODELS: CommandDecl = CommandDecl {
    name: "mem.models",
    entry: entry!(crate::commands::models),
    flags: "readonly fast",
    acl: "mem",
    summary: "Lists the model table in effect (mem.models entries first, then the built-in ones), or what one model resolves to: encoding, whether exact, context window.",
    complexity: "O(N) for N entries.",
    arity: -1,
    access: Keyless,
    args: &[optional(string("model"))],
};

/// Internal: a master's write, as replicas and the AOF receive it.
pub static APPLY: CommandDecl = CommandDecl {
    name: "mem._apply",
    entry: entry!(crate::commands::apply),
    flags: "write",
    acl: "",
    summary: "Internal: applies one write as decided by the master (replication and AOF).",
    complexity: "O(N) in the size of the payload.",
    arity: -3,
    access: Update,
    args: &[key(), string("payload"), optional(string("content"))],
};

/// Internal: a whole session, as AOF rewrites and imports replicate it.
pub static PUT: CommandDecl = CommandDecl {
    name: "mem._put",
    entry: entry!(crate::commands::put),
    flags: "write",
    acl: "",
    summary: "Internal: stores a whole serialized session (AOF rewrite, replication of imports).",
    complexity: "O(N) in the size of the payload.",
    arity: 3,
    access: Overwrite,
    args: &[key(), string("payload")],
};

/// Every command, in the order they are registered.
pub static ALL: [&CommandDecl; 17] = [
    &APPEND,
    &APPEND_BATCH,
    &GET,
    &SUMMARIZE_CHECK,
    &SUMMARIZE,
    &SUMMARIZE_BEGIN,
    &EXT_SET,
    &EXT_GET,
    &IMPORT,
    &INFO,
    &ATTR_SET,
    &ATTR_GET,
    &ATTR_DEL,
    &COUNT,
    &MODELS,
    &APPLY,
    &PUT,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A parser finds an option by its token: two arguments with one token
    /// would make the second unreachable.
    #[test]
    fn each_option_token_is_declared_once_per_command() {
        for decl in ALL {
            let mut seen: Vec<&str> = Vec::new();
            fn tokens(args: &[Arg], seen: &mut Vec<&'static str>, name: &str) {
                for a in args {
                    match a.token() {
                        Some(t) => {
                            assert!(!seen.contains(&t), "{name}: {t} twice");
                            seen.push(t);
                        }
                        None => tokens(a.subargs(), seen, name),
                    }
                }
            }
            tokens(decl.args, &mut seen, decl.name);
            for t in &seen {
                assert!(decl.option(t).is_some(), "{}: {t}", decl.name);
            }
        }
    }
}
