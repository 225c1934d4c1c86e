//! The fact check (`SUMMARY_FACT_CHECK`): each summary's recall of the removed part's
//! identifiers is recorded in its usage event and reported by `/stats`; in `retry` mode an
//! LLM summary below `SUMMARY_MIN_FACT_RECALL` is asked for once more, listing what it
//! lost, and the better of the two is written. The expected figures are measured here
//! from the archive (what was removed) and the summary as written.
//!
//! This module holds the fake LLM and the measuring helpers; the scenarios are in
//! `retry` (second attempts), `recorded` (what each mode and summarizer records, and
//! `/stats`) and `hostile` (a 5 MB old part).

mod hostile;
mod recorded;
mod retry;

use serde_json::{Value, json};
use summarizer::facts::{FactSet, Recall};
use summarizer::message::Message;
use summarizer::summary::HEADINGS;
use wiremock::matchers::method;
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::helpers::{SUMMARY, Stored, TestApp, completion};

pub const RETRY: (&str, &str) = ("SUMMARY_FACT_CHECK", "retry");

/// The header a second attempt's list of the facts a first summary did not state
/// starts with.
pub const LISTED: &str = " facts a first summary did not state]\n";

/// A summary in the template that keeps almost nothing of the test histories.
pub const VAGUE: &str = "**Investigating:** an outage\n**Key findings:**\n- things were slow\n**Ruled out:** nothing ruled out yet\n**Current state:** looking into it";

/// A model that does as it is told: [`SUMMARY`] at first; asked again, a summary with
/// every identifier listed (within `SUMMARY_MAX_CHARS`), and a usage of its own.
pub struct Obliging;

impl Respond for Obliging {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        obliging(request, HEADINGS.len())
    }
}

/// [`Obliging`]'s answer, with only the first `headings` of the template's four.
pub fn obliging(request: &Request, headings: usize) -> ResponseTemplate {
    let listed = listed(request);
    if listed.is_empty() {
        return completion(SUMMARY);
    }
    let mut findings = String::new();
    for fact in listed {
        if findings.len() + fact.len() > 5_000 {
            break;
        }
        findings.push_str(&format!("- saw {fact}\n"));
    }
    let sections = [
        "**Investigating:** checkout-api slow".to_owned(),
        format!("**Key findings:**\n{findings}"),
        "**Ruled out:** DNS".to_owned(),
        "**Current state:** checking the database".to_owned(),
    ];
    answer_with_usage(&sections[..headings].join("\n"))
}

/// A chat completion of `summary`, with a usage that tells it from [`completion`]'s
/// (812 prompt and 64 completion tokens).
pub fn answer_with_usage(summary: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "model": "fake-model-2026",
        "choices": [{"message": {"role": "assistant", "content": summary}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 100}
    }))
}

/// The request's user message: the transcript, and in a second attempt the list.
pub fn user_message(request: &Request) -> String {
    let body: Value = request.body_json().unwrap();
    body["messages"][1]["content"].as_str().unwrap().to_owned()
}

/// The request's transcript, up to its end, its random marker replaced by `M`.
pub fn transcript(request: &Request) -> String {
    let user = user_message(request);
    let marker = user
        .split_once("from [")
        .unwrap()
        .1
        .split_once(' ')
        .unwrap()
        .0;
    let user = user.replace(marker, "M");
    let end = user.rfind("[M end of transcript]").unwrap();
    user[..end].to_owned()
}

/// The identifiers a second attempt lists, in order; none in a first attempt.
pub fn listed(request: &Request) -> Vec<String> {
    listed_with_statements(request)
        .into_iter()
        .map(|(value, _)| value)
        .collect()
}

/// The facts a second attempt lists: each identifier and the statement it was said in.
pub fn listed_with_statements(request: &Request) -> Vec<(String, String)> {
    let user = user_message(request);
    let Some((_, list)) = user.split_once(LISTED) else {
        return Vec::new();
    };
    list.lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| match l.split_once(" | ") {
            Some((value, said)) => (value.to_owned(), said.to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect()
}

/// The fake LLM answers `first` to the first request and `then` to the rest.
pub async fn llm_answers_then(
    app: &TestApp,
    first: ResponseTemplate,
    then: impl Respond + 'static,
) {
    Mock::given(method("POST"))
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(then)
        .mount(&app.llm)
        .await;
}

pub fn message(m: Stored) -> Message {
    Message {
        seq: m.seq,
        role: m.role.parse().unwrap(),
        content: m.content.unwrap_or_default(),
        tool_calls: m.tool_calls,
        tool_call_id: m.tool_call_id,
        is_summary: m.is_summary,
        chars: m.chars,
        pinned: false,
    }
}

/// The facts of what the session's compactions removed, from the archive.
pub async fn removed_facts(app: &TestApp, session: &str) -> FactSet {
    let old: Vec<Message> = app
        .archived(session)
        .await
        .into_iter()
        .map(message)
        .collect();
    FactSet::established_in(&old)
}

/// The session's summary, as the summarizer wrote it (without the recall note).
pub async fn written_summary(app: &TestApp, session: &str) -> String {
    let messages = app.messages(session).await;
    assert!(messages[0].is_summary, "{messages:?}");
    crate::helpers::without_note(messages[0].content.as_deref().unwrap()).to_owned()
}

/// `(facts_total, facts_kept, facts_stated)` of a usage event's metadata.
pub fn figures(metadata: &Value) -> (Option<u64>, Option<u64>, Option<u64>) {
    (
        metadata["facts_total"].as_u64(),
        metadata["facts_kept"].as_u64(),
        metadata["facts_stated"].as_u64(),
    )
}

pub fn recorded(recall: &Recall) -> (Option<u64>, Option<u64>, Option<u64>) {
    (
        Some(recall.total as u64),
        Some(recall.kept as u64),
        Some(recall.stated as u64),
    )
}

pub async fn metrics(app: &TestApp) -> String {
    reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
