//! What a compaction's LLM requests cost, counted where they are made.
//!
//! A compaction may send many requests: one per chunk, the acceptance gate's second ask,
//! the fact check's second attempt, the retries after a cut-off answer or a context-length
//! refusal, the retries after a transient error, and the LLM's part of a fallback. Each
//! is counted by the HTTP layer as it is sent ([`Meter::sent`]), and each answer's usage
//! as the provider reported it ([`Meter::answered`]), into one [`Meter`] per compaction,
//! whatever becomes of the answer (written, refused, cut off, thrown away). Nothing above
//! the HTTP layer adds usage up, so no path can forget to: the usage event records the
//! meter's total (docs/protocol.md, "The schema").

use std::sync::{Arc, Mutex, PoisonError};

/// The most tokens of one kind a usage event records for a compaction (2^30 - 1, about a
/// billion): two of them still sum within a 32-bit column. See [`Usage::recorded`].
pub const MAX_RECORDED_TOKENS: i64 = (1 << 30) - 1;

/// What one answer's `usage` said; a figure the provider left out is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The part of `prompt_tokens` read from the provider's prompt cache (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`, Anthropic's
    /// `usage.cache_read_input_tokens`).
    pub cached_prompt_tokens: Option<i64>,
}

/// Every request of a compaction and what their answers reported, summed. A token figure
/// is `None` while no answer reported it, so "not reported" stays apart from 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests sent to the provider, answered or not (a retried 503, a request cut
    /// short by the deadline): `llm_requests` in the usage event.
    pub requests: i64,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_prompt_tokens: Option<i64>,
}

impl Usage {
    fn add(&mut self, answer: Reported) {
        let add = |sum: Option<i64>, more: Option<i64>| match (sum, more) {
            (sum, None) => sum,
            (sum, Some(more)) => Some(sum.unwrap_or(0).saturating_add(more.max(0))),
        };
        self.prompt_tokens = add(self.prompt_tokens, answer.prompt_tokens);
        self.completion_tokens = add(self.completion_tokens, answer.completion_tokens);
        self.cached_prompt_tokens = add(self.cached_prompt_tokens, answer.cached_prompt_tokens);
    }

    /// This usage as the usage event's 32-bit token columns hold it: each figure at most
    /// [`MAX_RECORDED_TOKENS`], so that `total_tokens` (their sum) fits as well. Only a
    /// provider reporting nonsense comes near it; its compaction is written all the same.
    #[must_use]
    pub fn recorded(self) -> Self {
        let cap = |n: Option<i64>| n.map(|n| n.min(MAX_RECORDED_TOKENS));
        Self {
            requests: self.requests,
            prompt_tokens: cap(self.prompt_tokens),
            completion_tokens: cap(self.completion_tokens),
            cached_prompt_tokens: cap(self.cached_prompt_tokens),
        }
    }
}

/// One compaction's running [`Usage`], shared by every request it makes (clones share
/// the count).
#[derive(Clone, Debug, Default)]
pub struct Meter(Arc<Mutex<Usage>>);

impl Meter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A request is on its way.
    pub fn sent(&self) {
        self.update(|usage| usage.requests = usage.requests.saturating_add(1));
    }

    /// A request was answered, with this usage.
    pub fn answered(&self, answer: Reported) {
        self.update(|usage| usage.add(answer));
    }

    /// The usage so far.
    pub fn total(&self) -> Usage {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut Usage)) {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_and_every_reported_figure_is_summed() {
        let meter = Meter::new();
        let clone = meter.clone();
        meter.sent();
        clone.sent();
        meter.sent();
        meter.answered(Reported {
            prompt_tokens: Some(100),
            completion_tokens: Some(20),
            cached_prompt_tokens: None,
        });
        clone.answered(Reported {
            prompt_tokens: Some(50),
            completion_tokens: Some(5),
            cached_prompt_tokens: Some(40),
        });
        assert_eq!(
            meter.total(),
            Usage {
                requests: 3,
                prompt_tokens: Some(150),
                completion_tokens: Some(25),
                cached_prompt_tokens: Some(40),
            }
        );
    }

    #[test]
    fn nothing_reported_stays_apart_from_zero() {
        let meter = Meter::new();
        meter.sent();
        meter.answered(Reported::default());
        let usage = meter.total();
        assert_eq!(usage.requests, 1);
        assert_eq!(usage.prompt_tokens, None);
        assert_eq!(usage.cached_prompt_tokens, None);
    }

    #[test]
    fn hostile_figures_cannot_overflow_or_subtract() {
        let meter = Meter::new();
        for tokens in [i64::MAX, -5, i64::MAX] {
            meter.answered(Reported {
                prompt_tokens: Some(tokens),
                completion_tokens: Some(tokens),
                cached_prompt_tokens: Some(tokens),
            });
        }
        let usage = meter.total();
        assert_eq!(usage.prompt_tokens, Some(i64::MAX));
        assert_eq!(usage.completion_tokens, Some(i64::MAX));
    }
}
