//! The split: which oldest messages a compaction replaces (docs/compaction.md, "When and what is compacted").
//!
//! A plain function over plain data, so every rule is tested without a database.

use std::collections::HashMap;

use crate::config::Limits;
use crate::message::{Message, Role};
use crate::outcome::Reason;

/// A planned compaction of one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Index of the first kept message: a human turn.
    pub cut: usize,
    /// Indices of the messages the summary replaces, oldest first: every message before
    /// `cut` except those that stay where they are (see [`stays_in_place`]).
    pub removed: Vec<usize>,
    /// Indices of the messages before `cut` that stay where they are and are not system
    /// messages: pinned messages and their tool-call partners. Usually none.
    pub kept: Vec<usize>,
}

impl Split {
    pub fn removed<'a>(&'a self, messages: &'a [Message]) -> impl Iterator<Item = &'a Message> {
        self.removed.iter().map(|&i| &messages[i])
    }

    pub fn chars_removed(&self, messages: &[Message]) -> i64 {
        self.removed(messages).map(|m| m.chars).sum()
    }

    /// Messages left beside the summary: the kept part and the system messages before it.
    pub fn messages_kept(&self, messages: &[Message]) -> usize {
        messages.len() - self.removed.len()
    }
}

/// Plans the compaction of `messages` (one session, in `seq` order).
///
/// # Errors
/// The skip reason, as a reply carries it:
/// - [`Reason::BelowThreshold`]: the session holds at most `threshold_chars`;
/// - [`Reason::TooFewTurns`]: fewer than two human turns;
/// - [`Reason::WithinKeep`]: the whole history is within `keep_chars` (a forced
///   compaction's: an ordinary one's threshold is above its keep);
/// - [`Reason::NoSafeBoundary`]: no human turn after the first message at which the kept
///   part holds `keep_chars` without separating a tool call from its result or removing
///   a call still waiting for its result;
/// - [`Reason::NothingToCompact`]: the old part is only earlier summaries.
pub fn plan(messages: &[Message], limits: Limits) -> Result<Split, Reason> {
    let total: i64 = messages.iter().map(|m| m.chars).sum();
    if total <= limits.threshold_chars {
        return Err(Reason::BelowThreshold);
    }
    if messages.iter().filter(|m| m.is_human_turn()).count() < 2 {
        return Err(Reason::TooFewTurns);
    }

    // The latest start at which the kept part reaches `keep_chars`.
    let mut kept = 0;
    let latest = messages
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| {
            kept += m.chars;
            kept >= limits.keep_chars
        })
        .map(|(i, _)| i)
        .ok_or(Reason::WithinKeep)?;

    // Moving the cut back only grows the kept part, so it still holds `keep_chars`.
    let splits_a_call = calls_spanning(messages);
    let cut = (1..=latest)
        .rev()
        .find(|&i| messages[i].is_human_turn() && !splits_a_call[i])
        .ok_or(Reason::NoSafeBoundary)?;

    let stays = stays_in_place(messages);
    let (kept, removed): (Vec<usize>, Vec<usize>) = (0..cut)
        .filter(|&i| messages[i].role != Role::System)
        .partition(|&i| stays[i]);
    if removed.is_empty() {
        return Err(Reason::NoSafeBoundary);
    }
    if removed.iter().all(|&i| messages[i].is_summary) {
        return Err(Reason::NothingToCompact);
    }
    Ok(Split { cut, removed, kept })
}

/// `result[i]` is true when message `i` stays where it is whatever the cut, as system
/// messages do: a system message, a pinned one (`messages.pinned`; not a summary, which
/// the next summary always folds in), and the tool-call
/// partners of a pinned one, so that pinning never breaks a pair. A pinned call keeps
/// its results; a pinned result keeps the call it answers, and with it that call's other
/// results. A result answers the nearest earlier call of its id (see [`calls_spanning`]).
///
/// Linear in the messages and their calls; one allocation when nothing is pinned.
fn stays_in_place(messages: &[Message]) -> Vec<bool> {
    // A summary is the worker's, folded into the next one: a pin on it is not heeded,
    // or the session would end up with two.
    let pinned = |m: &Message| m.pinned && !m.is_summary;
    let mut stays: Vec<bool> = (messages.iter())
        .map(|m| m.role == Role::System || pinned(m))
        .collect();
    if !messages.iter().any(pinned) {
        return stays;
    }
    // Each result's call, and whether that call stays for a pinned partner.
    let mut latest: HashMap<String, usize> = HashMap::new();
    let mut call_of: Vec<Option<usize>> = vec![None; messages.len()];
    for (i, m) in messages.iter().enumerate() {
        call_of[i] = (m.tool_call_id.as_deref()).and_then(|id| latest.get(id).copied());
        for id in m.tool_call_ids() {
            latest.insert(id.into_owned(), i);
        }
    }
    let mut call_stays = vec![false; messages.len()];
    for (i, _) in messages.iter().enumerate().filter(|(_, m)| pinned(m)) {
        call_stays[i] = true;
        if let Some(call) = call_of[i] {
            call_stays[call] = true;
        }
    }
    for i in 0..messages.len() {
        let answers_one = call_of[i].is_some_and(|call| call_stays[call]);
        if call_stays[i] || answers_one {
            stays[i] = true;
        }
    }
    stays
}

/// `result[i]` is true when cutting before message `i` would leave a tool call in the old
/// part while a result that answers it, or may still come to answer it, is kept.
///
/// A result answers the nearest earlier call of its id: some model servers reuse ids
/// (`call_0` every turn), so the first call of an id is the wrong partner. It follows that
/// only the last call of an id can still be waiting: a result written later would pair
/// with it, never with an earlier call of the same id. A waiting call (no result after
/// it) stays in the kept part, so a result the agent has yet to write is not orphaned.
///
/// Linear in the messages and their calls: one pass with a map from each id to its
/// latest call, then a running sum.
fn calls_spanning(messages: &[Message]) -> Vec<bool> {
    let ids: Vec<_> = messages.iter().map(Message::tool_call_ids).collect();
    // +1 where a call/result pair opens, -1 after it closes: a running sum above zero
    // means a pair spans that position.
    let mut delta = vec![0i32; messages.len() + 1];
    // Each id's latest call so far, and whether a result has answered it.
    let mut latest: HashMap<&str, (usize, bool)> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        // The result first, so that a message never pairs with its own calls.
        let answered = m.tool_call_id.as_deref().and_then(|id| latest.get_mut(id));
        if let Some((call, answered)) = answered {
            delta[*call + 1] += 1;
            delta[i + 1] -= 1;
            *answered = true;
        }
        for id in &ids[i] {
            latest.insert(id, (i, false));
        }
    }
    // A waiting call spans every position after it: it is never closed.
    for (call, answered) in latest.into_values() {
        if !answered {
            delta[call + 1] += 1;
        }
    }
    let mut open = 0;
    delta[..messages.len()]
        .iter()
        .map(|d| {
            open += d;
            open > 0
        })
        .collect()
}

#[cfg(test)]
mod tests;
