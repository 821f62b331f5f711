//! Argument parsing shared by the MEM.* commands, with Redis-style errors.

use redis_module::{RedisError, RedisString};

use crate::declare::CommandDecl;
use crate::session::{MAX_ROLE_BYTES, MAX_TTL_SECS};

/// Options after the positional arguments: `NAME value` pairs (or bare flags),
/// case-insensitive, each at most once, in any order.
pub struct Options<'a> {
    values: Vec<(&'static str, Option<&'a RedisString>)>,
}

impl<'a> Options<'a> {
    /// Parses `args` against the options `command` declares (the tokens of
    /// its `args`: those of a pure token take no value, the others one).
    pub fn parse(
        args: &'a [RedisString],
        command: &CommandDecl,
    ) -> Result<Options<'a>, RedisError> {
        let mut values: Vec<(&'static str, Option<&'a RedisString>)> =
            Vec::with_capacity(args.len().div_ceil(2));
        let mut i = 0;
        while i < args.len() {
            let given = args[i].as_slice();
            let (name, value) = match command.option(given) {
                Some((name, true)) => {
                    let value = args.get(i + 1).ok_or_else(|| {
                        crate::error::invalid(format!(
                            "syntax error, option '{name}' needs a value"
                        ))
                    })?;
                    i += 2;
                    (name, Some(value))
                }
                Some((name, false)) => {
                    i += 1;
                    (name, None)
                }
                None => {
                    return Err(crate::error::invalid(format!(
                        "syntax error, unknown option '{}'",
                        printable(&String::from_utf8_lossy(given).to_ascii_uppercase())
                    )))
                }
            };
            if values.iter().any(|(n, _)| *n == name) {
                return Err(crate::error::invalid(format!(
                    "syntax error, option '{name}' given more than once"
                )));
            }
            values.push((name, value));
        }
        Ok(Options { values })
    }

    pub fn has(&self, name: &str) -> bool {
        self.values.iter().any(|(n, _)| *n == name)
    }

    pub fn get(&self, name: &str) -> Option<&'a RedisString> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| *v)
    }

    /// A non-negative integer option, at least `min`.
    pub fn u64(&self, name: &str, min: u64) -> Result<Option<u64>, RedisError> {
        self.get(name).map(|v| parse_u64(name, v, min)).transpose()
    }

    /// A TTL-like option in seconds (TTL, EX), at least `min` and at most
    /// [`MAX_TTL_SECS`], so no expiry computed from it can overflow.
    pub fn seconds(&self, name: &str, min: u64) -> Result<Option<u64>, RedisError> {
        match self.u64(name, min)? {
            Some(s) if s > MAX_TTL_SECS => Err(crate::error::invalid(format!(
                "{name} must be at most {MAX_TTL_SECS} (100 years)"
            ))),
            other => Ok(other),
        }
    }

    /// A non-negative integer option in `min..=max`, `max` being the setting
    /// `limit` (named in the error).
    pub fn u64_at_most(
        &self,
        name: &str,
        min: u64,
        max: u64,
        limit: &str,
    ) -> Result<Option<u64>, RedisError> {
        match self.u64(name, min)? {
            Some(n) if n > max => Err(crate::error::invalid(format!(
                "{name} must be at most {max} ({limit})"
            ))),
            n => Ok(n),
        }
    }

    /// A UTF-8 string option.
    pub fn str(&self, name: &str) -> Result<Option<&'a str>, RedisError> {
        self.get(name).map(|v| utf8(name, v)).transpose()
    }
}

/// Keeps error messages on one printable line.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A decimal integer `>= min`; Redis's wording for anything else. Redis's
/// integer syntax (string2ll): digits only, no sign, no spaces, and no
/// leading zero but in `0` itself (`01`, `+1`, ` 5` are refused).
pub fn parse_u64(name: &str, v: &RedisString, min: u64) -> Result<u64, RedisError> {
    let s = crate::utf8::str(v.as_slice()).unwrap_or("");
    let canonical = s == "0" || (!s.starts_with('0') && !s.is_empty());
    let n = if canonical && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>().ok().filter(|n| *n <= i64::MAX as u64)
    } else {
        None
    };
    match n {
        Some(n) if n >= min => Ok(n),
        Some(_) => Err(crate::error::invalid(format!(
            "{name} must be at least {min}"
        ))),
        None => Err(crate::error::invalid(format!(
            "{name} is not an integer or out of range"
        ))),
    }
}

pub fn utf8<'a>(name: &str, v: &'a RedisString) -> Result<&'a str, RedisError> {
    utf8_bytes(name, v.as_slice())
}

/// [`utf8`] of an argument's bytes (a worker has the bytes, not the string).
pub fn utf8_bytes<'a>(name: &str, v: &'a [u8]) -> Result<&'a str, RedisError> {
    crate::utf8::str(v).ok_or_else(|| crate::error::invalid(format!("{name} is not valid UTF-8")))
}

/// A JSON text without the whitespace JSON allows around it (space, tab,
/// CR, LF): how a META or an attribute value is stored, whichever command
/// brought it (APPENDBATCH and IMPORT read theirs without it).
pub fn trim_json(text: &str) -> &str {
    text.trim_matches([' ', '\t', '\n', '\r'])
}

pub fn check_role(role: &str) -> Result<(), RedisError> {
    if role.is_empty() || role.len() > MAX_ROLE_BYTES {
        return Err(crate::error::invalid(format!(
            "role must be 1 to {MAX_ROLE_BYTES} bytes"
        )));
    }
    name_chars("role", role)
}

pub fn check_model(model: &str) -> Result<(), RedisError> {
    crate::session::check_model(model).map_err(|e| crate::error::invalid(e.to_string()))?;
    name_chars("model name", model)
}

/// MSGID (and a batch item's `msgid`): 1 to 128 bytes.
pub fn check_msgid(msgid: &str) -> Result<(), RedisError> {
    crate::session::check_msgid(msgid).map_err(|e| crate::error::invalid(e.to_string()))?;
    name_chars("msgid", msgid)
}

/// See [`crate::session::check_name_chars`].
pub fn name_chars(what: &str, name: &str) -> Result<(), RedisError> {
    crate::session::check_name_chars(what, name).map_err(|e| crate::error::invalid(e.to_string()))
}

/// Content (or summary text) must fit `mem.max-message-bytes`.
pub fn check_size(what: &str, len: usize, max: u64) -> Result<(), RedisError> {
    if len as u64 > max {
        return Err(too_large(what, len, max));
    }
    Ok(())
}

/// Refuses a text that shows nothing: only white space (Unicode's), control,
/// format and unassigned characters (zero-width spaces, joiners, BOM, soft
/// hyphen), marks without a base (combining accents, variation selectors),
/// the other default-ignorable code points and the blank fillers (U+115F,
/// U+1160, U+3164, U+FFA0, U+2800). A summary
/// like that would replace messages with nothing: an LLM's empty answer.
/// Invalid UTF-8 is left to the text's own check.
pub fn check_shows_something(what: &str, bytes: &[u8]) -> Result<(), RedisError> {
    static BLANK: std::sync::LazyLock<Option<regex_automata::meta::Regex>> =
        std::sync::LazyLock::new(|| {
            regex_automata::meta::Regex::new(
                r"\A[\p{White_Space}\p{Cc}\p{Cf}\p{Cn}\p{M}\p{Default_Ignorable_Code_Point}\x{115F}\x{1160}\x{3164}\x{FFA0}\x{2800}]*\z",
            )
            .ok()
        });
    // The pattern is fixed: it builds. Without it, ASCII white space only.
    let blank = match BLANK.as_ref() {
        Some(re) => re.is_match(bytes),
        None => bytes.iter().all(u8::is_ascii_whitespace),
    };
    if blank {
        return Err(crate::error::invalid(format!(
            "{what} is empty: only white space or invisible characters"
        )));
    }
    Ok(())
}

/// The error of [`check_size`].
pub fn too_large(what: &str, len: usize, max: u64) -> RedisError {
    crate::error::invalid(format!(
        "{what} is {len} bytes, above mem.max-message-bytes ({max})"
    ))
}

/// META must be a JSON object that `FORMAT JSON` can give back to
/// MEM.IMPORT; it is kept as sent.
pub fn check_meta(meta: &str) -> Result<(), RedisError> {
    crate::session::check_meta(meta).map_err(|e| crate::error::invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_of_invisible_characters_shows_nothing() {
        for blank in [
            "",
            " \t\n",
            "\u{a0}\u{3000}\u{2028}\u{85}\u{b}",
            "\u{200b}\u{feff}\u{ad}\u{2060}",
            "\0\u{1}",
            "\u{3164}\u{2800}\u{115f}",
            "\u{fe0f}\u{fe00}\u{e0100}",
            "\u{34f}\u{180b}",
            "\u{17b4}\u{2065}",
            "\u{301}\u{302}\u{303}",
        ] {
            assert!(
                check_shows_something("s", blank.as_bytes()).is_err(),
                "{blank:?}"
            );
        }
        for shown in ["a", "e\u{301}", " . ", "\u{200b}x", "\u{4e2d}", "\u{1f600}"] {
            assert!(
                check_shows_something("s", shown.as_bytes()).is_ok(),
                "{shown:?}"
            );
        }
        // Invalid UTF-8 is the text check's to refuse, not blank.
        assert!(check_shows_something("s", b"\xff").is_ok());
    }
}
