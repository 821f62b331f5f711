//! Invariants of sessions and ops, checked on everything that comes from
//! outside the commands' own parsing: RDB/DUMP payloads, `MEM._PUT` and
//! `MEM._APPLY`. A corrupt payload is refused, never half-loaded.

use super::{Message, Op, Session, Settings, Summary, MAX_ROLE_BYTES, MAX_TS};
use crate::tokenizer::SUMMARY_COUNTED_AS;

/// A JSON object, as META and imported members must be.
pub fn check_json_object(what: &str, text: &str) -> Result<(), String> {
    match serde_json::from_str::<&serde_json::value::RawValue>(text) {
        Ok(raw) if raw.get().trim_start().starts_with('{') => Ok(()),
        Ok(_) => Err(format!("{what} must be a JSON object")),
        Err(e) => Err(format!("{what} is not valid JSON: {e}")),
    }
}

/// A token count can never exceed the bytes counted (every token covers at
/// least one byte), plus the 3 framing tokens: a larger one is corrupt.
fn check_tokens(tokens: u64, role_bytes: usize, text_bytes: usize) -> Result<(), String> {
    if tokens > 3 + role_bytes as u64 + text_bytes as u64 {
        return Err(format!("token count {tokens} exceeds its text"));
    }
    Ok(())
}

impl Message {
    pub fn validate(&self) -> Result<(), String> {
        if self.role.is_empty() || self.role.len() > MAX_ROLE_BYTES {
            return Err(format!("bad role at id {}", self.id));
        }
        if !(0..=MAX_TS).contains(&self.ts) {
            return Err(format!("bad ts at id {}", self.id));
        }
        check_tokens(self.tokens, self.role.len(), self.content.len())?;
        match &self.meta {
            Some(meta) => check_json_object("meta", meta),
            None => Ok(()),
        }
    }
}

impl Summary {
    pub fn validate(&self) -> Result<(), String> {
        if self.upto == 0 || !(0..=MAX_TS).contains(&self.ts) {
            return Err("bad summary".to_owned());
        }
        check_tokens(self.tokens, SUMMARY_COUNTED_AS.len(), self.text.len())
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_msgs == 0 || self.max_tokens == 0 {
            return Err("caps must be at least 1".to_owned());
        }
        if self.model.is_empty() {
            return Err("empty model name".to_owned());
        }
        Ok(())
    }
}

impl Op {
    /// Checks what an op received from outside (`MEM._APPLY`) carries, as
    /// the commands check what clients send.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Op::Append { settings, message, .. } => {
                settings.validate()?;
                message.validate()
            }
            Op::Summarize { summary, .. } => summary.validate(),
            Op::ExtSet { settings, system, .. } if !system.is_empty() => settings.validate(),
            Op::ExtSet { .. } => Err("empty external system name".to_owned()),
        }
    }
}

impl Session {
    /// Checks the invariants a loaded payload must hold, so a corrupt one is
    /// refused instead of misbehaving later.
    pub fn validate(&self) -> Result<(), String> {
        self.settings.validate()?;
        let mut prev = 0;
        let mut total = 0u64;
        if let Some(s) = &self.summary {
            s.validate()?;
            prev = s.upto;
            total = s.tokens;
        }
        for m in &self.messages {
            if m.id <= prev {
                return Err(format!("message ids not increasing at id {}", m.id));
            }
            m.validate()?;
            prev = m.id;
            total += m.tokens; // bounded by the content sizes: cannot overflow
        }
        if prev > self.last_id {
            return Err("last id below a message id".to_owned());
        }
        if total != self.total_tokens {
            return Err(format!(
                "total_tokens {} does not match the sum {total}",
                self.total_tokens
            ));
        }
        if let Some(extra) = &self.extra {
            check_json_object("imported members", extra)?;
        }
        if self.external.keys().any(String::is_empty) {
            return Err("empty external system name".to_owned());
        }
        Ok(())
    }
}
