//! The old part cut into units (a sentence of the human or the agent, a line of tool
//! output, a bullet of an earlier summary), each with the identifiers it holds, and a
//! weight per identifier that says how much it matters.
//!
//! Weights come from where an identifier is seen, not from what it is:
//! - said by the human or the agent, or kept by an earlier summary: +4 (someone thought
//!   it worth writing);
//! - +1 for each further message that mentions it, up to 3 (the investigation came
//!   back to it);
//! - on a line or in a sentence with an error word: +1;
//! - in a tool line an earlier summary kept (`name → line`): +1, which is all that an
//!   identifier seen only in tool output gets for having been kept: noise, once chosen,
//!   must not become a fact by being carried;
//! - +1 when seen anywhere but a templated tool line. A tool line is templated when its
//!   shape (digits aside) repeats three times or more in the old part: log and metric
//!   noise, whose timestamps and counters would otherwise crowd out every fact.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

use crate::facts;
use crate::message::{Message, Role};
use crate::summary::{CURRENT_STATE, INVESTIGATING, KEY_FINDINGS, RULED_OUT};

/// A unit is shown by its first this many characters: a finding is a line, not a paste.
pub(super) const MAX_UNIT_CHARS: usize = 300;

/// A line or sentence is read for identifiers up to this many characters (those past the
/// shown part can still be carried in "Also noted"); it bounds the work one huge line (a
/// minified JSON dump) can cost.
pub(super) const MAX_SCAN_CHARS: usize = 4_000;

/// A unit shorter than this carries no finding worth a bullet.
const MIN_UNIT_CHARS: usize = 12;

/// What being said by the human or the agent adds to an identifier's weight: the
/// strongest sign that it matters.
pub(super) const SAID: u32 = 4;

/// Each message past the first that mentions an identifier adds 1, up to this.
const REPEATS: u32 = 3;

/// Between a tool's name and a line of its output, in a finding.
pub(super) const TOOL_ARROW: &str = "→";

/// A tool line whose shape repeats this often is noise (see the module doc).
const TEMPLATED: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// An earlier summary's bullet or ruled-out item.
    Earlier,
    /// An earlier summary's bullet that quotes a tool's output (`name → line`).
    EarlierTool,
    Human,
    Agent,
    /// A tool call the agent made, as `called <name> <arguments>`.
    Call,
    Tool,
}

#[derive(Clone, Debug)]
pub(super) struct Unit {
    pub text: String,
    pub ids: Vec<u32>,
    /// It rules something out (see [`rules_out`]).
    pub negation: bool,
    /// Not from an earlier summary.
    pub new: bool,
    /// A tool call (`called <name> <arguments>`): what was asked says less than what
    /// came back, so calls only fill room nothing else wants.
    pub call: bool,
    /// A line of tool output, now or in an earlier summary.
    pub quotes_tool: bool,
}

/// What an identifier's mention implies: the identifiers inside it
/// (`2026-04-02T15:32:10Z` holds `15:32:10`), covered with it.
pub(super) type Parts = Vec<Vec<u32>>;

/// A unit before its identifiers are weighed.
struct Raw {
    text: String,
    source: Source,
    message: usize,
    /// An earlier summary's "Also noted" list: its identifiers are carried, but it is
    /// not a unit (it would be a second list).
    listed: bool,
}

impl Raw {
    fn unit(text: String, source: Source, message: usize) -> Self {
        Self {
            text,
            source,
            message,
            listed: false,
        }
    }
}

impl Unit {
    pub fn chars(&self) -> usize {
        self.text.chars().count()
    }
}

/// The units of an old part, its identifiers and what an earlier summary in it said.
#[derive(Debug, Default)]
pub(super) struct Collected {
    pub units: Vec<Unit>,
    /// Each identifier's text, by id.
    pub ids: Vec<String>,
    /// Each identifier's weight, by id.
    pub weights: Vec<u32>,
    /// Each identifier's id, by text.
    pub index: HashMap<String, u32>,
    /// By id, the identifiers inside it.
    pub parts: Parts,
    /// By id, whether the human or the agent wrote it (or an earlier summary said so).
    pub said: Vec<bool>,
    /// The earlier summary's "Investigating" line.
    pub earlier_investigating: Option<String>,
    /// The earlier summary's "Current state" line.
    pub earlier_state: Option<String>,
}

#[derive(Clone, Copy, Default)]
struct Seen {
    said: bool,
    signal: bool,
    untemplated: bool,
    /// In a tool line an earlier summary kept.
    carried: bool,
    messages: u32,
    last_message: Option<usize>,
}

pub(super) fn collect(old: &[Message]) -> Collected {
    let mut collected = Collected::default();
    let mut raw: Vec<Raw> = Vec::new();
    let mut call_names: HashMap<String, String> = HashMap::new();
    for (index, m) in old.iter().enumerate() {
        match (m.role, m.is_summary) {
            (Role::User, true) => earlier(&m.content, index, &mut raw, &mut collected),
            (Role::User, false) => {
                raw.extend(sentences(&m.content).map(|s| Raw::unit(s, Source::Human, index)));
            }
            (Role::Assistant, _) => {
                raw.extend(sentences(&m.content).map(|s| Raw::unit(s, Source::Agent, index)));
                raw.extend(calls(m).map(|s| Raw::unit(s, Source::Call, index)));
                for call in m.calls().iter() {
                    if let (Some(id), Some(name)) = (crate::message::call_id(call), call_name(call))
                    {
                        call_names.insert(id.to_owned(), name.to_owned());
                    }
                }
            }
            (Role::Tool, _) => {
                // Each line under the name of the tool that printed it (`query_logs →
                // ...`): the agent reading the summary learns where it came from, and a
                // later compaction tells it from what was said.
                let tool = (m.tool_call_id.as_ref())
                    .and_then(|id| call_names.get(id))
                    .map_or("tool", String::as_str);
                raw.extend(
                    (m.content.lines())
                        .map(|line| one_line(line, MAX_SCAN_CHARS))
                        .filter(|line| line.chars().count() >= MIN_UNIT_CHARS)
                        .map(|line| {
                            Raw::unit(format!("{tool} {TOOL_ARROW} {line}"), Source::Tool, index)
                        }),
                );
            }
            (Role::System, _) => {}
        }
    }
    raw.retain(|r| r.listed || r.text.chars().count() >= MIN_UNIT_CHARS);

    let shapes = count_shapes((raw.iter().filter(|r| r.source == Source::Tool)).map(|r| &r.text));
    let mut index = std::mem::take(&mut collected.index);
    let mut seen: Vec<Seen> = Vec::new();
    for Raw {
        text,
        source,
        message,
        listed,
    } in raw
    {
        let signal = has_signal(&text);
        let templated = source == Source::Tool && shapes[&shape(&text)] >= TEMPLATED;
        // The part shown; identifiers past it are weighed but not covered by the unit.
        let shown = if listed {
            text.len()
        } else {
            clip_words(&text, MAX_UNIT_CHARS).len()
        };
        let mut ids = Vec::new();
        let mut outer: Option<(u32, usize)> = None;
        for fact in facts::extract(&text) {
            let start = fact.text.as_ptr() as usize - text.as_ptr() as usize;
            let end = start + fact.text.len();
            let id = match index.entry(fact.text.to_owned()) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    let id = u32::try_from(collected.ids.len()).unwrap_or(u32::MAX);
                    collected.ids.push(fact.text.to_owned());
                    collected.parts.push(Vec::new());
                    seen.push(Seen::default());
                    *e.insert(id)
                }
            };
            // `extract` gives a composite identifier just before its parts.
            match outer {
                Some((outer_id, outer_end)) if end <= outer_end && outer_id != id => {
                    if !collected.parts[outer_id as usize].contains(&id) {
                        collected.parts[outer_id as usize].push(id);
                    }
                }
                _ => outer = Some((id, end)),
            }
            let s = &mut seen[id as usize];
            s.said |= matches!(source, Source::Human | Source::Agent | Source::Earlier);
            s.carried |= source == Source::EarlierTool;
            s.signal |= signal;
            s.untemplated |= !templated;
            if s.last_message != Some(message) {
                s.messages += 1;
                s.last_message = Some(message);
            }
            if end <= shown && !ids.contains(&id) {
                ids.push(id);
            }
        }
        if listed {
            continue;
        }
        let negation =
            matches!(source, Source::Human | Source::Agent | Source::Earlier) && rules_out(&text);
        let mut text = text;
        text.truncate(shown);
        collected.units.push(Unit {
            text,
            ids,
            negation,
            new: !matches!(source, Source::Earlier | Source::EarlierTool),
            call: source == Source::Call,
            quotes_tool: matches!(source, Source::Tool | Source::EarlierTool),
        });
    }
    // A tool line does not cover what the human or the agent said: that must be kept
    // where a later compaction still sees it as said (a sentence, the "Also noted"
    // list), or a fact the agent stressed would be carried as tool output and weigh
    // less at each compaction until it is dropped.
    for unit in collected.units.iter_mut().filter(|u| u.quotes_tool) {
        unit.ids.retain(|&id| !seen[id as usize].said);
    }
    collected.index = index;
    collected.said = seen.iter().map(|s| s.said).collect();
    collected.weights = seen
        .iter()
        .map(|s| {
            u32::from(s.untemplated)
                + SAID * u32::from(s.said)
                + s.messages.saturating_sub(1).min(REPEATS)
                + u32::from(s.signal)
                + u32::from(s.carried)
        })
        .collect();
    collected
}

/// An earlier summary's sections: its bullets and ruled-out items become units, so
/// that its facts compete with the new ones on equal terms.
fn earlier(summary: &str, index: usize, raw: &mut Vec<Raw>, collected: &mut Collected) {
    let mut in_findings = false;
    for line in summary.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix(INVESTIGATING) {
            collected.earlier_investigating = Some(rest.trim().to_owned());
        } else if line.starts_with(KEY_FINDINGS) {
            in_findings = true;
        } else if let Some(rest) = line.strip_prefix(RULED_OUT) {
            in_findings = false;
            raw.extend(
                (rest.split("; "))
                    .map(|item| one_line(item, MAX_SCAN_CHARS))
                    .filter(|item| !item.eq_ignore_ascii_case(super::NOTHING_RULED_OUT))
                    .map(|item| Raw::unit(item, Source::Earlier, index)),
            );
        } else if let Some(rest) = line.strip_prefix(CURRENT_STATE) {
            in_findings = false;
            collected.earlier_state = Some(rest.trim().to_owned());
            // Replaced by the new state, but what it says may still matter.
            raw.extend(sentences(rest).map(|s| Raw::unit(s, Source::Earlier, index)));
        } else if in_findings && let Some(list) = line.strip_prefix(super::ALSO_NOTED) {
            // Not cut to a unit's length: every identifier of the list is carried.
            raw.push(Raw {
                listed: true,
                ..Raw::unit(list.to_owned(), Source::Earlier, index)
            });
        } else if in_findings && let Some(list) = line.strip_prefix(super::ALSO_IN_TOOLS) {
            raw.push(Raw {
                listed: true,
                ..Raw::unit(list.to_owned(), Source::EarlierTool, index)
            });
        } else if in_findings && let Some(bullet) = line.strip_prefix("- ") {
            let source = match bullet.split_once(TOOL_ARROW) {
                Some((tool, _)) if !tool.trim().is_empty() && !tool.trim().contains(' ') => {
                    Source::EarlierTool
                }
                _ => Source::Earlier,
            };
            raw.push(Raw::unit(one_line(bullet, MAX_SCAN_CHARS), source, index));
        }
    }
}

/// A tool call as one line: `query_logs {"service":"checkout-api"}`.
fn calls(m: &Message) -> impl Iterator<Item = String> + '_ {
    m.calls().into_owned().into_iter().filter_map(|call| {
        let name = call_name(&call)?.to_owned();
        let args = facts::call_arguments(&call).unwrap_or_default();
        Some(one_line(&format!("called {name} {args}"), MAX_SCAN_CHARS))
    })
}

/// A tool call's name, in each stored shape.
fn call_name(call: &Value) -> Option<&str> {
    call.get("name")
        .or_else(|| call.get("function").and_then(|f| f.get("name")))
        .and_then(Value::as_str)
}

/// How often each tool line's shape occurs.
fn count_shapes<'a>(lines: impl Iterator<Item = &'a String>) -> HashMap<u64, u32> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(shape(line)).or_insert(0) += 1;
    }
    counts
}

/// A line with every run of digits made one: log lines of one template share it.
fn shape(line: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    let mut in_digits = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                '#'.hash(&mut hasher);
            }
            in_digits = true;
        } else {
            c.hash(&mut hasher);
            in_digits = false;
        }
    }
    hasher.finish()
}

/// Sentences, each on one line: a line of text is cut after `. `, `? ` and `! `.
pub(super) fn sentences(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .flat_map(split_sentences)
        .map(|s| one_line(s, MAX_SCAN_CHARS))
}

fn split_sentences(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        if rest.trim().is_empty() {
            return None;
        }
        let end = rest
            .match_indices([' ', '\t'])
            .find(|(at, _)| rest[..*at].ends_with(['.', '?', '!']))
            .map_or(rest.len(), |(at, _)| at);
        let (sentence, after) = rest.split_at(end);
        rest = after;
        Some(sentence)
    })
    .filter(|s| !s.trim().is_empty())
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

/// Whitespace collapsed to single spaces, at most `max_chars` characters (whole words
/// where it can): the rest of the text is not even read.
pub(super) fn one_line(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut room = max_chars;
    for word in text.split_whitespace() {
        let needed = word.chars().count() + usize::from(!out.is_empty());
        if needed > room {
            if out.is_empty() {
                // One word longer than a unit: its start.
                out.extend(word.chars().take(room));
            }
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        room -= needed;
    }
    out
}

const NEGATIONS: [&str; 9] = [
    "ruled out",
    "no sign of",
    "not the cause",
    "unrelated",
    "no errors",
    "looks normal",
    "is fine",
    "are fine",
    "nominal",
];

/// Whether a sentence rules something out: "not", "n't", "healthy" as words, or one of
/// [`NEGATIONS`].
pub(super) fn rules_out(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    NEGATIONS.iter().any(|n| lower.contains(n))
        || lower
            .split(|c: char| !(c.is_alphanumeric() || c == '\''))
            .any(|word| word == "not" || word == "healthy" || word.ends_with("n't"))
}

const SIGNALS: [&str; 14] = [
    "error",
    "fail",
    "fatal",
    "exception",
    "timeout",
    "timed out",
    "refused",
    "denied",
    "panic",
    "oom",
    "killed",
    "expired",
    "exceeded",
    "unreachable",
];

fn has_signal(text: &str) -> bool {
    let lower = text.to_lowercase();
    SIGNALS.iter().any(|s| lower.contains(s))
}
