use std::sync::Mutex;

use super::*;
use crate::facts::MissingFact;
use crate::message::Role;
use crate::prompt;
use crate::summarizer::SummaryRequest;
use crate::usage::Reported;

const SUMMARY: &str = "**Investigating:** checkout 502s\n**Key findings:**\n- pool at 100/100\n**Ruled out:** DNS\n**Current state:** raising the pool";

/// A provider that answers at once: [`SUMMARY`] to a request within its `limit` (system
/// and user tokens together), a context-length error to a larger one. Keeps every request.
struct Fake {
    limit: usize,
    delay: Duration,
    /// How many answers, from the first, are cut off at the output limit.
    cut_off: usize,
    requests: Arc<Mutex<Vec<ChatRequest>>>,
}

impl Fake {
    fn new(limit: usize) -> (Self, Arc<Mutex<Vec<ChatRequest>>>) {
        let requests = Arc::default();
        let fake = Self {
            limit,
            delay: Duration::ZERO,
            cut_off: 0,
            requests: Arc::clone(&requests),
        };
        (fake, requests)
    }
}

fn size(request: &ChatRequest) -> usize {
    tokens::count(&request.system) + tokens::count(&request.user)
}

/// What the fake reports of every answer, a cut-off one included, as a provider does.
const USAGE: Reported = Reported {
    prompt_tokens: Some(10),
    completion_tokens: Some(3),
    cached_prompt_tokens: None,
};

impl Chat for Fake {
    /// Counts into `meter` as the HTTP layer does: every request, and the usage of every
    /// answer but a context-length refusal.
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        meter: Option<&'a Meter>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        let mut requests = self.requests.lock().unwrap();
        requests.push(request.clone());
        let too_long = size(request) > self.limit;
        if let Some(meter) = meter {
            meter.sent();
            if !too_long {
                meter.answered(USAGE);
            }
        }
        let answer = if requests.len() <= self.cut_off {
            Err(LlmError::Truncated("finish_reason: length".to_owned()))
        } else if too_long {
            Err(LlmError::ContextLength(format!(
                "maximum context length is {} tokens",
                self.limit
            )))
        } else {
            Ok(Summary {
                text: SUMMARY.to_owned(),
                model: "fake".to_owned(),
                ..Summary::default()
            })
        };
        drop(requests);
        let delay = self.delay;
        async move {
            tokio::time::sleep(delay).await;
            answer
        }
        .boxed()
    }
}

fn msg(role: Role, content: String) -> Message {
    Message {
        seq: 0,
        role,
        chars: content.chars().count() as i64,
        content,
        tool_calls: None,
        tool_call_id: None,
        is_summary: false,
        pinned: false,
    }
}

/// `turns` numbered human turns with an answer of `answer_chars` each.
fn history(turns: usize, answer_chars: usize) -> Vec<Message> {
    (0..turns)
        .flat_map(|n| {
            [
                msg(Role::User, format!("question {n}: why is checkout slow?")),
                msg(
                    Role::Assistant,
                    format!(
                        "answer {n}: {}",
                        "orders-db pool saturated at 14:01 ".repeat(answer_chars / 34)
                    ),
                ),
            ]
        })
        .collect()
}

fn summarizer(chat: Fake, budget: usize) -> LlmSummarizer {
    LlmSummarizer::with_budget(Box::new(chat), budget, 200, Duration::from_secs(60))
}

#[tokio::test]
async fn an_old_part_that_fits_goes_as_one_request_as_before() {
    let (fake, requests) = Fake::new(100_000);
    let old = history(3, 200);

    let summary = summarizer(fake, 100_000)
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap();

    assert_eq!(summary.text, SUMMARY);
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    // The same transcript as one request of the whole, but for its random marker.
    assert_eq!(
        unmarked(&requests[0].user),
        unmarked(&prompt::transcript(&old))
    );
    assert_eq!(requests[0].system, prompt::system_prompt());
    assert_eq!(requests[0].max_tokens, 200);
}

#[tokio::test]
async fn a_large_old_part_goes_in_chunks_that_fit_oldest_first_with_the_summary_folded_in() {
    let (fake, requests) = Fake::new(2_000);
    let old = history(60, 600);
    let meter = Meter::new();

    let summary = summarizer(fake, 2_000)
        .summarize(SummaryRequest::of(&old).metered(&meter))
        .await
        .unwrap();

    assert_eq!(summary.text, SUMMARY);
    let requests = requests.lock().unwrap();
    assert!(requests.len() > 5, "{}", requests.len());
    let sent = requests.len() as i64;
    assert_eq!(meter.total().requests, sent);
    assert_eq!(meter.total().prompt_tokens, Some(10 * sent));
    let mut seen = 0;
    for (i, request) in requests.iter().enumerate() {
        assert!(size(request) <= 2_000, "request {i}: {}", size(request));
        assert_eq!(
            request
                .user
                .contains(" earlier summary]\n**Investigating:** checkout 502s"),
            i > 0,
            "request {i}"
        );
        // Whole messages, in order, none twice, none left out.
        while seen < old.len() && request.user.contains(old[seen].content.trim()) {
            seen += 1;
        }
    }
    assert_eq!(seen, old.len());
}

#[tokio::test]
async fn a_message_larger_than_a_chunk_is_clipped_with_the_marker() {
    let (fake, requests) = Fake::new(3_000);
    let dump = format!("BEGIN {} END", "GET /api/orders 200 12ms\n".repeat(40_000));
    let mut old = history(2, 100);
    old.insert(2, msg(Role::Tool, dump));

    summarizer(fake, 3_000)
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap();

    let requests = requests.lock().unwrap();
    let clipped: Vec<_> = requests
        .iter()
        .filter(|r| r.user.contains("characters left out ...]"))
        .collect();
    assert_eq!(clipped.len(), 1);
    assert!(clipped[0].user.contains("BEGIN GET /api/orders"));
    assert!(clipped[0].user.contains("200 12ms\n END"));
    assert!(requests.iter().all(|r| size(r) <= 3_000));
}

#[tokio::test]
async fn a_budget_over_the_models_context_shrinks_until_it_fits() {
    let (fake, requests) = Fake::new(2_500);
    let old = history(40, 600);

    let summary = summarizer(fake, 5_000)
        .summarize(SummaryRequest::of(&old))
        .await;

    assert_eq!(summary.unwrap().text, SUMMARY);
    let requests = requests.lock().unwrap();
    let refused = requests.iter().filter(|r| size(r) > 2_500).count();
    assert!((1..=MAX_SHRINKS).contains(&refused), "{refused}");
}

#[tokio::test]
async fn a_model_whose_context_never_fits_fails_after_a_few_shrinks() {
    let (fake, requests) = Fake::new(100);
    let old = history(40, 600);

    let error = summarizer(fake, 5_000)
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap_err();

    assert!(matches!(error, LlmError::ContextLength(_)), "{error}");
    // The first try and one per shrink, or fewer once no room is left.
    assert!(requests.lock().unwrap().len() <= MAX_SHRINKS + 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_whole_summarization_not_each_request() {
    let (mut fake, requests) = Fake::new(2_000);
    fake.delay = Duration::from_secs(1);
    let old = history(60, 600);
    let summarizer =
        LlmSummarizer::with_budget(Box::new(fake), 2_000, 200, Duration::from_millis(3_500));

    let error = summarizer
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap_err();

    assert!(error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("deadline reached during request 4"),
        "{error}"
    );
    assert_eq!(requests.lock().unwrap().len(), 4);
}

/// `text` with every transcript marker (12 hex digits after a `[`) blanked out.
fn unmarked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let marker = rest
            .get(..12)
            .filter(|m| m.bytes().all(|b| b.is_ascii_hexdigit()));
        if marker.is_some() {
            out.push_str("MARKER");
            rest = &rest[12..];
        }
    }
    out.push_str(rest);
    out
}

fn missing() -> Vec<MissingFact> {
    ["orders-db", "14:01:07"]
        .map(|value| MissingFact {
            value: value.to_owned(),
            said: format!("we saw {value}"),
        })
        .to_vec()
}

#[tokio::test]
async fn a_second_attempt_lists_the_missing_identifiers_after_the_transcript() {
    let (fake, requests) = Fake::new(100_000);
    let old = history(3, 200);

    let missing = missing();
    let request = SummaryRequest {
        model: Some("gpt-test"),
        ..SummaryRequest::of(&old)
    };
    let summary = summarizer(fake, 100_000)
        .summarize(request.again(&missing))
        .await
        .unwrap();

    assert_eq!(summary.text, SUMMARY);
    assert_eq!(
        summary.prompt_version.as_deref(),
        Some(prompt::DEFAULT_VERSION)
    );
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(
        request.system,
        prompt::system_prompt(),
        "the prompt is unchanged"
    );
    assert_eq!(request.model.as_deref(), Some("gpt-test"));
    let (transcript, appendix) = request
        .user
        .split_once(" end of transcript]\n")
        .expect("the transcript ends");
    assert_eq!(
        unmarked(&format!("{transcript} end of transcript]\n")),
        unmarked(&prompt::transcript(&old))
    );
    assert!(
        appendix.contains(" facts a first summary did not state]"),
        "{appendix}"
    );
    assert!(
        appendix.contains("\n- orders-db | we saw orders-db\n- 14:01:07 | we saw 14:01:07\n"),
        "{appendix}"
    );
}

#[tokio::test]
async fn in_chunks_only_the_last_request_lists_them_and_every_request_fits() {
    let (fake, requests) = Fake::new(2_000);
    let old = history(60, 600);

    let missing = missing();
    summarizer(fake, 2_000)
        .summarize(SummaryRequest::of(&old).again(&missing))
        .await
        .unwrap();

    let requests = requests.lock().unwrap();
    assert!(requests.len() > 5, "{}", requests.len());
    let listing: Vec<bool> = requests
        .iter()
        .map(|r| r.user.contains("\n- orders-db | we saw orders-db\n"))
        .collect();
    let last = listing.len() - 1;
    assert_eq!(listing, (0..=last).map(|i| i == last).collect::<Vec<_>>());
    assert!(requests.iter().all(|r| size(r) <= 2_000));
}

#[tokio::test]
async fn a_long_list_of_missing_identifiers_is_cut_to_leave_a_small_budget_its_room() {
    let (fake, requests) = Fake::new(2_000);
    let old = history(60, 600);
    let missing: Vec<MissingFact> = (0..200)
        .map(|n| MissingFact {
            value: format!("checkout-api-7d9f8c-{n:04}.prod.eu-west-1.internal"),
            said: String::new(),
        })
        .collect();

    summarizer(fake, 2_000)
        .summarize(SummaryRequest::of(&old).again(&missing))
        .await
        .expect("the list leaves the transcript room");

    let requests = requests.lock().unwrap();
    let last = &requests.last().unwrap().user;
    assert!(
        last.contains(&format!("\n- {}\n", missing[0].value)),
        "{last}"
    );
    assert!(last.contains(" more not listed"), "{last}");
    assert!(requests.iter().all(|r| size(r) <= 2_000));
}

#[tokio::test]
async fn a_chunk_answer_cut_off_is_asked_again_shorter_with_more_room_never_taken_as_running() {
    let (mut fake, requests) = Fake::new(2_000);
    fake.cut_off = 1;
    let old = history(60, 600);

    let summary = summarizer(fake, 2_000)
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap();

    assert_eq!(summary.text, SUMMARY);
    let requests = requests.lock().unwrap();
    let (first, again) = (&requests[0], &requests[1]);
    assert_eq!(first.max_tokens, 200);
    assert!(!first.user.contains("was cut off"));
    // The first chunk again: the same transcript, no running summary (the cut-off answer
    // is not one), more room, and the note.
    assert!(!again.user.contains(" earlier summary]"), "{}", again.user);
    assert_eq!(again.max_tokens, 300);
    assert!(again.user.contains(" your previous answer was cut off]"));
    assert!(again.user.contains(old[0].content.trim()));
    for (i, request) in requests.iter().enumerate().skip(1) {
        assert!(size(request) <= 2_000, "request {i}: {}", size(request));
        assert!(request.user.contains("was cut off"), "request {i}");
    }
}

#[tokio::test]
async fn answers_always_cut_off_fail_as_truncated_after_a_few_tries() {
    let (mut fake, requests) = Fake::new(100_000);
    fake.cut_off = usize::MAX;
    let old = history(3, 200);

    let error = summarizer(fake, 100_000)
        .summarize(SummaryRequest::of(&old))
        .await
        .unwrap_err();

    assert!(matches!(error, LlmError::Truncated(_)), "{error}");
    assert_eq!(error.metric_cause(), "truncated");
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 1 + MAX_TRUNCATIONS);
    let room: Vec<u32> = requests.iter().map(|r| r.max_tokens).collect();
    assert_eq!(room, [200, 300, 450]);
}
