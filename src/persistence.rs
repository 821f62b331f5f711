//! The session's serialized form, shared by RDB, DUMP/RESTORE, AOF rewrite
//! and replication (`MEM._PUT`, `MEM._APPLY`).
//!
//! A payload is one format byte followed by the postcard encoding of the
//! value. Decoding checks the format byte, refuses trailing bytes, and
//! validates the session's invariants, so a corrupt payload is an error,
//! never a half-loaded session.

use crate::session::{Op, Session};

/// The data type's RDB encoding version (what Redis stores per value).
pub const RDB_ENCODING_VERSION: i32 = 1;

/// First byte of every payload of format 1.
const FORMAT_V1: u8 = 1;

pub fn encode_session(session: &Session) -> Vec<u8> {
    encode(session)
}

pub fn decode_session(bytes: &[u8]) -> Result<Session, String> {
    let session: Session = decode(bytes)?;
    session.validate()?;
    Ok(session)
}

pub fn encode_op(op: &Op) -> Vec<u8> {
    encode(op)
}

pub fn decode_op(bytes: &[u8]) -> Result<Op, String> {
    decode(bytes)
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Serializing into a Vec cannot fail for these plain data types; an empty
    // payload (refused by decode) is the fallback rather than a panic.
    postcard::to_extend(value, vec![FORMAT_V1]).unwrap_or_default()
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&FORMAT_V1, body)) => {
            let (value, rest) =
                postcard::take_from_bytes(body).map_err(|e| format!("corrupt payload: {e}"))?;
            if rest.is_empty() {
                Ok(value)
            } else {
                Err(format!("corrupt payload: {} trailing bytes", rest.len()))
            }
        }
        Some((version, _)) => Err(format!("unknown payload format {version}")),
        None => Err("empty payload".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Message, Settings};
    use crate::tokenizer::Encoding;

    fn sample() -> Session {
        let settings = Settings {
            model: "gpt-4o".into(),
            encoding: Encoding::O200kBase,
            ttl: 60,
            max_tokens: 1000,
            max_msgs: 10,
        };
        let mut s = Session::new(settings.clone(), 5);
        for id in 1..=3 {
            let message = Message {
                id,
                role: "user".into(),
                content: format!("message {id}").into(),
                ts: 10 + id as i64,
                tokens: 7,
                meta: (id == 2).then(|| r#"{"name":"x"}"#.into()),
            };
            s.apply(Op::Append { now: 20, settings: settings.clone(), message }).unwrap();
        }
        s
    }

    #[test]
    fn session_round_trips() {
        let s = sample();
        assert_eq!(decode_session(&encode_session(&s)).unwrap(), s);
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = encode_session(&sample());
        for len in 0..bytes.len() {
            assert!(decode_session(&bytes[..len]).is_err(), "truncated at {len}");
        }
    }

    #[test]
    fn flipped_bytes_never_panic_and_never_break_invariants() {
        let bytes = encode_session(&sample());
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                if let Ok(s) = decode_session(&b) {
                    assert!(s.validate().is_ok());
                }
            }
        }
    }

    #[test]
    fn unknown_format_is_refused() {
        let mut bytes = encode_session(&sample());
        bytes[0] = 9;
        assert!(decode_session(&bytes).unwrap_err().contains("unknown payload format"));
    }
}
