//! Malformed requests get `rejected/invalid_request` with a reason, and the worker keeps
//! serving.

use summarizer::outcome::{Reason, Status};

use crate::helpers::spawn_app;

#[tokio::test]
async fn malformed_requests_are_rejected_and_the_worker_keeps_serving() {
    let app = spawn_app().await;
    let huge = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(1_000_000));
    let cases: [(&[u8], &str); 6] = [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"{}", "session_id is required"),
        (br#"{"session_id": 12}"#, "session_id must be a string"),
        (br#"["s"]"#, "must be a JSON object"),
        (huge.as_bytes(), "the limit is 65536"),
    ];
    for (payload, why) in cases {
        let reply = app.send_raw(payload).await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Rejected, Reason::InvalidRequest)
        );
        let message = reply.message.unwrap_or_default();
        assert!(message.contains(why), "{message:?} should say {why:?}");
        assert_eq!(reply.session_id, None);
    }

    app.append_turns("s", 1).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::BelowThreshold)
    );
    app.stop().await;
}
