//! The durable job queue (`TRANSPORT=jetstream`): each test runs a private `nats-server`
//! with JetStream, so streams never leak into the shared server and a test may stop it.

use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use serde_json::Value;
use summarizer::client::JobPublisher;
use summarizer::config::Settings;
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::{Reply, Request};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::fixtures::NatsServer;
use crate::helpers::{SUMMARY, TestApp, eventually, setup};

const PREFIX: &str = "summarizer.jobs";
const STREAM: &str = "SUMMARIZER_JOBS";

/// A private NATS with JetStream, storing in a directory of its own.
pub async fn jetstream_server() -> NatsServer {
    let dir = std::env::temp_dir().join(format!("summarizer-js-{:08x}", fastrand::u32(..)));
    NatsServer::start(&["-js", "-sd", dir.to_str().unwrap()]).await
}

/// A test app whose workers pull jobs from `nats` (and serve no requests).
pub async fn jobs_app(nats: &NatsServer, overrides: &[(&str, &str)]) -> TestApp {
    let url = nats.url();
    let mut all = vec![("NATS_URL", url.as_str()), ("TRANSPORT", "jetstream")];
    all.extend_from_slice(overrides);
    setup(&all).await
}

/// The stream, created as a worker creates it (`summarizer::transport::jetstream::bind`), before any
/// worker runs.
async fn create_stream(app: &TestApp, nats: &async_nats::Client) {
    let settings = Settings::from_sources(None, Some(app.env(&[]))).unwrap();
    summarizer::transport::jetstream::bind(nats, &settings.jobs, &settings.subject)
        .await
        .unwrap();
}

async fn stream_messages(nats: &async_nats::Client) -> u64 {
    let mut stream = jetstream::new(nats.clone())
        .get_stream(STREAM)
        .await
        .unwrap();
    stream.info().await.unwrap().state.messages
}

async fn until_stream_empty(nats: &async_nats::Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stream_messages(nats).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream did not empty"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `summarizer dead-letters replay --all` against this test's database and NATS.
async fn replay_dead_letters(app: &TestApp) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(["dead-letters", "replay", "--all"])
        .env_clear()
        .envs(app.env(&[]))
        .output()
        .await
        .unwrap()
}

async fn compactions(app: &TestApp, session: &str) -> usize {
    app.usage_events(session).await.len()
}

#[tokio::test]
async fn jobs_published_while_no_worker_runs_are_processed_once_workers_start() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    // 100 sessions: the even ones over the threshold, the odd ones below it.
    for n in 0..100 {
        let turns = if n % 2 == 0 { 5 } else { 2 };
        app.append_turns(&format!("s{n}"), turns).await;
    }
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    for round in 0..5 {
        for n in 0..100 {
            let published = publisher
                .compact(&format!("s{n}"), Some(&format!("batch-1:s{n}:{round}")))
                .await
                .unwrap();
            assert!(!published.duplicate);
        }
    }
    assert_eq!(
        stream_messages(&client).await,
        500,
        "stored with no worker running"
    );

    app.start_worker(&[]).await;
    app.start_worker(&[]).await;
    until_stream_empty(&client).await;

    for n in 0..100 {
        let expected = usize::from(n % 2 == 0);
        assert_eq!(compactions(&app, &format!("s{n}")).await, expected, "s{n}");
    }
    assert!(app.check().await.is_clean());
    let dead: i64 = (app.db)
        .query("SELECT count(*) FROM dead_letters")
        .scalar()
        .await
        .unwrap();
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn duplicates_with_the_same_msg_id_are_processed_once_and_answered_on_reply_to() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.append_turns("s", 5).await;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    let request = Request {
        session_id: "s".into(),
        request_id: Some("job-1".into()),
        ..Request::default()
    };
    let mut duplicates = Vec::new();
    for _ in 0..3 {
        let published = publisher
            .publish(&request, Some("once"), Some(&inbox))
            .await
            .unwrap();
        duplicates.push(published.duplicate);
    }
    assert_eq!(duplicates, [false, true, true]);

    app.start_worker(&[]).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .unwrap()
        .unwrap();
    let reply: Reply = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(reply.request_id.as_deref(), Some("job-1"));
    until_stream_empty(&client).await;
    let mut stream = jetstream::new(client.clone())
        .get_stream(STREAM)
        .await
        .unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.last_sequence,
        1,
        "one stored"
    );
    assert_eq!(compactions(&app, "s").await, 1);
    assert_eq!(app.llm_requests().await, 1);
}

#[tokio::test]
async fn a_job_that_keeps_failing_is_retried_with_a_delay_then_dead_lettered_and_replayed() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(
        &nats,
        &[
            ("JETSTREAM_MAX_DELIVER", "3"),
            ("FAILURE_BACKOFF_MS", "0"),
            ("LLM_MAX_RETRIES", "0"),
        ],
    )
    .await;
    // The LLM is down.
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .with_priority(1)
        .up_to_n_times(3)
        .mount(&app.llm)
        .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.append_turns("s", 5).await;
    app.start_worker(&[]).await;
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    let published = tokio::time::Instant::now();
    publisher.compact("s", Some("job-s")).await.unwrap();

    eventually("a dead letter", || async {
        (app.db)
            .query("SELECT count(*) FROM dead_letters")
            .scalar::<i64>()
            .await
            .unwrap()
            == 1
    })
    .await;
    let (session, msg_id, deliveries, error, payload): (String, String, i32, String, String) =
        (app.db)
            .query("SELECT session_id, msg_id, deliveries, last_error, payload FROM dead_letters")
            .fetch_one()
            .await
            .unwrap();
    assert_eq!(
        (session.as_str(), msg_id.as_str(), deliveries),
        ("s", "job-s", 3)
    );
    assert!(error.contains("500"), "{error}");
    assert_eq!(
        serde_json::from_str::<Value>(&payload).unwrap()["session_id"],
        "s"
    );
    // One LLM call per delivery, the deliveries apart by the nak's delay (1 s, then 2 s):
    // the third cannot have come sooner.
    assert!(published.elapsed() >= Duration::from_secs(3));
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
    until_stream_empty(&client).await;
    assert_eq!(compactions(&app, "s").await, 0);

    // The LLM is back: a replay compacts the session, once.
    let replay = replay_dead_letters(&app).await;
    assert!(replay.status.success(), "{replay:?}");
    assert!(String::from_utf8_lossy(&replay.stdout).contains("replayed 1 dead letters"));
    eventually("the replayed job to compact the session", || async {
        compactions(&app, "s").await == 1
    })
    .await;
    until_stream_empty(&client).await;
    let again = replay_dead_letters(&app).await;
    assert!(!again.status.success(), "a dead letter is replayed once");
}

#[tokio::test]
async fn a_long_summarization_is_kept_alive_and_not_handed_to_another_worker() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[("JETSTREAM_ACK_WAIT_MS", "1000")]).await;
    // Longer than two ack waits, shorter than the LLM timeout (3 s).
    app.llm_answers(SUMMARY, Duration::from_millis(2500)).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.append_turns("s", 5).await;
    app.start_worker(&[]).await;
    app.start_worker(&[]).await;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    let request = Request {
        session_id: "s".into(),
        ..Request::default()
    };
    JobPublisher::new(client.clone(), PREFIX)
        .publish(&request, None, Some(&inbox))
        .await
        .unwrap();

    // A redelivery would reach the other worker at once and be answered busy, before
    // the first delivery's compaction is answered.
    let first = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .unwrap()
        .unwrap();
    let first: Reply = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(first.status, Status::Compacted, "{first:?}");
    until_stream_empty(&client).await;
    let consumer: jetstream::consumer::PullConsumer = jetstream::new(client.clone())
        .get_stream(STREAM)
        .await
        .unwrap()
        .get_consumer("summarizer-workers")
        .await
        .unwrap();
    let mut consumer = consumer;
    assert_eq!(consumer.info().await.unwrap().num_redelivered, 0);
    assert_eq!(app.llm_requests().await, 1);
}

#[tokio::test]
async fn a_malformed_job_is_terminated_answered_and_gone_from_the_stream() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.start_worker(&[]).await;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Reply-To", inbox.as_str());
    jetstream::new(client.clone())
        .publish_with_headers(format!("{PREFIX}.garbage"), headers, "{\"nope".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .unwrap()
        .unwrap();
    let reply: Reply = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Rejected, Reason::InvalidRequest)
    );
    until_stream_empty(&client).await;
}

#[tokio::test]
async fn a_job_prefix_overlapping_the_request_subject_stops_the_worker_with_exit_code_64() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .arg("worker")
        .env_clear()
        .envs([
            ("TRANSPORT", "both"),
            ("NATS_SUBJECT", "summarizer.jobs.turn"),
            ("JETSTREAM_SUBJECT_PREFIX", "summarizer.jobs"),
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("JETSTREAM_SUBJECT_PREFIX") && stderr.contains("overlap"),
        "{stderr}"
    );
}

#[tokio::test]
async fn sigterm_stops_pulling_finishes_what_runs_and_exits_0_and_no_job_is_lost() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[("HTTP_ADDR", "")]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(1500)).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    for n in 0..20 {
        app.append_turns(&format!("s{n}"), 5).await;
        publisher.compact(&format!("s{n}"), None).await.unwrap();
    }
    let mut worker =
        crate::fixtures::WorkerProcess::spawn(&app.env(&[("WORKER_CONCURRENCY", "4")]));
    worker.wait_for_log("worker ready").await;
    app.until_llm_called(1).await;
    worker.signal("TERM").await;
    let status = worker.exit_status(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.logs());

    // What the stopped worker did not finish is still in the stream, for the next one.
    let left = stream_messages(&client).await;
    assert!(left > 0 && left < 20, "{left} left");
    app.start_worker(&[]).await;
    until_stream_empty(&client).await;
    for n in 0..20 {
        assert_eq!(compactions(&app, &format!("s{n}")).await, 1, "s{n}");
    }
}

#[tokio::test]
async fn an_existing_stream_that_takes_the_request_subject_stops_the_worker_naming_it() {
    let nats = jetstream_server().await;
    let app = jobs_app(&nats, &[("TRANSPORT", "both"), ("HTTP_ADDR", "")]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let subject = app.env(&[])["NATS_SUBJECT"].clone();
    // Someone made a stream of the job stream's name on the request subject.
    jetstream::new(client.clone())
        .create_stream(jetstream::stream::Config {
            name: STREAM.to_owned(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();

    let mut worker = crate::fixtures::WorkerProcess::spawn(&app.env(&[]));
    let status = worker.exit_status(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(1), "{}", worker.logs());
    let logs = worker.logs();
    assert!(
        logs.contains(STREAM) && logs.contains("overlaps NATS_SUBJECT"),
        "{logs}"
    );
    assert!(!logs.contains("worker ready"), "{logs}");
}

#[tokio::test]
async fn a_worker_waiting_for_jetstream_takes_no_share_of_the_requests() {
    // NATS without JetStream: the job stream cannot be made.
    let nats = NatsServer::start(&[]).await;
    let app = jobs_app(&nats, &[("TRANSPORT", "both"), ("HTTP_ADDR", "")]).await;
    let mut worker = crate::fixtures::WorkerProcess::spawn(&app.env(&[]));
    worker
        .wait_for_log("the JetStream job stream unreachable, retrying")
        .await;
    // Had it subscribed to requests first, this request would wait out its timeout
    // for an answer that never comes.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let turns = summarizer::client::TurnClient::new(client, app.env(&[])["NATS_SUBJECT"].clone());
    let decision = turns.turn_starting("s", Duration::from_secs(5)).await;
    assert_eq!(decision, summarizer::client::Decision::NoWorkers);
    worker.signal("TERM").await;
    assert_eq!(
        worker.exit_status(Duration::from_secs(10)).await.code(),
        Some(0)
    );
}

#[tokio::test]
async fn a_job_kept_as_a_dead_letter_is_not_kept_twice() {
    let app = setup(&[]).await;
    let store = &app.store;
    let letter = summarizer::store::NewDeadLetter {
        session_id: Some("s"),
        subject: "summarizer.jobs.x",
        msg_id: Some("m"),
        payload: "{\"session_id\":\"s\"}",
        last_error: "LLM down",
        deliveries: 5,
        job_key: Some("SUMMARIZER_JOBS:7:1796277031000000000"),
    };
    assert!(store.dead_letter(&letter).await.unwrap().is_some());
    // Its ack was lost: delivered again, it is recognised.
    assert_eq!(store.dead_letter(&letter).await.unwrap(), None);
    // Another job (another publish time at the same sequence: a stream made again).
    let other = summarizer::store::NewDeadLetter {
        job_key: Some("SUMMARIZER_JOBS:7:1796277099000000000"),
        ..letter
    };
    assert!(store.dead_letter(&other).await.unwrap().is_some());
    assert_eq!(store.dead_letters(true).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_nightly_job_reusing_its_request_id_is_processed_after_a_failure() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(
        &nats,
        &[("FAILURE_BACKOFF_MS", "0"), ("LLM_MAX_RETRIES", "0")],
    )
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.start_worker(&[]).await;
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    // A scheduler sends the same request every night.
    let nightly = Request {
        session_id: "s".into(),
        request_id: Some("nightly".into()),
        ..Request::default()
    };
    app.append_turns("s", 5).await;
    publisher
        .publish(&nightly, Some("night-1"), None)
        .await
        .unwrap();
    until_stream_empty(&client).await;
    assert_eq!(compactions(&app, "s").await, 1, "the first night compacts");

    // The second night the session is over its threshold again, and the LLM fails the
    // job's first delivery.
    for n in 6..=10 {
        app.append_turn("s", n).await;
    }
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .with_priority(1)
        .up_to_n_times(1)
        .mount(&app.llm)
        .await;
    publisher
        .publish(&nightly, Some("night-2"), None)
        .await
        .unwrap();
    app.until_llm_called(3).await;
    until_stream_empty(&client).await;
    assert_eq!(
        compactions(&app, "s").await,
        2,
        "the redelivered job is processed, not taken for the first night's"
    );
    let events = app.usage_events("s").await;
    let job_ids: Vec<&str> = events
        .iter()
        .map(|e| e.4["job_id"].as_str().unwrap())
        .collect();
    assert_ne!(job_ids[0], job_ids[1], "each job records its own identity");
    assert!(app.check().await.is_clean());
}

/// Recall is a request whatever the transport of turns: a worker that only pulls jobs
/// serves it too.
#[tokio::test]
async fn a_worker_that_only_pulls_jobs_serves_recall() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    create_stream(&app, &client).await;
    app.append_turns("s", 5).await;
    app.start_worker(&[]).await;
    let publisher = JobPublisher::new(client.clone(), PREFIX);
    publisher.compact("s", Some("recall-test")).await.unwrap();
    until_stream_empty(&client).await;
    assert_eq!(compactions(&app, "s").await, 1);

    let found = app
        .recall
        .search("s", "pool exhausted", 3, Duration::from_secs(10))
        .await
        .unwrap();

    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found.iter().all(|r| r.content.contains("pool exhausted")));
}
