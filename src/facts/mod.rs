//! The identifiers in a conversation: the facts a summary must not lose.
//!
//! An investigation turns on specifics: the error code, the version, the host, the
//! timestamp. [`extract`] finds them in text, as written, with a kind each; [`FactSet`]
//! holds the distinct ones of a removed part, and [`FactSet::recall`] says how many of
//! them a summary still carries. The worker's fact check, the extractive summarizer and
//! `summarizer eval` all measure with this one definition.
//!
//! Extraction is a single pass over the text, with one token of lookahead: linear in the
//! input, whatever its shape. It is a heuristic tuned for incident transcripts (logs,
//! metrics, tool output and the agent's prose), biased towards precision: an ordinary
//! English word is never a fact, so a summary is not asked to keep noise.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::message::{Message, Role, ToolCall};
use lexer::{quoted, tokens};

mod classify;
mod lexer;
mod statements;
mod words;

pub use statements::{
    holds_name, is_list, sentences_of, stated_text, statements, states, strip_marker,
};

/// What an identifier is; for reports and tests, matching ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A number with a unit, a percentage, a ratio, or a number of three digits or more
    /// (four with a decimal point).
    Quantity,
    Version,
    /// A timestamp, a time of day or a date.
    Time,
    Duration,
    /// An IP address (v4, with a port or a prefix length, or v6), or `host:port`.
    Address,
    /// A host, pod, service, table or setting name.
    Name,
    /// An error code, an HTTP status, an errno or a signal.
    Code,
    /// An exception or error type.
    Exception,
    /// A file path or a URL.
    Path,
    /// A commit hash, a UUID, a ticket or any other id.
    Id,
    /// A quoted string of several words: an error message, a command.
    Quoted,
    /// A setting with its value: `max_connections=500`, `maxReplicas: 30`.
    Setting,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One identifier, as written in the text it was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fact<'a> {
    pub kind: Kind,
    pub text: &'a str,
}

/// Every identifier in `text`, in order of appearance, repeats included.
pub fn extract(text: &str) -> Vec<Fact<'_>> {
    let mut facts = Vec::new();
    quoted(text, &mut facts);
    tokens(text, &mut facts);
    facts
}

/// The text of a message that carries facts: its content, and the arguments of the
/// tool calls it makes (an agent's query names the service and the time range).
pub fn message_texts(m: &Message) -> impl Iterator<Item = String> + '_ {
    let arguments: Vec<String> = (m.calls().iter())
        .filter_map(|call| ToolCall(call).arguments().map(Cow::into_owned))
        .collect();
    std::iter::once(m.content.clone()).chain(arguments)
}

/// The distinct identifiers of some messages, in order of first appearance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactSet {
    facts: Vec<(Kind, String)>,
    seen: HashSet<String>,
    /// Where each fact was first seen, by index: enough to find the statement it was
    /// said in again ([`FactSet::said_in`]) without keeping a copy of it.
    origins: Vec<Origin>,
    /// How [`FactSet::established_in`] chose them; zeros for the other constructors.
    weighing: Weighing,
}

/// Why the identifiers of an old part were weighed ([`FactSet::established_in`]): how
/// many distinct ones it holds, how many the conversation said (the user, the agent, an
/// earlier summary), and how many more the tool-output lines it relied on hold. The rest
/// are routine tool output no one referred to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weighing {
    pub seen: usize,
    pub said: usize,
    pub relied_on: usize,
}

/// A line of tool output: its message's place, its offset in the message, and its
/// identifiers, each with its offset in the line.
type ToolLine<'a> = (usize, usize, Vec<(usize, Fact<'a>)>);

/// A tool-output line is one the conversation relied on when it holds an identifier the
/// conversation said that at most this many lines of tool output hold: the error code the
/// agent quoted points at its line; a service name on every line of a log points at none.
pub const RELIED_ON_LINES: usize = 3;

/// A place in some messages: the message, which of its texts ([`message_texts`]: its
/// content, then each call's arguments), the byte offset in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Origin {
    message: u32,
    part: u32,
    at: u32,
}

/// An identifier a summary does not state, with the statement of the transcript it was
/// first said in: what a second attempt is asked to keep, as a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingFact {
    pub value: String,
    /// The sentence or line it was first seen in, shortened around it (at most
    /// [`MissingFact::MAX_SAID_CHARS`]); empty when it cannot be found.
    pub said: String,
}

impl MissingFact {
    pub const MAX_SAID_CHARS: usize = 240;
    /// An identifier longer than this is not one a summary would copy (a blob in a
    /// dump); no statement is looked for.
    pub const MAX_VALUE_CHARS: usize = 200;
}

impl FactSet {
    /// The facts of `messages` (an earlier summary among them included).
    pub fn of_messages(messages: &[Message]) -> Self {
        let mut set = Self::default();
        for (n, m) in messages.iter().enumerate() {
            for (part, text) in message_texts(m).enumerate() {
                set.add_at(&text, n, part);
            }
        }
        set
    }

    /// The facts an old part established, the ones a summary of it is held to: the
    /// identifiers the conversation said (the user's and the agent's messages, their
    /// tool calls' arguments, an earlier summary), and those of the tool-output lines it
    /// relied on (see [`RELIED_ON_LINES`]); not every request id and timestamp of a
    /// routine log no one referred to. In order of first appearance; how they were
    /// chosen is [`FactSet::weighing`].
    pub fn established_in(messages: &[Message]) -> Self {
        let said = Self::of_messages_where(messages, |m| m.role != Role::Tool);
        // Each tool-output line with its identifiers, and in how many lines each occurs.
        let mut lines: Vec<ToolLine<'_>> = Vec::new();
        let mut in_lines: HashMap<&str, usize> = HashMap::new();
        for (n, m) in messages.iter().enumerate() {
            if m.role != Role::Tool {
                continue;
            }
            let mut start = 0;
            for line in m.content.split_inclusive('\n') {
                let found: Vec<(usize, Fact<'_>)> = extract(line)
                    .into_iter()
                    .map(|f| (f.text.as_ptr() as usize - line.as_ptr() as usize, f))
                    .collect();
                let distinct: HashSet<&str> = found.iter().map(|(_, f)| f.text).collect();
                for text in distinct {
                    *in_lines.entry(text).or_default() += 1;
                }
                if !found.is_empty() {
                    lines.push((n, start, found));
                }
                start += line.len();
            }
        }
        let seen = said.len() + in_lines.keys().filter(|text| !said.contains(text)).count();
        let relied = |found: &[(usize, Fact<'_>)]| {
            found.iter().any(|(_, f)| {
                said.contains(f.text)
                    && in_lines.get(f.text).copied().unwrap_or(0) <= RELIED_ON_LINES
            })
        };
        let mut set = Self::default();
        let mut lines = lines.into_iter().peekable();
        for (n, m) in messages.iter().enumerate() {
            if m.role != Role::Tool {
                for (part, text) in message_texts(m).enumerate() {
                    set.add_at(&text, n, part);
                }
                continue;
            }
            while let Some((_, start, found)) = lines.next_if(|(line_of, _, _)| *line_of == n) {
                if relied(&found) {
                    for (at, fact) in found {
                        set.add_found(fact.text, fact.kind, n, 0, start + at);
                    }
                }
            }
        }
        set.weighing = Weighing {
            seen,
            said: said.len(),
            relied_on: set.len() - said.len(),
        };
        set
    }

    /// How [`FactSet::established_in`] weighed these facts.
    pub fn weighing(&self) -> Weighing {
        self.weighing
    }

    fn of_messages_where(messages: &[Message], keep: impl Fn(&Message) -> bool) -> Self {
        let mut set = Self::default();
        for (n, m) in messages.iter().enumerate().filter(|(_, m)| keep(m)) {
            for (part, text) in message_texts(m).enumerate() {
                set.add_at(&text, n, part);
            }
        }
        set
    }

    pub fn of_text(text: &str) -> Self {
        let mut set = Self::default();
        set.add_text(text);
        set
    }

    pub fn add_text(&mut self, text: &str) {
        self.add_at(text, 0, 0);
    }

    fn add_at(&mut self, text: &str, message: usize, part: usize) {
        for fact in extract(text) {
            let at = fact.text.as_ptr() as usize - text.as_ptr() as usize;
            self.add_found(fact.text, fact.kind, message, part, at);
        }
    }

    fn add_found(&mut self, text: &str, kind: Kind, message: usize, part: usize, at: usize) {
        if self.seen.contains(text) {
            return;
        }
        self.seen.insert(text.to_owned());
        self.facts.push((kind, text.to_owned()));
        self.origins.push(Origin {
            message: u32::try_from(message).unwrap_or(u32::MAX),
            part: u32::try_from(part).unwrap_or(u32::MAX),
            at: u32::try_from(at).unwrap_or(u32::MAX),
        });
    }

    /// Each of `missing` (identifiers of this set) with the statement of `messages`
    /// (the ones this set was made of) it was first said in: for the first `limit` of
    /// them no longer than [`MissingFact::MAX_VALUE_CHARS`], the ones a second attempt
    /// can list; the rest with none, so that a log dump's 100,000 missing identifiers
    /// cost no search. Each message's text is read once, and around each identifier
    /// only a bounded window of it.
    pub fn said_in(
        &self,
        messages: &[Message],
        missing: &[String],
        limit: usize,
    ) -> Vec<MissingFact> {
        let index: HashMap<&str, usize> = (self.facts.iter().enumerate())
            .map(|(n, (_, text))| (text.as_str(), n))
            .collect();
        let mut texts: HashMap<(u32, u32), Option<String>> = HashMap::new();
        let mut found = 0;
        missing
            .iter()
            .map(|value| {
                let wanted = found < limit && value.chars().count() <= MissingFact::MAX_VALUE_CHARS;
                let said = wanted
                    .then(|| index.get(value.as_str()).and_then(|&n| self.origins.get(n)))
                    .flatten()
                    .and_then(|o| {
                        let text = texts.entry((o.message, o.part)).or_insert_with(|| {
                            let m = messages.get(o.message as usize)?;
                            message_texts(m).nth(o.part as usize)
                        });
                        let text = text.as_deref()?;
                        Some(statements::around(
                            text,
                            o.at as usize,
                            MissingFact::MAX_SAID_CHARS,
                        ))
                    })
                    .unwrap_or_default();
                found += usize::from(wanted);
                MissingFact {
                    value: value.clone(),
                    said,
                }
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.facts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }

    pub fn contains(&self, text: &str) -> bool {
        self.seen.contains(text)
    }

    /// The facts, in order of first appearance.
    pub fn iter(&self) -> impl Iterator<Item = (Kind, &str)> {
        self.facts.iter().map(|(kind, text)| (*kind, text.as_str()))
    }

    /// How many of these facts `summary` carries, how many inside its statements (not in
    /// a list of identifiers: see [`stated_text`]), and which it does not state.
    pub fn recall(&self, summary: &str) -> Recall {
        let carried = Carried::of(summary);
        let stated_text = stated_text(summary);
        let stated = Carried::of(&stated_text);
        let mut kept = 0;
        let mut missing = Vec::new();
        for (_, text) in self.iter() {
            if stated.holds(text) {
                kept += 1;
            } else {
                kept += usize::from(carried.holds(text));
                missing.push(text.to_owned());
            }
        }
        Recall {
            total: self.len(),
            kept,
            stated: self.len() - missing.len(),
            missing,
        }
    }
}

/// A text, ready to be asked whether it carries an identifier.
struct Carried<'a> {
    text: &'a str,
    facts: FactSet,
    grams: Grams,
}

impl<'a> Carried<'a> {
    fn of(text: &'a str) -> Self {
        Self {
            text,
            facts: FactSet::of_text(text),
            grams: Grams::of(text),
        }
    }

    fn holds(&self, fact: &str) -> bool {
        self.facts.contains(fact) || (self.grams.may_hold(fact) && contains_word(self.text, fact))
    }
}

/// The 4-byte windows of a text, hashed into a 64 Kibit set: a prefilter for
/// [`contains_word`]. A needle with a window the text lacks cannot occur in it, which a few
/// lookups tell, where a search reads the whole text: the facts of a 5 MB log dump,
/// searched one by one against a full summary, took a third of a second (docs/
/// benchmarks.md, "Figures behind the code"). A hash collision only lets
/// a needle through to the search, so the answer is exactly the search's.
struct Grams(Vec<u64>);

impl Grams {
    const BITS: u32 = 16;

    fn of(text: &str) -> Self {
        let mut bits = vec![0u64; (1 << Self::BITS) / 64];
        for window in text.as_bytes().windows(4) {
            let i = Self::index(window);
            bits[i / 64] |= 1 << (i % 64);
        }
        Self(bits)
    }

    fn index(window: &[u8]) -> usize {
        let gram = u32::from_le_bytes([window[0], window[1], window[2], window[3]]);
        // Fibonacci hashing: the top bits of a multiplication by 2^32 / phi.
        (gram.wrapping_mul(0x9E37_79B9) >> (32 - Self::BITS)) as usize
    }

    /// False only when `needle` cannot occur in the text.
    fn may_hold(&self, needle: &str) -> bool {
        needle.as_bytes().windows(4).all(|window| {
            let i = Self::index(window);
            self.0[i / 64] & (1 << (i % 64)) != 0
        })
    }
}

/// What a summary kept of the facts it replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recall {
    pub total: usize,
    /// The facts it carries anywhere, a list of identifiers included ...
    pub kept: usize,
    /// ... and those it carries inside a statement: the ones it keeps in a form a reader
    /// can use.
    pub stated: usize,
    /// The facts it does not state (lacks, or only lists), in order of first appearance.
    pub missing: Vec<String>,
}

impl Recall {
    /// `stated / total`, what the fact check holds a summary to; 1 when there was
    /// nothing to keep.
    pub fn ratio(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.stated as f64 / self.total as f64
        }
    }
}

/// Whether `needle` occurs in `haystack` as a whole identifier: not inside a longer
/// word or number (`500` is not in `5000`, `pg-1` is not in `pg-10`), though a plural
/// or unit may follow a number (`502` is in `502s`).
pub fn contains_word(haystack: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let ends_in_digit = needle.ends_with(|c: char| c.is_ascii_digit());
    haystack.match_indices(needle).any(|(at, _)| {
        let before = haystack[..at].chars().next_back();
        let after = haystack[at + needle.len()..].chars().next();
        let free_before = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let free_after = after.is_none_or(|c| {
            if ends_in_digit {
                !c.is_ascii_digit()
            } else {
                !(c.is_alphanumeric() || c == '_')
            }
        });
        free_before && free_after
    })
}

#[cfg(test)]
mod tests;
