//! The task state, told by its wording: what the agent did (an action with its object:
//! "I rolled back checkout-api to v5.32.1", "Opened INC-4821 for the DBA team"), what was
//! decided ("we decided", "decision:", "going with"), and what comes next ("Next:", "next
//! step", "I will", "then we", "TODO"). An agent that loses these redoes work it already
//! did and forgets where it was going; the summary keeps them under "Current state".
//!
//! Wording, not meaning: a sentence is read for a few cues, in this order (a sentence
//! that starts with "Next:" is a next step whatever verb follows; "we decided to roll
//! back" is a decision). A question or a request is never task state (see
//! [`super::units`]'s `unfit`).

/// What a statement of task state records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Task {
    /// Something done, with its object and often its result.
    Action,
    Decision,
    /// Something still to do.
    NextStep,
}

/// Past-tense verbs of things an agent does to a system, a ticket or a person, each
/// with an object after it. Not "checked" or "confirmed": those report findings.
const DONE: [&str; 58] = [
    "added",
    "applied",
    "archived",
    "asked",
    "attached",
    "backfilled",
    "blocked",
    "bumped",
    "capped",
    "closed",
    "commented",
    "cordoned",
    "created",
    "deactivated",
    "deleted",
    "deployed",
    "detached",
    "disabled",
    "drained",
    "enabled",
    "escalated",
    "exported",
    "fenced",
    "filed",
    "flushed",
    "increased",
    "killed",
    "locked",
    "lowered",
    "merged",
    "migrated",
    "moved",
    "notified",
    "opened",
    "paged",
    "patched",
    "pinned",
    "posted",
    "promoted",
    "published",
    "purged",
    "raised",
    "ran",
    "reduced",
    "removed",
    "replaced",
    "replayed",
    "restarted",
    "restored",
    "reverted",
    "revoked",
    "rolled",
    "rotated",
    "saved",
    "scaled",
    "sent",
    "suspended",
    "terminated",
];

/// Verbs that are also present tenses or nouns: an action only after "I" or "we".
const DONE_AFTER_SUBJECT: [&str; 3] = ["set", "put", "cut"];

/// Words between the subject and the verb that leave it an action: "I also paged",
/// "we've just rolled back".
const BETWEEN: [&str; 7] = ["also", "just", "already", "then", "have", "now", "manually"];

const DECIDED: [&str; 6] = [
    "decided",
    "going with",
    "go with",
    "agreed to",
    "we agreed",
    "the decision is",
];

/// What marks a next step wherever it stands.
const NEXT: [&str; 6] = [
    "next step",
    "next steps",
    "todo",
    "to do:",
    "then we ",
    "follow-up:",
];

/// A promise, when the sentence starts with it: "I will check the 16:55 run". Not in
/// the middle of one ("Summarise the diff, I'll relay" is a request).
const PROMISE: [&str; 4] = ["i will ", "i'll ", "we will ", "we'll "];

/// Verbs after a promise that say what the speaker will learn or be, not do.
const NOT_DONE: [&str; 6] = ["know", "see", "let", "be", "need", "have"];

/// What `sentence` records of the task, if anything.
pub(super) fn classify(sentence: &str) -> Option<Task> {
    let lower = sentence.trim().to_lowercase();
    let words: Vec<&str> = (lower.split(|c: char| !(c.is_alphanumeric() || c == '\'')))
        .filter(|w| !w.is_empty())
        .collect();
    let first = words.first().copied().unwrap_or_default();
    if first == "next" || first == "todo" || lower.starts_with("decision") {
        return Some(if first == "next" || first == "todo" {
            Task::NextStep
        } else {
            Task::Decision
        });
    }
    if DECIDED.iter().any(|cue| lower.contains(cue)) {
        return Some(Task::Decision);
    }
    if did(&words) {
        return Some(Task::Action);
    }
    let promised = PROMISE.iter().any(|p| lower.starts_with(p))
        && (words.get(if first.ends_with("'ll") { 1 } else { 2 }))
            .is_some_and(|verb| !NOT_DONE.contains(verb));
    (promised || NEXT.iter().any(|cue| lower.contains(cue))).then_some(Task::NextStep)
}

/// Whether `words` (lower case) say that the speaker did something to something: "I" or
/// "we" (a few adverbs aside) then a verb of [`DONE`], or such a verb first ("Posted the
/// summary."), with at least one word after it.
fn did(words: &[&str]) -> bool {
    let mut at = 0;
    let subject = matches!(
        words.first().copied(),
        Some("i" | "we" | "i've" | "we've" | "i'd" | "we'd")
    );
    if subject {
        at = 1;
        while words.get(at).is_some_and(|w| BETWEEN.contains(w)) {
            at += 1;
        }
    }
    let Some(verb) = words.get(at) else {
        return false;
    };
    let done = DONE.contains(verb) || (subject && DONE_AFTER_SUBJECT.contains(verb));
    done && words.len() > at + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_decisions_and_next_steps_are_told_by_their_wording() {
        for (sentence, task) in [
            (
                "I rolled back checkout-api to v5.32.1 at 14:20; the 502 rate fell to 0.1%.",
                Some(Task::Action),
            ),
            (
                "Opened ticket INC-4821 for the DBA team.",
                Some(Task::Action),
            ),
            (
                "Ran `SELECT count(*) FROM pg_stat_activity` on orders-db-2: 498 connections.",
                Some(Task::Action),
            ),
            ("We've also paged the DBA on-call.", Some(Task::Action)),
            ("I set max_pool=200 on orders-db-2.", Some(Task::Action)),
            (
                "We decided to keep the replica out of rotation until the fix lands.",
                Some(Task::Decision),
            ),
            ("Decision: roll back, no fix forward.", Some(Task::Decision)),
            ("We're going with option 1.", Some(Task::Decision)),
            (
                "Next: raise max_pool to 200 on orders-db-2 and watch p99 for 10 minutes.",
                Some(Task::NextStep),
            ),
            (
                "I will check the 16:55 run when it completes.",
                Some(Task::NextStep),
            ),
            ("TODO: delete the canary pod.", Some(Task::NextStep)),
            (
                "Once it is merged, then we re-enable auto-sync.",
                Some(Task::NextStep),
            ),
            // Findings, and things others did.
            ("The HPA scaled from 12 to 26 replicas at 16:06.", None),
            ("pg-primary-1 runs with max_connections=500.", None),
            ("I checked the replica: it is healthy.", None),
            ("Set the pool to 200.", None),
            ("Posted.", None),
            ("I'll know in a few minutes.", None),
            ("Summarise the diff, I'll relay.", None),
        ] {
            assert_eq!(classify(sentence), task, "{sentence}");
        }
    }
}
