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
//! - in a statement an earlier summary kept: +2 more (it was judged a finding before);
//! - in a tool line an earlier summary kept (`name → line`): +1, which is all that an
//!   identifier seen only in tool output gets for having been kept: noise, once chosen,
//!   must not become a fact by being carried;
//! - +1 when seen anywhere but a templated tool line. A tool line is templated when its
//!   shape (digits aside) repeats three times or more in the old part: log and metric
//!   noise, whose timestamps and counters would otherwise crowd out every fact.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::clauses;
use super::task::{self, Task};
use crate::facts;
use crate::message::{Message, Role, ToolCall};
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

/// What an earlier summary's keeping it in a statement adds: it was judged a finding
/// before, and a new sentence must say more to displace it.
const KEPT: u32 = 2;

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
    /// A statement of the human's or the agent's, or an earlier summary's: what the
    /// investigation concluded, as opposed to what a tool printed.
    pub said: bool,
    /// A line of tool output, now or in an earlier summary.
    pub quotes_tool: bool,
    /// Never a finding: a question (it asks, it states nothing), a tool call (what was
    /// asked says less than what came back), or a tool line that says all is well, is
    /// templated noise without an error word, or is a fragment (a JSON field, a word or
    /// two) rather than a line that says something.
    pub unfit: bool,
    /// The compact form ([`clauses::compact`]) of the statement before it: the same
    /// identifiers in fewer characters, for when the whole one does not fit.
    pub compact: bool,
    /// The unit's place in the old part (a compact form shares its statement's):
    /// findings are shown in this order.
    pub origin: usize,
    /// The task state it records, told by its wording ([`task::classify`]); an earlier
    /// summary's "Current state" bullet is task state whatever its wording.
    pub task: Option<Task>,
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
    /// A bullet of an earlier summary's "Current state": task state it kept.
    task_state: bool,
}

impl Raw {
    fn unit(text: String, source: Source, message: usize) -> Self {
        Self {
            text,
            source,
            message,
            listed: false,
            task_state: false,
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
    /// By id, for a setting with its value (`max_pool=103`, `maxReplicas: 30`), its key.
    pub keys: Vec<Option<String>>,
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
    /// In a statement an earlier summary kept.
    kept: bool,
    messages: u32,
    last_message: Option<usize>,
}

pub(super) fn collect(old: &[Message]) -> Collected {
    let mut collected = Collected::default();
    let mut raw: Vec<Raw> = Vec::new();
    let mut call_names: HashMap<String, String> = HashMap::new();
    for (index, m) in old.iter().enumerate() {
        match (m.role, m.is_summary) {
            (Role::User, true) => earlier(
                &crate::summary::strip_ours(&m.content),
                index,
                &mut raw,
                &mut collected,
            ),
            (Role::User, false) => {
                raw.extend(
                    (statements(&m.content).into_iter())
                        .map(|s| Raw::unit(s, Source::Human, index)),
                );
            }
            (Role::Assistant, _) => {
                raw.extend(
                    (statements(&m.content).into_iter())
                        .map(|s| Raw::unit(s, Source::Agent, index)),
                );
                raw.extend(calls(m).map(|s| Raw::unit(s, Source::Call, index)));
                for call in m.calls().iter().map(ToolCall) {
                    if let (Some(id), Some(name)) = (call.id(), call.name()) {
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
        task_state,
    } in raw
    {
        let signal = has_signal(&text);
        let templated = source == Source::Tool && shapes[&shape(&text)] >= TEMPLATED;
        let said = matches!(source, Source::Human | Source::Agent | Source::Earlier);
        let mut spans: Vec<((usize, usize), u32)> = Vec::new();
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
                    collected.keys.push(setting_key(fact));
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
            s.said |= said;
            s.carried |= source == Source::EarlierTool;
            s.kept |= source == Source::Earlier;
            s.signal |= signal;
            s.untemplated |= !templated;
            if s.last_message != Some(message) {
                s.messages += 1;
                s.last_message = Some(message);
            }
            spans.push(((start, end), id));
        }
        if listed {
            continue;
        }
        let unfit = match source {
            Source::Human => asks(&text),
            Source::Agent | Source::Earlier => text.trim_end().ends_with('?'),
            Source::Call => true,
            // A tool line is a finding only when it shows something wrong (an error
            // word) that nobody stated (its identifiers said elsewhere are not its to
            // cover, below), and never when it is log noise or not a sentence.
            Source::Tool => {
                !signal
                    || templated
                    || rules_out(&text)
                    || looks_healthy(&text)
                    || fragment(&text)
                    || header(&text)
            }
            Source::EarlierTool => false,
        };
        // A list of identifiers is no finding, whoever wrote it.
        let unfit = unfit || facts::is_list(&text);
        let negation = said && !unfit && rules_out(&text);
        let ranges: Vec<(usize, usize)> = spans.iter().map(|&(span, _)| span).collect();
        // What is shown: a statement shortened by whole clauses, a tool line by words.
        let shown = if said {
            clauses::within(&text, &ranges, MAX_UNIT_CHARS)
        } else {
            let head = clauses::clip_words(&text, MAX_UNIT_CHARS);
            clauses::Shortened {
                text: if head.len() < text.len() {
                    format!("{head}…")
                } else {
                    head.to_owned()
                },
                kept: vec![(0, head.len())],
            }
        };
        let ids_in = |form: &clauses::Shortened| -> Vec<u32> {
            let mut ids = Vec::new();
            for &(span, id) in &spans {
                if form.keeps(span) && !ids.contains(&id) {
                    ids.push(id);
                }
            }
            ids
        };
        let origin = collected.units.len();
        let task = (said && !unfit)
            .then(|| task::classify(&text).or(task_state.then_some(Task::Action)))
            .flatten();
        let compact = (said && !unfit)
            .then(|| clauses::compact(&text, &ranges))
            .flatten()
            .filter(|c| {
                let chars = c.text.chars().count();
                chars <= MAX_UNIT_CHARS && chars * 5 <= shown.text.chars().count() * 4
            });
        let unit = Unit {
            ids: ids_in(&shown),
            text: shown.text,
            negation,
            new: !matches!(source, Source::Earlier | Source::EarlierTool),
            said,
            quotes_tool: matches!(source, Source::Tool | Source::EarlierTool),
            unfit,
            compact: false,
            origin,
            task,
        };
        if let Some(short) = compact {
            let compact = Unit {
                ids: ids_in(&short),
                text: short.text,
                compact: true,
                negation: false,
                ..unit.clone()
            };
            collected.units.push(unit);
            collected.units.push(compact);
        } else {
            collected.units.push(unit);
        }
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
                + KEPT * u32::from(s.kept)
        })
        .collect();
    collected
}

/// What sharing a word with the request's instructions adds to the weight of each
/// identifier in a unit: more than being said ([`SAID`]), so that a finding on the focus
/// asked for displaces one that is not.
pub(super) const FOCUS: u32 = 2 * SAID;

/// Words too common to tell a focus: an instruction's own verbs and fillers.
const NOT_A_FOCUS: &[&str] = &[
    "about", "and", "are", "but", "focus", "for", "from", "into", "keep", "mention", "more", "not",
    "note", "only", "please", "summary", "that", "the", "their", "this", "what", "when", "which",
    "with",
];

/// Weighs the findings that share a word with `instructions` (a forced compaction's
/// focus): each identifier of a unit that holds one of its words (3 chars or more,
/// case-insensitive, whole words, common ones aside) gains [`FOCUS`]. A unit without an
/// identifier gains nothing, as it weighs nothing to begin with.
pub(super) fn focus(collected: &mut Collected, instructions: &str) {
    let wanted: std::collections::HashSet<String> = words(instructions)
        .filter(|w| !NOT_A_FOCUS.contains(&w.as_str()))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let mut focused = vec![false; collected.weights.len()];
    for unit in collected.units.iter().filter(|u| !u.ids.is_empty()) {
        if words(&unit.text).any(|w| wanted.contains(&w)) {
            for &id in &unit.ids {
                focused[id as usize] = true;
            }
        }
    }
    for (weight, _) in (collected.weights.iter_mut())
        .zip(focused)
        .filter(|(_, f)| *f)
    {
        *weight += FOCUS;
    }
}

/// The lowercase words of `text` of 3 chars or more: runs of letters, digits, `-`, `_`.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
        .map(|w| w.trim_matches(|c| c == '-' || c == '_'))
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
}

/// An earlier summary's sections: its bullets and ruled-out items become units, so
/// that its facts compete with the new ones on equal terms.
fn earlier(summary: &str, index: usize, raw: &mut Vec<Raw>, collected: &mut Collected) {
    let mut in_findings = false;
    let mut in_state = false;
    for line in summary.lines().map(str::trim) {
        if in_state {
            match line.strip_prefix("- ") {
                Some(bullet) => {
                    raw.push(Raw {
                        task_state: true,
                        ..Raw::unit(
                            one_line(facts::strip_marker(bullet), MAX_SCAN_CHARS),
                            Source::Earlier,
                            index,
                        )
                    });
                    continue;
                }
                // What follows the bullets (a part of the worker's, a note) is not
                // task state.
                None if !line.is_empty() => in_state = false,
                None => continue,
            }
        }
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
            in_state = true;
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
            raw.push(Raw::unit(
                one_line(facts::strip_marker(bullet), MAX_SCAN_CHARS),
                source,
                index,
            ));
        }
    }
}

/// A tool call as one line: `query_logs {"service":"checkout-api"}`.
fn calls(m: &Message) -> impl Iterator<Item = String> + '_ {
    let lines: Vec<String> = (m.calls().iter().map(ToolCall))
        .filter_map(|call| {
            let name = call.name()?;
            let args = call.arguments().unwrap_or_default();
            Some(one_line(&format!("called {name} {args}"), MAX_SCAN_CHARS))
        })
        .collect();
    lines.into_iter()
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

/// The statements of a human's or an agent's message: its sentences, each without the
/// list marker or bold label it may start with (`- `, `1. `, `**Cause:**`).
fn statements(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut after_question = false;
    for sentence in sentences(text) {
        let sentence = without_opener(facts::strip_marker(&sentence));
        if sentence.is_empty() {
            continue;
        }
        // "What about the database? It was upgraded to v15.4.2 yesterday.": the answer
        // needs its question to say what "it" is.
        let question = sentence.ends_with('?');
        match out.last_mut() {
            Some(last) if after_question && !question && starts_with_pronoun(sentence) => {
                last.push(' ');
                last.push_str(sentence);
            }
            _ => out.push(sentence.to_owned()),
        }
        after_question = question;
    }
    out
}

fn starts_with_pronoun(sentence: &str) -> bool {
    let first = sentence.split_whitespace().next().unwrap_or_default();
    matches!(
        first,
        "It" | "They" | "This" | "That" | "These" | "Those" | "He" | "She" | "Its" | "Their"
    )
}

/// A tool line that is not a sentence a reader can take in: a JSON value or field
/// (`"start_line": 7,`), a table row (`| a | b |`), a line of code or of a diff, the
/// tool's own preamble (`query_logs: 500 of 61,204 matching lines`), or fewer than two
/// words of letters.
fn fragment(unit: &str) -> bool {
    let (tool, line) = unit.split_once(TOOL_ARROW).unwrap_or(("", unit));
    let line = line.trim();
    let tool = tool.trim();
    if line.starts_with(['"', '{', '}', '[', ']', '|', '+', '@'])
        || line.matches('|').count() >= 2
        || line.ends_with(['{', '}', '('])
        || (line.ends_with(';') && code_statement(line))
        || line.contains(" { ")
        || (!tool.is_empty() && line.starts_with(tool))
    {
        return true;
    }
    let words = line
        .split_whitespace()
        .filter(|w| w.len() >= 2 && w.chars().all(|c| c.is_alphabetic()))
        .count();
    words < 2
}

/// Whether a line that ends in `;` is a statement of code (`x = 5;`, `import a.b;`,
/// `throw new PoolError("pool exhausted for " + tenant);`) rather than a log line that
/// happens to end in one: code ends in a call or a literal, assigns, or has fewer than
/// four words of letters.
fn code_statement(line: &str) -> bool {
    let body = line.trim_end_matches(';').trim_end();
    let words = (line.split_whitespace())
        .filter(|w| {
            let w = w.trim_end_matches([',', ';', '.', ':']);
            w.len() >= 2 && w.chars().all(char::is_alphabetic)
        })
        .count();
    body.ends_with([')', ']', '"', '\''])
        || [" = ", " += ", "(\"", "\" + "]
            .iter()
            .any(|m| line.contains(m))
        || words < 4
}

/// A setting's key (`max_pool` of `max_pool=103`), lower-cased; `None` for another
/// kind of identifier.
fn setting_key(fact: facts::Fact<'_>) -> Option<String> {
    if fact.kind != facts::Kind::Setting {
        return None;
    }
    let key = fact.text.split(['=', ':']).next()?.trim();
    (!key.is_empty()).then(|| key.to_lowercase())
}

/// The byte ranges of the identifiers in `text`.
pub(super) fn spans(text: &str) -> Vec<(usize, usize)> {
    (facts::extract(text).iter())
        .map(|fact| {
            let start = fact.text.as_ptr() as usize - text.as_ptr() as usize;
            (start, start + fact.text.len())
        })
        .collect()
}

/// The part of a sentence that rules something out: its first clause and the clauses
/// with a negation ("The replica is not overloaded (cpu 41%, lag 0.3s)" of a sentence
/// that goes on to what did break).
pub(super) fn negation_part(sentence: &str) -> String {
    let ids = spans(sentence);
    let all = clauses::clauses(sentence, &ids);
    let keep: Vec<bool> = (all.iter().enumerate())
        .map(|(n, &(s, e))| n == 0 || rules_out(&sentence[s..e]))
        .collect();
    if keep.iter().all(|&k| k) {
        return sentence.to_owned();
    }
    clauses::assemble(sentence, &all, &keep).text
}

/// Words a human's request starts with: "Check orders-db." asks for something and
/// states nothing.
const REQUESTS: [&str; 24] = [
    "check",
    "look",
    "find",
    "dig",
    "investigate",
    "pull",
    "show",
    "tell",
    "give",
    "draft",
    "write",
    "roll",
    "run",
    "try",
    "please",
    "go",
    "make",
    "open",
    "send",
    "compare",
    "confirm",
    "verify",
    "get",
    "set",
];

/// Whether a sentence of the human's asks rather than states: a question, or a request.
fn asks(sentence: &str) -> bool {
    let first = (sentence.split_whitespace().next())
        .map(|w| w.trim_end_matches([',', ':', '.']).to_lowercase())
        .unwrap_or_default();
    sentence.trim_end().ends_with('?') || REQUESTS.contains(&first.as_str())
}

/// Openers that answer the last question and state nothing themselves: "Yes: the
/// rollout ..." is the rollout.
const OPENERS: [&str; 7] = ["yes", "no", "ok", "okay", "right", "found it", "confirmed"];

/// `sentence` without an opener ([`OPENERS`]) and the `:` or `,` after it.
fn without_opener(sentence: &str) -> &str {
    for opener in OPENERS {
        if let Some(head) = sentence.get(..opener.len())
            && head.eq_ignore_ascii_case(opener)
            && let Some(rest) = sentence[opener.len()..].strip_prefix([':', ','])
        {
            return rest.trim_start();
        }
    }
    sentence
}

/// A table's header line: no digits, and most of its words are column names (in
/// capitals, `CamelCase`, `camelCase` or `snake_case`): `NAME READY STATUS`,
/// `EventTime EventSource ErrorCode`.
fn header(unit: &str) -> bool {
    let line = unit.split_once(TOOL_ARROW).map_or(unit, |(_, line)| line);
    if line.contains(|c: char| c.is_ascii_digit()) {
        return false;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let names = (words.iter())
        .filter(|w| {
            let inner_capital = w.chars().skip(1).any(char::is_uppercase);
            w.len() >= 2 && (inner_capital || w.contains('_'))
        })
        .count();
    words.len() >= 3 && names * 5 >= words.len() * 3
}

/// Sentences, each on one line ([`facts::sentences_of`]).
pub(super) fn sentences(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .flat_map(facts::sentences_of)
        .map(|s| one_line(s, MAX_SCAN_CHARS))
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

/// Whether a sentence rules something out: "not" or "n't" as words, "healthy" said of
/// something ("the replica is healthy", not "a healthy renewal"), or one of
/// [`NEGATIONS`].
pub(super) fn rules_out(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    if NEGATIONS.iter().any(|n| lower.contains(n)) {
        return true;
    }
    let words: Vec<&str> = (lower.split(|c: char| !(c.is_alphanumeric() || c == '\'')))
        .filter(|w| !w.is_empty())
        .collect();
    words.iter().enumerate().any(|(n, &word)| {
        word == "not"
            || word.ends_with("n't")
            || (word == "healthy"
                && words[n.saturating_sub(2)..n].iter().any(|w| {
                    matches!(
                        *w,
                        "is" | "are"
                            | "was"
                            | "were"
                            | "looks"
                            | "look"
                            | "seems"
                            | "stays"
                            | "remains"
                            | "all"
                            | "back"
                    )
                }))
    })
}

/// Whether a tool line reports that all is well: a level of INFO or DEBUG, or OK or
/// healthy, with no error word.
fn looks_healthy(line: &str) -> bool {
    if has_signal(line) {
        return false;
    }
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| matches!(word, "INFO" | "DEBUG" | "OK" | "healthy"))
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
