//! Second attempts: the better summary is written, and one that fails never fails the
//! compaction.

use std::time::Duration;

use serde_json::json;
use summarizer::outcome::Status;
use wiremock::matchers::method;
use wiremock::{Mock, Request, ResponseTemplate};

use super::*;
use crate::helpers::{SUMMARY, completion, spawn_app_with};

/// A summary that only lists the identifiers ("Also noted: ...") states none of them:
/// it is asked for again, and the second request gives each fact with the sentence it
/// was said in, so that the model can say what each one is about.
#[tokio::test]
async fn a_summary_that_only_lists_identifiers_is_asked_again_with_each_facts_statement() {
    let app = spawn_app_with(&[RETRY]).await;
    app.append_turns("s", 5).await;
    let facts = {
        // The facts the first summary will list: every identifier of the removed part.
        let old: Vec<_> = app.messages("s").await.into_iter().map(message).collect();
        FactSet::of_messages(&old)
    };
    let all: Vec<&str> = facts.iter().map(|(_, text)| text).collect();
    let listing = format!(
        "**Investigating:** a slow service\n**Key findings:**\n- Also noted: {}\n**Ruled out:** DNS\n**Current state:** checking the database",
        all.join(", ")
    );
    llm_answers_then(&app, completion(&listing), Obliging).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(
        requests.len(),
        2,
        "the list does not pass as keeping the facts"
    );
    let first = removed_facts(&app, "s").await.recall(&listing);
    assert_eq!(first.kept, first.total, "every identifier listed");
    assert_eq!(first.stated, 0, "and none stated");
    let listed = listed_with_statements(&requests[1]);
    assert_eq!(
        listed.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
        first.missing
    );
    let (_, said) = listed
        .iter()
        .find(|(value, _)| value == "14:03:01")
        .expect("the third turn's log time is listed");
    assert!(
        said.starts_with("14:03:01 ERROR checkout-api pool exhausted"),
        "the line it was said in: {said}"
    );
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(metadata["fact_retry_outcome"], "improved");
    let (_, _, stated) = figures(metadata);
    assert!(stated.unwrap() > 0, "{metadata}");
}

#[tokio::test]
async fn a_summary_that_drops_identifiers_is_asked_for_once_more_and_the_better_one_written() {
    let app = spawn_app_with(&[RETRY]).await;
    Mock::given(method("POST"))
        .respond_with(Obliging)
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2, "exactly one more request");
    let facts = removed_facts(&app, "s").await;
    let first = facts.recall(SUMMARY);
    assert!(
        first.ratio() < 0.8,
        "the first summary is below the minimum: {first:?}"
    );
    assert!(listed(&requests[0]).is_empty());
    assert_eq!(
        listed(&requests[1]),
        first.missing,
        "every missing identifier, in order"
    );
    assert_eq!(
        transcript(&requests[1]),
        transcript(&requests[0]),
        "the same transcript"
    );
    let (first_asked, asked_again) = (user_message(&requests[0]), user_message(&requests[1]));
    assert!(
        asked_again.starts_with(&first_asked),
        "the second attempt repeats the first's prompt byte for byte (its marker too), for \
         the provider's prompt cache, and lists the facts after it:\n{first_asked}\n---\n\
         {asked_again}"
    );
    let written = written_summary(&app, "s").await;
    assert_ne!(written, SUMMARY, "the second, better summary is written");
    let kept = facts.recall(&written);
    assert!(kept.kept > first.kept, "{kept:?} vs {first:?}");
    let events = app.usage_events("s").await;
    let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
    assert_eq!(
        (*prompt_tokens, *completion_tokens),
        (Some(812 + 900), Some(64 + 100)),
        "both calls are paid for"
    );
    assert_eq!(
        figures(metadata),
        recorded(&kept),
        "the written summary's figures"
    );
    assert_eq!(metadata["fact_retry"], true);
    assert_eq!(metadata["fact_retry_outcome"], "improved");
    assert_eq!(metadata["llm_requests"], 2, "both requests are counted");
    let metrics = metrics(&app).await;
    for line in [
        "summarizer_fact_retries_total{outcome=\"improved\"} 1",
        "summarizer_fact_recall_count 1",
        "summarizer_llm_duration_seconds_count 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_second_summary_that_keeps_no_more_leaves_the_first() {
    let app = spawn_app_with(&[RETRY]).await;
    llm_answers_then(&app, completion(SUMMARY), answer_with_usage(VAGUE)).await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 2);
    assert_eq!(written_summary(&app, "s").await, SUMMARY);
    let facts = removed_facts(&app, "s").await;
    let events = app.usage_events("s").await;
    let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
    assert_eq!(
        (*prompt_tokens, *completion_tokens),
        (Some(1712), Some(164))
    );
    assert_eq!(figures(metadata), recorded(&facts.recall(SUMMARY)));
    assert_eq!(metadata["fact_retry_outcome"], "not_improved");
}

/// A second answer that comes to nothing, and the usage the worker reads from it.
struct Failing {
    what: &'static str,
    answer: Box<dyn Fn(&Request) -> ResponseTemplate + Send + Sync>,
    usage: Option<(i32, i32)>,
}

#[tokio::test]
async fn a_second_attempt_that_fails_leaves_the_first_summary_and_the_compaction_succeeds() {
    let cases = [
        Failing {
            what: "HTTP 500 until the deadline",
            answer: Box::new(|_| ResponseTemplate::new(500).set_body_string("overloaded")),
            usage: None,
        },
        Failing {
            what: "a summary that lists every identifier but lacks a heading",
            answer: Box::new(|request| obliging(request, 3)),
            usage: Some((900, 100)),
        },
        Failing {
            what: "a summary longer than what it replaces",
            answer: Box::new(|_| {
                let long = "- 10.0.0.1:5432 reset\n".repeat(40_000);
                answer_with_usage(&format!("{SUMMARY}\n{long}"))
            }),
            usage: Some((900, 100)),
        },
        Failing {
            what: "a completion larger than the worker reads (8 MiB)",
            answer: Box::new(|_| {
                let endless = "- 10.0.0.1:5432 reset\n".repeat(1 << 20);
                answer_with_usage(&format!("{SUMMARY}\n{endless}"))
            }),
            usage: None,
        },
        Failing {
            what: "a body that is not a completion",
            answer: Box::new(|_| ResponseTemplate::new(200).set_body_string("{\"choices\": [oops")),
            usage: None,
        },
    ];
    for Failing {
        what,
        answer,
        usage,
    } in cases
    {
        let app = spawn_app_with(&[
            RETRY,
            ("LLM_MAX_RETRIES", "50"),
            ("LLM_RETRY_MIN_DELAY_MS", "50"),
            ("LLM_RETRY_MAX_DELAY_MS", "200"),
            ("LLM_DEADLINE_MS", "2000"),
        ])
        .await;
        llm_answers_then(&app, completion(SUMMARY), answer).await;
        app.append_turns("s", 5).await;

        let started = std::time::Instant::now();
        let reply = app.turn_starting("s").await;

        assert_eq!(reply.status, Status::Compacted, "{what}: {reply:?}");
        assert!(
            started.elapsed() < Duration::from_millis(2000 + 1500),
            "{what}: within the deadline, {:?}",
            started.elapsed()
        );
        assert!(app.llm_requests().await >= 2, "{what}");
        assert_eq!(written_summary(&app, "s").await, SUMMARY, "{what}");
        let facts = removed_facts(&app, "s").await;
        let events = app.usage_events("s").await;
        let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
        let (extra_prompt, extra_completion) = usage.unwrap_or((0, 0));
        assert_eq!(
            (*prompt_tokens, *completion_tokens),
            (Some(812 + extra_prompt), Some(64 + extra_completion)),
            "{what}: an answer the check refused was paid for too"
        );
        assert_eq!(
            figures(metadata),
            recorded(&facts.recall(SUMMARY)),
            "{what}"
        );
        assert_eq!(
            (&metadata["fact_retry"], &metadata["fact_retry_outcome"]),
            (&json!(true), &json!("failed")),
            "{what}"
        );
        assert_eq!(app.lease_owner("s").await, None, "{what}");
        let backing_off: bool = (app.db)
            .query("SELECT retry_at IS NOT NULL FROM sessions WHERE session_id = 's'")
            .scalar()
            .await
            .unwrap();
        assert!(!backing_off, "{what}: a compaction, not a failure");
        let metrics = metrics(&app).await;
        let line = "summarizer_fact_retries_total{outcome=\"failed\"} 1";
        assert!(metrics.lines().any(|l| l == line), "{what}: {metrics}");
        let report = app.check().await;
        assert!(report.is_clean(), "{what}: {report}");
    }
}

#[tokio::test]
async fn no_second_attempt_starts_once_the_lease_is_three_quarters_gone() {
    // The first answer comes 800 ms into a 1 s lease: a second attempt could only end
    // after the lease, and another worker could take the session and the summary with it.
    let app = spawn_app_with(&[RETRY, ("LEASE_DURATION_MS", "1000")]).await;
    llm_answers_then(
        &app,
        completion(SUMMARY).set_delay(Duration::from_millis(800)),
        Obliging,
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 1, "not asked again");
    assert_eq!(written_summary(&app, "s").await, SUMMARY);
    let metadata = &app.usage_events("s").await[0].4;
    let recall = removed_facts(&app, "s").await.recall(SUMMARY);
    assert!(recall.ratio() < 0.8, "{recall:?}");
    assert_eq!(figures(metadata), recorded(&recall));
    assert_eq!(metadata["fact_retry"], false);
}
