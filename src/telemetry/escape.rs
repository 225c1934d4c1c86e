//! Escaping for text logs: client text (session and request ids, error bodies) must not
//! break a log line in two, forge a new one, or reorder what a reader sees.

use std::fmt;

/// Line and paragraph separators, C0 and C1 controls (line breaks, ESC, DEL) and the
/// bidirectional-text controls (`U+202E` shows text reversed, "Trojan Source").
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Shows text with every [`needs_escape`] character written as Rust writes it in a
/// literal (`\n`, `\u{2028}`), and every other character as it is.
pub struct Escaped<'a> {
    text: &'a str,
    keep_esc: bool,
}

impl<'a> Escaped<'a> {
    pub fn new(text: &'a str) -> Self {
        Self {
            text,
            keep_esc: false,
        }
    }

    /// Leaves ESC as it is: for a line a terminal formatter coloured itself.
    pub fn keeping_esc(self) -> Self {
        Self {
            keep_esc: true,
            ..self
        }
    }

    fn escapes(&self, c: char) -> bool {
        needs_escape(c) && !(self.keep_esc && c == '\u{1b}')
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.text;
        while let Some(at) = rest.find(|c: char| self.escapes(c)) {
            f.write_str(&rest[..at])?;
            let mut chars = rest[at..].chars();
            // `find` returned the start of a char, so there is one here.
            if let Some(c) = chars.next() {
                write!(f, "{}", c.escape_default())?;
            }
            rest = chars.as_str();
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn breaks_controls_and_bidi_are_escaped_the_rest_kept() {
        let text = "a\nb\rc\u{1b}[2Jd\u{2028}e\u{202e}f\u{2066}g\u{85}h 🦀 é\u{301} \\ \"";
        assert_eq!(
            Escaped::new(text).to_string(),
            "a\\nb\\rc\\u{1b}[2Jd\\u{2028}e\\u{202e}f\\u{2066}g\\u{85}h 🦀 é\u{301} \\ \""
        );
        assert_eq!(Escaped::new("plain-id").to_string(), "plain-id");
    }

    proptest! {
        #[test]
        fn escaped_text_has_no_character_that_breaks_a_line(text in "\\PC*|[\\u{0}-\\u{9f}\\u{2028}\\u{202e}a]*") {
            let shown = Escaped::new(&text).to_string();
            prop_assert!(!shown.chars().any(needs_escape), "{shown:?}");
            if !text.chars().any(needs_escape) {
                prop_assert_eq!(shown, text);
            }
        }
    }
}
