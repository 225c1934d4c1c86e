//! The built-in summarizer: fills the seed's template from the old messages with a
//! deterministic heuristic, offline. Good enough to keep a session inside its window
//! when no LLM is configured, and predictable enough to test against.
//!
//! - Investigating: an earlier summary's line, else the first human ask.
//! - Key findings: an earlier summary's findings, then lines from assistant and tool
//!   messages that carry specifics (numbers, timestamps, hyphenated or underscored
//!   service names, error words).
//! - Ruled out: lines that rule something out (negations), after an earlier summary's.
//! - Current state: the last assistant message of the old part.

use futures_util::future::{BoxFuture, FutureExt};

use super::{LlmError, Summarizer, Summary};
use crate::message::{Message, Role, char_count};
use crate::summary::{CURRENT_STATE, INVESTIGATING, KEY_FINDINGS, RULED_OUT};

#[derive(Clone, Copy, Debug, Default)]
pub struct Extractive;

impl Summarizer for Extractive {
    fn summarize<'a>(&'a self, old: &'a [Message]) -> BoxFuture<'a, Result<Summary, LlmError>> {
        // Linear, but the old part may hold megabytes of tool output: on the blocking
        // pool, so that the async threads go on serving other events meanwhile. The copy
        // costs less than the summarizing.
        let old = old.to_vec();
        async move {
            match tokio::task::spawn_blocking(move || summarize(&old)).await {
                Ok(summarized) => summarized,
                // A panic stays a panic: the compaction's task turns it into `failed`.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The blocking pool cancels a task only when the runtime shuts down.
                Err(_) => Err(LlmError::Transient {
                    cause: "summarizing was cancelled at shutdown".to_owned(),
                    retry_after: None,
                }),
            }
        }
        .boxed()
    }
}

const NOTHING_RULED_OUT: &str = "nothing ruled out yet";

/// How much each section may take, from generous to terse; the first that yields a
/// summary shorter than its input wins.
const BUDGETS: [Budget; 4] = [
    Budget {
        findings: 8,
        ruled_out: 4,
        line: 200,
    },
    Budget {
        findings: 5,
        ruled_out: 3,
        line: 120,
    },
    Budget {
        findings: 3,
        ruled_out: 2,
        line: 70,
    },
    Budget {
        findings: 1,
        ruled_out: 1,
        line: 40,
    },
];

/// The most any budget takes of each section: candidates past these are never shown,
/// so they are not kept, which also keeps the de-duplication constant-time per line.
const MAX_FINDINGS: usize = BUDGETS[0].findings;
const MAX_RULED_OUT: usize = BUDGETS[0].ruled_out;

/// Candidate lines are judged and kept by their first this many characters: more than
/// any budget shows, and it bounds the work and memory one huge line (a minified JSON
/// dump, say) can cost.
const MAX_LINE_CHARS: usize = 1000;

#[derive(Clone, Copy)]
struct Budget {
    findings: usize,
    ruled_out: usize,
    line: usize,
}

fn summarize(old: &[Message]) -> Result<Summary, LlmError> {
    let input_chars: i64 = old.iter().map(|m| m.chars).sum();
    let parts = Parts::collect(old);
    BUDGETS
        .iter()
        .map(|budget| parts.render(*budget))
        .find(|text| char_count(text) < input_chars)
        .map(|text| Summary {
            text,
            model: "extractive".to_owned(),
            ..Summary::default()
        })
        .ok_or_else(|| {
            LlmError::Invalid(format!(
                "the old part ({input_chars} chars) is too small for the template"
            ))
        })
}

/// The candidate lines of each section, before budgeting.
struct Parts {
    investigating: String,
    findings: Vec<String>,
    ruled_out: Vec<String>,
    current_state: String,
}

impl Parts {
    fn collect(old: &[Message]) -> Self {
        let earlier = old
            .iter()
            .find(|m| m.is_summary)
            .map(|m| m.content.as_str());
        let investigating = earlier
            .and_then(|s| section_line(s, INVESTIGATING))
            .or_else(|| {
                old.iter()
                    .find(|m| m.is_human_turn())
                    .map(|m| one_line(&m.content))
            })
            .unwrap_or_else(|| "(no question recorded)".to_owned());

        let mut findings: Vec<String> = earlier.map(earlier_findings).unwrap_or_default();
        let mut ruled_out: Vec<String> = earlier
            .and_then(|s| section_line(s, RULED_OUT))
            .filter(|line| !line.eq_ignore_ascii_case(NOTHING_RULED_OUT))
            .into_iter()
            .collect();
        // The agent's own sentences digest what the tools returned, so they come first;
        // tool output lines fill what room is left.
        let mut from_tools = Vec::new();
        for m in old {
            if findings.len() >= MAX_FINDINGS && ruled_out.len() >= MAX_RULED_OUT {
                break; // nothing later can be shown
            }
            let units: Box<dyn Iterator<Item = String>> = match m.role {
                Role::Assistant => Box::new(sentences(&m.content)),
                Role::Tool => Box::new(m.content.lines().map(one_line)),
                Role::System | Role::User => continue,
            };
            for unit in units.filter(|u| u.chars().count() >= 12) {
                if rules_out(&unit) {
                    push_new(&mut ruled_out, unit, MAX_RULED_OUT);
                } else if is_specific(&unit) {
                    let list = if m.role == Role::Tool {
                        &mut from_tools
                    } else {
                        &mut findings
                    };
                    push_new(list, unit, MAX_FINDINGS);
                }
            }
        }
        for line in from_tools {
            push_new(&mut findings, line, MAX_FINDINGS);
        }

        let current_state = old
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant && !m.content.trim().is_empty())
            .or_else(|| old.iter().rev().find(|m| !m.content.trim().is_empty()))
            .map(|m| one_line(&m.content))
            .unwrap_or_else(|| "(no state recorded)".to_owned());

        Self {
            investigating,
            findings,
            ruled_out,
            current_state,
        }
    }

    fn render(&self, budget: Budget) -> String {
        let clip = |s: &str| clip(s, budget.line);
        let mut out = format!(
            "{INVESTIGATING} {}\n{KEY_FINDINGS}\n",
            clip(&self.investigating)
        );
        if self.findings.is_empty() {
            out.push_str("- no specific findings recorded\n");
        }
        for finding in self.findings.iter().take(budget.findings) {
            out.push_str("- ");
            out.push_str(&clip(finding));
            out.push('\n');
        }
        let ruled_out = if self.ruled_out.is_empty() {
            NOTHING_RULED_OUT.to_owned()
        } else {
            let items: Vec<String> = self
                .ruled_out
                .iter()
                .take(budget.ruled_out)
                .map(|s| clip(s))
                .collect();
            items.join("; ")
        };
        out.push_str(&format!("{RULED_OUT} {ruled_out}\n"));
        out.push_str(&format!("{CURRENT_STATE} {}", clip(&self.current_state)));
        out
    }
}

/// The text after `heading` on its line, in an earlier summary.
fn section_line(summary: &str, heading: &str) -> Option<String> {
    summary
        .lines()
        .find_map(|line| line.trim().strip_prefix(heading))
        .map(|rest| rest.trim().to_owned())
        .filter(|rest| !rest.is_empty())
}

/// The bullet lines under an earlier summary's "Key findings".
fn earlier_findings(summary: &str) -> Vec<String> {
    summary
        .lines()
        .skip_while(|line| !line.trim().starts_with(KEY_FINDINGS))
        .skip(1)
        .map_while(|line| line.trim().strip_prefix("- "))
        .map(one_line)
        .take(MAX_FINDINGS)
        .collect()
}

/// Adds `line` unless it is there already or `list` holds `max` lines: at most `max`
/// comparisons, however many lines the old part has.
fn push_new(list: &mut Vec<String>, line: String, max: usize) {
    if list.len() < max && !list.contains(&line) {
        list.push(line);
    }
}

/// Sentences and lines, each on one line.
fn sentences(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .flat_map(|line| line.split_inclusive(". "))
        .map(one_line)
}

/// Whitespace collapsed to single spaces, and at most [`MAX_LINE_CHARS`] characters:
/// the rest of the text is not even read.
fn one_line(text: &str) -> String {
    let mut out = String::new();
    let mut room = MAX_LINE_CHARS;
    for word in text.split_whitespace() {
        if !out.is_empty() {
            if room == 0 {
                break;
            }
            out.push(' ');
            room -= 1;
        }
        let end = word.char_indices().nth(room).map_or(word.len(), |(i, _)| i);
        out.push_str(&word[..end]);
        room -= word[..end].chars().count();
        if room == 0 {
            break;
        }
    }
    out
}

fn clip(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", text[..end].trim_end()),
        None => text.to_owned(),
    }
}

const NEGATIONS: [&str; 12] = [
    "ruled out",
    "is not",
    "are not",
    "was not",
    "were not",
    "not the cause",
    "isn't",
    "wasn't",
    "unrelated",
    "no sign of",
    "no errors",
    "looks normal",
];

fn rules_out(line: &str) -> bool {
    let lower = line.to_lowercase();
    NEGATIONS.iter().any(|n| lower.contains(n))
}

const SIGNALS: [&str; 9] = [
    "error",
    "fail",
    "exception",
    "timeout",
    "timed out",
    "refused",
    "panic",
    "oom",
    "latency",
];

fn is_specific(line: &str) -> bool {
    let lower = line.to_lowercase();
    line.chars().any(|c| c.is_ascii_digit())
        || SIGNALS.iter().any(|s| lower.contains(s))
        || line.split_whitespace().any(|word| {
            let word = word.trim_matches(|c: char| !c.is_alphanumeric());
            word.contains(['-', '_']) && word.chars().any(char::is_alphabetic)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary;

    fn msg(role: Role, content: &str) -> Message {
        Message::text(role, content)
    }

    fn incident() -> Vec<Message> {
        let padding = "The rotation handbook says to check dashboards first. ".repeat(10);
        vec![
            msg(
                Role::User,
                "Why is checkout-api returning 502s since 14:05 UTC?",
            ),
            msg(
                Role::Assistant,
                &format!("Let me look at the load balancer.\n{padding}"),
            ),
            msg(
                Role::Tool,
                "14:05:12 ERROR checkout-api upstream timeout after 30s\n14:05:13 pool size 100/100",
            ),
            msg(
                Role::Assistant,
                "DNS resolution looks normal, so DNS is ruled out.",
            ),
            msg(Role::User, "What about the database?"),
            msg(
                Role::Assistant,
                "orders_db shows 480 active connections; checking pgbouncer next.",
            ),
        ]
    }

    #[test]
    fn fills_every_heading_from_the_transcript() {
        let old = incident();
        let s = summarize(&old).unwrap();
        let replaced: i64 = old.iter().map(|m| m.chars).sum();
        let text = summary::check(&s.text, replaced, 6_000).unwrap();
        assert!(
            text.starts_with(
                "**Investigating:** Why is checkout-api returning 502s since 14:05 UTC?"
            )
        );
        assert!(text.contains("- 14:05:12 ERROR checkout-api upstream timeout after 30s"));
        assert!(text.contains("- orders_db shows 480 active connections"));
        assert!(text.contains("**Ruled out:** DNS resolution looks normal, so DNS is ruled out."));
        assert!(text.ends_with(
            "**Current state:** orders_db shows 480 active connections; checking pgbouncer next."
        ));
        assert_eq!(s.model, "extractive");
    }

    #[test]
    fn is_deterministic() {
        assert_eq!(
            summarize(&incident()).unwrap(),
            summarize(&incident()).unwrap()
        );
    }

    #[test]
    fn folds_in_an_earlier_summary() {
        let mut earlier = msg(
            Role::User,
            "**Investigating:** 502s on checkout\n**Key findings:**\n- pool at 100/100 at 14:05\n**Ruled out:** DNS\n**Current state:** checking db",
        );
        earlier.is_summary = true;
        let mut old = vec![earlier];
        old.extend(incident().into_iter().skip(1));
        let text = summarize(&old).unwrap().text;
        assert!(text.starts_with("**Investigating:** 502s on checkout\n"));
        assert!(text.contains("**Key findings:**\n- pool at 100/100 at 14:05\n"));
        assert!(text.contains("**Ruled out:** DNS; DNS resolution looks normal"));
    }

    /// About `bytes` of distinct log lines, each "specific" (digits, an error word).
    fn log_dump(bytes: usize) -> String {
        let mut dump = String::with_capacity(bytes + 100);
        let mut n = 0;
        while dump.len() < bytes {
            dump.push_str(&format!("{n:08} ERROR svc-{} upstream reset\n", n % 97));
            n += 1;
        }
        dump
    }

    #[test]
    fn megabytes_of_distinct_tool_lines_are_summarized_in_linear_time() {
        // Every line used to be compared with every line kept before it: 5 MB of
        // distinct lines took minutes. Now each line costs at most MAX_FINDINGS
        // comparisons, and this finishes in about the time it takes to read the input.
        let mut old = incident();
        old[2] = msg(Role::Tool, &log_dump(5_000_000));
        let text = summarize(&old).unwrap().text;
        assert!(
            text.contains("- 00000000 ERROR svc-0 upstream reset\n"),
            "{text}"
        );
        assert!(text.contains("- orders_db shows 480 active connections"));
    }

    #[test]
    fn a_huge_single_line_is_judged_and_kept_by_its_start() {
        let huge = format!("{} {}", "0xdeadbeef-".repeat(500_000), "no errors");
        assert_eq!(one_line(&huge).chars().count(), MAX_LINE_CHARS);
        let mut old = incident();
        old[2] = msg(Role::Tool, &huge);
        let text = summarize(&old).unwrap().text;
        // Its start has digits (a finding); its end's negation is never reached.
        assert!(text.contains("- 0xdeadbeef-0xdeadbeef-"), "{text}");
        assert!(!text.contains("no errors"));
    }

    #[test]
    fn one_line_collapses_whitespace_within_the_bound() {
        assert_eq!(one_line("  a\t b \n\n c  "), "a b c");
        let words = "ab ".repeat(MAX_LINE_CHARS);
        let line = one_line(&words);
        assert_eq!(line.chars().count(), MAX_LINE_CHARS);
        assert!(line.starts_with("ab ab"));
        assert_eq!(
            one_line(&"é".repeat(MAX_LINE_CHARS + 5)).chars().count(),
            MAX_LINE_CHARS
        );
    }

    #[test]
    fn terser_budgets_fit_a_small_input_and_a_tiny_one_fails() {
        let old = vec![
            msg(
                Role::User,
                &format!("incident 42 on svc-a {}", "x".repeat(200)),
            ),
            msg(
                Role::Assistant,
                &format!("error 1 at 10:00 {}", "y".repeat(200)),
            ),
        ];
        let replaced: i64 = old.iter().map(|m| m.chars).sum();
        let s = summarize(&old).unwrap();
        assert!(char_count(&s.text) < replaced);
        assert!(matches!(
            summarize(&[msg(Role::User, "hi"), msg(Role::Assistant, "hello")]),
            Err(LlmError::Invalid(_))
        ));
    }
}
