//! Statements: the sentences and bullets a text is made of, and whether one of them
//! states a fact (holds its subject and its value) rather than listing identifiers.
//!
//! A value alone says nothing: "14:01" in a list cannot tell a reader what happened at
//! 14:01. A fact is kept when one statement holds both what it is about and its value
//! ("checkout-api v5.33.0 rolled out at 14:01"), and that statement is not a list of
//! identifiers ("Also noted: 14:01, v5.33.0, 8.4%"). `summarizer eval` measures its
//! planted statements with [`states`]; the worker's fact check counts the identifiers a
//! summary keeps inside statements with [`stated_text`].

use super::{contains_word, extract};

/// The statements of `text`: each line, its list marker or bold label taken off
/// ([`strip_marker`]), cut into sentences ([`sentences_of`]).
pub fn statements(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .flat_map(|line| sentences_of(strip_marker(line)))
}

/// A line or sentence without the list marker (`-`, `*`, `•`, `1.`, `2)`) or the bold
/// label (`**Key findings:**`, a few words ending in a colon) it starts with.
pub fn strip_marker(line: &str) -> &str {
    let mut rest = line.trim();
    loop {
        let before = rest;
        if let Some(after) = rest.strip_prefix(['-', '*', '•'])
            && after.starts_with(' ')
        {
            rest = after.trim_start();
        }
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if (1..=3).contains(&digits)
            && let Some(after) = rest[digits..].strip_prefix(['.', ')'])
            && after.starts_with(' ')
        {
            rest = after.trim_start();
        }
        if let Some(label) = rest.strip_prefix("**")
            && let Some((head, after)) = label.split_once("**")
            && head.ends_with(':')
            && head.split_whitespace().count() <= 4
        {
            rest = after.trim_start();
        }
        if rest == before {
            return rest;
        }
    }
}

/// Abbreviations whose period ends no sentence.
const ABBREVIATIONS: [&str; 8] = [
    "e.g.", "i.e.", "vs.", "cf.", "approx.", "incl.", "etc.", "resp.",
];

/// The sentences of one line: it is cut after a `.`, `?` or `!` followed by whitespace,
/// so that `29.9s` or `v5.33.0` never ends one, nor does an ellipsis (`...`) or an
/// abbreviation (`e.g.`, `i.e.`; `etc.` only before a capital letter).
pub fn sentences_of(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        let trimmed = rest.trim_start();
        if trimmed.is_empty() {
            return None;
        }
        let end = trimmed
            .match_indices(char::is_whitespace)
            .find(|&(at, _)| ends_sentence(&trimmed[..at], &trimmed[at..]))
            .map_or(trimmed.len(), |(at, _)| at);
        let (sentence, after) = trimmed.split_at(end);
        rest = after;
        Some(sentence)
    })
}

/// Whether `head` (up to a space) ends a sentence, `tail` following.
fn ends_sentence(head: &str, tail: &str) -> bool {
    // An ellipsis elides ("a SELECT ... FOR SHARE"); it ends no sentence.
    if !head.ends_with(['.', '?', '!']) || head.ends_with("..") {
        return false;
    }
    let word = head.rsplit(char::is_whitespace).next().unwrap_or(head);
    let word = word
        .trim_start_matches(['(', '"', '\'', '`'])
        .to_ascii_lowercase();
    match ABBREVIATIONS.iter().find(|a| **a == word) {
        Some(&"etc.") => tail.trim_start().starts_with(char::is_uppercase),
        Some(_) => false,
        None => true,
    }
}

/// The statement of `text` around byte `at` (a sentence of its line, or the line), on
/// one line, at most `max_chars`: shortened to the words around `at` when longer, an
/// ellipsis where it was cut. What an identifier was said in, for a reader to see what
/// it is about.
pub fn around(text: &str, at: usize, max_chars: usize) -> String {
    // A window of the text, so that a line of megabytes is not read whole.
    let reach = max_chars * 8;
    let mut from = at.saturating_sub(reach).min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = at.saturating_add(reach).min(text.len());
    while !text.is_char_boundary(to) {
        to += 1;
    }
    let (text, at) = (&text[from..to], at.min(text.len()) - from);
    let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let end = text[at..].find('\n').map_or(text.len(), |n| at + n);
    let line = &text[start..end];
    let offset = at - start;
    let sentence = sentences_of(line)
        .find(|s| {
            let s_start = s.as_ptr() as usize - line.as_ptr() as usize;
            s_start <= offset && offset <= s_start + s.len()
        })
        .unwrap_or(line);
    let s_offset = (sentence.as_ptr() as usize - line.as_ptr() as usize).min(offset);
    let words: Vec<(usize, &str)> = sentence
        .split_whitespace()
        .map(|w| (w.as_ptr() as usize - sentence.as_ptr() as usize, w))
        .collect();
    let chars = |w: &[(usize, &str)]| -> usize {
        w.iter().map(|(_, w)| w.chars().count() + 1).sum::<usize>()
    };
    if chars(&words) <= max_chars + 1 {
        return words.iter().map(|(_, w)| *w).collect::<Vec<_>>().join(" ");
    }
    // The word holding `at`, then its neighbours, one on each side in turn.
    let local = offset - s_offset;
    let centre = words
        .iter()
        .rposition(|&(start, _)| start <= local)
        .unwrap_or(0);
    let (mut from, mut to) = (centre, centre + 1);
    let room = max_chars.saturating_sub(2);
    loop {
        let mut grew = false;
        if to < words.len() && chars(&words[from..=to]) <= room {
            to += 1;
            grew = true;
        }
        if from > 0 && chars(&words[from - 1..to]) <= room {
            from -= 1;
            grew = true;
        }
        if !grew {
            break;
        }
    }
    let mut out = String::new();
    if from > 0 {
        out.push('…');
    }
    out.push_str(
        &words[from..to]
            .iter()
            .map(|(_, w)| *w)
            .collect::<Vec<_>>()
            .join(" "),
    );
    if to < words.len() {
        out.push('…');
    }
    out
}

/// Whether `statement` is a list of identifiers rather than a statement: after a short
/// label (`Also noted:`), three or more items separated by commas or semicolons, two
/// thirds of which are bare (at most two words, or identifiers only). "Errors began at
/// 14:03, the pool hit 480 of 500, and p99 rose to 29.9s" is a statement; "14:05, 480,
/// max_connections=500, 41%" is a list.
pub fn is_list(statement: &str) -> bool {
    let body = match statement.split_once(": ") {
        Some((label, rest)) if label.split_whitespace().count() <= 4 => rest,
        _ => statement,
    };
    let items: Vec<&str> = items(body)
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .collect();
    if items.len() < 3 {
        return false;
    }
    let bare = items.iter().filter(|item| is_bare(item)).count();
    bare * 3 >= items.len() * 2
}

/// The items of a list: split at `;`, and at `,` but for a thousands separator
/// (`21,402`), never inside parentheses (an example in a sentence is not the sentence
/// being a list).
fn items(body: &str) -> impl Iterator<Item = &str> {
    let bytes = body.as_bytes();
    let mut start = 0;
    let mut at = 0;
    let mut depth = 0u32;
    std::iter::from_fn(move || {
        while at < bytes.len() {
            let here = at;
            at += 1;
            let separates = match bytes[here] {
                b'(' => {
                    depth += 1;
                    false
                }
                b')' => {
                    depth = depth.saturating_sub(1);
                    false
                }
                _ if depth > 0 => false,
                b';' => true,
                b',' => {
                    !(here > 0
                        && bytes[here - 1].is_ascii_digit()
                        && bytes.get(here + 1).is_some_and(u8::is_ascii_digit))
                }
                _ => false,
            };
            if separates {
                let item = &body[start..here];
                start = here + 1;
                return Some(item);
            }
        }
        (start <= bytes.len()).then(|| {
            let item = &body[start..];
            start = bytes.len() + 1;
            item
        })
    })
}

/// An item of a list that says nothing of its own: at most two words, or only
/// identifiers.
fn is_bare(item: &str) -> bool {
    let words: Vec<&str> = item.split_whitespace().collect();
    if words.len() <= 2 {
        return true;
    }
    let ids = extract(item);
    words.iter().all(|word| {
        let word = word.trim_matches(|c: char| matches!(c, '.' | '(' | ')' | '`' | '"'));
        word.is_empty() || ids.iter().any(|id| id.text.contains(word))
    })
}

/// Whether one statement of `text`, not a list, holds `value` (as a whole identifier,
/// as written) and one of `subjects` (as whole words, in any case).
pub fn states(text: &str, subjects: &[String], value: &str) -> bool {
    statements(text).any(|s| {
        contains_word(s, value)
            && subjects.iter().any(|subject| holds_name(s, subject))
            && !is_list(s)
    })
}

/// Whether `statement` holds `name` as whole words, ignoring case.
pub fn holds_name(statement: &str, name: &str) -> bool {
    if name.is_ascii() && statement.is_ascii() {
        contains_word(&statement.to_ascii_lowercase(), &name.to_ascii_lowercase())
    } else {
        contains_word(&statement.to_lowercase(), &name.to_lowercase())
    }
}

/// `text` without its lists: the statements that are not lists of identifiers, one per
/// line. What a summary states, as opposed to what it merely names.
pub fn stated_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for statement in statements(text).filter(|s| !is_list(s)) {
        out.push_str(statement);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(subjects: &[&str]) -> Vec<String> {
        subjects.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn statements_are_bullets_and_sentences_and_a_decimal_point_ends_none() {
        let text = "**Current state:** requests wait up to 29.9s. The pool is at 480/500.\n\
                    - checkout-api v5.33.0 rolled out at 14:01! Why?\n\
                    **Key findings:**";
        assert_eq!(
            statements(text).collect::<Vec<_>>(),
            [
                "requests wait up to 29.9s.",
                "The pool is at 480/500.",
                "checkout-api v5.33.0 rolled out at 14:01!",
                "Why?",
            ]
        );
    }

    #[test]
    fn an_abbreviation_ends_no_sentence_and_markers_go() {
        assert_eq!(
            statements(
                "1. Alerts fire at 30 days, i.e. after the renewal. Good. **Cause:** etc. Then"
            )
            .collect::<Vec<_>>(),
            [
                "Alerts fire at 30 days, i.e. after the renewal.",
                "Good.",
                "**Cause:** etc.",
                "Then"
            ]
        );
        assert_eq!(
            statements("All run a SELECT ... FOR SHARE. Next.").collect::<Vec<_>>(),
            ["All run a SELECT ... FOR SHARE.", "Next."]
        );
        assert_eq!(strip_marker("- **Cause:** the pool"), "the pool");
        assert_eq!(strip_marker("12) the pool"), "the pool");
        assert_eq!(strip_marker("-5 degrees"), "-5 degrees");
    }

    #[test]
    fn around_is_the_sentence_of_the_line_shortened_around_the_offset() {
        let text = "first line\nThe pool was full. checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors. Then more.\nlast";
        let at = text.find("v5.33.0").unwrap();
        assert_eq!(
            around(text, at, 200),
            "checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors."
        );
        assert_eq!(around(text, at, 30), "checkout-api v5.33.0 rolled…");
        let at = text.find("14:01").unwrap();
        assert_eq!(around(text, at, 30), "…out at 14:01, two minutes…");
        let long = format!(
            "{} max_pool=103 {}",
            "word ".repeat(100),
            "tail ".repeat(100)
        );
        let cut = around(&long, long.find("max_pool").unwrap(), 40);
        assert!(
            cut.contains("max_pool=103") && cut.chars().count() <= 40,
            "{cut}"
        );
        // A line of megabytes is read only around the offset.
        let huge = format!(
            "{}é max_pool=7 {}",
            "x".repeat(3_000_000),
            "é".repeat(1_000_000)
        );
        let cut = around(&huge, huge.find("max_pool").unwrap(), 40);
        assert!(cut.contains("max_pool=7"), "{cut}");
    }

    #[test]
    fn a_list_of_identifiers_is_not_a_statement() {
        assert!(is_list(
            "Also noted: 14:05, 480, max_connections=500, 41%, 30s, us-east-1, 0.1%, v5.33.0"
        ));
        assert!(is_list("query_metrics, 13:55, 30m, orders-db-replica-1"));
        assert!(!is_list(
            "Errors began at 14:03, the pool hit 480 of 500, and p99 rose to 29.9s"
        ));
        assert!(!is_list(
            "pgbouncer: pool capped at max_pool=103, later 283"
        ));
        assert!(!is_list("checkout-api v5.33.0 rolled out at 14:01"));
        // A thousands separator separates no items.
        assert!(!is_list(
            "sentry: nil pointer dereference events=21,402 users=13,917 first=15:21"
        ));
        assert!(is_list("Counts: 21,402, 13,917, 1,284"));
    }

    #[test]
    fn a_fact_is_stated_when_one_statement_holds_its_subject_and_value() {
        let subjects = names(&["checkout-api", "checkout"]);
        assert!(states(
            "- Checkout-API v5.33.0 rolled out at 14:01.",
            &subjects,
            "v5.33.0"
        ));
        // Apart, in a list, or another value: not stated.
        assert!(!states(
            "checkout-api was deployed. It runs v5.33.0.",
            &subjects,
            "v5.33.0"
        ));
        assert!(!states(
            "- Also noted: checkout-api, v5.33.0, 14:01, 8.4%",
            &subjects,
            "v5.33.0"
        ));
        assert!(!states(
            "checkout-api v5.33.1 is fine",
            &subjects,
            "v5.33.0"
        ));
        assert!(!states("checkouts v5.33.0", &subjects, "v5.33.0"));
    }

    #[test]
    fn the_stated_text_leaves_the_lists_out() {
        let text = "- orders-db max_connections=500 is the limit.\n- Also noted: 14:05, 480, 41%";
        assert_eq!(
            stated_text(text),
            "orders-db max_connections=500 is the limit.\n"
        );
    }
}
