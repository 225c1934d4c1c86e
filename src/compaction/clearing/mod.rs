//! Clearing old tool output: the cheap first stage of a compaction
//! (`TOOL_OUTPUT_CLEARING`, docs/compaction.md, "Clearing old tool output").
//!
//! Most of an investigation's history is tool output the agent has already read and
//! turned into prose. Clearing replaces the content of old tool results with a short
//! placeholder, leaving each row where it is (role, `seq`, `tool_call_id`): every call
//! stays paired with its result, so providers accept the history, and the reasoning
//! around them stays word for word. The originals go to the archive in the commit that
//! clears them. No LLM is asked.
//!
//! A plain function over plain data, like the split planner: which results to clear,
//! oldest first, until the session would be at or below its keep ([`plan`]); and which
//! results are too large to stay whatever those rules say ([`evictions`],
//! `TOOL_OUTPUT_MAX_CHARS`): one huge output among the newest can be the keep alone, and
//! no summary then brings the session under its threshold.

use std::collections::HashMap;

use crate::message::{Message, Role, ToolCall, char_count};

/// The start of every placeholder: how a cleared result is told from others by people
/// and by tests (the store knows it by `messages.cleared_by`).
pub const PLACEHOLDER_START: &str = "[tool output cleared";

/// What is never cleared, beside results already cleared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// The newest this many tool results.
    pub keep: usize,
    /// Results of fewer chars.
    pub min_chars: i64,
    /// Results of calls to these tools (by the call's name).
    pub exclude: Vec<String>,
}

/// One result to clear: its index in the history, the placeholder that replaces its
/// content, and the chars that saves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleared {
    pub index: usize,
    pub placeholder: String,
    /// The result's chars, less the placeholder's.
    pub saved: i64,
}

/// The results a clearing replaces, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Clearing {
    pub cleared: Vec<Cleared>,
}

impl Clearing {
    pub fn is_empty(&self) -> bool {
        self.cleared.is_empty()
    }

    /// The chars the whole clearing saves.
    pub fn saved(&self) -> i64 {
        self.cleared.iter().map(|c| c.saved).sum()
    }

    /// `messages` as the clearing leaves them: each cleared result's content replaced by
    /// its placeholder, its chars counted again as the database counts them.
    pub fn apply(&self, messages: &mut [Message]) {
        for c in &self.cleared {
            let m = &mut messages[c.index];
            m.chars -= c.saved;
            m.content.clone_from(&c.placeholder);
        }
    }
}

/// The placeholder a cleared result of `tool` of `chars` chars at `seq` holds: it says
/// what was there, and how to get it back (a recall of that seq, docs/protocol.md).
pub fn placeholder(tool: &str, chars: i64, seq: i64) -> String {
    format!(
        "{PLACEHOLDER_START}: {chars} chars of {tool} output were here; recall seq {seq} \
         for the original]"
    )
}

/// How many chars of an evicted result's first lines, and of its last, stay around its
/// placeholder: enough for a log's header and its final error, little beside the output
/// that was there.
pub const EVICTED_ENDS_CHARS: usize = 1_000;

/// The placeholder of an evicted result: [`placeholder`]'s note, between the first and
/// the last lines of `content` (about [`EVICTED_ENDS_CHARS`] each, whole lines where a
/// line is shorter).
pub fn evicted_placeholder(content: &str, tool: &str, chars: i64, seq: i64) -> String {
    let note = format!(
        "{PLACEHOLDER_START}: {chars} chars of {tool} output were here, its first and last \
         lines around this note; recall seq {seq} for the original]"
    );
    let lines: Vec<&str> = content.lines().collect();
    let head = ends(lines.iter().copied(), EVICTED_ENDS_CHARS);
    // The last lines of those after the first ones: never a line twice.
    let rest = &lines[head.len().min(lines.len())..];
    let mut tail = ends(rest.iter().rev().copied(), EVICTED_ENDS_CHARS);
    tail.reverse();
    let mut parts: Vec<String> = head;
    parts.push(note);
    parts.extend(tail);
    parts.join("\n")
}

/// The first `lines` within `budget` chars: whole lines, and the first one cut at the
/// budget when it alone is longer.
fn ends<'a>(lines: impl Iterator<Item = &'a str>, budget: usize) -> Vec<String> {
    let mut taken = Vec::new();
    let mut used = 0;
    for line in lines {
        let n = line.chars().count() + 1;
        if used + n > budget {
            if taken.is_empty() {
                let cut: String = line.chars().take(budget.saturating_sub(1)).collect();
                taken.push(format!("{cut}…"));
            }
            break;
        }
        used += n;
        taken.push(line.to_owned());
    }
    taken
}

/// The tool results of `messages` larger than `max_chars` (`TOOL_OUTPUT_MAX_CHARS`; 0
/// is none), each with its [`evicted_placeholder`]: whatever `TOOL_OUTPUT_KEEP` and
/// `TOOL_OUTPUT_CLEARING` say, since a result that large can be the keep alone. Never a
/// pinned result, one cleared already, or one that answers no call (the history would
/// not pair); a result whose call still waits for another result is evicted all the
/// same: it is the newest output that is too large to keep.
pub fn evictions(messages: &[Message], already: &[bool], max_chars: i64) -> Clearing {
    if max_chars <= 0
        || !messages
            .iter()
            .any(|m| m.role == Role::Tool && m.chars > max_chars)
    {
        return Clearing::default();
    }
    let calls = pair_calls(messages);
    let mut clearing = Clearing::default();
    for (i, m) in messages.iter().enumerate() {
        if m.role != Role::Tool
            || m.chars <= max_chars
            || m.pinned
            || already.get(i).copied().unwrap_or(false)
        {
            continue;
        }
        let Some((_, tool)) = calls.answered.get(&i) else {
            continue;
        };
        let text = evicted_placeholder(&m.content, tool, m.chars, m.seq);
        let saved = m.chars - char_count(&text);
        if saved > 0 {
            clearing.cleared.push(Cleared {
                index: i,
                placeholder: text,
                saved,
            });
        }
    }
    clearing
}

/// The largest tool result of `messages` that [`evictions`] could clear: answering a
/// call, neither pinned nor cleared already (0 when there is none). What
/// `sessions.largest_output_chars` is set to when the planner refuses a history.
pub fn largest_evictable(messages: &[Message], already: &[bool]) -> i64 {
    let calls = pair_calls(messages);
    messages
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            m.role == Role::Tool
                && !m.pinned
                && !already.get(*i).copied().unwrap_or(false)
                && calls.answered.contains_key(i)
        })
        .map(|(_, m)| m.chars)
        .max()
        .unwrap_or(0)
}

impl Clearing {
    /// This clearing and `evictions` of the same history: each result once (cleared by
    /// the rules when both name it: their placeholder is the shorter), oldest first.
    #[must_use]
    pub fn with(mut self, evictions: Clearing) -> Self {
        for evicted in evictions.cleared {
            if !self.cleared.iter().any(|c| c.index == evicted.index) {
                self.cleared.push(evicted);
            }
        }
        self.cleared.sort_by_key(|c| c.index);
        self
    }
}

/// Which tool results of `messages` (one session, in `seq` order) to clear, oldest first,
/// until the session holds at most `target_chars` or none is left. `already[i]` tells
/// that message `i` was cleared before.
///
/// A result is cleared only when none of these holds: it is among the newest
/// `rules.keep` tool results; it has fewer than `rules.min_chars` chars; it answers no
/// call (the planner's pairing: the nearest earlier call of its id), or a call of an
/// excluded tool; the message that made its call still waits for a result of another of
/// its calls (the agent is mid-step); it was cleared already. Clearing one that saves
/// nothing (a result shorter than its placeholder) is pointless, and skipped too.
pub fn plan(messages: &[Message], already: &[bool], rules: &Rules, target_chars: i64) -> Clearing {
    let total: i64 = messages.iter().map(|m| m.chars).sum();
    if total <= target_chars {
        return Clearing::default();
    }
    let calls = pair_calls(messages);
    let newest_kept: usize = {
        // The index from which on the newest `keep` results lie.
        let mut seen = 0;
        let mut from = messages.len();
        for (i, m) in messages.iter().enumerate().rev() {
            if seen == rules.keep {
                break;
            }
            if m.role == Role::Tool {
                seen += 1;
                from = i;
            }
        }
        if seen < rules.keep { 0 } else { from }
    };
    let mut clearing = Clearing::default();
    let mut left = total;
    for (i, m) in messages.iter().enumerate() {
        if left <= target_chars || i >= newest_kept {
            break;
        }
        if m.role != Role::Tool
            || m.pinned
            || already.get(i).copied().unwrap_or(false)
            || m.chars < rules.min_chars
        {
            continue;
        }
        let Some(&(call, ref tool)) = calls.answered.get(&i) else {
            continue;
        };
        if calls.waiting.contains(&call) || rules.exclude.iter().any(|name| name == tool) {
            continue;
        }
        let text = placeholder(tool, m.chars, m.seq);
        // What the row weighs goes (its text, and blocks such as a screenshot's), and the
        // placeholder comes.
        let saved = m.chars - char_count(&text);
        if saved <= 0 {
            continue;
        }
        left -= saved;
        clearing.cleared.push(Cleared {
            index: i,
            placeholder: text,
            saved,
        });
    }
    clearing
}

/// The calls the results of a history answer.
struct Calls {
    /// By result index: the index of the message that made the call it answers, and
    /// the call's tool name (`"unknown tool"` when the call names none).
    answered: HashMap<usize, (usize, String)>,
    /// Messages with a call no later result answers: the agent is still waiting on it.
    waiting: std::collections::HashSet<usize>,
}

/// Pairs each result with the nearest earlier call of its id, as the split planner does
/// (a model server may reuse ids: `call_0` every turn); linear in the messages and calls.
fn pair_calls(messages: &[Message]) -> Calls {
    let mut latest: HashMap<String, (usize, String, bool)> = HashMap::new();
    let mut answered = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(id) = m.tool_call_id.as_deref()
            && let Some((call, name, done)) = latest.get_mut(id)
        {
            answered.insert(i, (*call, name.clone()));
            *done = true;
        }
        for call in m.calls().iter().map(ToolCall) {
            if let Some(id) = call.id() {
                let name = call.name().unwrap_or("unknown tool");
                latest.insert(id.to_owned(), (i, name.to_owned(), false));
            }
        }
    }
    let waiting = (latest.into_values())
        .filter(|(_, _, done)| !done)
        .map(|(call, _, _)| call)
        .collect();
    Calls { answered, waiting }
}

#[cfg(test)]
mod tests;
