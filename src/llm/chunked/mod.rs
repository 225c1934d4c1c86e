//! [`LlmSummarizer`]: a [`Summarizer`] over any [`Chat`] provider that keeps every request
//! within `LLM_MAX_INPUT_TOKENS`, whatever the size of the old part.
//!
//! The old part is rendered message by message and each message counted with the
//! tokenizer. When the whole transcript fits, it goes as one request, as it always did.
//! Otherwise it is split at message boundaries into chunks ([`super::chunks`]) summarized
//! oldest first, each request holding the running summary of the chunks before it as the
//! `[earlier summary]` the prompt folds in; the last answer, in the seed's template, is
//! the summary. A message that alone is over a chunk's room is clipped head and tail with
//! a marker. A provider's context-length error shrinks the budget (x0.7, at most
//! [`MAX_SHRINKS`] times in one summarization) and the rest is planned again. An answer
//! cut off at the output limit ([`LlmError::Truncated`]), for any chunk, is never taken
//! as a summary or a running one: the same chunk is asked again with half as much room
//! again and a note asking for a shorter summary (kept in every later request), at most
//! [`MAX_TRUNCATIONS`] times in one summarization; then the summarization fails
//! (`failed/llm_error`, or the extractive fallback with `LLM_FALLBACK=extractive`).
//!
//! `LLM_DEADLINE_MS` bounds the whole summarization, every chunk's request, retries and
//! waits included, not each request: the session's lease (`LEASE_DURATION_MS`, kept
//! above the deadline) is what keeps other workers out meanwhile, and a summarization
//! that outlived it would be thrown away at commit. A very long history with a slow model
//! therefore needs a longer deadline (and lease), not a per-request one.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tokio::time::Instant;

use super::chat::{Chat, ChatRequest};
use super::chunks;
use crate::compaction::tokens;
use crate::config::LlmSettings;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::prompt::{self, MissingFacts, Prompt, Transcript};
use crate::protocol::Instructions;
use crate::summarizer::{LlmError, Summarizer, SummaryRequest};
use crate::summary::{self, Rejected, Summary, added_since_summary};
use crate::usage::Meter;

mod second_attempts;

pub use second_attempts::SecondAttempts;

/// `old` without its earlier summary, and that summary without the worker's own parts;
/// `None` when it has none, or nothing after it (see [`added_since_summary`]).
fn without_earlier_summary(old: &[Message]) -> Option<(String, Vec<Message>)> {
    let added = added_since_summary(old)?;
    let at = old.iter().rposition(|m| m.is_summary)?;
    let mut newer = old.to_vec();
    newer.remove(at);
    Some((added.earlier, newer))
}

/// Context-length errors survived in one summarization before it fails: 0.7^4 is about
/// a quarter of the configured budget, past which the setting is wrong, not a little off.
pub const MAX_SHRINKS: usize = 4;

/// How long past `LLM_DEADLINE_MS` the whole summarization is cut short. A provider's
/// own retries end by the same deadline counted from its request's start, a moment after
/// this summarization's, and then report their own cause (the last `HTTP 500`, say): cut
/// at exactly the deadline, a retry wait or attempt ending in that moment was reported as
/// "deadline reached" instead. The lease (`LEASE_DURATION_MS`) has room for far more.
const PROVIDER_GRACE: Duration = Duration::from_millis(250);

/// Answers cut off at the output limit survived in one summarization before it fails:
/// each is asked again, for a shorter summary, with half as much room again.
pub const MAX_TRUNCATIONS: usize = 2;

/// A chunk's room under this many tokens is no room: the budget is too small for the
/// prompt and the running summary.
const MIN_CHUNK_TOKENS: usize = 64;

/// Room for the running summary's header (`[earlier summary]`) beyond its text.
const RUNNING_HEADER_TOKENS: usize = 16;

/// Old parts with more characters than this are rendered, counted and planned on the
/// blocking pool: at the tokenizer's speed (docs/benchmarks.md, "Figures behind the
/// code"), below this it takes well under a millisecond and the hop would cost more than
/// it saves.
const OFF_THREAD_CHARS: usize = 32 * 1024;

pub struct LlmSummarizer {
    chat: Box<dyn Chat>,
    prompt: Prompt,
    max_input_tokens: usize,
    summary_max_tokens: u32,
    /// `SUMMARY_MAX_CHARS`: a longer answer is refused by the gate.
    summary_max_chars: i64,
    deadline: Duration,
    /// Where refused answers are counted (`summarizer_answers_refused_total`).
    metrics: Option<Arc<Metrics>>,
    /// How the fact check's second attempts went, per model.
    second_attempts: SecondAttempts,
}

impl LlmSummarizer {
    /// With the budgets `settings` give (`LLM_MAX_INPUT_TOKENS`, `SUMMARY_MAX_CHARS`,
    /// `LLM_DEADLINE_MS`).
    pub fn new(chat: Box<dyn Chat>, settings: &LlmSettings) -> Self {
        Self::with_budget(
            chat,
            settings.max_input_tokens,
            settings.summary_max_tokens(),
            settings.deadline,
        )
        .with_prompt(settings.prompt.clone())
        .with_max_chars(settings.summary_max_chars)
    }

    /// `SUMMARY_MAX_CHARS`, when it is not three times `summary_max_tokens`.
    pub fn with_max_chars(mut self, max_chars: usize) -> Self {
        self.summary_max_chars = i64::try_from(max_chars).unwrap_or(i64::MAX);
        self
    }

    /// Counts refused answers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The system prompt in force (`SUMMARY_PROMPT_FILE`), instead of the default.
    pub fn with_prompt(mut self, prompt: Prompt) -> Self {
        self.prompt = prompt;
        self
    }

    /// Every request within `max_input_tokens`, each answer asked to stay within
    /// `summary_max_tokens`, the whole within `deadline`.
    pub fn with_budget(
        chat: Box<dyn Chat>,
        max_input_tokens: usize,
        summary_max_tokens: u32,
        deadline: Duration,
    ) -> Self {
        Self {
            chat,
            prompt: Prompt::default(),
            max_input_tokens,
            summary_max_tokens,
            summary_max_chars: i64::from(summary_max_tokens).saturating_mul(3),
            deadline,
            metrics: None,
            second_attempts: SecondAttempts::default(),
        }
    }

    /// The summary of `old`; with `missing`, a second attempt whose last request lists
    /// the identifiers a first summary left out.
    ///
    /// The last request's answer passes the acceptance gate ([`LlmSummarizer::gate`]):
    /// an answer it refuses is asked for once more, the same request with a note saying
    /// what was wrong, and a second refusal is [`LlmError::Refused`]. An echo of the
    /// earlier summary is asked for once more differently: the messages after the earlier
    /// summary alone, whose summary is then merged into it ([`summary::merge`]), since a
    /// model that repeated what it was shown (a small one does, every time) repeats it
    /// again when told not to. (A second attempt of the fact check is not asked a third
    /// time: its refusal is the error.)
    async fn summarize_all(
        &self,
        context: &[Message],
        old: &[Message],
        (model, instructions, marker): (Option<&str>, Option<&Instructions>, Option<&str>),
        missing: Option<MissingFacts>,
        meter: Option<&Meter>,
    ) -> Result<Summary, LlmError> {
        let deadline = Instant::now() + self.deadline + PROVIDER_GRACE;
        let large = old.iter().map(|m| m.content.len()).sum::<usize>() > OFF_THREAD_CHARS;
        let may_ask_again = missing.is_none();
        let missing_listed = missing.as_ref().map(|m| m.listed.clone());
        let mut rendered = self
            .render(large, (context, old), (instructions, marker), missing)
            .await?;
        let mut budget = self.max_input_tokens;
        let mut shrinks = 0;
        let mut next = 0;
        let mut requests = 0;
        let mut truncations = 0;
        let mut max_tokens = self.summary_max_tokens;
        // The running summary the next request folds in. (Every request and answer is
        // counted into `meter` as it is made.)
        let mut running: Option<String> = None;
        let mut refused: Vec<&'static str> = Vec::new();
        let mut refusal_note: Option<String> = None;
        // After an echo: the earlier summary the answer about the newer messages alone
        // is merged into.
        let mut merge_into: Option<String> = None;
        // Clauses of the prompt's examples taken out of the answers.
        let mut copied_from_prompt = 0;
        loop {
            // After a cut-off answer, every later request asks for a shorter one too.
            let note = (truncations > 0).then(|| rendered.transcript.cut_off_note());
            let note = [note, refusal_note.clone()]
                .into_iter()
                .flatten()
                .collect::<String>();
            let note_tokens = tokens::count(&note);
            let (mut request, end) = self
                .next_request(
                    &rendered,
                    large,
                    next,
                    (budget.saturating_sub(note_tokens), max_tokens),
                    running.clone(),
                )
                .await?;
            request.model = model.map(str::to_owned);
            request.user.push_str(&note);
            requests += 1;
            let answered = tokio::time::timeout_at(deadline, self.chat.complete(&request, meter))
                .await
                .map_err(|_| LlmError::Transient {
                    cause: format!(
                        "deadline reached during request {requests} (messages {next}..{end} \
                         of {})",
                        rendered.pieces.len()
                    ),
                    retry_after: None,
                })?;
            match answered {
                Ok(mut summary) => {
                    let last = end >= rendered.pieces.len();
                    if !last {
                        running = Some(summary.text);
                        next = end;
                        continue;
                    }
                    // What the model copied of the prompt's own examples, or of the
                    // list of facts a second attempt was given, is no finding.
                    let (text, copied) = prompt::strip_copied_examples(&summary.text, old);
                    let (text, pasted) = match &missing_listed {
                        Some(listed) => prompt::strip_copied_list(&text, listed),
                        None => (text, 0),
                    };
                    summary.text = text;
                    copied_from_prompt += copied + pasted;
                    if let Some(earlier) = &merge_into {
                        let newer = summary::strip_ours(&summary.text);
                        summary.text = summary::merge(earlier, &newer, self.summary_max_chars);
                    }
                    let Err(rejected) = self.gate(&summary.text, old) else {
                        summary.text = summary::strip_ours(&summary.text);
                        summary.refused = refused;
                        summary.copied_from_prompt = copied_from_prompt;
                        summary.prompt_version = Some(self.prompt.version().to_owned());
                        return Ok(summary);
                    };
                    if let Some(metrics) = &self.metrics {
                        metrics.answer_refused(rejected.rule());
                    }
                    if !may_ask_again || !refused.is_empty() {
                        return Err(LlmError::Refused(rejected));
                    }
                    tracing::warn!(
                        rule = rejected.rule(),
                        error = %rejected,
                        "the answer is not a summary the worker writes; asking once more"
                    );
                    refused.push(rejected.rule());
                    if let (Rejected::Echo { .. }, Some((earlier, newer))) =
                        (&rejected, without_earlier_summary(old))
                    {
                        // A model shown the earlier summary repeated it: asked about the
                        // newer messages alone, it cannot, and the worker keeps what the
                        // earlier summary said by merging the two (`summary::merge`).
                        rendered = self
                            .render(large, (context, &newer), (instructions, marker), None)
                            .await?;
                        merge_into = Some(earlier);
                        (next, running) = (0, None);
                        continue;
                    }
                    refusal_note = Some(rendered.transcript.refused_note(&rejected));
                }
                Err(LlmError::Truncated(cause)) if truncations < MAX_TRUNCATIONS => {
                    truncations += 1;
                    max_tokens = max_tokens.saturating_add(max_tokens / 2);
                    tracing::warn!(
                        max_tokens,
                        truncations,
                        error = %cause,
                        "the answer was cut off at the output limit; asking again for a shorter one"
                    );
                }
                Err(LlmError::ContextLength(cause)) if shrinks < MAX_SHRINKS => {
                    shrinks += 1;
                    budget = shrink(budget);
                    tracing::warn!(
                        budget,
                        shrinks,
                        error = %cause,
                        "the model's context is below LLM_MAX_INPUT_TOKENS; shrinking the budget"
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The acceptance gate of a final answer: what [`summary::accept`] refuses, and an
    /// echo of the earlier summary ([`summary::echoes`]), measured on the answer without
    /// what it copied of the worker's own parts ([`summary::strip_ours`]). An answer not
    /// shorter than what it replaces passes here: asking again cannot make a few words
    /// of history longer (a forced compaction's), and the worker decides.
    fn gate(&self, text: &str, old: &[Message]) -> Result<(), Rejected> {
        let text = summary::strip_ours(text);
        let replaced: i64 = old.iter().map(|m| m.chars).sum();
        match summary::accept(&text, replaced, self.summary_max_chars) {
            Ok(accepted) => summary::echoes(&accepted, old),
            Err(Rejected::NotShorter { .. }) => Ok(()),
            Err(rejected) => Err(rejected),
        }
    }
}

impl LlmSummarizer {
    /// `old` after `context` rendered for requests, with what comes after the transcript
    /// (instructions, the missing facts of a second attempt), on the blocking pool for a
    /// large old part.
    async fn render(
        &self,
        large: bool,
        (context, old): (&[Message], &[Message]),
        (instructions, marker): (Option<&Instructions>, Option<&str>),
        missing: Option<MissingFacts>,
    ) -> Result<Arc<Rendered>, LlmError> {
        let (context, old, system) = (
            context.to_vec(),
            old.to_vec(),
            self.prompt.system().to_owned(),
        );
        let instructions = instructions.cloned();
        let marker = marker.map(str::to_owned);
        cpu(large, move || {
            Rendered::of(system, &context, &old, marker.as_deref())
                .with_instructions(instructions.as_ref())
                .with_missing(missing.as_ref())
        })
        .await
        .map(Arc::new)
    }

    /// The request for the chunk from message `next` (see [`Rendered::request`]), planned
    /// on the blocking pool for a large old part.
    async fn next_request(
        &self,
        rendered: &Arc<Rendered>,
        large: bool,
        next: usize,
        (budget, max_tokens): (usize, u32),
        running: Option<String>,
    ) -> Result<(ChatRequest, usize), LlmError> {
        let rendered = Arc::clone(rendered);
        cpu(large, move || {
            rendered.request(next, budget, running.as_deref(), max_tokens)
        })
        .await?
    }
}

impl Summarizer for LlmSummarizer {
    /// A second attempt (`missing` facts given) is the whole summarization again (a
    /// model told what it lost may write differently from the first chunk on, and the
    /// first pass's running summaries are gone), with the identifiers listed after the
    /// transcript of the last request, which writes the summary.
    fn summarize<'a>(
        &'a self,
        request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        let missing = (!request.missing.is_empty())
            .then(|| MissingFacts::of(request.missing, self.max_input_tokens));
        let asked = (request.model, request.instructions, request.marker);
        (self.summarize_all(request.context, request.old, asked, missing, request.meter)).boxed()
    }

    fn can_do_better(&self, model: Option<&str>) -> bool {
        self.second_attempts.worth_asking(model)
    }

    fn retried(&self, model: Option<&str>, improved: bool) {
        self.second_attempts.went(model, improved);
    }
}

/// 70% of `budget` (the multiplication cannot overflow, whatever the setting).
fn shrink(budget: usize) -> usize {
    budget - budget / 10 * 3
}

/// The old part rendered for the transcript, message by message, with token counts.
#[derive(Debug)]
struct Rendered {
    system: String,
    transcript: Transcript,
    /// Tokens of the system prompt, the transcript's header and the appendix.
    fixed_tokens: usize,
    pieces: Vec<String>,
    tokens: Vec<usize>,
    /// What the last request adds after the transcript (a second attempt's list of
    /// missing identifiers). Its room is kept in every request, which costs the earlier
    /// chunks a little room and keeps the planning one pass.
    appendix: Option<String>,
    /// What every request adds after the transcript: the request's instructions, marked
    /// as the operator's or the agent's (see `Transcript::instructions`).
    instructions: Option<String>,
}

impl Rendered {
    fn of(system: String, context: &[Message], old: &[Message], marker: Option<&str>) -> Self {
        let transcript = Transcript::for_messages_with(marker, context, old);
        let fixed_tokens =
            tokens::count(&system) + transcript.fixed().map(tokens::count).sum::<usize>();
        let pieces: Vec<String> = old.iter().map(|m| transcript.message(m)).collect();
        let tokens = pieces.iter().map(|p| tokens::count(p)).collect();
        Self {
            system,
            transcript,
            fixed_tokens,
            pieces,
            tokens,
            appendix: None,
            instructions: None,
        }
    }

    /// With the request's `instructions` after every request's transcript: each chunk's
    /// running summary is written with the same focus.
    fn with_instructions(mut self, instructions: Option<&Instructions>) -> Self {
        if let Some(instructions) = instructions {
            let rendered = self.transcript.instructions(instructions);
            self.fixed_tokens += tokens::count(&rendered);
            self.instructions = Some(rendered);
        }
        self
    }

    /// With the list of `missing` identifiers after the last request's transcript.
    fn with_missing(mut self, missing: Option<&MissingFacts>) -> Self {
        if let Some(missing) = missing {
            let appendix = self.transcript.missing_facts(missing);
            self.fixed_tokens += tokens::count(&appendix);
            self.appendix = Some(appendix);
        }
        self
    }

    /// The request for the chunk starting at message `next`, within `budget` tokens with
    /// the `running` summary folded in, and the end of that chunk.
    ///
    /// # Errors
    /// [`LlmError::ContextLength`] when the budget leaves no room for a chunk.
    fn request(
        &self,
        next: usize,
        budget: usize,
        running: Option<&str>,
        max_tokens: u32,
    ) -> Result<(ChatRequest, usize), LlmError> {
        let no_room = |room: usize| {
            LlmError::ContextLength(format!(
                "a budget of {budget} tokens leaves {room} for the transcript after the prompt \
                 and the running summary; raise LLM_MAX_INPUT_TOKENS"
            ))
        };
        // Chat formats add a few tokens per message; the rest of the margin absorbs the
        // small differences between counting pieces and counting their concatenation.
        let margin = budget / 50 + 16;
        let before_running = budget.saturating_sub(self.fixed_tokens + margin);
        // The running summary is asked to stay under `max_tokens`; a provider that
        // ignores that gets it clipped to that size, so that it cannot crowd out the
        // transcript.
        let running = match running {
            None => None,
            Some(text) => {
                let rendered = self.transcript.running_summary(text);
                let limit = (max_tokens as usize).min(before_running / 2) + RUNNING_HEADER_TOKENS;
                Some(chunks::clip_to(&rendered, limit, tokens::count).ok_or_else(|| no_room(0))?)
            }
        };
        let room = before_running.saturating_sub(
            running
                .as_deref()
                .map_or(0, |r| tokens::count(r) + chunks::JOIN_TOKENS),
        );
        if room < MIN_CHUNK_TOKENS {
            return Err(no_room(room));
        }
        let end = chunks::next_chunk(&self.tokens, next, room);
        let mut transcript: Vec<std::borrow::Cow<'_, str>> = Vec::with_capacity(end - next + 1);
        transcript.extend(running.map(std::borrow::Cow::Owned));
        for i in next..end {
            let piece = self.pieces[i].as_str();
            if chunks::oversize(self.tokens[i], room) {
                let limit = room - chunks::JOIN_TOKENS;
                let clipped =
                    chunks::clip_to(piece, limit, tokens::count).ok_or_else(|| no_room(room))?;
                transcript.push(clipped.into());
            } else {
                transcript.push(piece.into());
            }
        }
        let mut user = self.transcript.assemble(transcript);
        if let Some(instructions) = &self.instructions {
            user.push_str(instructions);
        }
        if let Some(appendix) = self
            .appendix
            .as_deref()
            .filter(|_| end == self.pieces.len())
        {
            user.push_str(appendix);
        }
        let request = ChatRequest {
            system: self.system.clone(),
            user,
            max_tokens,
            model: None,
        };
        Ok((request, end))
    }
}

/// Runs `work` on the blocking pool when `large`, inline otherwise.
async fn cpu<T, F>(large: bool, work: F) -> Result<T, LlmError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if !large {
        return Ok(work());
    }
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => Ok(done),
        // The compaction's task catches the panic (see `Worker::compact_in_task`).
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The blocking pool cancels a task only when the runtime shuts down.
        Err(_) => Err(LlmError::Transient {
            cause: "summarization was cancelled at shutdown".to_owned(),
            retry_after: None,
        }),
    }
}

#[cfg(test)]
mod tests;
