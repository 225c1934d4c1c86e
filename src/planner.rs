//! The split planner: which oldest messages a compaction replaces (DESIGN.md section 3).
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
    /// `cut` except `system` ones, which stay where they are.
    pub removed: Vec<usize>,
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
/// - [`Reason::NoSafeBoundary`]: no human turn after the first message at which the kept
///   part holds `keep_chars` without separating a tool call from its result;
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
        .ok_or(Reason::NoSafeBoundary)?;

    // Moving the cut back only grows the kept part, so it still holds `keep_chars`.
    let splits_a_call = calls_spanning(messages);
    let cut = (1..=latest)
        .rev()
        .find(|&i| messages[i].is_human_turn() && !splits_a_call[i])
        .ok_or(Reason::NoSafeBoundary)?;

    let removed: Vec<usize> = (0..cut)
        .filter(|&i| messages[i].role != Role::System)
        .collect();
    if removed.is_empty() {
        return Err(Reason::NoSafeBoundary);
    }
    if removed.iter().all(|&i| messages[i].is_summary) {
        return Err(Reason::NothingToCompact);
    }
    Ok(Split { cut, removed })
}

/// `result[i]` is true when cutting before message `i` would leave a tool call in the old
/// part and its result in the kept part.
fn calls_spanning(messages: &[Message]) -> Vec<bool> {
    let mut caller: HashMap<&str, usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        for id in m.tool_call_ids() {
            caller.entry(id).or_insert(i);
        }
    }
    // +1 where a call/result pair opens, -1 after it closes: a running sum above zero
    // means a pair spans that position.
    let mut delta = vec![0i32; messages.len() + 1];
    for (result, m) in messages.iter().enumerate() {
        let Some(call) = m.tool_call_id.as_deref().and_then(|id| caller.get(id)) else {
            continue;
        };
        if *call < result {
            delta[call + 1] += 1;
            delta[result + 1] -= 1;
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
