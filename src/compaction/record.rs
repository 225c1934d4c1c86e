//! The record of one compaction: everything the commit writes ([`Record`]), built by one
//! constructor for a summary and for a clearing alone, and the usage event's metadata,
//! whose shape is defined here and nowhere else (docs/protocol.md, "The schema"). A
//! pending summary stores its metadata from here too; applying it adds only what the
//! database alone knows at that moment ([`MEASURED_AT_APPLY`]) and the applying turn's
//! ids ([`applied_turn_metadata`]).

use serde_json::{Value, json};

use super::plan::{ClearedRow, Plan};
use crate::fact_check::Figures;
use crate::message::char_count;
use crate::protocol::Instructions;
use crate::redact::Redactions;
use crate::summary::Summary;
use crate::usage::Usage;

use super::tokens;

/// The usage event's `model` for a clearing alone, which asked no model.
pub const CLEARING_MODEL: &str = "tool-output-clearing";

/// The metadata a pending summary's apply measures in the database, in the transaction
/// that writes it: the messages kept then, the apply's own time, and when the summary
/// was prepared (`pending_summaries.created_at`).
pub const MEASURED_AT_APPLY: [&str; 3] = ["messages_kept", "duration_ms", "precomputed_at"];

/// A summary written for a plan and checked: what a commit or a pending summary stores.
#[derive(Debug)]
pub struct Written {
    pub summary: Summary,
    /// The text to write: the summary's, finished (see [`crate::summary::finish`]).
    pub text: String,
    /// The fact check's figures; `None` when it is off.
    pub facts: Option<Figures>,
    /// Every request the summary took and what their answers reported
    /// ([`crate::usage`]).
    pub usage: Usage,
    /// The secrets kept out of what the summarizer saw and of the text, by kind
    /// (`REDACT_SECRETS`; see [`crate::redact`]).
    pub redacted: Redactions,
}

/// Who asked for a compaction, and under which lease: the turn's side of its record.
#[derive(Clone, Copy, Debug)]
pub struct Turn<'a> {
    pub session_id: &'a str,
    pub lease_owner: &'a str,
    pub request_id: &'a str,
    /// The durable job that asked for it, if one did.
    pub job_id: Option<&'a str>,
    /// The request forced it (`"force": true`).
    pub forced: bool,
    /// It answers a context overflow (`"overflow": true`).
    pub overflow: bool,
    /// The fleet started it in a session left idle (`SUMMARIZATION_IDLE_AFTER_MS`), no
    /// agent asked: `"idle": true`.
    pub idle: bool,
}

/// Everything the commit transaction writes, planned before the LLM call.
#[derive(Debug)]
pub struct Record<'a> {
    pub session_id: &'a str,
    pub lease_owner: &'a str,
    /// The seq of the first kept message: everything older that is not `system` goes.
    pub cut_seq: i64,
    /// The removed messages' seqs, chars and fingerprints (the load's), oldest first, as
    /// planned.
    pub removed_seqs: &'a [i64],
    pub removed_chars: &'a [i64],
    /// The seqs of the messages before the cut that stay in place besides system
    /// messages: pinned messages and their tool-call partners (`split::Split::kept`).
    /// The commit removes every other non-system message before the cut, and gives up
    /// when those are not exactly `removed_seqs`.
    pub kept_seqs: &'a [i64],
    pub removed_fingerprints: &'a [String],
    pub text: &'a str,
    pub model: &'a str,
    /// The session's own model (`session_settings.model`), recorded in the usage event's
    /// metadata as `requested_model` when set.
    pub requested_model: Option<&'a str>,
    /// Every request of the compaction, and the usage its answers reported: the usage
    /// event's `prompt_tokens`, `completion_tokens` and `cached_prompt_tokens` columns
    /// and its `llm_requests`. Nothing for a clearing alone.
    pub usage: Usage,
    /// The prompt's version, when a prompt asked for the summary.
    pub prompt_version: Option<&'a str>,
    /// Why the fallback summarizer wrote it, when it did (`LLM_FALLBACK`).
    pub fallback_reason: Option<&'a str>,
    /// The rules the answers before the written one broke (the acceptance gate asked
    /// again): `refused_answers` in the metadata.
    pub refused: &'a [&'static str],
    /// What the answers copied of the prompt (its examples, a second attempt's list),
    /// taken out: `prompt_examples_removed` in the metadata when there were any.
    pub copied_from_prompt: usize,
    pub messages_kept: i64,
    /// The tokenizer's count of the removed part, and of the summary.
    pub tokens_removed: i64,
    pub summary_tokens: i64,
    /// The tokens the results cleared in place no longer take (`tokens_cleared`).
    pub tokens_cleared: i64,
    /// The fact check's figures; `None` when `SUMMARY_FACT_CHECK=off`.
    pub facts: Option<Figures>,
    pub request_id: &'a str,
    /// The durable job that asked for it, if one did.
    pub job_id: Option<&'a str>,
    /// Time since the lease was taken, for the duration histogram.
    pub duration_ms: i64,
    /// `false` for a clearing alone: no prefix is removed (`removed_*` empty) and no
    /// summary written (`text` empty).
    pub summarized: bool,
    /// The tool results cleared in place, in `seq` order (docs/compaction.md, "Clearing
    /// old tool output").
    pub cleared: &'a [ClearedRow],
    /// The request forced it (`"force": true`): recorded as `forced` in the usage event.
    pub forced: bool,
    /// It answers a context overflow (`"overflow": true`): recorded as `overflow`.
    pub overflow: bool,
    /// An idle pass started it (`"idle": true`).
    pub idle: bool,
    /// The request's focus for the summary, recorded as `instructions` in the usage
    /// event, with who wrote them as `instructions_from`.
    pub instructions: Option<&'a Instructions>,
    /// The secrets redacted, by kind: `redacted` in the usage event when there were any.
    pub redacted: Option<&'a Redactions>,
}

impl<'a> Record<'a> {
    /// The record of `plan` for `turn`, `duration_ms` after its lease was taken: with
    /// `written`, its summary; without, a clearing alone (`plan.summarized` is false),
    /// which asked no model, removed nothing and wrote no summary, so that neither the
    /// session's model nor the request's instructions are recorded for it.
    pub fn new(
        plan: &'a Plan,
        turn: Turn<'a>,
        written: Option<&'a Written>,
        duration_ms: i64,
    ) -> Self {
        let summary = written.map(|w| &w.summary);
        Self {
            session_id: turn.session_id,
            lease_owner: turn.lease_owner,
            cut_seq: plan.cut_seq,
            removed_seqs: &plan.removed_seqs,
            kept_seqs: &plan.kept_seqs,
            removed_chars: &plan.removed_chars,
            removed_fingerprints: &plan.removed_fingerprints,
            text: written.map_or("", |w| &w.text),
            model: summary.map_or(CLEARING_MODEL, |s| &s.model),
            requested_model: written.and(plan.model.as_deref()),
            usage: written.map(|w| w.usage.recorded()).unwrap_or_default(),
            prompt_version: summary.and_then(|s| s.prompt_version.as_deref()),
            fallback_reason: summary.and_then(|s| s.fallback_reason.as_deref()),
            refused: summary.map_or(&[], |s| s.refused.as_slice()),
            copied_from_prompt: summary.map_or(0, |s| s.copied_from_prompt),
            messages_kept: plan.messages_kept,
            tokens_removed: if written.is_some() {
                plan.tokens_removed
            } else {
                0
            },
            summary_tokens: written.map_or(0, |w| {
                i64::try_from(tokens::count(&w.text)).unwrap_or(i64::MAX)
            }),
            tokens_cleared: plan.tokens_cleared,
            facts: written.and_then(|w| w.facts),
            request_id: turn.request_id,
            job_id: turn.job_id,
            duration_ms,
            summarized: written.is_some(),
            cleared: &plan.cleared,
            forced: turn.forced,
            overflow: turn.overflow,
            idle: turn.idle,
            instructions: written.and(plan.instructions.as_ref()),
            redacted: written.map(|w| &w.redacted),
        }
    }

    /// The usage event's metadata that describes the summary itself (tokens, prompt,
    /// fallback, model asked for, facts), without the turn's figures.
    fn summary_metadata(&self) -> Value {
        let mut metadata = json!({
            "tokens_removed": self.tokens_removed,
            "summary_tokens": self.summary_tokens,
            "llm_requests": self.usage.requests,
        });
        if let Some(version) = self.prompt_version {
            metadata["prompt_version"] = json!(version);
        }
        if let Some(reason) = self.fallback_reason {
            metadata["fallback"] = json!(true);
            metadata["fallback_reason"] = json!(reason);
        }
        if let Some(model) = self.requested_model {
            metadata["requested_model"] = json!(model);
        }
        if !self.refused.is_empty() {
            metadata["refused_answers"] = json!(self.refused);
        }
        if self.copied_from_prompt > 0 {
            metadata["prompt_examples_removed"] = json!(self.copied_from_prompt);
        }
        if let Some(redacted) = self.redacted.filter(|r| !r.is_empty()) {
            metadata["redacted"] = redacted.to_json();
        }
        if let Some(facts) = &self.facts {
            metadata["facts_total"] = json!(facts.total);
            metadata["facts_kept"] = json!(facts.kept);
            metadata["facts_stated"] = json!(facts.stated);
            metadata["facts_seen"] = json!(facts.weighing.seen);
            metadata["facts_said"] = json!(facts.weighing.said);
            metadata["facts_relied_on"] = json!(facts.weighing.relied_on);
            metadata["fact_retry"] = json!(facts.retry.is_some());
            if let Some(outcome) = facts.retry {
                metadata["fact_retry_outcome"] = json!(outcome.as_str());
            }
        }
        metadata
    }

    /// What was removed and written, whichever turn writes it.
    fn compaction_metadata(&self) -> Value {
        let mut metadata = self.summary_metadata();
        metadata["summarization"] = json!(true);
        metadata["messages_removed"] = json!(self.removed_seqs.len());
        metadata["chars_removed"] = json!(self.removed_chars.iter().sum::<i64>());
        metadata["summary_chars"] = json!(char_count(self.text));
        metadata["summarized"] = json!(self.summarized);
        if self.forced {
            metadata["forced"] = json!(true);
        }
        if self.overflow {
            metadata["overflow"] = json!(true);
        }
        if self.idle {
            metadata["idle"] = json!(true);
        }
        if let Some(instructions) = self.instructions {
            metadata["instructions"] = json!(instructions.text);
            metadata["instructions_from"] = json!(instructions.from.as_str());
        }
        if !self.cleared.is_empty() {
            metadata["tool_outputs_cleared"] = json!(self.cleared.len());
            metadata["chars_cleared"] = json!(self.chars_cleared());
            metadata["tokens_cleared"] = json!(self.tokens_cleared);
        }
        metadata
    }

    /// The usage event's whole metadata, for a commit.
    pub fn event_metadata(&self) -> Value {
        let mut metadata = self.compaction_metadata();
        metadata["messages_kept"] = json!(self.messages_kept);
        metadata["duration_ms"] = json!(self.duration_ms);
        merge(
            &mut metadata,
            applied_turn_metadata(self.request_id, self.job_id),
        );
        metadata
    }

    /// The metadata a pending summary stores for the turn that applies it: the event's,
    /// `precomputed: true` and the summary's own time (`precompute_ms`), without what
    /// belongs to that turn ([`applied_turn_metadata`], [`MEASURED_AT_APPLY`]).
    pub fn pending_metadata(&self) -> Value {
        let mut metadata = self.compaction_metadata();
        metadata["precomputed"] = json!(true);
        metadata["precompute_ms"] = json!(self.duration_ms);
        metadata
    }

    /// The chars per token of what the summary removed (its chars over the tokenizer's
    /// count of them), which the commit keeps as the session's `chars_per_token`; `None`
    /// when nothing with a token was removed.
    pub fn chars_per_token(&self) -> Option<f64> {
        let chars: i64 = self.removed_chars.iter().sum();
        (self.summarized && self.tokens_removed > 0 && chars > 0)
            .then(|| chars as f64 / self.tokens_removed as f64)
    }

    /// The chars the clearing saves.
    pub fn chars_cleared(&self) -> i64 {
        self.cleared.iter().map(|c| c.saved).sum()
    }
}

/// The usage event's metadata that names the turn that wrote it: its request id, and the
/// durable job's when a job asked.
pub fn applied_turn_metadata(request_id: &str, job_id: Option<&str>) -> Value {
    let mut metadata = json!({ "request_id": request_id });
    if let Some(job_id) = job_id {
        metadata["job_id"] = json!(job_id);
    }
    metadata
}

/// `more`'s fields set in `metadata` (both JSON objects).
pub fn merge(metadata: &mut Value, more: Value) {
    if let (Value::Object(into), Value::Object(from)) = (metadata, more) {
        into.extend(from);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::config::Limits;
    use crate::message::{Message, Role};
    use crate::protocol::InstructionsFrom;

    /// Six turns of a question and an answer of 400 chars each.
    fn loaded() -> super::super::Loaded {
        let messages: Vec<Message> = (0..12)
            .map(|i| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                let mut m = Message::text(role, &format!("{i} {}", "x".repeat(400)));
                m.seq = i + 1;
                m
            })
            .collect();
        super::super::Loaded {
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

    fn turn() -> Turn<'static> {
        Turn {
            session_id: "s",
            lease_owner: "w/1",
            request_id: "r1",
            job_id: Some("job-7"),
            forced: true,
            overflow: false,
            idle: false,
        }
    }

    fn keys(value: &Value) -> BTreeSet<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn a_pending_summary_stores_the_events_shape_but_for_what_the_applying_turn_gives() {
        let mut plan = super::super::plan(loaded(), limits(), None, 0).unwrap();
        plan.instructions = Some(Instructions {
            text: "keep the pool".to_owned(),
            from: InstructionsFrom::Agent,
        });
        let written = Written {
            summary: Summary {
                text: "**Investigating:** x".to_owned(),
                model: "m".to_owned(),
                ..Summary::default()
            },
            text: "**Investigating:** x".to_owned(),
            facts: None,
            usage: Usage {
                requests: 3,
                ..Usage::default()
            },
            redacted: Redactions::default(),
        };
        let record = Record::new(&plan, turn(), Some(&written), 12);
        let event = record.event_metadata();
        assert_eq!(event["llm_requests"], 3);
        assert!(event.get("redacted").is_none(), "{event}");
        assert_eq!(event["messages_removed"], json!(plan.removed_seqs.len()));
        assert_eq!(event["request_id"], "r1");
        assert_eq!(event["job_id"], "job-7");
        assert_eq!(event["instructions_from"], "agent");
        let pending = record.pending_metadata();
        let mut applied = keys(&pending);
        applied.extend(keys(&applied_turn_metadata("r2", Some("job-8"))));
        applied.extend(MEASURED_AT_APPLY.map(str::to_owned));
        let mut expected = keys(&event);
        expected.extend(["precomputed", "precompute_ms", "precomputed_at"].map(str::to_owned));
        assert_eq!(applied, expected);
        for turns_own in ["request_id", "job_id", "duration_ms", "messages_kept"] {
            assert!(pending.get(turns_own).is_none(), "{turns_own}");
        }
    }

    #[test]
    fn a_clearing_alone_records_no_model_no_summary_and_no_instructions() {
        let mut plan = super::super::plan(loaded(), limits(), None, 0).unwrap();
        plan.summarized = false;
        plan.model = Some("gpt-x".to_owned());
        plan.instructions = Some(Instructions {
            text: "keep the pool".to_owned(),
            from: InstructionsFrom::Operator,
        });
        let record = Record::new(&plan, turn(), None, 5);
        assert_eq!(record.model, CLEARING_MODEL);
        assert!(!record.summarized);
        assert_eq!(record.text, "");
        assert_eq!((record.requested_model, record.instructions), (None, None));
        assert_eq!((record.tokens_removed, record.summary_tokens), (0, 0));
        let event = record.event_metadata();
        assert_eq!(event["summarized"], false);
        assert!(event.get("instructions").is_none());
        assert_eq!(event["forced"], true);
    }
}
