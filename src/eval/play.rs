//! One scenario played as an agent plays it: each message appended in turn, and before
//! each of the agent's turns (an assistant message) the compaction a worker would run,
//! with the real planner, the summarizer under test and the summary check.
//!
//! After each compaction it records which planted facts have been compacted so far (were
//! in a removed part, an earlier summary included) and which of those the agent still
//! has in its context (the summary or a kept message): the recall an agent lives with.
//! It does the same for the planted statements, kind by kind (findings, and the task
//! state: actions, decisions, next steps): a statement is compacted when a removed
//! message stated it, and known while one sentence or line of the context (not a list
//! of identifiers) holds its subject and its value. And for the user's rules: a rule is
//! compacted when a removed message held it, and known while a message of the context
//! holds its exact words (whitespace runs aside).

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;

use super::corpus::{Kind, Scenario, Statement};
use crate::compaction::split;
use crate::config::{FactCheck, Limits};
use crate::fact_check::{self, Checked};
use crate::facts::{FactSet, contains_word};
use crate::message::{Message, Role, char_count};
use crate::summarizer::{LlmError, Summarizer, SummaryRequest};
use crate::summary;
use crate::usage::Meter;

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
    /// The same of the planted statements: stated in a removed part so far, ...
    pub statements_compacted: usize,
    /// ... of those, still stated (subject and value in one statement) in the context, ...
    pub statements_known: usize,
    /// ... by phase (compacted, known), ...
    #[serde(skip)]
    pub statements_by_phase: Vec<(usize, usize)>,
    /// ... and the ones the context no longer states. These five are of the findings.
    pub statements_missing: Vec<String>,
    /// The planted statements of each kind ([`Kind::ALL`]'s order), findings included.
    pub by_kind: [Tally; 4],
    /// The compacted actions, decisions and next steps the context no longer states.
    pub task_missing: Vec<String>,
    /// The user's rules compacted so far, and of those the ones the context holds word
    /// for word ...
    pub rules: Tally,
    /// ... and the ones it does not.
    pub rules_missing: Vec<String>,
    /// The summary written.
    #[serde(skip)]
    pub summary: String,
    /// The requests it took (first answers, the acceptance gate's and the fact check's
    /// second asks, retries), and the prompt and completion tokens their answers
    /// reported: what the worker's usage event records.
    pub llm_requests: i64,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
}

/// Of some planted facts: how many were compacted so far, and how many of those the
/// context still has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub compacted: usize,
    pub known: usize,
}

/// What is tracked: the planted identifiers, the planted statements, or the user's rules.
#[derive(Clone, Copy)]
enum Probe<'a> {
    Identifier(&'a str),
    Statement(&'a Statement),
    /// A rule, its whitespace runs made single spaces.
    Rule(&'a str),
}

impl Probe<'_> {
    /// Whether `m` (its content, or its calls' arguments) holds this fact: the
    /// identifier as a whole word, the statement in one of its sentences or lines, the
    /// rule word for word in its content.
    fn in_message(self, m: &Message) -> bool {
        match self {
            Self::Identifier(fact) => mentions(m, fact),
            Self::Statement(statement) => {
                statement.stated_in(&m.content)
                    || m.tool_calls
                        .as_ref()
                        .is_some_and(|calls| statement.stated_in(&calls.to_string()))
            }
            Self::Rule(rule) => single_spaced(&m.content).contains(rule),
        }
    }

    fn label(self) -> String {
        match self {
            Self::Identifier(fact) | Self::Rule(fact) => fact.to_owned(),
            Self::Statement(statement) => statement.to_string(),
        }
    }
}

/// `text` with every run of whitespace made one space: a rule is kept word for word
/// whether it is quoted on one line or wrapped.
fn single_spaced(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the agent knows of some planted facts after a compaction.
struct Known {
    compacted: usize,
    known: usize,
    by_phase: Vec<(usize, usize)>,
    missing: Vec<String>,
}

impl Known {
    fn tally(&self) -> Tally {
        Tally {
            compacted: self.compacted,
            known: self.known,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Play {
    pub compactions: Vec<Compaction>,
    /// Compactions whose summary the summarizer or the check refused: the session stays
    /// as it was, as the worker leaves it.
    pub failures: Vec<String>,
    /// Second attempts the fact check asked for (an LLM's, in `retry` mode).
    pub fact_retries: usize,
    /// Answers the acceptance gate refused (an echo of the earlier summary, an
    /// acknowledgement: docs/compaction.md, "The acceptance gate"), those of a compaction
    /// that failed because the gate refused its second answer too included.
    pub refused: usize,
    /// Requests sent to the summarizer's provider, those of compactions that failed
    /// included.
    pub llm_requests: i64,
}

/// A compaction as it ends, for a report that cannot wait for the whole run (a real
/// model takes minutes per compaction): what it wrote, or why the summarizer or the
/// check refused it, with the play's running counts.
pub enum Ended<'a> {
    Written(&'a Compaction),
    Failed(&'a str),
}

/// What the worker does with a summary before it writes it, as the settings say.
#[derive(Clone, Copy, Debug)]
pub struct Checks {
    /// `SUMMARY_MAX_CHARS`: the template check's limit.
    pub max_chars: i64,
    /// `SUMMARY_FACT_CHECK` and its minimum: when a summary is asked for once more.
    pub fact_check: FactCheck,
    /// `SUMMARY_USER_WORDS_CHARS`: the user's words quoted after the summary.
    pub user_words_chars: usize,
}

impl Checks {
    /// The worker's defaults with a summary of at most `max_chars`.
    pub fn defaults(max_chars: i64) -> Self {
        Self {
            max_chars,
            fact_check: FactCheck::default(),
            user_words_chars: summary::words::DEFAULT_CHARS,
        }
    }
}

/// Plays `scenario` with `summarizer` at `limits`, summaries checked and finished as the
/// worker would under `checks` (the template check, the acceptance gate where the
/// summarizer runs it, the fact check asking once more, the user's words quoted after);
/// it stops after the `until`th compaction when given (a subset for a slow model).
pub async fn play(
    scenario: &Scenario,
    summarizer: &dyn Summarizer,
    limits: Limits,
    checks: Checks,
    until: Option<usize>,
    on_end: &mut dyn FnMut(Ended<'_>, &Play),
) -> Play {
    let facts: Vec<(usize, Probe<'_>)> = (scenario.phases.iter().enumerate())
        .flat_map(|(i, phase)| {
            (phase.facts.iter()).map(move |f| (i, Probe::Identifier(f.as_str())))
        })
        .collect();
    let statements: [Vec<(usize, Probe<'_>)>; 4] = Kind::ALL.map(|kind| {
        (scenario.phases.iter().enumerate())
            .flat_map(|(i, phase)| {
                (phase.statements.iter())
                    .filter(move |s| s.kind == kind)
                    .map(move |s| (i, Probe::Statement(s)))
            })
            .collect()
    });
    let rule_texts: Vec<(usize, String)> = (scenario.phases.iter().enumerate())
        .flat_map(|(i, phase)| (phase.rules.iter()).map(move |r| (i, single_spaced(r))))
        .collect();
    let rules: Vec<(usize, Probe<'_>)> = (rule_texts.iter())
        .map(|(i, rule)| (*i, Probe::Rule(rule.as_str())))
        .collect();
    let mut compacted: HashSet<usize> = HashSet::new();
    let mut statements_compacted: [HashSet<usize>; 4] = Default::default();
    let mut rules_compacted: HashSet<usize> = HashSet::new();
    let mut session: Vec<Message> = scenario.system.iter().cloned().collect();
    let mut play = Play::default();
    for played in &scenario.messages {
        if until.is_some_and(|n| play.compactions.len() >= n) {
            break;
        }
        if played.message.role == Role::Assistant
            && let Ok(split) = split::plan(&session, limits)
        {
            let old: Vec<Message> = split.removed(&session).cloned().collect();
            let context: Vec<Message> = (session[..split.cut].iter())
                .filter(|m| m.role == Role::System)
                .cloned()
                .collect();
            let removed_chars = split.chars_removed(&session);
            let started = Instant::now();
            let meter = Meter::new();
            let asked = (&context[..], &old[..], &meter);
            let checked = summarize(summarizer, asked, removed_chars, checks, &mut play).await;
            let millis = started.elapsed().as_secs_f64() * 1000.0;
            let usage = meter.total();
            play.llm_requests += usage.requests;
            match checked {
                Err(e) => {
                    on_end(Ended::Failed(&e), &play);
                    play.failures.push(e);
                }
                Ok(text) => {
                    mark_compacted(&facts, &old, &mut compacted);
                    for (probes, done) in statements.iter().zip(&mut statements_compacted) {
                        mark_compacted(probes, &old, done);
                    }
                    mark_compacted(&rules, &old, &mut rules_compacted);
                    let kept = session.split_off(split.cut);
                    session.retain(|m| m.role == Role::System);
                    session.push(summary_message(&text));
                    session.extend(kept);
                    let phases = scenario.phases.len();
                    let of_facts = knowledge(&facts, &compacted, &session, phases);
                    let [of_findings, task @ ..] = [0, 1, 2, 3].map(|k| {
                        knowledge(&statements[k], &statements_compacted[k], &session, phases)
                    });
                    let of_rules = knowledge(&rules, &rules_compacted, &session, phases);
                    let mut by_kind = [Tally::default(); 4];
                    by_kind[0] = of_findings.tally();
                    for (tally, known) in by_kind[1..].iter_mut().zip(&task) {
                        *tally = known.tally();
                    }
                    let compaction = Compaction {
                        removed_chars,
                        summary_chars: char_count(&text),
                        millis,
                        compacted: of_facts.compacted,
                        known: of_facts.known,
                        by_phase: of_facts.by_phase,
                        missing: of_facts.missing,
                        statements_compacted: of_findings.compacted,
                        statements_known: of_findings.known,
                        statements_by_phase: of_findings.by_phase,
                        statements_missing: of_findings.missing,
                        by_kind,
                        task_missing: task.into_iter().flat_map(|k| k.missing).collect(),
                        rules: of_rules.tally(),
                        rules_missing: of_rules.missing,
                        summary: text,
                        llm_requests: usage.requests,
                        prompt_tokens: usage.prompt_tokens,
                        completion_tokens: usage.completion_tokens,
                    };
                    on_end(Ended::Written(&compaction), &play);
                    play.compactions.push(compaction);
                }
            }
        }
        session.push(played.message.clone());
    }
    play
}

/// The summary the worker would write, finished: the first that passes the template
/// check, or a second attempt that keeps more facts when the first kept too few of what
/// the old part established, measured with the user's words the worker quotes.
async fn summarize(
    summarizer: &dyn Summarizer,
    (context, old, meter): (&[Message], &[Message], &Meter),
    removed_chars: i64,
    checks: Checks,
    play: &mut Play,
) -> Result<String, String> {
    let check = |summary: crate::summary::Summary| {
        summary::accept(&summary.text, removed_chars, checks.max_chars)
            .map(|text| (summary, text))
            .map_err(|e| e.to_string())
    };
    let finish = |text: String| {
        summary::finish(
            text,
            old,
            &[],
            (removed_chars, checks.max_chars),
            checks.user_words_chars,
        )
    };
    let marker = crate::prompt::draw_marker(context, old);
    let request = SummaryRequest {
        old,
        context,
        meter: Some(meter),
        marker: Some(&marker),
        ..SummaryRequest::default()
    };
    let answered = summarizer.summarize(request).await;
    if let Err(LlmError::Refused(_)) = &answered {
        // The gate refused the answer, asked again, and refused that one too.
        play.refused += 2;
    }
    let (summary, text) = answered.map_err(|e| e.to_string()).and_then(check)?;
    play.refused += summary.refused.len();
    let facts = FactSet::established_in(old);
    let recall = facts.recall(&finish(text.clone()));
    let first = Checked {
        summary,
        text,
        recall,
    };
    let max_chars = usize::try_from(checks.max_chars).unwrap_or(usize::MAX);
    if !fact_check::asks_again(checks.fact_check, &first, &facts, max_chars)
        || !summarizer.can_do_better(None)
    {
        return Ok(finish(first.text));
    }
    let missing = facts.said_in(old, &first.recall.missing, crate::prompt::MAX_LISTED_FACTS);
    let again = summarizer.summarize(request.again(&missing));
    play.fact_retries += 1;
    match again.await.map_err(|e| e.to_string()).and_then(check) {
        Ok((summary, text)) => {
            let recall = facts.recall(&finish(text.clone()));
            let second = Checked {
                summary,
                text,
                recall,
            };
            let (kept, outcome) = fact_check::better(first, second);
            summarizer.retried(None, outcome == fact_check::RetryOutcome::Improved);
            Ok(finish(kept.text))
        }
        Err(_) => Ok(finish(first.text)),
    }
}

/// Marks the facts that `old` (a part being removed) holds as compacted.
fn mark_compacted(facts: &[(usize, Probe<'_>)], old: &[Message], compacted: &mut HashSet<usize>) {
    for (i, (_, fact)) in facts.iter().enumerate() {
        if !compacted.contains(&i) && old.iter().any(|m| fact.in_message(m)) {
            compacted.insert(i);
        }
    }
}

/// What the agent knows of the compacted facts, given its context now.
fn knowledge(
    facts: &[(usize, Probe<'_>)],
    compacted: &HashSet<usize>,
    session: &[Message],
    phases: usize,
) -> Known {
    let mut record = Known {
        compacted: 0,
        known: 0,
        by_phase: vec![(0, 0); phases],
        missing: Vec::new(),
    };
    let mut compacted: Vec<usize> = compacted.iter().copied().collect();
    compacted.sort_unstable();
    for i in compacted {
        let (phase, fact) = facts[i];
        record.compacted += 1;
        record.by_phase[phase].0 += 1;
        if session.iter().any(|m| fact.in_message(m)) {
            record.known += 1;
            record.by_phase[phase].1 += 1;
        } else {
            record.missing.push(fact.label());
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
        pinned: false,
    }
}
