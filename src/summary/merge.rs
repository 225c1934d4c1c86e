//! An earlier summary and a summary of the messages after it, made one, heading by
//! heading: what the LLM summarizer writes when a model echoed the earlier summary
//! instead of folding the newer messages in (see `crate::llm::LlmSummarizer`). A model
//! that is only shown the newer messages cannot echo what it did not see; the worker
//! keeps what the earlier summary said, without asking a model to copy it.
//!
//! The rule, for each of the template's headings:
//! - **Investigating:** the earlier summary's (the question the whole conversation is
//!   about; a summary of its latest part sees only a fragment of it), or the newer one's
//!   when the earlier is empty.
//! - **Key findings**, **Ruled out**, **Current state:** the earlier lines, then the newer
//!   lines that are not among them, oldest first, so that the state of the work ends with
//!   where it is now. A placeholder ("nothing ruled out yet", "none") gives way to lines
//!   that say something.
//!
//! When the whole is longer than the summary may be, the earlier key findings go first,
//! oldest first (their messages are archived, for recall), then the earlier ruled-out
//! lines; the newer lines and the state of the work are never cut here.

use super::{CURRENT_STATE, HEADINGS, INVESTIGATING, KEY_FINDINGS, RULED_OUT};
use crate::message::char_count;

/// `earlier` and `newer` as one summary of at most `max_chars` where the rule above can
/// make it so (the acceptance gate judges the result like any answer).
pub fn merge(earlier: &str, newer: &str, max_chars: i64) -> String {
    let (earlier, newer) = (Sections::of(earlier), Sections::of(newer));
    let investigating = if earlier.investigating.is_empty() {
        newer.investigating
    } else {
        earlier.investigating
    };
    let mut merged = Merged {
        investigating,
        findings: Lines::joined(earlier.findings, newer.findings),
        ruled_out: Lines::joined(earlier.ruled_out, newer.ruled_out),
        state: Lines::joined(earlier.state, newer.state),
    };
    let mut text = merged.render();
    while char_count(&text) > max_chars && merged.drop_oldest_earlier() {
        text = merged.render();
    }
    text
}

/// A summary's text under each heading, as lines; empty where a heading is missing.
struct Sections {
    investigating: String,
    findings: Vec<String>,
    ruled_out: Vec<String>,
    state: Vec<String>,
}

impl Sections {
    fn of(text: &str) -> Self {
        let mut at: Vec<(usize, &str)> = HEADINGS
            .iter()
            .filter_map(|h| text.find(h).map(|i| (i, *h)))
            .collect();
        at.sort_unstable();
        let body = |heading: &str| -> &str {
            let Some(k) = at.iter().position(|(_, h)| *h == heading) else {
                return "";
            };
            let start = at[k].0 + heading.len();
            let end = at.get(k + 1).map_or(text.len(), |(i, _)| *i);
            text[start..end].trim()
        };
        let lines = |heading: &str| -> Vec<String> {
            body(heading)
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .map(str::to_owned)
                .collect()
        };
        Self {
            investigating: body(INVESTIGATING).to_owned(),
            findings: lines(KEY_FINDINGS),
            ruled_out: lines(RULED_OUT),
            state: lines(CURRENT_STATE),
        }
    }
}

/// One heading's lines after a merge: the earlier summary's, then the newer's.
struct Lines {
    earlier: Vec<String>,
    newer: Vec<String>,
}

impl Lines {
    /// `earlier`, then each line of `newer` not already there (compared as the words
    /// they say, bullets and case aside); placeholders dropped where the other side says
    /// something.
    fn joined(earlier: Vec<String>, newer: Vec<String>) -> Self {
        let says_something = |lines: &[String]| lines.iter().any(|l| !is_placeholder(l));
        let (earlier_says, newer_says) = (says_something(&earlier), says_something(&newer));
        let keep = |lines: Vec<String>, other_says: bool| -> Vec<String> {
            if other_says {
                lines.into_iter().filter(|l| !is_placeholder(l)).collect()
            } else {
                lines
            }
        };
        let earlier = keep(earlier, newer_says);
        let mut newer = keep(newer, earlier_says);
        if !earlier_says && !newer_says {
            // Both say nothing: one placeholder is enough.
            newer.clear();
        }
        let seen: Vec<String> = earlier.iter().map(|l| key(l)).collect();
        let mut newer_seen = Vec::new();
        newer.retain(|l| {
            let k = key(l);
            let fresh = !seen.contains(&k) && !newer_seen.contains(&k);
            newer_seen.push(k);
            fresh
        });
        Self { earlier, newer }
    }

    fn all(&self) -> impl Iterator<Item = &String> {
        self.earlier.iter().chain(&self.newer)
    }
}

struct Merged {
    investigating: String,
    findings: Lines,
    ruled_out: Lines,
    state: Lines,
}

impl Merged {
    fn render(&self) -> String {
        let mut out = format!("{INVESTIGATING} {}\n{KEY_FINDINGS}", self.investigating);
        for line in self.findings.all() {
            out.push('\n');
            out.push_str(line);
        }
        for (heading, lines) in [(RULED_OUT, &self.ruled_out), (CURRENT_STATE, &self.state)] {
            out.push('\n');
            out.push_str(heading);
            let lines: Vec<&String> = lines.all().collect();
            match lines.as_slice() {
                [] => {}
                [one] if !one.starts_with('-') => {
                    out.push(' ');
                    out.push_str(one);
                }
                many => {
                    for line in many {
                        out.push('\n');
                        out.push_str(line);
                    }
                }
            }
        }
        out
    }

    /// Drops the oldest earlier key finding, else the oldest earlier ruled-out line;
    /// false when there is none left to drop.
    fn drop_oldest_earlier(&mut self) -> bool {
        for lines in [&mut self.findings.earlier, &mut self.ruled_out.earlier] {
            if !lines.is_empty() {
                lines.remove(0);
                return true;
            }
        }
        false
    }
}

/// What a line says, for telling repeats apart: without its bullet, in lower case, its
/// spaces collapsed.
fn key(line: &str) -> String {
    line.trim_start_matches(['-', '*', '•', ' '])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// A line that says there is nothing under its heading.
fn is_placeholder(line: &str) -> bool {
    let said = key(line);
    let said = said.trim_end_matches(['.', '!']);
    matches!(
        said,
        "" | "none"
            | "none yet"
            | "nothing"
            | "nothing yet"
            | "n/a"
            | "nothing ruled out"
            | "nothing ruled out yet"
            | "nothing has been ruled out yet"
            | "no findings yet"
            | "<list or \"nothing ruled out yet\">"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EARLIER: &str = "**Investigating:** 502s on checkout-api since 14:02\n\
        **Key findings:**\n\
        - checkout-api v5.33.0 rolled out at 14:01.\n\
        - orders-db-replica-1 hit max_connections=500 at 14:05.\n\
        **Ruled out:** nothing ruled out yet\n\
        **Current state:** Paged the DBA as PD-88314.";

    const NEWER: &str = "**Investigating:** the pool\n\
        **Key findings:**\n\
        - HikariPool-1 timed out after 30000 ms at 14:09.\n\
        - Orders-db-replica-1 hit max_connections=500 at 14:05.\n\
        **Ruled out:**\n- DNS: lookups took 2 ms.\n\
        **Current state:**\n- Rolled back checkout-api to v5.32.1 at 14:20.\n- Next: watch p99.";

    #[test]
    fn each_heading_keeps_the_earlier_lines_then_the_newer_ones_once() {
        let merged = merge(EARLIER, NEWER, 10_000);
        assert_eq!(
            merged,
            "**Investigating:** 502s on checkout-api since 14:02\n\
             **Key findings:**\n\
             - checkout-api v5.33.0 rolled out at 14:01.\n\
             - orders-db-replica-1 hit max_connections=500 at 14:05.\n\
             - HikariPool-1 timed out after 30000 ms at 14:09.\n\
             **Ruled out:**\n- DNS: lookups took 2 ms.\n\
             **Current state:**\nPaged the DBA as PD-88314.\n\
             - Rolled back checkout-api to v5.32.1 at 14:20.\n- Next: watch p99."
        );
        assert!(crate::summary::accept(&merged, 100_000, 10_000).is_ok());
    }

    #[test]
    fn two_placeholders_are_one_and_a_missing_heading_is_empty() {
        let newer = "**Investigating:** x\n**Key findings:**\n- E-5417 at 14:09.\n\
                     **Ruled out:** None.\n**Current state:** waiting";
        let merged = merge(EARLIER, newer, 10_000);
        assert!(
            merged.contains("**Ruled out:** nothing ruled out yet\n"),
            "{merged}"
        );
        let merged = merge("no headings at all", newer, 10_000);
        assert!(merged.starts_with("**Investigating:** x\n"), "{merged}");
        for heading in HEADINGS {
            assert_eq!(merged.matches(heading).count(), 1, "{merged}");
        }
    }

    #[test]
    fn over_the_limit_the_oldest_earlier_findings_go_first() {
        let full = merge(EARLIER, NEWER, 10_000);
        let limit = char_count(&full) - 10;
        let merged = merge(EARLIER, NEWER, limit);
        assert!(char_count(&merged) <= limit, "{merged}");
        assert!(!merged.contains("v5.33.0 rolled out"), "{merged}");
        assert!(merged.contains("max_connections=500"), "{merged}");
        assert!(merged.contains("HikariPool-1"), "{merged}");
        assert!(merged.contains("Next: watch p99."), "{merged}");
        // What cannot be cut stays, over the limit: the gate judges it.
        let merged = merge(EARLIER, NEWER, 10);
        assert!(merged.contains("HikariPool-1") && merged.contains("PD-88314"));
    }
}
