//! Whether a second attempt is worth asking a model for: the fact check asks again when
//! a summary states too few of the facts, listing them; a model that did not state more
//! when told exactly what to state (a small one, on every compaction of a real run: see
//! docs/benchmarks.md, "A real model") pays twice the tokens and the time for nothing. So
//! after a second attempt that did not improve, the next compactions that would ask again
//! do not, for this model: two, then four, up to eight while its attempts keep not
//! improving; one that improves resets it. The memory is the worker process's, per
//! model, and starts afresh with the process: one compaction's attempt is cheap to learn
//! from, and never stops a model for good.

use std::collections::HashMap;
use std::sync::Mutex;

/// The most compactions a model's second attempts are skipped in a row.
pub const MAX_SKIPPED: u32 = 8;

/// Per model (`""` for the configured one): how many more compactions skip the second
/// attempt, and how many the next failure will skip.
#[derive(Debug, Default)]
pub struct SecondAttempts(Mutex<HashMap<String, Backoff>>);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Backoff {
    skip_left: u32,
    next_skip: u32,
}

impl SecondAttempts {
    /// Whether a compaction whose first summary falls short asks `model` again; `false`
    /// counts as one of the compactions skipped.
    pub fn worth_asking(&self, model: Option<&str>) -> bool {
        let mut models = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match models.get_mut(model.unwrap_or_default()) {
            Some(backoff) if backoff.skip_left > 0 => {
                backoff.skip_left -= 1;
                false
            }
            _ => true,
        }
    }

    /// How `model`'s second attempt went: whether it stated more than the first.
    pub fn went(&self, model: Option<&str>, improved: bool) {
        let mut models = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let backoff = models
            .entry(model.unwrap_or_default().to_owned())
            .or_default();
        *backoff = if improved {
            Backoff::default()
        } else {
            let skip = (backoff.next_skip.max(1) * 2).min(MAX_SKIPPED);
            Backoff {
                skip_left: skip,
                next_skip: skip,
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_that_do_not_improve_are_skipped_two_four_then_eight_times() {
        let attempts = SecondAttempts::default();
        assert!(attempts.worth_asking(None));
        let mut pattern = Vec::new();
        for _ in 0..4 {
            attempts.went(None, false);
            let mut skipped = 0;
            while !attempts.worth_asking(None) {
                skipped += 1;
            }
            pattern.push(skipped);
        }
        assert_eq!(pattern, [2, 4, 8, 8]);
        // Another model is asked as ever.
        attempts.went(None, false);
        assert!(attempts.worth_asking(Some("gpt-4.1")));
    }

    #[test]
    fn an_attempt_that_improves_resets_the_backoff() {
        let attempts = SecondAttempts::default();
        attempts.went(Some("m"), false);
        assert!(!attempts.worth_asking(Some("m")));
        attempts.went(Some("m"), true);
        assert!(attempts.worth_asking(Some("m")));
        attempts.went(Some("m"), false);
        assert!(!attempts.worth_asking(Some("m")));
        assert!(!attempts.worth_asking(Some("m")));
        assert!(attempts.worth_asking(Some("m")));
    }
}
