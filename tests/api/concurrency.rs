use std::time::Duration;

use summarizer::outcome::{Reason, Status};

use crate::helpers::{SUMMARY, spawn_app};

#[tokio::test]
async fn a_second_request_during_a_compaction_is_busy() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;

    let first = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    let second = app.turn_starting("s").await;
    let first = first.await.unwrap();

    assert_eq!(
        (second.status, second.reason),
        (Status::Busy, Reason::InProgress)
    );
    assert!(first.compacted(), "{first:?}");
    assert_eq!(app.usage_events("s").await.len(), 1);
    assert_eq!(app.llm_requests().await, 1);
}

#[tokio::test]
async fn simultaneous_requests_compact_a_session_exactly_once() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(300)).await;
    app.append_turns("s", 5).await;

    let requests: Vec<_> = (0..8)
        .map(|_| app.turn_starting_in_background("s"))
        .collect();
    let mut compacted = 0;
    for request in requests {
        let decision = request.await.unwrap();
        if decision.compacted() {
            compacted += 1;
        } else {
            // Busy while the compaction runs, below the threshold after it.
            assert!(
                matches!(decision.reason(), "in_progress" | "below_threshold"),
                "{decision:?}"
            );
        }
    }

    assert_eq!(compacted, 1);
    assert_eq!(app.usage_events("s").await.len(), 1);
    assert_eq!(
        app.messages("s")
            .await
            .iter()
            .filter(|m| m.is_summary)
            .count(),
        1
    );
}
