//! What the agent must not forget (docs/compaction.md, "The user's words" and "The
//! acceptance gate"): the user's rules and task, quoted word for word after every
//! summary, and an answer that only echoes the earlier summary, refused and asked again.

use std::time::Duration;

use serde_json::Value;
use summarizer::facts::FactSet;
use summarizer::outcome::{Reason, Status};
use wiremock::Mock;
use wiremock::matchers::method;

use crate::facts::metrics;
use crate::helpers::{SUMMARY, TestApp, completion, spawn_app_with};

const TASK: &str = "Find why checkout-api returns 502s since 14:01 and tell me what to do.";
const RULE: &str = "Never restart orders-db without asking me first.";
const LATER_RULE: &str = "Only run read-only queries on the replicas.";

/// The session's summary message, as written.
async fn summary_text(app: &TestApp, session: &str) -> String {
    let messages = app.messages(session).await;
    assert!(messages[0].is_summary, "{messages:?}");
    messages[0].content.clone().unwrap()
}

#[tokio::test]
async fn the_users_rules_and_task_survive_five_compactions_word_for_word() {
    let app = spawn_app_with(&[("SUMMARY_USER_WORDS_CHARS", "1500")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", &format!("{TASK} {RULE}"), None, None)
        .await;
    app.append_turns("s", 5).await;
    for compaction in 1..=5 {
        let reply = app.turn_starting("s").await;
        assert_eq!(reply.status, Status::Compacted, "{compaction}: {reply:?}");
        let text = summary_text(&app, "s").await;
        assert!(
            text.contains(&format!("- Task: \"{TASK}\"")),
            "{compaction}: {text}"
        );
        assert!(
            text.contains(&format!("- Rule: \"{RULE}\"")),
            "{compaction}: {text}"
        );
        if compaction > 2 {
            assert!(
                text.contains(&format!("- Rule: \"{LATER_RULE}\"")),
                "{compaction}: {text}"
            );
        }
        // One section and one recall note, whatever the model copied of the last ones.
        assert_eq!(text.matches("**The user's words**").count(), 1, "{text}");
        assert_eq!(text.matches("[Recall:").count(), 1, "{text}");
        if compaction == 2 {
            app.append("s", "user", &format!("Good. {LATER_RULE}"), None, None)
                .await;
        }
        for n in 0..5 {
            app.append_turn("s", 10 * compaction + n).await;
        }
    }
    assert!(app.check().await.is_clean(), "{}", app.check().await);
}

#[tokio::test]
async fn a_model_that_copies_the_section_and_the_note_gets_them_written_once() {
    let app = spawn_app_with(&[("SUMMARY_USER_WORDS_CHARS", "1500")]).await;
    // A small model copies what it sees of the earlier summary: the worker's own parts
    // included, stale ones too.
    let copied = format!(
        "{SUMMARY}\n\n**The user's words** (verbatim, kept by the worker):\n- Rule: \"Restart \
         orders-db whenever you like.\"\n\n[Recall: the 3 messages this summary replaced (seq 1 \
         to 3) are archived: search them, or fetch one by its seq, with recall.]"
    );
    app.llm_answers(&copied, Duration::ZERO).await;
    app.append("s", "user", &format!("{TASK} {RULE}"), None, None)
        .await;
    app.append_turns("s", 5).await;

    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);

    let text = summary_text(&app, "s").await;
    assert!(!text.contains("whenever you like"), "{text}");
    assert!(text.contains(&format!("- Rule: \"{RULE}\"")), "{text}");
    assert_eq!(text.matches("**The user's words**").count(), 1, "{text}");
    assert_eq!(text.matches("[Recall:").count(), 1, "{text}");
}

#[tokio::test]
async fn at_zero_no_words_are_quoted() {
    let app = spawn_app_with(&[("SUMMARY_USER_WORDS_CHARS", "0")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", &format!("{TASK} {RULE}"), None, None)
        .await;
    app.append_turns("s", 5).await;

    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);

    let text = summary_text(&app, "s").await;
    assert!(!text.contains("The user's words"), "{text}");
    assert!(text.starts_with(SUMMARY), "{text}");
}

/// The fake model answers `SUMMARY` to the first `echoes + 1` requests (the first
/// compaction's, then echoes of it), and after that states what it is shown.
async fn echoing(app: &TestApp, echoes: u64) {
    Mock::given(method("POST"))
        .respond_with(completion(SUMMARY))
        .up_to_n_times(echoes + 1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(StatesWhatItSees)
        .mount(&app.llm)
        .await;
}

/// A model that answers `SUMMARY` with a last line stating the identifiers of its
/// transcript that `SUMMARY` does not hold.
struct StatesWhatItSees;

impl wiremock::Respond for StatesWhatItSees {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        let transcript = user_message(request);
        let own = FactSet::of_text(SUMMARY);
        let found = FactSet::of_text(&transcript);
        let seen: Vec<&str> = (found.iter())
            .map(|(_, fact)| fact)
            .filter(|fact| !own.contains(fact))
            .collect();
        completion(&format!("{SUMMARY}\n- Seen: {}", seen.join("; ")))
    }
}

fn user_message(request: &wiremock::Request) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    (body["messages"].as_array().unwrap().iter())
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect()
}

/// A model that echoed the earlier summary is asked about the newer messages alone, and
/// its answer is merged into the earlier summary: the second request holds neither the
/// earlier summary nor a note about it, and the summary written holds both.
#[tokio::test]
async fn an_echo_is_asked_again_about_the_newer_messages_alone_and_merged() {
    let app = spawn_app_with(&[]).await;
    echoing(&app, 1).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    for n in 10..15 {
        app.append_turn("s", n).await;
    }

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(
        requests.len(),
        3,
        "one for the first compaction, two for the second"
    );
    let first = user_message(&requests[1]);
    assert!(first.contains("earlier summary]"), "{first}");
    let again = user_message(&requests[2]);
    assert!(!again.contains("earlier summary]"), "{again}");
    assert!(!again.contains("pool exhausted at 14:01"), "{again}");
    assert!(
        !again.contains("your previous answer was refused"),
        "{again}"
    );
    // The newer messages of the old part, whole.
    assert!(again.contains("Finding 10:"), "{again}");
    let text = summary_text(&app, "s").await;
    // The earlier summary's lines once, then what the newer messages added.
    assert_eq!(
        text.matches("- pool exhausted at 14:01").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("- Seen: ") && text.contains("14:10:01"),
        "{text}"
    );
    for heading in summarizer::summary::HEADINGS {
        assert_eq!(text.matches(heading).count(), 1, "{text}");
    }
    let events = app.usage_events("s").await;
    let metadata = &events[1].4;
    assert_eq!(
        metadata["refused_answers"],
        serde_json::json!(["echo"]),
        "{metadata}"
    );
    // Both answers were paid for.
    assert_eq!((events[1].2, events[1].3), (Some(812 * 2), Some(64 * 2)));
    assert!(
        metrics(&app)
            .await
            .contains("summarizer_answers_refused_total{rule=\"echo\"} 1")
    );
}

#[tokio::test]
async fn an_echo_asked_for_twice_is_never_written() {
    for fallback in ["none", "extractive"] {
        let app = spawn_app_with(&[("LLM_FALLBACK", fallback)]).await;
        echoing(&app, 2).await;
        app.append_turns("s", 5).await;
        assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
        let first = summary_text(&app, "s").await;
        for n in 10..15 {
            app.append_turn("s", n).await;
        }
        let before = app.messages("s").await;

        let reply = app.turn_starting("s").await;

        assert_eq!(app.llm_requests().await, 3, "{fallback}");
        if fallback == "none" {
            assert_eq!(reply.status, Status::Failed, "{reply:?}");
            assert_eq!(reply.reason, Reason::LlmError, "{reply:?}");
            let message = reply.message.unwrap_or_default();
            assert!(message.contains("refused twice (echo)"), "{message}");
            assert_eq!(app.messages("s").await, before, "nothing written");
        } else {
            assert_eq!(reply.status, Status::Compacted, "{reply:?}");
            let text = summary_text(&app, "s").await;
            assert_ne!(text, first);
            assert!(
                (10..15).any(|n| text.contains(&format!("Finding {n}:"))),
                "the newer findings: {text}"
            );
            let events = app.usage_events("s").await;
            assert_eq!(events[1].4["fallback"], true, "{:?}", events[1]);
            // The two refused answers were paid for: their tokens are the event's.
            assert_eq!((events[1].2, events[1].3), (Some(812 * 2), Some(64 * 2)));
        }
        assert!(
            metrics(&app)
                .await
                .contains("summarizer_answers_refused_total{rule=\"echo\"} 2"),
            "{fallback}"
        );
        assert!(app.check().await.is_clean(), "{}", app.check().await);
    }
}

/// An acknowledgement ("Understood, I will summarize.") is not a summary: asked again.
#[tokio::test]
async fn an_acknowledgement_is_refused_and_the_summary_after_it_written() {
    let app = spawn_app_with(&[]).await;
    Mock::given(method("POST"))
        .respond_with(completion("Understood. I will summarize the conversation."))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 2);
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(
        metadata["refused_answers"],
        serde_json::json!(["acknowledgement"])
    );
}
