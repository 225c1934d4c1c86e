//! The built-in summarizer: fills the seed's template from the old messages, offline and
//! deterministic, choosing what to keep by the identifiers it carries ([`crate::facts`]).
//!
//! - **Investigating:** the first human ask, whole (an earlier summary's, when there is
//!   one, which was the first ask of all).
//! - **Key findings:** units (sentences of the human and the agent, tool output lines,
//!   an earlier summary's bullets, tool calls) chosen to cover the most identifier weight
//!   per character not covered yet ([`cover`]), so that new facts are never starved by
//!   old ones and log noise does not crowd out either ([`units`] says how identifiers are
//!   weighed); then, in the room left, the identifiers still uncovered, heaviest first,
//!   as one compressed "Also noted" bullet. An earlier summary's facts are carried
//!   forward in that form when its bullets no longer fit.
//! - **Ruled out:** sentences that rule something out ("not", "ruled out", "no sign
//!   of", "healthy"), from every role and the earlier summary, by the same cover.
//! - **Current state:** the latest exchange's conclusion: the last sentences of the
//!   agent's last answer, whole.
//!
//! The summary takes at most a quarter of what it replaces (at least [`MIN_BUDGET`]
//! chars, never `SUMMARY_MAX_CHARS` or more). Everything is linear in the old part's
//! size: one pass to cut units, one to weigh, and the bucket queue of [`cover`].

mod cover;
mod units;

use futures_util::future::{BoxFuture, FutureExt};

use crate::facts;
use crate::message::{Message, Role, char_count};
use crate::summarizer::{LlmError, Summarizer};
use crate::summary::Summary;
use crate::summary::{CURRENT_STATE, INVESTIGATING, KEY_FINDINGS, RULED_OUT};
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
    fn summarize<'a>(&'a self, old: &'a [Message]) -> BoxFuture<'a, Result<Summary, LlmError>> {
        // Linear, but the old part may hold megabytes of tool output: on the blocking
        // pool, so that the async threads go on serving other events meanwhile. The copy
        // costs less than the summarizing.
        let old = old.to_vec();
        let max_chars = self.max_chars;
        async move {
            match tokio::task::spawn_blocking(move || summarize(&old, max_chars)).await {
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

/// The least weight an identifier needs to be listed on its own: a tool's counter that
/// appears once, on a templated line, is not a fact worth carrying.
const LIST_MIN_WEIGHT: u32 = 2;

/// The summary takes at most `1 / COMPRESSION` of what it replaces...
const COMPRESSION: usize = 4;
/// ... but may take this much of a small old part (still less than all of it).
pub const MIN_BUDGET: usize = 600;

/// What the template's fixed text costs: headings, separators, line breaks.
const SKELETON: usize =
    INVESTIGATING.len() + KEY_FINDINGS.len() + RULED_OUT.len() + CURRENT_STATE.len() + 8;

/// Of the findings' room, the share full units may take; the rest (and what they leave)
/// goes to the "Also noted" identifiers.
const UNITS_SHARE: (usize, usize) = (3, 10);

/// Of the units' room, the share new units choose from first.
const NEW_FIRST: (usize, usize) = (2, 3);

fn summarize(old: &[Message], max_chars: usize) -> Result<Summary, LlmError> {
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
    let collected = units::collect(old);
    let mut covered = vec![false; collected.ids.len()];
    let room = budget - SKELETON;

    let investigating = investigating(old, &collected, room / 4);
    cover_text(&investigating, &collected, &mut covered);
    let state = current_state(old, &collected, (room / 6).min(600));
    cover_text(&state, &collected, &mut covered);

    let ruled_out_text = ruled_out(&collected, &mut covered, room / 10);

    let used = chars(&investigating) + chars(&state) + chars(&ruled_out_text);
    let findings_room = room.saturating_sub(used);
    // New units choose first, so that an earlier summary's facts, however dense, never
    // starve the new ones; then all compete for what is left. Whatever is not chosen
    // may still be carried as an identifier in "Also noted".
    let units_room = findings_room * UNITS_SHARE.0 / UNITS_SHARE.1;
    let new =
        (0..collected.units.len()).filter(|&u| collected.units[u].new && !collected.units[u].call);
    let mut chosen = cover::choose(
        &collected.units,
        new,
        &collected.weights,
        &mut covered,
        units_room * NEW_FIRST.0 / NEW_FIRST.1,
        cover::OVERHEAD,
    );
    let taken: usize = chosen
        .iter()
        .map(|&u| collected.units[u].chars() + cover::OVERHEAD)
        .sum();
    chosen.extend(cover::choose(
        &collected.units,
        (0..collected.units.len()).filter(|&u| !collected.units[u].call),
        &collected.weights,
        &mut covered,
        units_room.saturating_sub(taken),
        cover::OVERHEAD,
    ));
    let units_chars = |chosen: &[usize]| -> usize {
        chosen.iter().map(|&u| collected.units[u].chars() + 3).sum()
    };
    // What the human or the agent wrote, then what only tools printed, each as a list:
    // kept apart so that a later compaction still tells them apart (tool output, once
    // listed, must not weigh as if it had been said).
    let mut list = listed(
        &collected,
        &mut covered,
        findings_room.saturating_sub(units_chars(&chosen)),
        ALSO_NOTED,
        |id| collected.said[id],
    );
    list.push_str(&listed(
        &collected,
        &mut covered,
        findings_room.saturating_sub(units_chars(&chosen) + chars(&list)),
        ALSO_IN_TOOLS,
        |id| !collected.said[id],
    ));
    // What the list leaves goes to more units.
    let left = findings_room.saturating_sub(units_chars(&chosen) + chars(&list));
    chosen.extend(cover::choose(
        &collected.units,
        0..collected.units.len(),
        &collected.weights,
        &mut covered,
        left,
        3,
    ));
    // Oldest first, an earlier summary's bullets before the rest: the order they
    // happened in.
    chosen.sort_unstable();
    let mut findings = String::new();
    for &u in &chosen {
        findings.push_str("- ");
        findings.push_str(&collected.units[u].text);
        findings.push('\n');
    }
    findings.push_str(&list);
    if findings.is_empty() {
        findings = format!("{NO_FINDINGS}\n");
    }

    let text = format!(
        "{INVESTIGATING} {investigating}\n{KEY_FINDINGS}\n{findings}{RULED_OUT} {ruled_out_text}\n{CURRENT_STATE} {state}"
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

/// The sentences that rule something out, newest first while they fit in `room`,
/// shown oldest first; their identifiers are covered.
fn ruled_out(collected: &Collected, covered: &mut [bool], room: usize) -> String {
    let mut taken: Vec<&str> = Vec::new();
    let mut used = 0;
    for unit in collected.units.iter().rev().filter(|u| u.negation) {
        let cost = unit.chars() + 2;
        if used + cost > room || taken.contains(&unit.text.trim_end_matches('.')) {
            continue;
        }
        used += cost;
        taken.push(unit.text.trim_end_matches('.'));
        for &id in &unit.ids {
            covered[id as usize] = true;
        }
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

/// The last sentences of the agent's last answer that fit in `room`, whole; an earlier
/// summary's "Current state" when the agent said nothing since.
fn current_state(old: &[Message], collected: &Collected, room: usize) -> String {
    let answer = old
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && !m.content.trim().is_empty());
    let Some(answer) = answer else {
        return collected
            .earlier_state
            .as_deref()
            .map_or_else(|| "(no state recorded)".to_owned(), |s| fit(s, room));
    };
    let sentences: Vec<String> = units::sentences(&answer.content).collect();
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
        return fit(sentences.last().map_or("", String::as_str), room);
    }
    sentences[sentences.len() - taken..].join(" ")
}

/// `text` on one line within `room` chars: whole when it fits, else up to its last
/// sentence end that fits, else its words that fit and an ellipsis.
fn fit(text: &str, room: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if chars(&line) <= room {
        return line;
    }
    let Some((cut, _)) = line.char_indices().nth(room.saturating_sub(1)) else {
        return line;
    };
    let head = &line[..cut];
    if let Some(end) = head.rfind(['.', '?', '!'])
        && end > cut / 4
    {
        return head[..=end].to_owned();
    }
    match head.rfind(' ') {
        Some(space) if space > 0 => format!("{}…", &head[..space]),
        _ => format!("{head}…"),
    }
}

/// Marks the identifiers `text` holds as covered.
fn cover_text(text: &str, collected: &Collected, covered: &mut [bool]) {
    for fact in facts::extract(text) {
        if let Some(&id) = collected.index.get(fact.text) {
            covered[id as usize] = true;
        }
    }
}

/// Uncovered identifiers that `belongs` accepts, heaviest first (then in order of
/// appearance), as one bullet starting `heading`, within `room` chars; empty when none
/// fits. Listing one covers it and the identifiers inside it.
fn listed(
    collected: &Collected,
    covered: &mut [bool],
    room: usize,
    heading: &str,
    belongs: impl Fn(usize) -> bool,
) -> String {
    let heaviest = collected.weights.iter().copied().max().unwrap_or(0);
    let mut line = String::new();
    let mut used = chars(heading) + 1;
    'weights: for weight in (LIST_MIN_WEIGHT..=heaviest).rev() {
        for (id, text) in collected.ids.iter().enumerate() {
            if covered[id] || collected.weights[id] != weight || !belongs(id) {
                continue;
            }
            let cost = chars(text) + if line.is_empty() { 0 } else { 2 };
            if used + cost > room {
                if room.saturating_sub(used) < 8 {
                    break 'weights;
                }
                continue;
            }
            if !line.is_empty() {
                line.push_str(", ");
            }
            line.push_str(text);
            used += cost;
            covered[id] = true;
            for &part in &collected.parts[id] {
                covered[part as usize] = true;
            }
        }
    }
    if line.is_empty() {
        line
    } else {
        format!("{heading}{line}\n")
    }
}

#[cfg(test)]
mod tests;
