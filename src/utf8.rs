//! UTF-8 checks of the texts the module is given: command arguments, a
//! replica's ops, RDB and DUMP payloads. simdutf8's, not std's: std's check
//! branches per character, which text mixing scripts at random defeats (4 MB
//! of ASCII, accents, CJK and emoji: 15.6 ms against 0.4-0.5 ms; 200-byte
//! messages with accents: 130 against 32 ns), and the main thread runs most
//! of these checks.

/// `bytes` as a `&str`, or None when they are not UTF-8.
pub fn str(bytes: &[u8]) -> Option<&str> {
    simdutf8::basic::from_utf8(bytes).ok()
}
