//! The lab's runs end to end, as CI runs them: short chaos runs (Postgres, SQLite,
//! durable jobs) and the benchmark's smoke run, against the real Postgres and NATS.

// Test helpers panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

const NATS_URL: &str = "nats://127.0.0.1:4222";

/// `summarizer-lab` with a clean environment, run from an empty directory (no `.env`).
fn lab(args: &[&str]) -> tokio::process::Command {
    let dir = std::env::temp_dir().join(format!("summarizer-lab-test-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_summarizer-lab"));
    command
        .args(args)
        .env_clear()
        .current_dir(dir)
        .kill_on_drop(true);
    command
}

/// Runs `command` to its end (at most `limit`), asserts it succeeded, returns its stdout.
async fn succeeds(mut command: tokio::process::Command, limit: Duration) -> String {
    let output = tokio::time::timeout(limit, command.output())
        .await
        .expect("the command stops by itself in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// An 8-second chaos run with `options` (30 agents, 3 workers, a kill every ~second),
/// asserted clean, with workers killed and sessions compacted meanwhile; returns its
/// stdout.
async fn short_chaos_run(options: &[&str], limit: Duration) -> String {
    let mut args = vec![
        "chaos",
        "--duration-secs",
        "8",
        "--sessions",
        "30",
        "--workers",
        "3",
        "--kill-every-ms",
        "1000",
    ];
    args.extend_from_slice(options);
    let mut chaos = lab(&args);
    // Only the name's base: the run makes and drops a database of its own.
    chaos
        .env(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/summarizer",
        )
        .env("NATS_URL", NATS_URL);

    let stdout = succeeds(chaos, limit).await;

    assert!(
        stdout.contains(": 0 lost, 0 duplicated, 0 misplaced"),
        "{stdout}"
    );
    assert!(stdout.contains("chaos: every invariant held"), "{stdout}");
    let kills: u32 = stdout
        .lines()
        .find_map(|l| l.split_once(" worker kills;").map(|(n, _)| n))
        .and_then(|n| n.trim().parse().ok())
        .expect("a kill count");
    assert!(kills >= 3, "{stdout}");
    assert!(
        !stdout.contains("checked 30 sessions, 0 messages"),
        "{stdout}"
    );
    assert!(stdout.contains("compacted "), "{stdout}");
    stdout
}

#[tokio::test]
async fn a_short_chaos_run_loses_nothing() {
    short_chaos_run(&[], Duration::from_secs(120)).await;
}

/// Three worker processes and 30 agents share one SQLite file while workers are killed.
#[tokio::test]
async fn a_short_chaos_run_on_sqlite_loses_nothing() {
    let stdout = short_chaos_run(&["--database", "sqlite"], Duration::from_secs(120)).await;
    assert!(stdout.contains(" workers on sqlite,"), "{stdout}");
}

#[tokio::test]
async fn a_short_chaos_run_with_durable_jobs_loses_no_job() {
    let stdout = short_chaos_run(&["--transport", "jetstream"], Duration::from_secs(180)).await;
    // Every job was processed or dead-lettered (the stream is empty), none compacted its
    // session twice.
    let jobs = stdout
        .lines()
        .find(|l| l.starts_with("jobs: "))
        .unwrap_or_else(|| panic!("no jobs line in {stdout}"));
    assert!(
        jobs.contains(" 0 left in the stream") && jobs.contains(" 0 compacted twice"),
        "{jobs}"
    );
    let published: u64 = jobs
        .trim_start_matches("jobs: ")
        .split_once(' ')
        .and_then(|(n, _)| n.parse().ok())
        .expect("a published count");
    assert!(published >= 500, "{jobs}");
}

#[tokio::test]
async fn the_benchmark_smoke_run_reports_every_figure() {
    let mut bench = lab(&["bench", "--quick", "--json"]);
    bench
        .env(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/summarizer",
        )
        .env("NATS_URL", NATS_URL)
        .env("RUST_LOG", "warn");

    let stdout = succeeds(bench, Duration::from_secs(300)).await;

    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // No target is asserted (a smoke run on a shared CI machine measures little), but
    // every figure must be there and be a real measurement.
    let targets = report["targets"].as_array().unwrap();
    // 11 on Postgres, 12 on recall (6 a store), 3 on SQLite, 8 on the idle schedule (4 a
    // store).
    assert_eq!(targets.len(), 34, "{stdout}");
    for target in targets {
        assert!(target["ours"].as_f64().unwrap() > 0.0, "{target}");
        assert!(target["baseline"].as_f64().unwrap() > 0.0, "{target}");
    }
    // The precompute scenario compacted from pending summaries, and counted its calls.
    let precompute = &report["measurements"]["precompute"];
    assert!(
        precompute["precomputed"].as_i64().unwrap() > 0,
        "{precompute}"
    );
    assert!(
        precompute["llm_calls"].as_u64().unwrap() > 0,
        "{precompute}"
    );
    for series in ["nats_echo", "postgres_select", "noop", "noop_by_length"] {
        assert_eq!(
            report["measurements"][series].as_array().unwrap().len(),
            2,
            "{series}"
        );
    }
    // Recall at two archive sizes, each with its primary-key baseline.
    let recall = report["measurements"]["recall"].as_array().unwrap();
    assert_eq!(recall.len(), 2, "{stdout}");
    for size in recall {
        for series in ["identifier", "words", "seqs", "primary_key"] {
            assert!(size[series]["p50_us"].as_f64().unwrap() > 0.0, "{size}");
        }
    }
    for series in ["select", "noop"] {
        assert_eq!(
            report["measurements"]["sqlite"][series]
                .as_array()
                .unwrap()
                .len(),
            2,
            "sqlite {series}"
        );
    }
}
