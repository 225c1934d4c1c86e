//! A summary: the record a summarizer produces ([`Summary`]), the seed's template it
//! follows, [`accept`], which every summary passes, [`echoes`], which an LLM's answer
//! passes too, and [`finish`], which gives it the worker's own parts (the user's words,
//! [`words`], and the recall note) before it is written: the summary text is made here
//! alone.

mod merge;
pub mod words;

pub use merge::merge;

use crate::facts::FactSet;
use crate::message::{Message, char_count};

pub const INVESTIGATING: &str = "**Investigating:**";
pub const KEY_FINDINGS: &str = "**Key findings:**";
pub const RULED_OUT: &str = "**Ruled out:**";
pub const CURRENT_STATE: &str = "**Current state:**";

/// The four headings, in the order the template gives them.
pub const HEADINGS: [&str; 4] = [INVESTIGATING, KEY_FINDINGS, RULED_OUT, CURRENT_STATE];

/// The template as the seed wrote it; the LLM prompt quotes it verbatim.
pub const TEMPLATE: &str = "\
**Investigating:** <original incident or question>
**Key findings:**
- <finding with specifics — numbers, service names, timestamps>
**Ruled out:** <list or \"nothing ruled out yet\">
**Current state:** <where the investigation is now>";

/// A summary as a [`crate::summarizer::Summarizer`] produced it, before [`accept`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    /// The model that wrote it, as the provider reported it.
    pub model: String,
    /// The version of the prompt that asked for it ([`crate::prompt::Prompt::version`]); `None`
    /// when no prompt did (the extractive summarizer).
    pub prompt_version: Option<String>,
    /// Set when the configured LLM failed and `LLM_FALLBACK` wrote this summary instead:
    /// the LLM's error, which carries no secret (see `llm::http::scrub`).
    pub fallback_reason: Option<String>,
    /// The rules ([`Rejected::rule`]) the answers asked for before this one broke: the
    /// acceptance gate asked again, and this is the answer that passed.
    pub refused: Vec<&'static str>,
    /// What the model copied of its own prompt into its answers, taken out: clauses of
    /// the examples (`crate::prompt::strip_copied_examples`) and lines of a second
    /// attempt's list of missing facts (`crate::prompt::strip_copied_list`).
    pub copied_from_prompt: usize,
}

/// Why a summary was refused; the caller treats it as an LLM failure (after asking once
/// more, for an LLM: see `crate::llm::LlmSummarizer`). [`Rejected::rule`] names the
/// rule, in metrics and usage events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the summary is empty")]
    Empty,
    #[error("the answer is an acknowledgement, not a summary (no heading of the template)")]
    Acknowledgement,
    #[error(
        "the answer continues the conversation instead of summarizing it (no heading of the template)"
    )]
    Continuation,
    #[error("the summary lacks the heading {0}")]
    MissingHeading(&'static str),
    #[error(
        "the summary ({summary_chars} chars) is not shorter than what it replaces ({replaced_chars} chars)"
    )]
    NotShorter {
        summary_chars: i64,
        replaced_chars: i64,
    },
    #[error("the summary ({summary_chars} chars) is longer than SUMMARY_MAX_CHARS ({max_chars})")]
    TooLong { summary_chars: i64, max_chars: i64 },
    #[error(
        "the summary states nothing the messages after the earlier summary added (it echoes \
         the earlier summary; {new_facts} new identifiers, none stated)"
    )]
    Echo { new_facts: usize },
}

impl Rejected {
    /// The rule's name: `empty`, `acknowledgement`, `continuation`, `missing_heading`,
    /// `not_shorter`, `too_long`, `echo`.
    pub fn rule(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Acknowledgement => "acknowledgement",
            Self::Continuation => "continuation",
            Self::MissingHeading(_) => "missing_heading",
            Self::NotShorter { .. } => "not_shorter",
            Self::TooLong { .. } => "too_long",
            Self::Echo { .. } => "echo",
        }
    }
}

/// An answer with no heading this long or shorter is an acknowledgement ("Sure, here is
/// the summary."); a longer one goes on with the conversation.
const ACKNOWLEDGEMENT_CHARS: i64 = 300;

/// Trims `text` and accepts it if it can replace `replaced_chars` characters of history.
///
/// # Errors
/// [`Rejected`] when the summary is empty, holds no heading of the template (an
/// acknowledgement, or a continuation of the conversation), lacks one, is not strictly
/// shorter than what it replaces, or is longer than `max_chars` (`SUMMARY_MAX_CHARS`).
pub fn accept(text: &str, replaced_chars: i64, max_chars: i64) -> Result<String, Rejected> {
    let text = strip_fence(text.trim()).trim();
    if text.is_empty() {
        return Err(Rejected::Empty);
    }
    if !HEADINGS.iter().any(|h| text.contains(*h)) {
        return Err(if char_count(text) <= ACKNOWLEDGEMENT_CHARS {
            Rejected::Acknowledgement
        } else {
            Rejected::Continuation
        });
    }
    if let Some(missing) = HEADINGS.iter().find(|h| !text.contains(*h)) {
        return Err(Rejected::MissingHeading(missing));
    }
    let summary_chars = char_count(text);
    if summary_chars >= replaced_chars {
        return Err(Rejected::NotShorter {
            summary_chars,
            replaced_chars,
        });
    }
    if summary_chars > max_chars {
        return Err(Rejected::TooLong {
            summary_chars,
            max_chars,
        });
    }
    Ok(text.to_owned())
}

/// Whether `summary` (accepted, our own parts taken out) echoes the earlier summary of
/// `old` rather than folding in what came after it: the messages after the earlier
/// summary established identifiers it did not hold, and `summary` carries none of them.
/// A model that repeats its last answer passes every other rule. When they established
/// none ("Thanks, keep going."), the earlier summary again is a fair answer: nothing
/// measurable was lost, and asking again would pay for a request that has nothing to
/// fold in, or fail a compaction over it.
///
/// # Errors
/// [`Rejected::Echo`], with how many new identifiers there were.
pub fn echoes(summary: &str, old: &[Message]) -> Result<(), Rejected> {
    let Some(added) = added_since_summary(old) else {
        return Ok(());
    };
    let carried = FactSet::of_text(summary);
    let echoed = !added.facts.is_empty()
        && !(added.facts.iter())
            .any(|fact| carried.contains(fact) || crate::facts::contains_word(summary, fact));
    if echoed {
        Err(Rejected::Echo {
            new_facts: added.facts.len(),
        })
    } else {
        Ok(())
    }
}

/// What the messages after the earlier summary of an old part added to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Added {
    /// The earlier summary, without the worker's own parts.
    pub earlier: String,
    /// The identifiers they established ([`FactSet::established_in`]) that it did not
    /// hold, in order of first appearance.
    pub facts: Vec<String>,
}

/// What came after `old`'s earlier summary; `None` when there is no earlier summary, or
/// nothing after it.
pub fn added_since_summary(old: &[Message]) -> Option<Added> {
    let at = old.iter().rposition(|m| m.is_summary)?;
    let after = &old[at + 1..];
    if after.is_empty() {
        return None;
    }
    let earlier = strip_ours(&old[at].content);
    let before = FactSet::of_text(&earlier);
    let facts = (FactSet::established_in(after).iter())
        .map(|(_, text)| text)
        .filter(|text| !before.contains(text))
        .map(str::to_owned)
        .collect();
    Some(Added { earlier, facts })
}

/// `text` without the worker's own parts: the user's words ([`words::strip`]) and the
/// recall note. What a model echoed of an earlier summary's, which [`finish`] would add
/// again: a summary never carries two.
pub fn strip_ours(text: &str) -> String {
    words::strip(text)
        .lines()
        .filter(|line| !line.trim_start().starts_with(RECALL_NOTE_START))
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_owned()
}

/// How the recall note of a summary starts.
pub const RECALL_NOTE_START: &str = "[Recall:";

/// The accepted `summary` (see [`accept`]) of `old` as it is written: without what a
/// model copied of the worker's own parts ([`strip_ours`]), then with them, made anew:
///
/// - the user's words ([`words::section`]) within `words_budget` chars
///   (`SUMMARY_USER_WORDS_CHARS`; 0 writes none), after the template's sections;
/// - a last line that tells the model reading it that the messages it replaced are
///   archived and can be recalled (docs/protocol.md, "Recall"): their number and seqs,
///   which a fetch names. The note is an aid, not part of what was checked: when it
///   would take the summary past `max_chars` (`SUMMARY_MAX_CHARS`), the summary goes
///   without it.
///
/// Neither takes the whole to the length of the `replaced_chars` it replaces: the note
/// goes first, then the quotes that do not fit.
pub fn finish(
    summary: String,
    old: &[Message],
    removed_seqs: &[i64],
    (replaced_chars, max_chars): (i64, i64),
    words_budget: usize,
) -> String {
    let summary = strip_ours(&summary);
    let room = replaced_chars - char_count(&summary) - 3;
    let words = words::render(&words::choose(
        words::quotes(old),
        words_budget.min(usize::try_from(room).unwrap_or(0)),
    ));
    let body = if words.is_empty() {
        summary.clone()
    } else {
        format!("{summary}\n\n{words}")
    };
    let (Some(first), Some(last)) = (removed_seqs.first(), removed_seqs.last()) else {
        return body;
    };
    let note = format!(
        "\n\n{RECALL_NOTE_START} the {} messages this summary replaced (seq {first} to \
         {last}) are archived: search them, or fetch one by its seq, with recall.]",
        removed_seqs.len()
    );
    let noted = format!("{body}{note}");
    if char_count(&summary) + char_count(&note) > max_chars || char_count(&noted) >= replaced_chars
    {
        return body;
    }
    noted
}

/// Models often wrap an answer in a Markdown code fence; the fence is not the summary.
fn strip_fence(text: &str) -> &str {
    let Some(inner) = text.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = inner.strip_suffix("```") else {
        return text;
    };
    // Drop an info string such as "markdown" on the opening line.
    inner.split_once('\n').map_or(inner, |(_, body)| body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "**Investigating:** 502s on checkout\n**Key findings:**\n- pool at 100/100\n**Ruled out:** DNS\n**Current state:** raising pool";

    #[test]
    fn a_complete_shorter_summary_passes_trimmed() {
        assert_eq!(
            accept(&format!("\n  {GOOD}\n"), 10_000, 6_000).unwrap(),
            GOOD
        );
    }

    #[test]
    fn a_fenced_summary_is_unwrapped() {
        assert_eq!(
            accept(&format!("```markdown\n{GOOD}\n```"), 10_000, 6_000).unwrap(),
            GOOD
        );
    }

    #[test]
    fn empty_missing_headings_and_longer_are_rejected() {
        assert_eq!(accept("  \n", 100, 6_000), Err(Rejected::Empty));
        assert_eq!(
            accept(&GOOD.replace(RULED_OUT, "Ruled out:"), 10_000, 6_000),
            Err(Rejected::MissingHeading(RULED_OUT))
        );
        let n = char_count(GOOD);
        assert_eq!(
            accept(GOOD, n, 6_000),
            Err(Rejected::NotShorter {
                summary_chars: n,
                replaced_chars: n
            })
        );
    }

    #[test]
    fn an_answer_with_no_heading_is_an_acknowledgement_or_a_continuation() {
        assert_eq!(
            accept("Sure! Here is the summary you asked for.", 10_000, 6_000),
            Err(Rejected::Acknowledgement)
        );
        let reply = "To fix the pool exhaustion you should raise max_pool on orders-db-2 and \
                     then restart the checkout pods one by one, watching p99 as you go. "
            .repeat(3);
        assert_eq!(accept(&reply, 10_000, 6_000), Err(Rejected::Continuation));
        assert_eq!(Rejected::Continuation.rule(), "continuation");
    }

    fn summary_message(text: &str) -> Message {
        let mut m = Message::text(crate::message::Role::User, text);
        m.is_summary = true;
        m
    }

    #[test]
    fn an_echo_of_the_earlier_summary_is_refused_and_a_fold_is_not() {
        use crate::message::Role;
        let earlier = format!(
            "{GOOD}\n\n{RECALL_NOTE_START} the 4 messages this summary replaced (seq 1 to 4) \
             are archived: search them, or fetch one by its seq, with recall.]"
        );
        let old = [
            summary_message(&earlier),
            Message::text(Role::User, "Any news?"),
            Message::text(
                Role::Assistant,
                "orders-db-2 hit max_connections=500 at 14:05; error E-5417 in the log.",
            ),
        ];
        // orders-db-2, max_connections=500, 14:05, E-5417 (and 500 within the setting).
        let Err(Rejected::Echo { new_facts }) = echoes(GOOD, &old) else {
            panic!("an echo");
        };
        assert!(new_facts >= 4, "{new_facts}");
        let folded = GOOD.replace(
            "raising pool",
            "orders-db-2 hit max_connections=500 at 14:05",
        );
        assert_eq!(echoes(&folded, &old), Ok(()));
        // Nothing new with identifiers: the earlier summary again is a fair answer.
        let quiet = [
            summary_message(&earlier),
            Message::text(Role::User, "Thanks, keep going."),
        ];
        assert_eq!(echoes(&format!("{GOOD}\n"), &quiet), Ok(()));
        // A first compaction has nothing to echo.
        assert_eq!(echoes(GOOD, &old[1..]), Ok(()));
    }

    #[test]
    fn finish_writes_one_set_of_the_workers_parts_whatever_the_model_copied() {
        use crate::message::Role;
        let old = [
            Message::text(
                Role::User,
                "Why 502? Never restart orders-db without asking me.",
            ),
            Message::text(Role::Assistant, "Checking."),
        ];
        let once = finish(GOOD.to_owned(), &old, &[1, 2], (10_000, 6_000), 1_500);
        assert!(once.contains("- Rule: \"Never restart orders-db without asking me.\""));
        assert!(once.contains("- Task: \"Why 502?\""));
        // A model that copies the worker's parts back gets them written once.
        let twice = finish(once.clone(), &old, &[1, 2], (10_000, 6_000), 1_500);
        assert_eq!(twice, once);
        assert_eq!(once.matches(RECALL_NOTE_START).count(), 1);
        assert_eq!(once.matches(words::HEADING).count(), 1);
        // No budget, no words; and never as long as what it replaces.
        assert!(
            !finish(GOOD.to_owned(), &old, &[1, 2], (10_000, 6_000), 0).contains(words::HEADING)
        );
        let tight = char_count(GOOD) + 10;
        assert_eq!(
            finish(GOOD.to_owned(), &old, &[1, 2], (tight, 6_000), 1_500),
            GOOD
        );
    }

    #[test]
    fn the_recall_note_names_the_seqs_unless_it_would_not_fit() {
        let summary = "**Investigating:** x".to_owned();
        let noted = finish(summary.clone(), &[], &[4, 5, 9], (10_000, 6_000), 0);
        assert!(noted.starts_with(&format!("{summary}\n\n{RECALL_NOTE_START}")));
        assert!(noted.contains("the 3 messages this summary replaced (seq 4 to 9)"));
        let chars = noted.chars().count() as i64;
        // At exactly SUMMARY_MAX_CHARS it fits; a char less and the summary goes alone,
        // as it does when the note would make it as long as what it replaced.
        assert_eq!(
            finish(summary.clone(), &[], &[4, 5, 9], (10_000, chars), 0),
            noted
        );
        assert_eq!(
            finish(summary.clone(), &[], &[4, 5, 9], (10_000, chars - 1), 0),
            summary
        );
        assert_eq!(
            finish(summary.clone(), &[], &[4, 5, 9], (chars, 6_000), 0),
            summary
        );
        assert_eq!(
            finish(summary.clone(), &[], &[], (10_000, 6_000), 0),
            summary
        );
    }

    #[test]
    fn a_summary_over_summary_max_chars_is_rejected_even_when_shorter() {
        let n = char_count(GOOD);
        assert_eq!(accept(GOOD, 10_000, n), Ok(GOOD.to_owned()));
        assert_eq!(
            accept(GOOD, 10_000, n - 1),
            Err(Rejected::TooLong {
                summary_chars: n,
                max_chars: n - 1
            })
        );
    }
}
