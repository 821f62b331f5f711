//! The read side of a session: summarization thresholds, MEM.SUMMARIZE_CHECK
//! and which messages MEM.GET returns.

use super::log::Iter;
use super::{Session, Settings, Summary};

/// The summarization thresholds of a session (spec §3, MEM.SUMMARIZE_CHECK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub tokens: u64,
    pub messages: u64,
}

impl Thresholds {
    /// `ratio_percent` of the context window (or `fallback_tokens` when the
    /// window is unknown), never above the session's token cap less
    /// `headroom_percent` of it; the message cap less the headroom. The caps
    /// are a safety net: the summarize signal must come before they evict
    /// anything (what a cap evicts is lost), so a summarizer has the
    /// headroom's worth of appends to act. Headroom 0 is the rule of the
    /// releases before it existed (thresholds at the caps).
    pub fn new(
        context_window: Option<u64>,
        ratio_percent: u64,
        fallback_tokens: u64,
        settings: &Settings,
        headroom_percent: u64,
    ) -> Thresholds {
        let by_window = match context_window {
            Some(window) => window.saturating_mul(ratio_percent) / 100,
            None => fallback_tokens,
        };
        Thresholds {
            tokens: by_window.min(less_headroom(settings.max_tokens, headroom_percent)),
            messages: less_headroom(settings.max_msgs, headroom_percent),
        }
    }
}

/// `cap` less `headroom_percent` of it, rounded up (30 less 20% is 24; 6
/// less 20% is 5), so a threshold is never 0 while the cap is not.
pub fn less_headroom(cap: u64, headroom_percent: u64) -> u64 {
    let kept = u128::from(100 - headroom_percent.min(100));
    let value = (u128::from(cap) * kept).div_ceil(100);
    // value <= cap: it fits.
    u64::try_from(value).unwrap_or(cap)
}

/// The answer of MEM.SUMMARIZE_CHECK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummarizeCheck {
    pub summarize: bool,
    pub total_tokens: u64,
    pub messages: u64,
    pub thresholds: Thresholds,
    pub keep: u64,
    pub upto: u64,
    pub upto_tokens: u64,
}

/// Which messages MEM.GET returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub last: Option<u64>,
    pub after: Option<u64>,
    pub budget: Option<u64>,
}

impl Session {
    /// Whether the session meets its summarization thresholds (O(1), for the
    /// hot path; `summarize_check` also finds what to summarize).
    pub fn meets(&self, thresholds: Thresholds) -> bool {
        self.total_tokens >= thresholds.tokens || self.message_count() >= thresholds.messages
    }

    /// MEM.SUMMARIZE_CHECK for this session.
    pub fn summarize_check(&self, thresholds: Thresholds, keep: u64) -> SummarizeCheck {
        let messages = self.message_count();
        // Index of the first kept message; a kept part never starts with a
        // tool result, so the boundary moves back past tool messages.
        let mut first_kept = messages.saturating_sub(keep) as usize;
        while first_kept > 0 && self.messages.is_tool(first_kept) {
            first_kept -= 1;
        }
        let (upto, covered_tokens) = if first_kept == 0 {
            (0, 0)
        } else {
            let upto = self.messages.head(first_kept - 1).map_or(0, |h| h.id);
            // From the running total, so the cost is the kept part's (a few
            // messages), not the session's.
            let kept = self.messages.tokens_in(first_kept..self.messages.len());
            let messages_total = self.total_tokens.saturating_sub(self.summary_tokens());
            let covered = match messages_total.checked_sub(kept) {
                Some(covered) => covered,
                None => self.messages.tokens_in(0..first_kept),
            };
            (upto, covered)
        };
        SummarizeCheck {
            summarize: self.meets(thresholds),
            total_tokens: self.total_tokens,
            messages,
            thresholds,
            keep,
            upto,
            upto_tokens: self.summary_tokens() + covered_tokens,
        }
    }

    /// The summary (unless `AFTER` was given) and the messages MEM.GET returns.
    pub fn select(&self, sel: Selection) -> (Option<&Summary>, Iter<'_>) {
        let mut start = 0usize;
        let len = self.messages.len();
        if let Some(after) = sel.after {
            start = self.messages.after_id(after);
        }
        if let Some(last) = sel.last {
            let last = usize::try_from(last).unwrap_or(usize::MAX);
            start = start.max(len.saturating_sub(last));
        }
        let mut summary = if sel.after.is_some() {
            None
        } else {
            self.summary.as_deref()
        };
        if let Some(budget) = sel.budget {
            let mut used = summary.map_or(0, |s| s.tokens);
            if used > budget {
                // Nothing fits: the summary alone is over the budget.
                summary = None;
                start = len;
            } else {
                let mut fit = len;
                while fit > start {
                    match self.messages.head(fit - 1).map(|h| u64::from(h.tokens)) {
                        Some(tokens) if used.saturating_add(tokens) <= budget => used += tokens,
                        _ => break,
                    }
                    fit -= 1;
                }
                start = fit;
            }
        }
        // LAST and BUDGET give context to send as is: it never starts with a
        // tool result, whose call is not in it. AFTER alone is a sync cursor:
        // exactly the messages after the id.
        if sel.last.is_some() || sel.budget.is_some() {
            while self.messages.is_tool(start) {
                start += 1;
            }
        }
        (summary, self.messages.iter_from(start))
    }
}
