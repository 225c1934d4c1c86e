//! The plan of one compaction: from the history the lease loaded, what goes (the old part
//! the summary replaces), what stays in place, which tool results are cleared, and what
//! the summarizer is asked. A plain function over plain data ([`plan`]); the worker runs
//! it on the blocking pool for a large history.

use std::sync::Arc;

use super::clearing;
use super::split::{self, Split};
use super::tokens;
use crate::config::Limits;
use crate::message::{Message, Role};
use crate::outcome::Reason;
use crate::protocol::Instructions;
use crate::redact::{self, Redactions};
use crate::summarizer::SummaryRequest;

/// A session's history as the worker loaded it with the lease.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// In `seq` order.
    pub messages: Vec<Message>,
    /// Each message's fingerprint as the database computed it at load, in the same order:
    /// what the commit compares the rows it deletes with.
    pub fingerprints: Vec<String>,
    /// Whether each message is a tool result a compaction cleared (`cleared_by` set),
    /// in the same order.
    pub cleared: Vec<bool>,
}

impl Loaded {
    /// The counters this history gives: what a skip planned on it is remembered with.
    pub fn counted(&self) -> CountedAt {
        CountedAt {
            total_chars: self.messages.iter().map(|m| m.chars).sum(),
            message_count: i64::try_from(self.messages.len()).unwrap_or(i64::MAX),
            largest_output_chars: clearing::largest_evictable(&self.messages, &self.cleared),
        }
    }
}

/// A session's total chars and message count at some point: see [`Loaded::counted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountedAt {
    pub total_chars: i64,
    pub message_count: i64,
    /// The largest tool result a compaction could evict ([`clearing::largest_evictable`]).
    pub largest_output_chars: i64,
}

/// A tool result a compaction clears in place: its row as it was loaded (the commit
/// checks it is unchanged) and the placeholder that replaces its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClearedRow {
    pub seq: i64,
    pub chars: i64,
    /// The fingerprint of its row at load.
    pub fingerprint: String,
    pub placeholder: String,
    /// Its chars less the placeholder's.
    pub saved: i64,
}

/// A planned compaction, with what the log line, the summarizer and the commit need.
#[derive(Debug)]
pub struct Plan {
    /// The messages the summary replaces, oldest first; shared with the fact check's
    /// work on the blocking pool.
    pub old: Arc<[Message]>,
    /// The system messages before the cut, which stay: the summarizer's context.
    pub context: Vec<Message>,
    pub session_chars: i64,
    pub chars_removed: i64,
    pub messages_kept: i64,
    pub cut_seq: i64,
    pub removed_seqs: Vec<i64>,
    /// The pinned messages (and their tool-call partners) before the cut, which stay.
    pub kept_seqs: Vec<i64>,
    pub removed_chars: Vec<i64>,
    /// The removed rows' fingerprints at load, which the commit checks.
    pub removed_fingerprints: Vec<String>,
    /// The tokenizer's count of what is removed (see [`removed_tokens`]).
    pub tokens_removed: i64,
    /// The tokens the results cleared in place no longer take (their text's count less
    /// their placeholders'): with `tokens_removed`, what leaves the context.
    pub tokens_cleared: i64,
    /// The model the session asks to be summarized with (`session_settings.model`).
    pub model: Option<String>,
    /// The request's focus for the summary (`instructions`).
    pub instructions: Option<Instructions>,
    /// The tool results cleared in place (docs/compaction.md, "Clearing old tool output").
    pub cleared: Vec<ClearedRow>,
    /// `false`: the clearing is the whole compaction; nothing else is removed and no
    /// summary written.
    pub summarized: bool,
    /// The request forced it: its old part may be smaller than any summary.
    pub forced: bool,
    /// The secrets [`Plan::redact_secrets`] replaced in `old`, `context` and
    /// `instructions`, by kind.
    pub redacted: Redactions,
}

impl Plan {
    /// What the summarizer is asked for a first summary of the old part.
    pub fn request(&self) -> SummaryRequest<'_> {
        SummaryRequest {
            old: &self.old,
            context: &self.context,
            model: self.model.as_deref(),
            instructions: self.instructions.as_ref(),
            missing: &[],
            meter: None,
            marker: None,
        }
    }

    /// `old`, `context` and `instructions` as the summarizer may see them: every secret
    /// replaced by its kind's marker ([`crate::redact`]), counted in `redacted`. What the
    /// plan removes and commits (seqs, chars, fingerprints) is the stored rows' and does
    /// not change: the archive keeps the originals, for an exact restore.
    pub fn redact_secrets(&mut self) {
        let mut found = Redactions::default();
        self.old = (self.old.iter())
            .map(|m| redact::redact_message(m, &mut found))
            .collect();
        for m in &mut self.context {
            *m = redact::redact_message(m, &mut found);
        }
        if let Some(instructions) = &mut self.instructions {
            instructions.text = redact::redact(&instructions.text, &mut found).into_owned();
        }
        self.redacted.add(&found);
    }

    /// The chars the clearing saves.
    pub fn chars_cleared(&self) -> i64 {
        self.cleared.iter().map(|c| c.saved).sum()
    }

    /// A clearing that is the whole compaction: no summary, nothing removed.
    fn clearing_alone(
        session_chars: i64,
        messages_kept: i64,
        cleared: Vec<ClearedRow>,
        tokens_cleared: i64,
    ) -> Self {
        Self {
            old: Vec::new().into(),
            context: Vec::new(),
            session_chars,
            chars_removed: 0,
            messages_kept,
            cut_seq: i64::MIN,
            removed_seqs: Vec::new(),
            kept_seqs: Vec::new(),
            removed_chars: Vec::new(),
            removed_fingerprints: Vec::new(),
            tokens_removed: 0,
            tokens_cleared,
            model: None,
            instructions: None,
            cleared,
            summarized: false,
            forced: false,
            redacted: Redactions::default(),
        }
    }
}

/// Plans the compaction of the loaded history and moves the old part out of it. `Err` is
/// the reason to skip (the split's: no safe boundary, nothing to compact).
///
/// With `clearing`, old tool results are cleared first ([`clearing::plan`], down to the
/// keep), and, whatever `clearing` says, results over `evict_over` chars are
/// ([`clearing::evictions`], `TOOL_OUTPUT_MAX_CHARS`; 0 is off), even below the
/// threshold. When that brings the session to its threshold or below, the clearing is
/// the whole compaction; when it does not, the summary's split is planned on the history
/// as cleared (the summarizer reads the placeholders, not the outputs), and the results
/// cleared in the kept part are cleared in place. A clearing is written even when no
/// summary can be planned after it (no safe boundary, say): it still makes room.
///
/// # Errors
/// The [`Reason`] the split gives for not compacting; [`Reason::BelowThreshold`] for a
/// session at or below its threshold that has nothing to evict either (it was loaded
/// because its largest output looked too large, and none it could evict is).
pub fn plan(
    loaded: Loaded,
    limits: Limits,
    clearing: Option<&clearing::Rules>,
    evict_over: i64,
) -> Result<Plan, Reason> {
    let Loaded {
        mut messages,
        fingerprints,
        cleared,
    } = loaded;
    let session_chars: i64 = messages.iter().map(|m| m.chars).sum();
    let over = session_chars > limits.threshold_chars;
    let clearing = match clearing {
        Some(rules) if over => clearing::plan(&messages, &cleared, rules, limits.keep_chars),
        _ => clearing::Clearing::default(),
    }
    .with(clearing::evictions(&messages, &cleared, evict_over));
    if clearing.is_empty() && !over {
        return Err(Reason::BelowThreshold);
    }
    if clearing.is_empty() {
        let split = split::plan(&messages, limits)?;
        return Ok(summary_plan(
            split,
            messages,
            &fingerprints,
            Cleared::default(),
        ));
    }
    // The rows as stored (the commit compares their chars), then the history as the
    // clearing leaves it, the originals kept aside for the removed part's tokens.
    let stored_chars: Vec<i64> = messages.iter().map(|m| m.chars).collect();
    let mut rows = Vec::with_capacity(clearing.cleared.len());
    let mut originals = Vec::with_capacity(clearing.cleared.len());
    for c in &clearing.cleared {
        let m = &mut messages[c.index];
        rows.push(ClearedRow {
            seq: m.seq,
            chars: m.chars,
            fingerprint: fingerprints.get(c.index).cloned().unwrap_or_default(),
            placeholder: c.placeholder.clone(),
            saved: c.saved,
        });
        originals.push((
            c.index,
            std::mem::replace(&mut m.content, c.placeholder.clone()),
        ));
        m.chars -= c.saved;
    }
    let split = match split::plan(&messages, limits) {
        Ok(split) if session_chars - clearing.saved() > limits.threshold_chars => split,
        // At the threshold or below once cleared, or no summary to plan: the clearing
        // is the compaction.
        _ => {
            let kept = i64::try_from(messages.len()).unwrap_or(i64::MAX);
            let tokens_cleared = tokens_cleared(&messages, &originals);
            return Ok(Plan::clearing_alone(
                session_chars,
                kept,
                rows,
                tokens_cleared,
            ));
        }
    };
    // A result in the old part goes with it (archived whole, as removed: a tool result
    // is never a system message, so it is removed exactly when it is before the cut);
    // one in the kept part is cleared in place.
    let (removed_originals, in_place_originals): (Vec<_>, Vec<_>) =
        originals.into_iter().partition(|(i, _)| *i < split.cut);
    let tokens_cleared = tokens_cleared(&messages, &in_place_originals);
    let in_place = rows
        .into_iter()
        .zip(&clearing.cleared)
        .filter(|(_, c)| c.index >= split.cut)
        .map(|(row, _)| row)
        .collect();
    let cleared = Cleared {
        in_place,
        stored_chars: Some(&stored_chars),
        removed_originals,
    };
    let mut plan = summary_plan(split, messages, &fingerprints, cleared);
    plan.session_chars = session_chars;
    plan.tokens_cleared = tokens_cleared;
    Ok(plan)
}

/// What a clearing changed of a history the summary's split was planned on.
#[derive(Default)]
struct Cleared<'a> {
    /// The results cleared in place, in the kept part.
    in_place: Vec<ClearedRow>,
    /// Every row's chars as stored, when some were cleared.
    stored_chars: Option<&'a [i64]>,
    /// The original content of the cleared results the old part removes, by index.
    removed_originals: Vec<(usize, String)>,
}

/// The summary's plan for `split` of `messages` (as cleared, when `cleared` says so).
fn summary_plan(
    split: Split,
    messages: Vec<Message>,
    fingerprints: &[String],
    cleared: Cleared<'_>,
) -> Plan {
    let removed_seqs = split.removed(&messages).map(|m| m.seq).collect();
    let kept_seqs = split.kept.iter().map(|&i| messages[i].seq).collect();
    let removed_chars: Vec<i64> = match cleared.stored_chars {
        Some(stored) => split.removed.iter().map(|&i| stored[i]).collect(),
        None => split.removed(&messages).map(|m| m.chars).collect(),
    };
    let removed_fingerprints = (split.removed.iter())
        .filter_map(|&i| fingerprints.get(i).cloned())
        .collect();
    // What leaves the context is the cleared results' own text, not their placeholders.
    let tokens_removed = removed_tokens(split.removed(&messages))
        + tokens_cleared(&messages, &cleared.removed_originals);
    Plan {
        tokens_removed,
        tokens_cleared: 0,
        removed_fingerprints,
        session_chars: messages.iter().map(|m| m.chars).sum(),
        chars_removed: removed_chars.iter().sum(),
        messages_kept: split.messages_kept(&messages) as i64,
        cut_seq: messages[split.cut].seq,
        context: (messages[..split.cut].iter())
            .filter(|m| m.role == Role::System)
            .cloned()
            .collect(),
        removed_seqs,
        kept_seqs,
        removed_chars,
        old: take_removed(messages, &split.removed).into(),
        model: None,
        instructions: None,
        cleared: cleared.in_place,
        summarized: true,
        forced: false,
        redacted: Redactions::default(),
    }
}

/// The tokens of the removed messages' content and tool calls: what `chars` measures
/// (docs/protocol.md, "The schema"), in `o200k_base` tokens, for the usage event.
pub fn removed_tokens<'a>(removed: impl Iterator<Item = &'a Message>) -> i64 {
    removed
        .map(|m| count(&m.content) + count(&m.tool_calls_text()))
        .sum()
}

/// The tokens the cleared results' `originals` (by index) take beyond the placeholders
/// that now stand in `messages`.
fn tokens_cleared(messages: &[Message], originals: &[(usize, String)]) -> i64 {
    (originals.iter())
        .map(|(i, original)| count(original) - count(&messages[*i].content))
        .sum()
}

fn count(text: &str) -> i64 {
    i64::try_from(tokens::count(text)).unwrap_or(i64::MAX)
}

/// Moves the removed messages out of `messages`, oldest first.
fn take_removed(messages: Vec<Message>, removed: &[usize]) -> Vec<Message> {
    let mut next = removed.iter().peekable();
    messages
        .into_iter()
        .enumerate()
        .filter(|(i, _)| next.next_if_eq(&i).is_some())
        .map(|(_, m)| m)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: i64, role: Role, chars: usize) -> Message {
        let mut m = Message::text(role, &"y".repeat(chars));
        m.seq = seq;
        m
    }

    fn loaded(messages: Vec<Message>) -> Loaded {
        Loaded {
            fingerprints: messages.iter().map(|m| format!("v{}", m.seq)).collect(),
            cleared: vec![false; messages.len()],
            messages,
        }
    }

    fn limits() -> Limits {
        Limits {
            threshold_chars: 3_000,
            keep_chars: 1_000,
        }
    }

    #[test]
    fn the_old_part_goes_with_its_figures_and_the_system_message_is_context() {
        let mut messages = vec![message(1, Role::System, 50)];
        for turn in 0..4 {
            messages.push(message(2 + 2 * turn, Role::User, 300));
            messages.push(message(3 + 2 * turn, Role::Assistant, 600));
        }
        let plan = plan(loaded(messages), limits(), None, 0).unwrap();
        // The last turn (900 chars) is short of the keep: the last two stay.
        assert_eq!(plan.removed_seqs, [2, 3, 4, 5]);
        assert_eq!(plan.cut_seq, 6);
        assert_eq!(plan.removed_chars, [300, 600, 300, 600]);
        assert_eq!(plan.chars_removed, 1_800);
        assert_eq!(plan.removed_fingerprints, ["v2", "v3", "v4", "v5"]);
        assert_eq!(plan.messages_kept, 5, "the system message and two turns");
        assert_eq!(plan.context.len(), 1);
        assert_eq!(plan.old.len(), 4);
        assert!(plan.tokens_removed > 0);
        assert!(plan.summarized);
        assert_eq!(plan.request().old.len(), 4);
    }

    #[test]
    fn a_clearing_that_makes_room_enough_is_the_whole_compaction() {
        let mut messages = vec![message(1, Role::User, 100)];
        for n in 0..4 {
            let id = format!("c{n}");
            let mut call = message(2 + 2 * n, Role::Assistant, 0);
            call.tool_calls = Some(serde_json::json!([{"id": id, "name": "get_logs"}]));
            call.chars = 40;
            let mut result = message(3 + 2 * n, Role::Tool, 1_500);
            result.tool_call_id = Some(id);
            messages.extend([call, result]);
        }
        let rules = clearing::Rules {
            keep: 1,
            min_chars: 500,
            exclude: Vec::new(),
        };
        let plan = plan(loaded(messages), limits(), Some(&rules), 0).unwrap();
        assert!(!plan.summarized);
        assert_eq!(plan.cleared.len(), 3);
        assert_eq!(
            plan.cleared.iter().map(|c| c.seq).collect::<Vec<_>>(),
            [3, 5, 7]
        );
        assert!(plan.removed_seqs.is_empty());
        assert_eq!(
            plan.chars_cleared(),
            3 * (1_500 - plan.cleared[0].placeholder.len() as i64)
        );
    }
}
