//! Every MEM.* command, declared once, beside its handler (`write.rs`
//! declares MEM.APPEND, ...): its registration (name, entry point, flags,
//! ACL category; the key position follows from `access`), its `COMMAND
//! DOCS` (summary, complexity, arity, arguments, key spec) and the options
//! its parser takes (the tokens of `args`). This is the list `lib.rs`
//! registers.

use crate::declare::CommandDecl;

use super::{attrs, batch, ext, import, internal, lease, models, read, write};

/// Every command, in the order they are registered.
pub static ALL: [&CommandDecl; 17] = [
    &write::APPEND,
    &batch::APPEND_BATCH,
    &read::GET,
    &read::SUMMARIZE_CHECK,
    &write::SUMMARIZE,
    &lease::SUMMARIZE_BEGIN,
    &ext::EXT_SET,
    &ext::EXT_GET,
    &import::IMPORT,
    &read::INFO,
    &attrs::ATTR_SET,
    &attrs::ATTR_GET,
    &attrs::ATTR_DEL,
    &models::COUNT,
    &models::MODELS,
    &internal::APPLY,
    &internal::PUT,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declare::Arg;

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
                assert!(decl.option(t.as_bytes()).is_some(), "{}: {t}", decl.name);
            }
        }
    }
}
