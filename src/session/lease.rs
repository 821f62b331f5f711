//! Summarizer leases (MEM.SUMMARIZE_BEGIN). `mem.threshold` is pub/sub:
//! every subscribed worker hears it, on every append while the session is
//! over its threshold. A lease lets one worker at a time summarize a
//! session: the others are told `lease 0` and a summary that does not give
//! the live lease's token is refused, so no LLM call is made twice. A lease
//! is only time: a worker that dies blocks no one once it expires.
//!
//! The master decides the token and the expiry and replicates them in an
//! `Op::Lease`, so a replica (or an AOF reload) holds the same lease whatever
//! its own clock says; expiry is judged against each op's `now`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sparse::{Empty, Sparse};
use super::{Session, SessionError, SummarizeCheck, Thresholds, MAX_ID};

/// The greatest lease token this server granted or applied (from its master
/// or the AOF, or in a loaded session). The session's own rule (above its
/// last token, at least 32 x the ms) keeps tokens apart across restarts;
/// this keeps them apart when a key name gets a new lifetime (DEL, expiry,
/// IMPORT REPLACE, RESTORE) within the same millisecond. Process state
/// below both the commands and the data type, which note what they see.
static ISSUED: AtomicU64 = AtomicU64::new(0);

pub fn note_issued(token: u64) {
    // A grant's token is about 32 x its time: one more than a day ahead of
    // this clock came from a crafted or corrupt payload (RESTORE, a
    // poisoned AOF), and noting it would exhaust every key's tokens until a
    // restart. Such a session still loads; only its own key's tokens start
    // above it. (The process's clock is the server's: RedisModule_
    // Milliseconds reads the same one.)
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    if token <= lease_floor(now.saturating_add(86_400_000)) {
        ISSUED.fetch_max(token, Ordering::Relaxed);
    }
}

/// `lease` with its token above every token this server issued.
pub fn above_every_issued_token(mut lease: Lease) -> Result<Lease, SessionError> {
    let least = ISSUED.load(Ordering::Relaxed).saturating_add(1);
    if least > MAX_ID {
        return Err(SessionError::LeasesExhausted);
    }
    lease.token = lease.token.max(least);
    Ok(lease)
}

/// Longest lease a worker may ask for: a day. A summary takes seconds to
/// minutes; a longer lease would only block the session after a crash.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// One worker's right to summarize a session until `expires_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Strictly increasing within the session, never 0, and above every
    /// token of an earlier lifetime of the key name (`lease_floor`).
    pub token: u64,
    /// Unix ms; the lease is live while the clock is below it.
    pub expires_at: i64,
}

/// The lease state a session keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    /// The last lease granted, until a summary ends it (it may have expired).
    pub current: Option<Lease>,
    /// The last token handed out (0: none yet); the next one is above it.
    pub last_token: u64,
}

impl Empty for Leases {
    fn empty() -> &'static Leases {
        static NONE: Leases = Leases {
            current: None,
            last_token: 0,
        };
        &NONE
    }
}

/// Tokens per millisecond of the clock: a token is at least the grant's
/// time x this, so a key deleted (or expired, replaced by IMPORT REPLACE,
/// RESTOREd from an old dump) and made again never hands out a token an
/// earlier lifetime of the key name handed out: a stale worker's token is
/// below every later one. 32 x the latest clock (9999-12-31) stays below
/// [`MAX_ID`], so tokens stay exact in JSON.
const TOKENS_PER_MS: u64 = 32;

/// The least token a lease granted at `now` can have.
fn lease_floor(now: i64) -> u64 {
    u64::try_from(now)
        .unwrap_or(0)
        .saturating_mul(TOKENS_PER_MS)
        .min(MAX_ID)
}

impl Session {
    /// The lease that is live at `now`, if any.
    pub fn live_lease(&self, now: i64) -> Option<Lease> {
        self.leases.current.filter(|l| l.expires_at > now)
    }

    /// Whether a summary that gives `token` (None: no LEASE) may be committed
    /// at `now`. Without a token: refused only while a worker's lease is
    /// live. With one: it must be the session's current lease, live or
    /// expired with nobody taking over (a slow worker can still commit). Any
    /// other token was summarizing something else: a lease a summary ended,
    /// one another worker took over, or one of an earlier lifetime of the
    /// key name (DEL, IMPORT REPLACE: ids start again at 1, so its `upto`
    /// would name the new conversation's messages).
    pub fn check_lease(&self, token: Option<u64>, now: i64) -> Result<(), SessionError> {
        let live = self.live_lease(now);
        match (token, live) {
            (None, None) => Ok(()),
            (None, Some(live)) => Err(SessionError::LeaseHeld {
                expires_in_ms: live.expires_at.saturating_sub(now),
            }),
            (Some(token), Some(live)) if live.token != token => Err(SessionError::LeaseHeld {
                expires_in_ms: live.expires_at.saturating_sub(now),
            }),
            (Some(token), _) if self.leases.current.map(|l| l.token) != Some(token) => {
                Err(SessionError::LeaseNotCurrent { token })
            }
            _ => Ok(()),
        }
    }

    /// MEM.SUMMARIZE_BEGIN: the check, and the lease to grant for
    /// `lease_ms` when the session meets its threshold, there is something
    /// to summarize and no lease is live (None: `lease 0`).
    pub fn begin(
        &self,
        thresholds: Thresholds,
        keep: u64,
        now: i64,
        lease_ms: u64,
    ) -> Result<(SummarizeCheck, Option<Lease>), SessionError> {
        let check = self.summarize_check(thresholds, keep);
        if !check.summarize || check.upto == 0 || self.live_lease(now).is_some() {
            return Ok((check, None));
        }
        let token = match self.leases.last_token.checked_add(1) {
            Some(t) if t <= MAX_ID => t.max(lease_floor(now)),
            _ => return Err(SessionError::LeasesExhausted),
        };
        // lease_ms <= MAX_LEASE_MS (the command checks it); min() keeps
        // the cast and the sum far from overflow anyway.
        let expires_at = now.saturating_add(lease_ms.min(MAX_LEASE_MS) as i64);
        Ok((check, Some(Lease { token, expires_at })))
    }

    /// Installs a granted lease (from `Op::Lease`); its token must be above
    /// every earlier one. On error nothing changes.
    pub(super) fn grant(&mut self, lease: Lease) -> Result<(), SessionError> {
        if lease.token <= self.leases.last_token {
            return Err(SessionError::LeaseNotIncreasing {
                token: lease.token,
                last: self.leases.last_token,
            });
        }
        self.leases = Sparse::new(Leases {
            current: Some(lease),
            last_token: lease.token,
        });
        Ok(())
    }
}
