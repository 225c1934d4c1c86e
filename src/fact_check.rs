//! The fact check every summary passes after the template check: how many of the
//! identifiers of the part it replaces ([`crate::facts`]) it still carries, whether that
//! is worth a second attempt, and which of two summaries to keep. Plain functions over
//! plain data; the worker runs them (off the async threads for a large old part) and
//! does the asking.
//!
//! Only an LLM is asked again: the extractive summarizer would answer the same, and a
//! summary the extractive fallback wrote means the LLM just failed. A second attempt
//! replaces the first only when it keeps strictly more of the facts, so a retry can make
//! a compaction better and never worse.

use crate::config::{FactCheck, FactCheckMode};
use crate::facts::{FactSet, Recall, Weighing};
use crate::prompt::MAX_LISTED_FACT_CHARS;
use crate::summary::Summary;

/// A summary that passed [`crate::summary::accept`], with its recall.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub summary: Summary,
    /// The summary as it will be written: trimmed, unfenced.
    pub text: String,
    pub recall: Recall,
}

/// What a second attempt came to: the `outcome` label of
/// `summarizer_fact_retries_total`, and `fact_retry_outcome` in the usage event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryOutcome {
    /// It kept more of the facts, and replaced the first summary.
    Improved,
    /// It passed the template check but kept no more: the first summary stays.
    NotImproved,
    /// An error, or a summary the template check refused: the first summary stays.
    Failed,
}

impl RetryOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Improved => "improved",
            Self::NotImproved => "not_improved",
            Self::Failed => "failed",
        }
    }
}

/// What the usage event records of the fact check (`facts_total`, `facts_kept`,
/// `facts_stated`, `fact_retry`, `fact_retry_outcome`, and why `facts_total` were
/// weighed: `facts_seen`, `facts_said`, `facts_relied_on`): the kept summary's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub total: usize,
    /// Identifiers the summary carries anywhere ...
    pub kept: usize,
    /// ... and inside its statements, not in a list of identifiers.
    pub stated: usize,
    /// `None` when no second attempt was made.
    pub retry: Option<RetryOutcome>,
    /// Why `total` identifiers were weighed of those the old part holds.
    pub weighing: Weighing,
}

impl Figures {
    pub fn of(recall: &Recall, retry: Option<RetryOutcome>, weighing: Weighing) -> Self {
        Self {
            total: recall.total,
            kept: recall.kept,
            stated: recall.stated,
            retry,
            weighing,
        }
    }
}

/// Whether a first summary with `recall` is to be asked for again under `policy`: in
/// `retry` mode, when it states less than the minimum (a part with no facts has a
/// recall of 1). An identifier a summary only lists ("Also noted: 14:01, v5.33.0") does
/// not count: a reader cannot tell what it is about. Whether the summarizer can do
/// better is the summarizer's to say.
fn worth_retrying(policy: FactCheck, recall: &Recall) -> bool {
    policy.mode == FactCheckMode::Retry && recall.ratio() < policy.min_recall
}

/// Whether `first` is worth a second attempt under `policy`, as the worker and the
/// evaluation decide it: [`worth_retrying`], written by the LLM (a summary from the
/// extractive fallback means the LLM just failed) at its first answer (one the
/// acceptance gate refused was asked again already: one more request per compaction),
/// and with a minimum a summary within `max_chars` could reach ([`attainable`]).
/// Whether the summarizer can do better is the summarizer's to say.
pub fn asks_again(policy: FactCheck, first: &Checked, facts: &FactSet, max_chars: usize) -> bool {
    worth_retrying(policy, &first.recall)
        && first.summary.fallback_reason.is_none()
        && first.summary.refused.is_empty()
        && attainable(facts, policy.min_recall, max_chars)
}

/// Whether any summary within `max_chars` could keep `min_recall` of the identifiers a
/// summary can copy (those of at most [`MAX_LISTED_FACT_CHARS`] characters, the ones a
/// second attempt lists): the shortest that many, each with a separator, fit in it. When
/// they cannot (a log dump of thousands of distinct ids), a second attempt could not
/// reach the minimum whatever the LLM did, and would only pay for another call (and, in
/// chunks, another pass over the whole old part). Longer "identifiers" (a 50 KB token
/// in a dump) are left out of the count, so that one of them cannot stop the attempt
/// for the ordinary facts beside it.
pub fn attainable(facts: &FactSet, min_recall: f64, max_chars: usize) -> bool {
    let mut lengths: Vec<usize> = facts
        .iter()
        .map(|(_, text)| text.chars().count())
        .filter(|&n| n <= MAX_LISTED_FACT_CHARS)
        .map(|n| n + 2)
        .collect();
    let needed = (min_recall * lengths.len() as f64).ceil() as usize;
    lengths.sort_unstable();
    lengths.iter().take(needed).sum::<usize>() <= max_chars
}

/// The better of the first summary and a second attempt that passed the template check:
/// the second when it states strictly more facts (a tie keeps the first, which was
/// written without being told what to keep). (Both were paid for: the compaction's
/// meter counted both, see [`crate::usage`].)
pub fn better(first: Checked, second: Checked) -> (Checked, RetryOutcome) {
    // Both were measured against the same facts, so counts compare exactly.
    if second.recall.stated > first.recall.stated {
        (second, RetryOutcome::Improved)
    } else {
        (first, RetryOutcome::NotImproved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stated` of `total` stated, one more listed.
    fn recall(total: usize, stated: usize) -> Recall {
        Recall {
            total,
            kept: (stated + 1).min(total),
            stated,
            missing: (stated..total).map(|n| format!("fact-{n}")).collect(),
        }
    }

    fn checked(text: &str, kept: usize) -> Checked {
        Checked {
            summary: Summary {
                text: text.to_owned(),
                model: "m".to_owned(),
                ..Summary::default()
            },
            text: text.to_owned(),
            recall: recall(10, kept),
        }
    }

    const RETRY: FactCheck = FactCheck {
        mode: FactCheckMode::Retry,
        min_recall: 0.8,
    };

    #[test]
    fn only_retry_mode_below_the_minimum_asks_again() {
        assert!(worth_retrying(RETRY, &recall(10, 7)));
        assert!(!worth_retrying(RETRY, &recall(10, 8)), "at the minimum");
        assert!(!worth_retrying(RETRY, &recall(0, 0)), "nothing to keep");
        for mode in [FactCheckMode::Off, FactCheckMode::Record] {
            let policy = FactCheck { mode, ..RETRY };
            assert!(!worth_retrying(policy, &recall(10, 0)), "{mode:?}");
        }
        let never = FactCheck {
            min_recall: 0.0,
            ..RETRY
        };
        assert!(!worth_retrying(never, &recall(10, 0)));
        let always = FactCheck {
            min_recall: 1.0,
            ..RETRY
        };
        assert!(worth_retrying(always, &recall(10, 9)));
        assert!(!worth_retrying(always, &recall(10, 10)), "nothing lost");
    }

    /// A summary that lists what it was asked to keep ("Also noted: ...") states none of
    /// it: the list does not count, and the check asks again.
    #[test]
    fn identifiers_only_listed_are_not_kept_for_the_check() {
        let facts = FactSet::of_text(
            "checkout-api v5.33.0 rolled out at 14:01; orders-db hit max_connections=500 at 14:05.",
        );
        let listed = facts.recall(
            "**Key findings:**\n- Also noted: checkout-api, v5.33.0, 14:01, orders-db, max_connections=500, 14:05",
        );
        assert_eq!((listed.kept, listed.stated), (facts.len(), 0));
        assert!(worth_retrying(RETRY, &listed));
        let stated = facts.recall(
            "**Key findings:**\n- checkout-api v5.33.0 rolled out at 14:01.\n- orders-db hit max_connections=500 at 14:05.",
        );
        assert_eq!((stated.kept, stated.stated), (facts.len(), facts.len()));
        assert!(!worth_retrying(RETRY, &stated));
    }

    #[test]
    fn a_second_summary_that_keeps_more_facts_replaces_the_first() {
        let (kept, outcome) = better(checked("first", 5), checked("second", 9));

        assert_eq!(outcome, RetryOutcome::Improved);
        assert_eq!(kept.text, "second");
        assert_eq!(kept.recall, recall(10, 9));
    }

    #[test]
    fn a_second_summary_that_keeps_no_more_leaves_the_first() {
        for second_kept in [5, 4, 0] {
            let (kept, outcome) = better(checked("first", 5), checked("second", second_kept));

            assert_eq!(outcome, RetryOutcome::NotImproved, "{second_kept}");
            assert_eq!(kept.text, "first", "a tie keeps the first");
            assert_eq!(kept.recall, recall(10, 5));
        }
    }

    #[test]
    fn figures_are_the_kept_summarys() {
        let weighing = Weighing {
            seen: 40,
            said: 9,
            relied_on: 3,
        };
        let figures = Figures::of(&recall(12, 9), Some(RetryOutcome::Improved), weighing);
        assert_eq!(
            figures,
            Figures {
                total: 12,
                kept: 10,
                stated: 9,
                retry: Some(RetryOutcome::Improved),
                weighing,
            }
        );
        assert_eq!(RetryOutcome::NotImproved.as_str(), "not_improved");
    }

    #[test]
    fn a_minimum_no_summary_could_reach_is_not_worth_asking_for() {
        let few = FactSet::of_text("pg-primary-1 at 97% since 14:05:12 on v2.14.3");
        assert!(attainable(&few, 0.8, 6_000));
        let dump: String = (0..2_000).map(|n| format!("req-{n:06}x1 ")).collect();
        let many = FactSet::of_text(&dump);
        assert_eq!(many.len(), 2_000);
        assert!(!attainable(&many, 0.8, 6_000));
        // The shortest 80% decide: 1,600 ids of 12 chars and a separator each.
        assert!(attainable(&many, 0.8, 1_600 * 14));
        assert!(!attainable(&many, 0.8, 1_600 * 14 - 1));
        assert!(attainable(&FactSet::default(), 0.8, 10));
    }

    #[test]
    fn one_huge_pseudo_identifier_does_not_stop_the_attempt_for_ordinary_facts() {
        let blob = format!("tok-{}", "a1".repeat(25_000));
        let text = format!("pg-primary-1 at 97% since 14:05:12 on v2.14.3, then {blob}");
        let facts = FactSet::of_text(&text);
        assert!(
            facts.iter().any(|(_, t)| t.chars().count() > 50_000),
            "the blob is one identifier"
        );
        assert!(attainable(&facts, 0.8, 6_000));
        assert!(attainable(&facts, 1.0, 6_000));
    }
}
