//! A statement shortened without being cut: its clauses, and a compact form that keeps
//! the clause naming what it is about and those holding identifiers.
//!
//! A finding must stay a statement. A sentence cut at a character count loses its end
//! mid-word or mid-number ("requests wait up to 29."), and a list of its identifiers
//! loses what they are about. Between the two, a sentence can lose the clauses that
//! carry no identifier: "The replica is not overloaded (cpu 41%, lag 0.3s), but it has
//! hit max_connections=500: 12 pods x 40 = 480 checkout connections plus other clients"
//! keeps its subject and every value as "The replica is not overloaded (cpu 41%, lag
//! 0.3s) … it has hit max_connections=500 … 12 pods x 40 = 480 checkout connections".
//! This is how the summarizer makes room for old facts rather than dropping them.

/// Where one clause ends and the next begins, for each separator: the clause before
/// ends `end` bytes after the separator's start, the next starts `next` bytes after it
/// (a conjunction starts the next clause). Nothing splits inside parentheses.
const SEPARATORS: [(&str, usize, usize); 13] = [
    (", ", 0, 2),
    ("; ", 0, 2),
    (": ", 0, 2),
    (" — ", 0, 5),
    (" – ", 0, 5),
    (" … ", 0, 5),
    (" (", 0, 1),
    (" but ", 0, 1),
    (" so ", 0, 1),
    (" which ", 0, 1),
    (" while ", 0, 1),
    (" and ", 0, 1),
    (" because ", 0, 1),
];

/// Between the kept runs of a compact form.
pub(super) const ELLIPSIS: &str = " … ";

/// A compact form must save at least this share of the statement to be offered.
const SAVES: (usize, usize) = (1, 5);

/// The clauses of `text`, as byte ranges in order. A separator inside an identifier
/// (`maxReplicas: 30`, in `protected`) or inside parentheses does not split.
pub(super) fn clauses(text: &str, protected: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut guarded = vec![false; text.len()];
    for &(s, e) in protected {
        guarded[s.min(text.len())..e.min(text.len())].fill(true);
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0u32;
    let mut at = 0;
    while at < text.len() {
        match text.as_bytes()[at] {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0
            && at > start
            && !guarded[at]
            && let Some(&(_, end, next)) = SEPARATORS
                .iter()
                .find(|(sep, ..)| text[at..].starts_with(sep))
        {
            out.push((start, at + end));
            start = at + next;
            at = start;
            continue;
        }
        at += text[at..].chars().next().map_or(1, char::len_utf8);
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out.retain(|&(s, e)| !text[s..e].trim().is_empty());
    out
}

/// A compact form says something only with this many words of letters: fewer, and it
/// is a row of identifiers ("2026-05-20 … (#552)").
const MIN_WORDS: usize = 3;

/// The words of letters in `text` (identifiers and numbers are not).
fn words(text: &str) -> usize {
    (text.split_whitespace())
        .filter(|w| {
            let w = w.trim_matches(|c: char| !c.is_alphanumeric());
            w.len() >= 2 && w.chars().all(char::is_alphabetic)
        })
        .count()
}

/// A statement shortened: its text, and the byte ranges of the original it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Shortened {
    pub text: String,
    pub kept: Vec<(usize, usize)>,
}

impl Shortened {
    /// Whether the identifier at `span` of the original is in the shortened text.
    pub fn keeps(&self, span: (usize, usize)) -> bool {
        self.kept.iter().any(|&(s, e)| s <= span.0 && span.1 <= e)
    }
}

/// The clauses of `text` for which `keep` says so, runs of adjacent ones as written,
/// the gaps marked with an ellipsis (and a trailing one when the end is left out).
pub(super) fn assemble(text: &str, all: &[(usize, usize)], keep: &[bool]) -> Shortened {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (n, &(s, e)) in all.iter().enumerate().filter(|(n, _)| keep[*n]) {
        match runs.last_mut() {
            Some(run) if n > 0 && keep[n - 1] => run.1 = e,
            _ => runs.push((s, e)),
        }
    }
    let mut out = String::new();
    for &(s, e) in &runs {
        if !out.is_empty() {
            out.push_str(ELLIPSIS);
        }
        out.push_str(text[s..e].trim().trim_end_matches([',', ';', ':']));
    }
    if keep.last() == Some(&false) {
        out.push_str(ELLIPSIS.trim_end());
    }
    Shortened {
        text: out,
        kept: runs,
    }
}

/// `text` with only its first clause (which names what it is about) and the clauses
/// that hold an identifier (`ids`, byte ranges); `None` when every clause stays or the
/// form would save less than a fifth.
pub(super) fn compact(text: &str, ids: &[(usize, usize)]) -> Option<Shortened> {
    let all = clauses(text, ids);
    let keep: Vec<bool> = (all.iter().enumerate())
        .map(|(n, &(s, e))| n == 0 || ids.iter().any(|&(a, b)| a < e && s < b))
        .collect();
    if keep.iter().all(|&k| k) {
        return None;
    }
    let short = assemble(text, &all, &keep);
    let (full, chars) = (text.chars().count(), short.text.chars().count());
    (chars * SAVES.1 <= full * (SAVES.1 - SAVES.0) && words(&short.text) >= MIN_WORDS)
        .then_some(short)
}

/// `text` within `max_chars`: whole when it fits; else its compact form when that fits;
/// else its first clauses that fit (of the compact form's, when there is one), then an
/// ellipsis; else its first words. Never cut inside a word or a number.
pub(super) fn within(text: &str, ids: &[(usize, usize)], max_chars: usize) -> Shortened {
    if text.chars().count() <= max_chars {
        return Shortened {
            text: text.to_owned(),
            kept: vec![(0, text.len())],
        };
    }
    let all = clauses(text, ids);
    let candidates: Vec<bool> = match compact(text, ids) {
        Some(short) if short.text.chars().count() <= max_chars => return short,
        Some(_) => (all.iter().enumerate())
            .map(|(n, &(s, e))| n == 0 || ids.iter().any(|&(a, b)| a < e && s < b))
            .collect(),
        None => vec![true; all.len()],
    };
    let mut keep = vec![false; all.len()];
    let mut used = ELLIPSIS.len();
    for (n, &(s, e)) in all.iter().enumerate().filter(|(n, _)| candidates[*n]) {
        let cost = text[s..e].chars().count() + ELLIPSIS.chars().count();
        if used + cost > max_chars {
            break;
        }
        used += cost;
        keep[n] = true;
    }
    if !keep.iter().any(|&k| k) {
        let head = clip_words(text, max_chars.saturating_sub(1));
        return Shortened {
            text: format!("{head}…"),
            kept: vec![(0, head.len())],
        };
    }
    assemble(text, &all, &keep)
}

/// The longest prefix of `text` of whole words within `max_chars` (the start of its
/// first word when that alone is longer).
pub(super) fn clip_words(text: &str, max_chars: usize) -> &str {
    let Some((cut, _)) = text.char_indices().nth(max_chars) else {
        return text;
    };
    match text[..cut].rfind(' ') {
        Some(space) if space > 0 => &text[..space],
        _ => &text[..cut],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::extract;

    fn spans(text: &str) -> Vec<(usize, usize)> {
        extract(text)
            .iter()
            .map(|f| {
                let s = f.text.as_ptr() as usize - text.as_ptr() as usize;
                (s, s + f.text.len())
            })
            .collect()
    }

    fn pieces(text: &str) -> Vec<&str> {
        clauses(text, &spans(text))
            .into_iter()
            .map(|(s, e)| &text[s..e])
            .collect()
    }

    #[test]
    fn clauses_split_at_commas_and_conjunctions_but_not_inside_identifiers_or_parentheses() {
        assert_eq!(
            pieces(
                "The replica is not overloaded (cpu 41%, lag 0.3s), but it has hit max_connections=500: 480 from checkout"
            ),
            [
                "The replica is not overloaded",
                "(cpu 41%, lag 0.3s)",
                "but it has hit max_connections=500",
                "480 from checkout"
            ]
        );
        assert_eq!(
            pieces("HPA maxReplicas: 30 is reached"),
            ["HPA maxReplicas: 30 is reached"]
        );
    }

    #[test]
    fn a_compact_form_keeps_the_first_clause_and_those_with_identifiers() {
        let text = "Since 14:05 the pools are saturated at 480 of 480, which is bad for everyone involved in checkout, and requests wait up to 29.9s for a connection";
        assert_eq!(
            compact(text, &spans(text)).map(|s| s.text).as_deref(),
            Some(
                "Since 14:05 the pools are saturated at 480 of 480 … and requests wait up to 29.9s for a connection"
            )
        );
        // Nothing to leave out, or too little saved: no compact form.
        let dense = "checkout-api v5.33.0 rolled out at 14:01, two minutes before 14:03";
        assert_eq!(compact(dense, &spans(dense)), None);
    }

    #[test]
    fn a_long_statement_is_shortened_by_clauses_never_inside_a_number() {
        let text = format!(
            "Requests wait up to 29.9s for a connection, {}, and the pool is at 480 of 480",
            "which the dashboard shows in red for every pod in the region".repeat(4)
        );
        let short = within(&text, &spans(&text), 120);
        assert_eq!(
            short.text,
            "Requests wait up to 29.9s for a connection … and the pool is at 480 of 480"
        );
        let prose = "word ".repeat(60);
        let cut = within(&prose, &[], 50);
        assert!(cut.text.ends_with("word…"), "{}", cut.text);
        assert!(cut.text.chars().count() <= 50);
    }
}
