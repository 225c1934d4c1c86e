//! A summary: the record a summarizer produces ([`Summary`]), the seed's template it
//! follows, [`accept`], which every summary passes, and [`finish`], which gives it the
//! worker's own last line before it is written: the summary text is made here alone.

use crate::message::char_count;

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
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The version of the prompt that asked for it ([`crate::prompt::Prompt::version`]); `None`
    /// when no prompt did (the extractive summarizer).
    pub prompt_version: Option<String>,
    /// Set when the configured LLM failed and `LLM_FALLBACK` wrote this summary instead:
    /// the LLM's error, which carries no secret (see `llm::http::scrub`).
    pub fallback_reason: Option<String>,
}

impl Summary {
    /// Adds `other`'s token usage to this one's: a summary that took several calls
    /// (chunks, a second attempt) reports what all of them cost.
    pub fn add_usage(&mut self, other: &Summary) {
        let add = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.prompt_tokens = add(self.prompt_tokens, other.prompt_tokens);
        self.completion_tokens = add(self.completion_tokens, other.completion_tokens);
    }
}

/// Why a summary was refused; the caller treats it as an LLM failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the summary is empty")]
    Empty,
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
}

/// Trims `text` and accepts it if it can replace `replaced_chars` characters of history.
///
/// # Errors
/// [`Rejected`] when the summary is empty, lacks a heading of the template, is not
/// strictly shorter than what it replaces, or is longer than `max_chars`
/// (`SUMMARY_MAX_CHARS`).
pub fn accept(text: &str, replaced_chars: i64, max_chars: i64) -> Result<String, Rejected> {
    let text = strip_fence(text.trim()).trim();
    if text.is_empty() {
        return Err(Rejected::Empty);
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

/// How the recall note of a summary starts.
pub const RECALL_NOTE_START: &str = "[Recall:";

/// The accepted `summary` (see [`accept`]) as it is written: with a last line that tells
/// the model reading it that the messages it replaced are archived and can be recalled
/// (docs/protocol.md, "Recall"): their number and seqs, which a fetch names. The
/// template's sections come first, untouched. The note is an aid, not part of what was
/// checked: when it would take the summary past `max_chars` (`SUMMARY_MAX_CHARS`) or to
/// the length of the `replaced_chars` it replaces, the summary goes without it.
pub fn finish(
    summary: String,
    removed_seqs: &[i64],
    replaced_chars: i64,
    max_chars: i64,
) -> String {
    let (Some(first), Some(last)) = (removed_seqs.first(), removed_seqs.last()) else {
        return summary;
    };
    let noted = format!(
        "{summary}\n\n{RECALL_NOTE_START} the {} messages this summary replaced (seq {first} to \
         {last}) are archived: search them, or fetch one by its seq, with recall.]",
        removed_seqs.len()
    );
    if char_count(&noted) > max_chars || char_count(&noted) >= replaced_chars {
        return summary;
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
    fn the_recall_note_names_the_seqs_unless_it_would_not_fit() {
        let summary = "**Investigating:** x".to_owned();
        let noted = finish(summary.clone(), &[4, 5, 9], 10_000, 6_000);
        assert!(noted.starts_with(&format!("{summary}\n\n{RECALL_NOTE_START}")));
        assert!(noted.contains("the 3 messages this summary replaced (seq 4 to 9)"));
        let chars = noted.chars().count() as i64;
        // At exactly SUMMARY_MAX_CHARS it fits; a char less and the summary goes alone,
        // as it does when the note would make it as long as what it replaced.
        assert_eq!(finish(summary.clone(), &[4, 5, 9], 10_000, chars), noted);
        assert_eq!(
            finish(summary.clone(), &[4, 5, 9], 10_000, chars - 1),
            summary
        );
        assert_eq!(finish(summary.clone(), &[4, 5, 9], chars, 6_000), summary);
        assert_eq!(finish(summary.clone(), &[], 10_000, 6_000), summary);
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
