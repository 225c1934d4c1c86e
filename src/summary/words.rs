//! The user's own words (docs/compaction.md, "The user's words"): what the person running
//! the investigation said that the agent must keep obeying, carried through every
//! compaction word for word.
//!
//! A summary, however good, paraphrases, and a small model drops what it does not see
//! as a finding: "never restart orders-db without asking me" is not a finding, and an
//! agent that loses it restarts orders-db. So the worker, not the model, keeps these
//! words: it quotes them under a heading of its own after the template's four
//! ([`HEADING`]), from the user's messages of the old part and from the quotes the
//! earlier summary carried, chosen by what they are (a rule before the task) and then by
//! recency, within `SUMMARY_USER_WORDS_CHARS`.
//!
//! What counts is read from the words themselves, a plain heuristic over each sentence
//! of a user message: a **rule** is a standing instruction or constraint (it starts as
//! one, "Never ...", "Only ...", "Always ...", "Don't ...", "Make sure ...", "Report
//! to ...", or holds one, "without asking me", "read-only", "from now on"); the **task**
//! is what the person asked for first (the session's first user message), or a later
//! redirection of it ("focus on ...", "your task is ..."). Everything else the user said
//! is the summary's to state.

use std::collections::HashSet;

use crate::facts::sentences_of;
use crate::message::{Message, Role, char_count};

/// The heading of the quotes, after the template's four.
pub const HEADING: &str = "**The user's words** (verbatim, kept by the worker):";

/// A quote longer than this is not a rule or an ask but pasted data (a log, a stack
/// trace): it is never quoted.
pub const MAX_QUOTE_CHARS: usize = 500;

/// What a quote is; the order is the priority when the budget is short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Rule,
    Task,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Rule => "Rule",
            Self::Task => "Task",
        }
    }
}

/// One of the user's sentences, as written (whitespace runs made one space, so that it
/// stays on its line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    pub kind: Kind,
    pub text: String,
}

impl Quote {
    fn line(&self) -> String {
        format!("- {}: \"{}\"", self.kind.label(), self.text)
    }
}

/// `SUMMARY_USER_WORDS_CHARS`'s default: room for a few rules and the task, about a
/// quarter of the default `SUMMARY_MAX_CHARS`.
pub const DEFAULT_CHARS: usize = 1_500;

/// The section to write after a summary of `old` (the earlier summary among them
/// included), within `budget` chars: empty when there is nothing to quote or the budget
/// is 0.
pub fn section(old: &[Message], budget: usize) -> String {
    render(&choose(quotes(old), budget))
}

/// The section's text for `quotes`, in the order given.
pub fn render(quotes: &[Quote]) -> String {
    if quotes.is_empty() {
        return String::new();
    }
    let mut out = HEADING.to_owned();
    for quote in quotes {
        out.push('\n');
        out.push_str(&quote.line());
    }
    out
}

/// Every quote `old` offers, oldest first: those the earlier summary carried, then the
/// rules and tasks of the user's messages, each once.
pub fn quotes(old: &[Message]) -> Vec<Quote> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |quote: Quote, out: &mut Vec<Quote>| {
        if seen.insert(quote.text.to_lowercase()) {
            out.push(quote);
        }
    };
    let mut first_ask = !old.iter().any(|m| m.is_summary);
    for m in old {
        if m.is_summary {
            for quote in carried(&m.content) {
                push(quote, &mut out);
            }
            continue;
        }
        if m.role != Role::User {
            continue;
        }
        let opening = std::mem::take(&mut first_ask);
        // The first ask's sentences that are not rules, kept together: "Can you
        // check?" alone says nothing.
        let mut ask: Vec<String> = Vec::new();
        let mut said: Vec<Quote> = Vec::new();
        for line in m.content.lines() {
            for sentence in sentences_of(line) {
                let text = one_line(sentence);
                if text.is_empty() || char_count(&text) > MAX_QUOTE_CHARS as i64 {
                    continue;
                }
                if is_rule(&text) {
                    said.push(Quote {
                        kind: Kind::Rule,
                        text,
                    });
                } else if opening {
                    ask.push(text);
                } else if redirects(&text) {
                    said.push(Quote {
                        kind: Kind::Task,
                        text,
                    });
                }
            }
        }
        let mut text = String::new();
        for sentence in ask {
            if char_count(&text) + 1 + char_count(&sentence) > MAX_QUOTE_CHARS as i64 {
                break;
            }
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&sentence);
        }
        if !text.is_empty() {
            push(
                Quote {
                    kind: Kind::Task,
                    text,
                },
                &mut out,
            );
        }
        for quote in said {
            push(quote, &mut out);
        }
    }
    out
}

/// The quotes that fit `budget` chars of section: by kind (rules first), then the
/// newest, whole quotes only; written back in their order.
pub fn choose(quotes: Vec<Quote>, budget: usize) -> Vec<Quote> {
    if budget == 0 || quotes.is_empty() {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..quotes.len()).collect();
    // Stable: within a kind, the newest (the last) first.
    order.sort_by_key(|&i| (quotes[i].kind, std::cmp::Reverse(i)));
    let mut used = char_count(HEADING) as usize;
    let mut taken = vec![false; quotes.len()];
    for i in order {
        let n = char_count(&quotes[i].line()) as usize + 1;
        if used + n <= budget {
            used += n;
            taken[i] = true;
        }
    }
    quotes
        .into_iter()
        .zip(taken)
        .filter_map(|(q, taken)| taken.then_some(q))
        .collect()
}

/// The quotes an earlier summary's section carried.
pub fn carried(summary: &str) -> Vec<Quote> {
    let Some((_, after)) = summary.split_once(HEADING) else {
        return Vec::new();
    };
    after.lines().skip(1).map_while(parse_line).collect()
}

/// `text` without a section of quotes (the worker writes its own): what a model echoed
/// of an earlier one, or an earlier section itself.
pub fn strip(text: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with(HEADING) {
            inside = true;
            continue;
        }
        if inside && (line.trim().is_empty() || parse_line(line).is_some()) {
            continue;
        }
        inside = false;
        out.push(line);
    }
    out.join("\n").trim_end().to_owned()
}

fn parse_line(line: &str) -> Option<Quote> {
    let line = line.trim();
    let (kind, rest) = if let Some(rest) = line.strip_prefix("- Rule: \"") {
        (Kind::Rule, rest)
    } else if let Some(rest) = line.strip_prefix("- Task: \"") {
        (Kind::Task, rest)
    } else {
        return None;
    };
    let text = rest.strip_suffix('"')?;
    Some(Quote {
        kind,
        text: text.to_owned(),
    })
}

/// Whitespace runs as one space, trimmed.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a standing instruction starts: the sentence's first words, lowercased, after a
/// leading "please", "and", "also", "but" or "so".
const RULE_STARTS: [&str; 14] = [
    "avoid ",
    "report ",
    "keep ",
    "ask me ",
    "check with me ",
    "escalate ",
    "notify ",
    "stick to ",
    "stay ",
    "use only ",
    "leave ",
    "under no circumstances",
    "going forward",
    "before you ",
];

/// Words that make a sentence a constraint wherever they stand (whole words, lowercased):
/// a prohibition, an obligation, a scope or a condition that outlives the turn.
const RULE_WORDS: [&str; 18] = [
    "never",
    "always",
    "only",
    "must",
    "don't",
    "don’t",
    "without",
    "until",
    "nothing",
    "nobody",
    "everything",
    "every",
    "alone",
    "myself",
    "approval",
    "approve",
    "exceptions",
    "read-only",
];

/// Phrases that do the same.
const RULE_PHRASES: [&str; 6] = [
    "do not ",
    "no one ",
    "from now on",
    "at all times",
    "not allowed",
    "make sure ",
];

/// Whether `sentence` is a standing instruction or constraint: never a question; a
/// sentence that starts as one ([`RULE_STARTS`]) or holds a word or phrase that makes it
/// one ([`RULE_WORDS`], [`RULE_PHRASES`]). A plain heuristic that errs towards quoting:
/// a remark taken for a rule costs some of the budget, a rule taken for a remark is lost.
fn is_rule(sentence: &str) -> bool {
    if sentence.trim_end().ends_with('?') {
        return false;
    }
    let lower = sentence.to_lowercase();
    let mut start = lower.as_str();
    for lead in ["please ", "and ", "also ", "but ", "so "] {
        start = start.strip_prefix(lead).unwrap_or(start);
    }
    RULE_STARTS.iter().any(|s| start.starts_with(s))
        || RULE_PHRASES.iter().any(|p| lower.contains(p))
        || (lower.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’' || c == '-')))
            .any(|w| RULE_WORDS.contains(&w))
}

/// What redirects the investigation after its first ask.
const REDIRECTS: [&str; 7] = [
    "focus on",
    "your task",
    "new task",
    "i need you to",
    "the goal is",
    "our goal",
    "instead, ",
];

fn redirects(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    REDIRECTS.iter().any(|p| lower.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    fn summary(text: &str) -> Message {
        let mut m = user(text);
        m.is_summary = true;
        m
    }

    #[test]
    fn rules_and_the_first_ask_are_quoted_word_for_word() {
        let old = [
            user("Why does checkout-api return 502s since 14:01? It started after the deploy."),
            Message::text(
                Role::Assistant,
                "Looking at the logs. Never mind the cache.",
            ),
            user(
                "Never restart orders-db without asking me first. The replica lag looks \
                 fine to me.\nOnly run read-only queries on the replicas.",
            ),
            user("Post every update in #inc-checkout."),
        ];
        let quotes = quotes(&old);
        let texts: Vec<(Kind, &str)> = quotes.iter().map(|q| (q.kind, q.text.as_str())).collect();
        assert_eq!(
            texts,
            [
                (
                    Kind::Task,
                    "Why does checkout-api return 502s since 14:01? It started after the deploy."
                ),
                (
                    Kind::Rule,
                    "Never restart orders-db without asking me first."
                ),
                (Kind::Rule, "Only run read-only queries on the replicas."),
                (Kind::Rule, "Post every update in #inc-checkout."),
            ]
        );
    }

    #[test]
    fn a_section_is_carried_by_the_next_summary_and_read_back_exactly() {
        let first = [
            user("Find why p99 doubled. Don't touch the \"orders\" table."),
            Message::text(Role::Assistant, "On it."),
        ];
        let written = format!("**Investigating:** p99\n\n{}", section(&first, 1_500));
        assert!(written.contains("- Rule: \"Don't touch the \"orders\" table.\""));
        let second = [
            summary(&written),
            user("From now on, report to @maria before any change."),
        ];
        let carried: Vec<String> = quotes(&second).into_iter().map(|q| q.text).collect();
        assert_eq!(
            carried,
            [
                "Find why p99 doubled.",
                "Don't touch the \"orders\" table.",
                "From now on, report to @maria before any change."
            ]
        );
        // The earlier summary's first ask stays the task; later words are not a first ask.
        assert_eq!(quotes(&second)[0].kind, Kind::Task);
    }

    #[test]
    fn a_short_budget_keeps_rules_before_the_task_and_the_newest_first() {
        let quotes = vec![
            Quote {
                kind: Kind::Task,
                text: "t".repeat(100),
            },
            Quote {
                kind: Kind::Rule,
                text: "old rule".to_owned(),
            },
            Quote {
                kind: Kind::Rule,
                text: "new rule".to_owned(),
            },
        ];
        let room = |n: usize| char_count(HEADING) as usize + n;
        let one_rule = room(char_count(&quotes[2].line()) as usize + 1);
        let chosen = choose(quotes.clone(), one_rule);
        assert_eq!(chosen, [quotes[2].clone()]);
        let both_rules = one_rule + char_count(&quotes[1].line()) as usize + 1;
        assert_eq!(choose(quotes.clone(), both_rules), quotes[1..]);
        assert!(choose(quotes, 0).is_empty());
    }

    /// Standing rules as users write them, and what they say that is not one.
    #[test]
    fn rules_are_told_from_remarks_and_asks() {
        for rule in [
            "Leave the ledger database alone, it is not ours.",
            "Updates go to #inc-8012 only.",
            "And keep customer data out of the channel: ids and emails stay in the ticket.",
            "Any change you make goes under a CHG record, no exceptions.",
            "No Terraform applies on network-* projects until we understand this.",
            "I approve production IAM changes myself.",
            "Everything goes in #inc-6620.",
            "Do not page the DBA before 08:00.",
        ] {
            assert!(is_rule(rule), "{rule}");
        }
        for remark in [
            "Marketing launched the spring sale at 16:00 so my first guess is load.",
            "Can you check?",
            "Could it be the database that never recovered?",
            "Post that to #inc-5107 and keep digging.",
            "I didn't see anything in #deploys but I wasn't watching closely.",
            "Good.",
        ] {
            assert!(!is_rule(remark), "{remark}");
        }
    }

    #[test]
    fn pasted_data_is_never_quoted_and_strip_takes_a_section_out() {
        let dump = format!("Only {}", "x ".repeat(400));
        assert!(quotes(&[user(&dump)]).is_empty());
        let text = "**Current state:** waiting.\n\n**The user's words** (verbatim, kept by the \
                    worker):\n- Rule: \"Never restart orders-db.\"\n\n[Recall: ...]";
        assert_eq!(strip(text), "**Current state:** waiting.\n\n[Recall: ...]");
    }
}
