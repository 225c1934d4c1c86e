use proptest::prelude::*;

use super::*;

/// The facts of `text`, as `(kind, text)` pairs.
fn facts(text: &str) -> Vec<(Kind, &str)> {
    extract(text)
        .into_iter()
        .map(|f| (f.kind, f.text))
        .collect()
}

fn finds(text: &str, kind: Kind, expected: &str) {
    let found = facts(text);
    assert!(
        found.contains(&(kind, expected)),
        "expected {kind} {expected:?} in {text:?}, found {found:?}"
    );
}

fn finds_nothing(text: &str) {
    assert_eq!(facts(text), vec![], "{text:?}");
}

#[test]
fn numbers_with_units_percentages_and_ratios() {
    finds("CPU at 97% on the node", Kind::Quantity, "97%");
    finds("heap grew to 1.8GiB", Kind::Quantity, "1.8GiB");
    finds(
        "it holds 480 connections now",
        Kind::Quantity,
        "480 connections",
    );
    finds("scaled to 3 replicas", Kind::Quantity, "3 replicas");
    finds("pool size 100/100.", Kind::Quantity, "100/100");
    finds("p99 is 1,843 now", Kind::Quantity, "1,843");
    finds("load average 12.56", Kind::Quantity, "12.56");
    assert_eq!(facts("ratio 0.00 3.91"), vec![]);
}

#[test]
fn settings_with_their_values() {
    finds(
        "set max_connections=500 then",
        Kind::Setting,
        "max_connections=500",
    );
    finds("spec: maxReplicas: 30\n", Kind::Setting, "maxReplicas: 30");
    finds("EXPORT_WORKERS=24,", Kind::Setting, "EXPORT_WORKERS=24");
    finds("with pool.size=8.", Kind::Setting, "pool.size=8");
    // A word before a colon is prose, not a setting.
    assert!(
        !facts("Reason: unknown")
            .iter()
            .any(|(k, _)| *k == Kind::Setting)
    );
    finds("see PR #3317 for it", Kind::Id, "#3317");
}

#[test]
fn versions() {
    finds("rolled out v2.14.3 at noon", Kind::Version, "v2.14.3");
    finds("pgbouncer 1.21.0 is old", Kind::Version, "1.21.0");
    finds("pinned openssl@3.0.2", Kind::Version, "openssl@3.0.2");
    finds("release 3.0.0-rc.1 broke it", Kind::Version, "3.0.0-rc.1");
    finds("on v18", Kind::Version, "v18");
}

#[test]
fn timestamps_times_and_dates() {
    finds("since 14:05 UTC, errors", Kind::Time, "14:05 UTC");
    finds("at 14:05:12.345 the pool", Kind::Time, "14:05:12.345");
    finds(
        "[2026-03-14T14:05:12Z] ERROR",
        Kind::Time,
        "2026-03-14T14:05:12Z",
    );
    finds("expired on 2026-03-14.", Kind::Time, "2026-03-14");
    finds("logged 2026/03/14 09:00", Kind::Time, "2026/03/14");
    finds("logged 2026/03/14 09:00", Kind::Time, "09:00");
}

#[test]
fn durations() {
    finds("timed out after 30s", Kind::Duration, "30s");
    finds("p99 250ms", Kind::Duration, "250ms");
    finds("took 4m30s to drain", Kind::Duration, "4m30s");
    finds("waited 30 seconds", Kind::Duration, "30 seconds");
    finds("a 1.5h outage", Kind::Duration, "1.5h");
}

#[test]
fn addresses_and_ports() {
    finds(
        "connect to 10.42.3.17:5432 failed",
        Kind::Address,
        "10.42.3.17:5432",
    );
    finds("from 192.168.0.1, blocked", Kind::Address, "192.168.0.1");
    finds("subnet 10.0.0.0/16", Kind::Address, "10.0.0.0/16");
    finds(
        "v6 fe80::1ff:fe23:4567:890a up",
        Kind::Address,
        "fe80::1ff:fe23:4567:890a",
    );
    finds("dial pg-primary-1:5432", Kind::Address, "pg-primary-1:5432");
}

#[test]
fn host_pod_and_service_names() {
    finds("checkout-api returns 502", Kind::Name, "checkout-api");
    finds(
        "pod checkout-api-7d9f8c-x2k4p restarted",
        Kind::Id,
        "checkout-api-7d9f8c-x2k4p",
    );
    finds("orders_db is slow", Kind::Name, "orders_db");
    finds("host db1.prod.internal", Kind::Name, "db1.prod.internal");
    finds(
        "payments-ledger-canary is up",
        Kind::Name,
        "payments-ledger-canary",
    );
    finds("node ip-10-0-3-17 is", Kind::Name, "ip-10-0-3-17");
}

#[test]
fn error_codes_and_http_statuses() {
    finds("gateway says HTTP 502 now", Kind::Code, "502");
    finds("returning 502s since noon", Kind::Code, "502s");
    finds("SQLSTATE 53300 again", Kind::Code, "53300");
    finds("exit code 137", Kind::Code, "137");
    finds("raised ORA-00060 twice", Kind::Code, "ORA-00060");
    finds("error E1101 from the client", Kind::Code, "E1101");
    finds("got ECONNREFUSED back", Kind::Code, "ECONNREFUSED");
    finds("ERR_CONN_RESET on every call", Kind::Code, "ERR_CONN_RESET");
    finds("patched CVE-2024-3094.", Kind::Code, "CVE-2024-3094");
}

#[test]
fn exception_names() {
    finds(
        "threw ConnectionResetError: peer",
        Kind::Exception,
        "ConnectionResetError",
    );
    finds(
        "java.lang.OutOfMemoryError: Java heap space",
        Kind::Exception,
        "java.lang.OutOfMemoryError",
    );
    finds("Reason: OOMKilled", Kind::Exception, "OOMKilled");
    finds("in CrashLoopBackOff", Kind::Exception, "CrashLoopBackOff");
}

#[test]
fn file_paths_and_urls() {
    finds(
        "read /etc/ssl/certs/internal-ca.pem",
        Kind::Path,
        "/etc/ssl/certs/internal-ca.pem",
    );
    finds(
        "see src/pool/config.rs:42",
        Kind::Path,
        "src/pool/config.rs:42",
    );
    finds(
        "GET https://api.example.com/v1/cart failed",
        Kind::Path,
        "https://api.example.com/v1/cart",
    );
    finds("at C:\\logs\\app.log", Kind::Path, "C:\\logs\\app.log");
    finds("POST /api/cart", Kind::Path, "/api/cart");
    finds(
        "pushed to shopco-labs/deploy-helpers publicly",
        Kind::Path,
        "shopco-labs/deploy-helpers",
    );
    finds_nothing("and/or either/or");
}

#[test]
fn commit_hashes_and_other_ids() {
    finds("reverted a3f9c21 today", Kind::Id, "a3f9c21");
    finds("ticket INC-4821 opened", Kind::Id, "INC-4821");
    finds(
        "trace 4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
        Kind::Id,
        "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
    );
    finds("request req-8f3a2c91 failed", Kind::Id, "req-8f3a2c91");
}

#[test]
fn quoted_strings_of_several_words() {
    finds(
        r#"FATAL: "remaining connection slots are reserved" for"#,
        Kind::Quoted,
        "remaining connection slots are reserved",
    );
    finds(
        "ran `kubectl rollout undo deploy/checkout`",
        Kind::Quoted,
        "kubectl rollout undo deploy/checkout",
    );
    finds(
        "it said 'connection reset by peer' twice",
        Kind::Quoted,
        "connection reset by peer",
    );
    // One word in quotes is a token, not a quoted string; JSON keys are not facts.
    assert!(
        !facts(r#"{"status": "ok", "count": 3}"#)
            .iter()
            .any(|(k, _)| *k == Kind::Quoted)
    );
    // Apostrophes open nothing.
    assert!(
        !facts("it's the pool's fault, isn't it")
            .iter()
            .any(|(k, _)| *k == Kind::Quoted)
    );
}

#[test]
fn ordinary_prose_holds_no_facts() {
    finds_nothing("Let me look at the load balancer and follow-up with the on-call team.");
    finds_nothing("**Investigating:** why is it slow? The read-only replica is fine.");
    finds_nothing("ERROR WARN INFO GET POST DNS CPU, e.g. the 2 of us at 10 past.");
}

#[test]
fn a_fact_set_keeps_each_identifier_once_in_order_of_first_appearance() {
    let set = FactSet::of_text("pg-primary-1 at 97% then pg-primary-1 at 98%");
    let texts: Vec<&str> = set.iter().map(|(_, t)| t).collect();
    assert_eq!(texts, ["pg-primary-1", "97%", "98%"]);
}

#[test]
fn recall_counts_the_facts_a_summary_still_carries() {
    let old = FactSet::of_text(
        "checkout-api hit 502s at 14:05:12; pg-primary-1 at 480 connections, v2.14.3",
    );
    let recall = old.recall("**Key findings:** checkout-api 502s from 14:05:12 on v2.14.3");
    assert_eq!(recall.total, 6);
    assert_eq!(recall.kept, 4);
    assert_eq!(recall.missing, ["pg-primary-1", "480 connections"]);
    assert!((recall.ratio() - 4.0 / 6.0).abs() < 1e-9);
    assert_eq!(FactSet::default().recall("anything").ratio(), 1.0);
}

#[test]
fn a_fact_inside_a_longer_identifier_is_not_kept() {
    assert!(!contains_word("pg-primary-10 is up", "pg-primary-1"));
    assert!(!contains_word("took 5000ms", "500"));
    assert!(contains_word("HTTP 502s since", "502"));
    assert!(contains_word("(pg-primary-1)", "pg-primary-1"));
    assert!(!contains_word("", "x"));
}

#[test]
fn tool_call_arguments_carry_facts() {
    let mut m = crate::message::Message::text(crate::message::Role::Assistant, "Checking.");
    m.tool_calls = Some(serde_json::json!([
        {"id": "c1", "name": "logs", "args": {"service": "checkout-api", "since": "14:00"}},
        {"id": "c2", "type": "function", "function": {"name": "sql", "arguments": "{\"db\":\"orders_db\"}"}},
    ]));
    let set = FactSet::of_messages(&[m]);
    assert!(set.contains("checkout-api"), "{set:?}");
    assert!(set.contains("14:00"));
    assert!(set.contains("orders_db"));
}

#[test]
fn megabytes_are_extracted_in_one_pass() {
    let line =
        "2026-03-14T14:05:12Z ERROR checkout-api-7d9f8c upstream 10.0.3.17:5432 reset after 30s\n";
    let text = line.repeat(50_000);
    let set = FactSet::of_text(&text);
    assert_eq!(set.len(), 5, "{set:?}");
}

/// Identifiers of each kind, as an agent would meet them.
fn identifier() -> impl Strategy<Value = (Kind, String)> {
    prop_oneof![
        "[1-9][0-9]{0,3}(%|GiB|MiB|ms|rps)".prop_map(|s| (Kind::Quantity, s)),
        "[1-9][0-9]{2,5}".prop_map(|s| (Kind::Quantity, s)),
        "v[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,3}".prop_map(|s| (Kind::Version, s)),
        "(0[0-9]|1[0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]".prop_map(|s| (Kind::Time, s)),
        "20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])".prop_map(|s| (Kind::Time, s)),
        "[1-9][0-9]?m[1-5][0-9]s".prop_map(|s| (Kind::Duration, s)),
        "10\\.[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}:[1-9][0-9]{3}".prop_map(|s| (Kind::Address, s)),
        "[a-z]{3,8}-(api|db|svc|worker)(-[0-9])?".prop_map(|s| (Kind::Name, s)),
        "[a-z]{3,8}_[a-z]{2,8}".prop_map(|s| (Kind::Name, s)),
        "(E|ORA-|ERR)[0-9]{4,5}".prop_map(|s| (Kind::Code, s)),
        "[A-Z][a-z]{3,8}(Error|Exception)".prop_map(|s| (Kind::Exception, s)),
        "/[a-z]{2,8}(/[a-z]{2,8}){1,3}\\.(log|pem|conf)".prop_map(|s| (Kind::Path, s)),
        "[0-9a-f]{7,12}"
            .prop_filter("a hash has a letter and a digit", |s| {
                s.chars().any(|c| c.is_ascii_digit()) && s.chars().any(|c| c.is_ascii_alphabetic())
            })
            .prop_map(|s| (Kind::Id, s)),
        "INC-[0-9]{3,6}".prop_map(|s| (Kind::Id, s)),
        "[a-z]{2,6}_[a-z]{2,6}=[1-9][0-9]{0,3}".prop_map(|s| (Kind::Setting, s)),
        "#[1-9][0-9]{2,5}".prop_map(|s| (Kind::Id, s)),
    ]
}

/// [`FactSet::recall`] as it reads without its prefilter.
fn recall_by_search(facts: &FactSet, summary: &str) -> Vec<String> {
    let in_summary = FactSet::of_text(summary);
    facts
        .iter()
        .filter(|(_, text)| !in_summary.contains(text) && !contains_word(summary, text))
        .map(|(_, text)| text.to_owned())
        .collect()
}

#[test]
fn recall_against_a_large_part_is_exactly_what_a_search_finds() {
    let dump: String = (0..50_000)
        .map(|n| {
            format!(
                "2026-03-01T10:00:00Z host-{n}.internal req-{:08x} failed\n",
                n * 7919
            )
        })
        .collect();
    let facts = FactSet::of_text(&dump);
    let summary: String = (0..300)
        .map(|n| format!("- host-{n}.internal failed, req-{:08x}\n", n * 7919))
        .collect();

    let recall = facts.recall(&summary);

    assert_eq!(recall.missing, recall_by_search(&facts, &summary));
    assert!(recall.kept >= 600, "{} of {}", recall.kept, recall.total);
    assert_eq!(recall.stated, recall.kept, "every line is a statement");
}

proptest! {
    /// The prefilter never changes an answer: a fact is kept exactly when a search of
    /// the summary finds it.
    #[test]
    fn recall_keeps_exactly_what_a_search_finds(
        ids in prop::collection::vec(identifier(), 1..20),
        kept in prop::collection::vec(any::<bool>(), 20),
        noise in "\\PC{0,60}",
    ) {
        let part: String = ids.iter().map(|(_, id)| format!("saw {id} then\n")).collect();
        let facts = FactSet::of_text(&part);
        let mut summary = noise;
        for ((_, id), keep) in ids.iter().zip(&kept) {
            if *keep {
                summary.push_str(&format!(" {id}, "));
            }
        }
        // Carried anywhere, and stated (outside lists): each exactly what a search finds.
        let recall = facts.recall(&summary);
        let lacking = recall_by_search(&facts, &summary);
        prop_assert_eq!(recall.kept, recall.total - lacking.len());
        prop_assert_eq!(recall.missing, recall_by_search(&facts, &stated_text(&summary)));
    }

    /// An identifier that appears verbatim in the input is found, whatever is around it:
    /// as a fact of its own, or within one that takes its unit along (`100 s`).
    #[test]
    fn an_identifier_written_in_the_text_is_found(
        (kind, id) in identifier(),
        before in "(The |saw |[a-z]{1,10} |\\(|\\[|\"|, |\n)",
        after in "( was seen| |\\.|, then|\\)|\\]|: |\n|\\. Next)",
        filler in "[a-z ]{0,40}",
    ) {
        let text = format!("{filler} {before}{id}{after} {filler}");
        let found = extract(&text);
        prop_assert!(
            found.iter().any(|f| f.text.contains(id.as_str())),
            "{kind} {id:?} not found in {text:?}: {found:?}"
        );
        prop_assert!(FactSet::of_text(&text).recall(&id).missing.iter().all(|m| *m != id));
    }

    /// Extraction never panics and every fact is a slice of the input.
    #[test]
    fn any_text_extracts_without_panicking(text in "\\PC{0,200}") {
        for fact in extract(&text) {
            prop_assert!(text.contains(fact.text));
        }
    }
}

#[test]
fn the_parts_of_a_composite_identifier_are_found_too() {
    finds(
        "request_id=req-0be47f12 pod=x",
        Kind::Setting,
        "request_id=req-0be47f12",
    );
    finds("request_id=req-0be47f12 pod=x", Kind::Id, "req-0be47f12");
    finds("the oldest is pid=48213.", Kind::Setting, "pid=48213");
    finds(
        "RolloutCompleted 2026-04-02T15:32:10Z",
        Kind::Time,
        "15:32:10",
    );
    finds(
        "dsn postgresql://ledger_ro@10.42.3.17:5432/ledger?sslmode=require",
        Kind::Address,
        "10.42.3.17:5432",
    );
}

#[test]
fn symbols_channels_money_flags_and_registry_paths() {
    finds(
        "the PrometheusMeterRegistry grows",
        Kind::Name,
        "PrometheusMeterRegistry",
    );
    finds(
        "set maximumAllowableTags to 50",
        Kind::Name,
        "maximumAllowableTags",
    );
    finds(
        "posted to #ledger-alerts-legacy.",
        Kind::Name,
        "#ledger-alerts-legacy",
    );
    finds(
        "refunds worth $184,220.55 in total",
        Kind::Quantity,
        "$184,220.55",
    );
    finds("heap 1.12 GiB now", Kind::Quantity, "1.12 GiB");
    finds("leaks 180 MiB/h steadily", Kind::Quantity, "180 MiB/h");
    finds(
        "args --tls-cert=/etc/ledger/tls/tls.crt",
        Kind::Path,
        "/etc/ledger/tls/tls.crt",
    );
    finds(
        "Taints: node.kubernetes.io/unreachable:NoExecute",
        Kind::Path,
        "node.kubernetes.io/unreachable:NoExecute",
    );
    finds(
        "assumed-role/terraform-ci-network/atlantis-1779199916",
        Kind::Name,
        "terraform-ci-network",
    );
    finds(
        "type UnauthorizedAccess:IAMUser/MaliciousIPCaller.Custom fired",
        Kind::Id,
        "UnauthorizedAccess:IAMUser/MaliciousIPCaller.Custom",
    );
    finds(
        "condition aws:TokenIssueTime before",
        Kind::Id,
        "aws:TokenIssueTime",
    );
    finds_nothing("Postgres and HTTP and Kubernetes are fine");
}

/// A missing identifier comes back with the sentence it was first said in, from content
/// or a call's arguments; past the limit (a dump's thousands), with none, at no cost.
#[test]
fn a_missing_fact_is_given_with_the_statement_it_was_said_in() {
    let dump: String = (0..50_000).map(|n| format!("req-{n:06}x ok\n")).collect();
    let mut call = Message::text(crate::message::Role::Assistant, "");
    call.tool_calls = Some(serde_json::json!([{"id": "c1", "name": "logs",
        "arguments": {"service": "checkout-api", "since": "13:55"}}]));
    let messages = vec![
        Message::text(
            crate::message::Role::Assistant,
            "The pool was full. checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors.",
        ),
        call,
        Message::text(crate::message::Role::Tool, &dump),
    ];
    let facts = FactSet::of_messages(&messages);
    let missing: Vec<String> = facts.iter().map(|(_, t)| t.to_owned()).collect();
    assert!(missing.len() > 50_000);

    let listed = facts.said_in(&messages, &missing, 200);

    assert_eq!(listed.len(), missing.len());
    let said = |value: &str| {
        listed
            .iter()
            .find(|f| f.value == value)
            .unwrap()
            .said
            .clone()
    };
    assert_eq!(
        said("v5.33.0"),
        "checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors."
    );
    assert!(
        said("13:55").contains("\"since\":\"13:55\""),
        "{}",
        said("13:55")
    );
    assert!(said("req-000010x").starts_with("req-000010x ok"));
    assert_eq!(listed.iter().filter(|f| !f.said.is_empty()).count(), 200);
}

/// A log-heavy old part: 400 routine lines of request ids and timestamps, one line the
/// agent quoted. What is weighed is what the conversation said and that line; the
/// routine lines' identifiers are seen, not weighed.
#[test]
fn an_old_part_weighs_what_the_conversation_established() {
    use crate::message::Role;
    let mut log: Vec<String> = (0..400)
        .map(|n| {
            format!(
                "14:0{}:{:02} GET /api/orders req-{n:05} 200 12ms",
                n % 10,
                n % 60
            )
        })
        .collect();
    log[217] = "14:03:37 ERROR E-5417 pool exhausted on orders-db-2 req-00217".to_owned();
    let mut result = Message::text(Role::Tool, &log.join("\n"));
    result.tool_call_id = Some("c1".into());
    let old = [
        Message::text(Role::User, "Why does checkout-api return 502 since 14:01?"),
        result,
        Message::text(
            Role::Assistant,
            "The log shows E-5417 at 14:03:37: the pool of orders-db-2 is exhausted.",
        ),
    ];
    let set = FactSet::established_in(&old);
    let texts: Vec<&str> = set.iter().map(|(_, t)| t).collect();
    assert!(texts.contains(&"E-5417"), "{texts:?}");
    assert!(
        texts.contains(&"req-00217"),
        "the quoted line's id: {texts:?}"
    );
    assert!(
        !texts.contains(&"req-00001"),
        "a routine line's id: {texts:?}"
    );
    let weighing = set.weighing();
    assert_eq!(weighing.said + weighing.relied_on, set.len());
    assert!(weighing.relied_on >= 1, "{weighing:?}");
    assert!(weighing.seen > 400, "{weighing:?}");
    assert!(set.len() < 15, "{texts:?}");
    // Where each was first said is found as before.
    let missing = set.said_in(&old, &["req-00217".to_owned()], 10);
    assert!(
        missing[0].said.contains("ERROR E-5417 pool exhausted"),
        "{missing:?}"
    );
}
