//! One scenario played as an agent plays it: each message appended in turn, and before
//! each of the agent's turns (an assistant message) the compaction a worker would run,
//! with the real planner, the summarizer under test and the summary check.
//!
//! After each compaction it records which planted facts have been compacted so far (were
//! in a removed part, an earlier summary included) and which of those the agent still
//! has in its context (the summary or a kept message): the recall an agent lives with.

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;

use super::corpus::Scenario;
use crate::config::{FactCheck, Limits};
use crate::fact_check::{self, Checked};
use crate::facts::{FactSet, contains_word};
use crate::message::{Message, Role, char_count};
use crate::summarizer::Summarizer;
use crate::{planner, summary};

/// What one compaction did, and what the agent knew after it.
#[derive(Clone, Debug, Serialize)]
pub struct Compaction {
    pub removed_chars: i64,
    pub summary_chars: i64,
    pub millis: f64,
    /// Planted facts compacted so far.
    pub compacted: usize,
    /// Of those, the ones still in the context.
    pub known: usize,
    /// By phase: (compacted, known).
    #[serde(skip)]
    pub by_phase: Vec<(usize, usize)>,
    /// The compacted facts the context lacks, in the corpus's order.
    pub missing: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Play {
    pub compactions: Vec<Compaction>,
    /// Compactions whose summary the summarizer or the check refused: the session stays
    /// as it was, as the worker leaves it.
    pub failures: Vec<String>,
    /// Second attempts the fact check asked for (an LLM's, in `retry` mode).
    pub fact_retries: usize,
}

/// Plays `scenario` with `summarizer` at `limits`, summaries checked against
/// `max_chars` (`SUMMARY_MAX_CHARS`) and, as the worker does, asked once more under
/// `fact_check` when they lost too many facts.
pub async fn play(
    scenario: &Scenario,
    summarizer: &dyn Summarizer,
    limits: Limits,
    max_chars: i64,
    fact_check: FactCheck,
) -> Play {
    let facts: Vec<(usize, &str)> = (scenario.phases.iter().enumerate())
        .flat_map(|(i, phase)| phase.facts.iter().map(move |f| (i, f.as_str())))
        .collect();
    let mut compacted: HashSet<usize> = HashSet::new();
    let mut session: Vec<Message> = scenario.system.iter().cloned().collect();
    let mut play = Play::default();
    for played in &scenario.messages {
        if played.message.role == Role::Assistant
            && let Ok(split) = planner::plan(&session, limits)
        {
            let old: Vec<Message> = split.removed(&session).cloned().collect();
            let context: Vec<Message> = (session[..split.cut].iter())
                .filter(|m| m.role == Role::System)
                .cloned()
                .collect();
            let removed_chars = split.chars_removed(&session);
            let started = Instant::now();
            let checked = summarize(
                summarizer,
                &context,
                &old,
                removed_chars,
                max_chars,
                fact_check,
                &mut play,
            )
            .await;
            let millis = started.elapsed().as_secs_f64() * 1000.0;
            match checked {
                Err(e) => play.failures.push(e),
                Ok(text) => {
                    for (i, (_, fact)) in facts.iter().enumerate() {
                        if !compacted.contains(&i) && old.iter().any(|m| mentions(m, fact)) {
                            compacted.insert(i);
                        }
                    }
                    let kept = session.split_off(split.cut);
                    session.retain(|m| m.role == Role::System);
                    session.push(summary_message(&text));
                    session.extend(kept);
                    play.compactions.push(knowledge(
                        &facts,
                        &compacted,
                        &session,
                        scenario.phases.len(),
                        Compaction {
                            removed_chars,
                            summary_chars: char_count(&text),
                            millis,
                            compacted: 0,
                            known: 0,
                            by_phase: Vec::new(),
                            missing: Vec::new(),
                        },
                    ));
                }
            }
        }
        session.push(played.message.clone());
    }
    play
}

/// The summary the worker would write: the first that passes the template check, or a
/// second attempt that keeps more facts when the first kept too few.
async fn summarize(
    summarizer: &dyn Summarizer,
    context: &[Message],
    old: &[Message],
    removed_chars: i64,
    max_chars: i64,
    fact_check: FactCheck,
    play: &mut Play,
) -> Result<String, String> {
    let check = |summary: crate::summary::Summary| {
        summary::accept(&summary.text, removed_chars, max_chars)
            .map(|text| (summary, text))
            .map_err(|e| e.to_string())
    };
    let (summary, text) = summarizer
        .summarize_in_context(context, old, None)
        .await
        .map_err(|e| e.to_string())
        .and_then(check)?;
    let facts = FactSet::of_messages(old);
    let recall = facts.recall(&text);
    if !fact_check::worth_retrying(fact_check, &recall) {
        return Ok(text);
    }
    let missing = recall.missing.clone();
    let Some(again) = summarizer.summarize_keeping(context, old, None, &missing) else {
        return Ok(text);
    };
    play.fact_retries += 1;
    let first = Checked {
        summary,
        text,
        recall,
    };
    match again.await.map_err(|e| e.to_string()).and_then(check) {
        Ok((summary, text)) => {
            let recall = facts.recall(&text);
            let second = Checked {
                summary,
                text,
                recall,
            };
            Ok(fact_check::better(first, second).0.text)
        }
        Err(_) => Ok(first.text),
    }
}

/// Fills in what the agent knows of the compacted facts, given its context now.
fn knowledge(
    facts: &[(usize, &str)],
    compacted: &HashSet<usize>,
    session: &[Message],
    phases: usize,
    mut record: Compaction,
) -> Compaction {
    record.by_phase = vec![(0, 0); phases];
    let mut compacted: Vec<usize> = compacted.iter().copied().collect();
    compacted.sort_unstable();
    for i in compacted {
        let (phase, fact) = facts[i];
        let known = session.iter().any(|m| mentions(m, fact));
        record.compacted += 1;
        record.by_phase[phase].0 += 1;
        if known {
            record.known += 1;
            record.by_phase[phase].1 += 1;
        } else {
            record.missing.push(fact.to_owned());
        }
    }
    record
}

/// Whether `m` (its content, or its calls' arguments) states `fact`.
fn mentions(m: &Message, fact: &str) -> bool {
    contains_word(&m.content, fact)
        || m.tool_calls
            .as_ref()
            .is_some_and(|calls| contains_word(&calls.to_string(), fact))
}

fn summary_message(text: &str) -> Message {
    Message {
        seq: 0,
        role: Role::User,
        content: text.to_owned(),
        tool_calls: None,
        tool_call_id: None,
        is_summary: true,
        chars: char_count(text),
    }
}
