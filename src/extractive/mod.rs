//! The built-in summarizer: fills the seed's template from the old messages, offline and
//! deterministic, with the investigation's statements: sentences that say what a value
//! is about, never lists of identifiers.
//!
//! - **Investigating:** the first human ask, whole (an earlier summary's, when there is
//!   one, which was the first ask of all).
//! - **Key findings:** statements chosen to cover the most identifier weight per
//!   character not covered yet ([`cover`]; [`units`] says how identifiers are weighed):
//!   what the agent concluded and the human said, and an earlier summary's findings,
//!   each one whole sentence, shortened only by whole clauses ([`clauses`]). Never a
//!   question, a request, a tool call, or a list. A tool line only when it shows
//!   something wrong (an error word) that nobody stated, and never when it repeats a
//!   template (log noise), says all is well, or is not a sentence (a table row, JSON,
//!   code). As findings age they are carried in compact form (the clauses without an
//!   identifier left out) rather than dropped: see [`findings`].
//! - **Ruled out:** the part of each sentence that rules something out ("not", "ruled
//!   out", "no sign of", "is healthy"), from every role and the earlier summary.
//! - **Current state:** the latest exchange's conclusion: the last sentences of the
//!   agent's last answer, whole, which no finding repeats; then the task state, one
//!   bullet each: what the agent did, what was decided, what comes next, told by their
//!   wording ([`task`]) and chosen by [`task_state`]. An earlier summary's bullets are
//!   carried as statements that compete with the new ones.
//!
//! The summary takes at most a quarter of what it replaces (at least [`MIN_BUDGET`]
//! chars, never `SUMMARY_MAX_CHARS` or more). Everything is linear in the old part's
//! size: one pass to cut units, one to weigh, and the bucket queue of [`cover`].

mod clauses;
mod cover;
mod task;
mod units;

use futures_util::future::{BoxFuture, FutureExt};

use crate::facts;
use crate::message::{Message, Role, char_count};
use crate::summarizer::{LlmError, Summarizer, SummaryRequest};
use crate::summary::Summary;
use crate::summary::{CURRENT_STATE, INVESTIGATING, KEY_FINDINGS, RULED_OUT};
use task::Task;
use units::Collected;

#[derive(Clone, Copy, Debug)]
pub struct Extractive {
    /// `SUMMARY_MAX_CHARS`: no summary is longer.
    max_chars: usize,
}

impl Extractive {
    pub fn new(max_chars: usize) -> Self {
        Self { max_chars }
    }
}

/// `SUMMARY_MAX_CHARS`'s default.
impl Default for Extractive {
    fn default() -> Self {
        Self::new(6_000)
    }
}

impl Summarizer for Extractive {
    /// The context and the model are of no use here; the instructions, whoever wrote
    /// them, weigh the findings that share a word with them (see [`units::focus`]). A
    /// second attempt would answer the same (see [`Summarizer::can_do_better`]).
    fn summarize<'a>(
        &'a self,
        request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        // Linear, but the old part may hold megabytes of tool output: on the blocking
        // pool, so that the async threads go on serving other events meanwhile. The copy
        // costs less than the summarizing.
        let old = request.old.to_vec();
        let instructions = request.instructions.map(|i| i.text.clone());
        let max_chars = self.max_chars;
        async move {
            let summarized = tokio::task::spawn_blocking(move || {
                summarize_focused(&old, max_chars, instructions.as_deref())
            });
            match summarized.await {
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
const NO_FINDINGS: &str = "- no specific findings recorded";
const ALSO_NOTED: &str = "- Also noted: ";
const ALSO_IN_TOOLS: &str = "- Also in tool output: ";

/// The summary takes at most `1 / COMPRESSION` of what it replaces...
const COMPRESSION: usize = 4;
/// ... but may take this much of a small old part (still less than all of it).
pub const MIN_BUDGET: usize = 600;

/// What the template's fixed text costs: headings, separators, line breaks.
const SKELETON: usize =
    INVESTIGATING.len() + KEY_FINDINGS.len() + RULED_OUT.len() + CURRENT_STATE.len() + 8;

/// Of the findings' room, the share an earlier summary's statements choose from first
/// (see [`findings`]) ...
const OLD_SHARE: (usize, usize) = (1, 2);
/// ... and the share the new statements may then fill.
const NEW_SHARE: (usize, usize) = (2, 3);

#[cfg(test)]
fn summarize(old: &[Message], max_chars: usize) -> Result<Summary, LlmError> {
    summarize_focused(old, max_chars, None)
}

/// The summary of `old` in at most `max_chars`, its findings weighed towards
/// `instructions` when given.
fn summarize_focused(
    old: &[Message],
    max_chars: usize,
    instructions: Option<&str>,
) -> Result<Summary, LlmError> {
    let input_chars = usize::try_from(old.iter().map(|m| m.chars).sum::<i64>()).unwrap_or(0);
    let budget = (input_chars / COMPRESSION)
        .max(MIN_BUDGET)
        .min(max_chars)
        .min(input_chars.saturating_sub(1));
    let too_small = || {
        LlmError::Invalid(format!(
            "the old part ({input_chars} chars) is too small for the template"
        ))
    };
    if budget < SKELETON + 40 {
        return Err(too_small());
    }
    let mut collected = units::collect(old);
    if let Some(instructions) = instructions {
        units::focus(&mut collected, instructions);
    }
    let mut covered = vec![false; collected.ids.len()];
    let room = budget - SKELETON;

    let investigating = investigating(old, &collected, room / 4);
    cover_text(&investigating, &collected, &mut covered);
    // A sixth of the room, but room for one ordinary sentence in a small summary.
    let state_room = (room / 6).clamp((room / 3).min(200), 600);
    let (state, drawn) = current_state(old, &collected, state_room);
    cover_text(&state, &collected, &mut covered);

    let tasks = task_state(&collected, &drawn, room / 6);
    let mut task_text = String::new();
    for &u in &tasks {
        task_text.push_str("\n- ");
        task_text.push_str(&collected.units[u].text);
    }
    cover_text(&task_text, &collected, &mut covered);
    let stated: Vec<String> = (drawn.iter().cloned())
        .chain(tasks.iter().map(|&u| collected.units[u].text.clone()))
        .collect();

    let ruled_out_text = ruled_out(&collected, &mut covered, room / 8);

    let used = chars(&investigating) + chars(&state) + chars(&task_text) + chars(&ruled_out_text);
    let findings_room = room.saturating_sub(used);
    let mut chosen = findings(&collected, &stated, &mut covered, findings_room);
    let units = &collected.units;
    chosen.sort_unstable_by_key(|&u| units[u].origin);
    let left = findings_room.saturating_sub(
        (chosen.iter())
            .map(|&u| units[u].chars() + cover::OVERHEAD)
            .sum::<usize>(),
    );
    let earlier = earlier_values(&collected, &chosen, &covered, left);
    let mut findings = String::new();
    for &u in &chosen {
        findings.push_str("- ");
        findings.push_str(&units[u].text);
        if let Some(values) = earlier.get(&u) {
            findings.push_str(&format!(" (earlier {})", values.join(", ")));
        }
        findings.push('\n');
    }
    if findings.is_empty() {
        findings = format!("{NO_FINDINGS}\n");
    }

    let text = format!(
        "{INVESTIGATING} {investigating}\n{KEY_FINDINGS}\n{findings}{RULED_OUT} {ruled_out_text}\n{CURRENT_STATE} {state}{task_text}"
    );
    if char_count(&text) >= i64::try_from(input_chars).unwrap_or(i64::MAX)
        || chars(&text) > max_chars
    {
        return Err(too_small());
    }
    Ok(Summary {
        text,
        model: "extractive".to_owned(),
        ..Summary::default()
    })
}

/// The findings: statements chosen to cover the most identifier weight per character
/// ([`cover`]), in `room` characters, in four rounds.
///
/// 1. An earlier summary's statements, in up to [`OLD_SHARE`] of the room, each in its
///    compact form when it has one: the investigation's findings so far are kept, said
///    in fewer words as they age, rather than pushed out by whatever the newest
///    messages hold (an old part of 12,000 characters holds dozens of sentences with
///    identifiers, and two or three findings).
/// 2. The new statements, whole, up to [`NEW_SHARE`] of the room in all.
/// 3. Every statement, whole (an earlier one in its compact form), in what is left.
/// 4. Compact forms of the statements that did not fit, then tool lines that show
///    something wrong that nobody stated, in what is left.
///
/// The statements `in_state` (the current state's) are left out. Returns the chosen
/// units' indices, in no particular order.
fn findings(
    collected: &Collected,
    in_state: &[String],
    covered: &mut [bool],
    room: usize,
) -> Vec<usize> {
    let units = &collected.units;
    let weights = &collected.weights;
    // The statements "Current state" says, whole or shortened, are not said twice.
    let stated: std::collections::HashSet<usize> = (units.iter())
        .filter(|u| !u.compact && in_state.iter().any(|s| s.contains(u.text.as_str())))
        .map(|u| u.origin)
        .collect();
    let statement =
        |u: usize| units[u].said && !units[u].unfit && !stated.contains(&units[u].origin);
    let has_compact =
        |u: usize| (units.get(u + 1)).is_some_and(|c| c.compact && c.origin == units[u].origin);
    // An earlier statement as it is carried: compact when it can be.
    let carried = |u: usize| statement(u) && !units[u].new && (units[u].compact || !has_compact(u));
    let whole = |u: usize| statement(u) && !units[u].compact;
    let taken = |chosen: &[usize]| -> usize {
        (chosen.iter())
            .map(|&u| units[u].chars() + cover::OVERHEAD)
            .sum()
    };
    let share = |(n, d): (usize, usize)| room * n / d;

    let mut chosen = cover::choose(
        units,
        (0..units.len()).filter(|&u| carried(u)),
        weights,
        covered,
        share(OLD_SHARE),
        cover::OVERHEAD,
    );
    let room_for = |chosen: &[usize], total: usize| total.saturating_sub(taken(chosen));
    chosen.extend(cover::choose(
        units,
        (0..units.len()).filter(|&u| units[u].new && whole(u)),
        weights,
        covered,
        room_for(&chosen, share(NEW_SHARE)),
        cover::OVERHEAD,
    ));
    chosen.extend(cover::choose(
        units,
        (0..units.len()).filter(|&u| carried(u) || (units[u].new && whole(u))),
        weights,
        covered,
        room_for(&chosen, room),
        cover::OVERHEAD,
    ));
    chosen.extend(cover::choose(
        units,
        (0..units.len()).filter(|&u| statement(u) && units[u].compact),
        weights,
        covered,
        room_for(&chosen, room),
        cover::OVERHEAD,
    ));
    chosen.extend(cover::choose(
        units,
        (0..units.len()).filter(|&u| !units[u].unfit && !units[u].said),
        weights,
        covered,
        room_for(&chosen, room),
        cover::OVERHEAD,
    ));
    chosen
}

/// The earlier values of the settings the chosen findings state, where no finding says
/// them: a later value supersedes an earlier one of the same key, and both are said in
/// one statement ("... capped at max_pool=283 (earlier max_pool=103)") rather than the
/// earlier one lost or given a bullet of its own. By chosen unit, the values to add,
/// oldest first, within `room` characters.
fn earlier_values(
    collected: &Collected,
    chosen: &[usize],
    covered: &[bool],
    room: usize,
) -> std::collections::HashMap<usize, Vec<String>> {
    let units = &collected.units;
    let mut latest: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for &u in chosen {
        for &id in &units[u].ids {
            if let Some(key) = collected.keys[id as usize].as_deref() {
                latest.insert(key, u);
            }
        }
    }
    let mut out: std::collections::HashMap<usize, Vec<String>> = std::collections::HashMap::new();
    let mut used = 0;
    for unit in units.iter().filter(|u| u.said && !u.compact) {
        for &id in &unit.ids {
            let id = id as usize;
            let Some(&later) = collected.keys[id].as_deref().and_then(|k| latest.get(k)) else {
                continue;
            };
            let value = &collected.ids[id];
            let said = out.get(&later).is_some_and(|v| v.contains(value));
            if covered[id] || said || unit.origin >= units[later].origin {
                continue;
            }
            let cost = value.chars().count() + if out.contains_key(&later) { 2 } else { 11 };
            if used + cost > room {
                continue;
            }
            used += cost;
            out.entry(later).or_default().push(value.clone());
        }
    }
    out
}

/// The sentences that rule something out, newest first while they fit in `room`,
/// shown oldest first; their identifiers are covered.
fn ruled_out(collected: &Collected, covered: &mut [bool], room: usize) -> String {
    let mut taken: Vec<String> = Vec::new();
    let mut used = 0;
    for unit in collected.units.iter().rev().filter(|u| u.negation) {
        let part = units::negation_part(&unit.text);
        let part = part.trim_end_matches('.');
        let cost = chars(part) + 2;
        if used + cost > room || taken.iter().any(|t| t == part) {
            continue;
        }
        used += cost;
        cover_text(part, collected, covered);
        taken.push(part.to_owned());
    }
    if taken.is_empty() {
        return NOTHING_RULED_OUT.to_owned();
    }
    taken.reverse();
    taken.join("; ")
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

/// The first human ask, whole, or an earlier summary's "Investigating" line; cut at a
/// sentence end when longer than `room`.
fn investigating(old: &[Message], collected: &Collected, room: usize) -> String {
    let ask = collected.earlier_investigating.clone().or_else(|| {
        old.iter()
            .find(|m| m.is_human_turn() && !m.content.trim().is_empty())
            .map(|m| m.content.clone())
    });
    ask.map_or_else(
        || "(no question recorded)".to_owned(),
        |text| fit(&text, room),
    )
}

/// The last sentences of the agent's last answer that fit in `room`, whole (the last one
/// shortened when none fits); an earlier summary's "Current state" when the agent said
/// nothing since. With it, the sentences it was drawn from, which no finding repeats.
fn current_state(old: &[Message], collected: &Collected, room: usize) -> (String, Vec<String>) {
    let answer = old
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && !m.content.trim().is_empty());
    let Some(answer) = answer else {
        let state = (collected.earlier_state.as_deref())
            .map_or_else(|| "(no state recorded)".to_owned(), |s| fit(s, room));
        return (state, Vec::new());
    };
    let sentences: Vec<String> = (units::sentences(&answer.content))
        .map(|s| facts::strip_marker(&s).to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let mut taken = 0;
    let mut used = 0;
    for sentence in sentences.iter().rev() {
        let cost = chars(sentence) + usize::from(taken > 0);
        if used + cost > room {
            break;
        }
        used += cost;
        taken += 1;
    }
    if taken == 0 {
        let last = sentences.last().map_or("", String::as_str);
        return (fit(last, room), vec![last.to_owned()]);
    }
    let drawn = sentences[sentences.len() - taken..].to_vec();
    (drawn.join(" "), drawn)
}

/// The task state to keep, as units in the old part's order: statements of what the
/// agent did, what was decided and what comes next ([`Unit::task`]), none of them among
/// the `drawn` sentences "Current state" already says, whole when they fit in `room`,
/// else in their compact form. The newest of each kind first (the next step, the last
/// decision, the last action), then the rest newest first: an agent redoes old work
/// less often than it loses where it was going.
fn task_state(collected: &Collected, drawn: &[String], room: usize) -> Vec<usize> {
    let units = &collected.units;
    let candidates: Vec<usize> = (0..units.len())
        .rev()
        .filter(|&u| {
            let unit = &units[u];
            unit.task.is_some()
                && unit.said
                && !unit.unfit
                && !unit.compact
                && !drawn.iter().any(|s| s.contains(unit.text.as_str()))
        })
        .collect();
    let mut order: Vec<usize> = Vec::with_capacity(candidates.len());
    for kind in [Task::NextStep, Task::Decision, Task::Action] {
        order.extend(candidates.iter().find(|&&u| units[u].task == Some(kind)));
    }
    order.extend(
        candidates
            .iter()
            .filter(|u| !order.contains(u))
            .collect::<Vec<_>>(),
    );
    let mut chosen: Vec<usize> = Vec::new();
    let mut seen_text: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut used = 0;
    for u in order {
        let compact = (units.get(u + 1)).filter(|c| c.compact && c.origin == units[u].origin);
        let pick = std::iter::once(u)
            .chain(compact.map(|_| u + 1))
            .find(|&v| used + units[v].chars() + cover::OVERHEAD <= room);
        // A compact form and its whole statement (one carried, one new) are one.
        if let Some(v) = pick
            && seen_text.insert(units[v].text.trim_end_matches(" …"))
        {
            used += units[v].chars() + cover::OVERHEAD;
            chosen.push(v);
        }
    }
    chosen.sort_unstable_by_key(|&u| units[u].origin);
    chosen
}

/// `text` on one line within `room` chars: whole when it fits, else its first whole
/// sentences that fit, else its first sentence shortened by clauses or words
/// ([`clauses::within`]): never cut inside a word or a number.
fn fit(text: &str, room: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if chars(&line) <= room {
        return line;
    }
    let mut out = String::new();
    for sentence in facts::sentences_of(&line) {
        if chars(&out) + usize::from(!out.is_empty()) + chars(sentence) > room {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(sentence);
    }
    if chars(&out) > room / 4 {
        return out;
    }
    let first = facts::sentences_of(&line).next().unwrap_or(&line);
    clauses::within(first, &units::spans(first), room).text
}

/// Marks the identifiers `text` holds as covered.
fn cover_text(text: &str, collected: &Collected, covered: &mut [bool]) {
    for fact in facts::extract(text) {
        if let Some(&id) = collected.index.get(fact.text) {
            covered[id as usize] = true;
        }
    }
}

#[cfg(test)]
mod tests;
