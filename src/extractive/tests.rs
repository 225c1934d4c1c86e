use super::*;
use crate::facts::FactSet;
use crate::summary;

fn msg(role: Role, content: &str) -> Message {
    Message::text(role, content)
}

fn earlier_summary(text: &str) -> Message {
    let mut m = msg(Role::User, text);
    m.is_summary = true;
    m
}

fn summarize_default(old: &[Message]) -> String {
    summarize(old, 6_000).unwrap().text
}

fn incident() -> Vec<Message> {
    let padding = "The rotation handbook says to check dashboards first. ".repeat(10);
    vec![
        msg(
            Role::User,
            "Why is checkout-api returning 502s since 14:05 UTC? Customers see errors at checkout.",
        ),
        msg(
            Role::Assistant,
            &format!("Let me look at the load balancer.\n{padding}"),
        ),
        msg(
            Role::Tool,
            "14:05:12 ERROR checkout-api upstream timeout after 30s\n14:05:13 pool size 100/100",
        ),
        msg(
            Role::Assistant,
            "DNS resolution looks normal, so DNS is ruled out.",
        ),
        msg(
            Role::User,
            "What about the database? It was upgraded to v15.4.2 yesterday.",
        ),
        msg(
            Role::Assistant,
            "orders_db shows 480 connections against max_connections=500. The pool is saturated. Checking pgbouncer next.",
        ),
    ]
}

#[test]
fn fills_every_heading_from_the_transcript() {
    let old = incident();
    let s = summarize(&old, 6_000).unwrap();
    let replaced: i64 = old.iter().map(|m| m.chars).sum();
    let text = summary::accept(&s.text, replaced, 6_000).unwrap();
    assert!(
        text.starts_with(
            "**Investigating:** Why is checkout-api returning 502s since 14:05 UTC? Customers see errors at checkout.\n"
        ),
        "{text}"
    );
    // What only a tool printed is kept when it shows something wrong, in its line.
    assert!(
        text.contains("- tool → 14:05:12 ERROR checkout-api upstream timeout after 30s\n"),
        "{text}"
    );
    // A user message other than the first carries facts too; a question is kept only
    // to say what the answer after it is about.
    assert!(
        text.contains("- What about the database? It was upgraded to v15.4.2 yesterday.\n"),
        "{text}"
    );
    assert!(
        text.contains("**Ruled out:** DNS resolution looks normal, so DNS is ruled out\n"),
        "{text}"
    );
    // The last answer, whole, said once: not again among the findings.
    assert!(
        text.ends_with(
            "**Current state:** orders_db shows 480 connections against max_connections=500. The pool is saturated. Checking pgbouncer next."
        ),
        "{text}"
    );
    assert_eq!(text.matches("480 connections").count(), 1, "{text}");
    assert_eq!(s.model, "extractive");
    // Every identifier but the pool's size, a line with no error word nobody stated.
    assert_eq!(
        FactSet::of_messages(&old).recall(&text).missing,
        ["14:05:13", "100/100"],
        "{text}"
    );
}

#[test]
fn is_deterministic() {
    assert_eq!(
        summarize(&incident(), 6_000).unwrap(),
        summarize(&incident(), 6_000).unwrap()
    );
}

#[test]
fn an_earlier_summarys_facts_are_carried_forward() {
    let earlier = earlier_summary(
        "**Investigating:** 502s on checkout\n**Key findings:**\n- pool at 100/100 at 14:05 on pg-primary-1\n- Commit a3f9c21 was deployed for INC-4821.\n- Also noted: 9f2c7e1, INC-7\n**Ruled out:** DNS is not involved\n**Current state:** checking db",
    );
    let mut old = vec![earlier];
    old.extend(incident().into_iter().skip(1));
    // Room for every section: a long, repetitive log.
    old.push(msg(
        Role::Tool,
        &"12:00:01 INFO heartbeat ok from web-1\n".repeat(200),
    ));
    let text = summarize_default(&old);
    assert!(
        text.starts_with("**Investigating:** 502s on checkout\n"),
        "{text}"
    );
    for statement in [
        "pool at 100/100 at 14:05 on pg-primary-1",
        "Commit a3f9c21 was deployed for INC-4821.",
        "orders_db shows 480 connections against max_connections=500.",
    ] {
        assert!(text.contains(statement), "{statement} lost: {text}");
    }
    assert!(
        text.contains("DNS is not involved; DNS resolution looks normal"),
        "{text}"
    );
    // A list of identifiers (an older version wrote them) is not carried as one.
    assert!(!text.contains("Also noted"), "{text}");
}

#[test]
fn new_facts_are_not_starved_by_an_earlier_summarys() {
    // An earlier summary as long as a summary may be, then new facts: the new summary
    // keeps the new ones, and the old ones as far as room allows.
    let bullets: String = (0..60)
        .map(|i| format!("- node-{i} saw 5{i:02}ms at 13:{i:02}:00\n"))
        .collect();
    let earlier = earlier_summary(&format!(
        "**Investigating:** slow checkout\n**Key findings:**\n{bullets}**Ruled out:** nothing ruled out yet\n**Current state:** looking"
    ));
    let mut old = vec![earlier];
    old.push(msg(
        Role::User,
        "We deployed v2.14.3 an hour ago. Anything new since?",
    ));
    old.push(msg(
        Role::Assistant,
        &format!(
            "{} Found it: checkout-api-7d9f8c-x2k4p throws java.lang.OutOfMemoryError at 15:42:07.",
            "Reading the heap dumps now. ".repeat(200)
        ),
    ));
    let text = summarize(&old, 3_000).unwrap().text;
    for fact in [
        "v2.14.3",
        "checkout-api-7d9f8c-x2k4p",
        "java.lang.OutOfMemoryError",
        "15:42:07",
    ] {
        assert!(text.contains(fact), "{fact} starved: {text}");
    }
    assert!(text.contains("node-0"), "{text}");
}

/// A question states nothing: it is never a finding, though its identifiers still weigh.
/// Nor is a tool line that says all is well.
#[test]
fn questions_and_healthy_lines_are_never_findings() {
    let old = vec![
        msg(
            Role::User,
            "Is orders-db-replica-2 lagging, or is pgbouncer-14 the problem?",
        ),
        msg(Role::Assistant, "Checking the replica."),
        msg(
            Role::Tool,
            "2026-03-14T14:02:11Z INFO orders-db-replica-2 replication healthy lag_ms=12",
        ),
        msg(
            Role::Assistant,
            "pgbouncer-14 hit max_client_conn=2000 at 14:03, so new clients are refused. That is the cause.",
        ),
    ];
    let text = summarize(&old, 6_000).unwrap().text;
    let findings = text
        .split(KEY_FINDINGS)
        .nth(1)
        .and_then(|rest| rest.split(RULED_OUT).next())
        .unwrap();
    assert!(!findings.contains('?'), "{text}");
    assert!(!findings.contains("INFO orders-db-replica-2"), "{text}");
    assert!(
        findings.contains("pgbouncer-14 hit max_client_conn=2000 at 14:03"),
        "{text}"
    );
}

/// A request states nothing; an answer's opener ("Yes:") is not part of what it states.
#[test]
fn requests_and_openers_are_not_findings() {
    let old = vec![
        msg(
            Role::User,
            "Checkout is failing since 14:05. Check orders-db.",
        ),
        msg(
            Role::Assistant,
            "Yes: checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors.",
        ),
        msg(Role::User, "Roll back to v5.32.0 now, please."),
        msg(
            Role::Assistant,
            "Rolled back: 12 of 12 pods run v5.32.0 since 14:35 and errors stopped.",
        ),
    ];
    let text = summarize(&old, 6_000).unwrap().text;
    let findings = text
        .split(KEY_FINDINGS)
        .nth(1)
        .and_then(|rest| rest.split(RULED_OUT).next())
        .unwrap();
    assert!(
        findings.contains(
            "- checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors.\n"
        ),
        "{text}"
    );
    assert!(!findings.contains("Check orders-db"), "{text}");
    assert!(!findings.contains("Roll back to"), "{text}");
}

/// Tool output that is not a sentence (a table row, a header, JSON, code) is never a
/// finding, even when it holds an error word and nobody stated its identifiers.
#[test]
fn tool_output_that_is_not_a_sentence_is_never_a_finding() {
    let old = vec![
        msg(Role::User, "Which etcd member is failing since 14:12?"),
        msg(Role::Assistant, "Listing the members."),
        msg(
            Role::Tool,
            "ENDPOINT ID VERSION ERRORS\n\
             | https://10.20.5.11:2379 | 1c7d3f0e84a2b961 | 3.5.17 | error |\n\
             {\"level\":\"warn\",\"error\":\"rpc error: code = DeadlineExceeded\"}\n\
             \"errorCode\": \"DeadlineExceeded-5000\",\n\
             if err != nil { return fmt.Errorf(\"failed: %w\", err) }\n\
             Failed to get the status of endpoint https://10.20.70.14:2379 (context deadline exceeded)",
        ),
        msg(
            Role::Assistant,
            "One member does not answer; the other four agree on raft_term=42.",
        ),
    ];
    let text = summarize(&old, 6_000).unwrap().text;
    let tool_lines: Vec<&str> = text.lines().filter(|l| l.contains('→')).collect();
    assert_eq!(
        tool_lines,
        [
            "- tool → Failed to get the status of endpoint https://10.20.70.14:2379 (context deadline exceeded)"
        ],
        "{text}"
    );
}

/// When the room is short, an earlier summary's long statements are carried in compact
/// form (their clauses without identifiers left out) rather than dropped.
#[test]
fn old_statements_are_said_in_fewer_words_rather_than_dropped() {
    let long = |n: usize| {
        format!(
            "The pool of pgbouncer-{n}, which every service in the payments namespace shares \
             and which nobody had looked at since the migration last spring, was capped at \
             max_pool={n}03"
        )
    };
    let bullets: String = (1..=6).map(|n| format!("- {}.\n", long(n))).collect();
    let earlier = earlier_summary(&format!(
        "**Investigating:** slow payments\n**Key findings:**\n{bullets}**Ruled out:** nothing ruled out yet\n**Current state:** looking"
    ));
    let mut old = vec![earlier];
    old.push(msg(
        Role::User,
        "The payments team raised max_pool on pgbouncer-1 to 283.",
    ));
    old.push(msg(Role::Assistant, "Rechecking the pools."));
    old.push(msg(Role::Tool, &"12:00:01 INFO pool ok\n".repeat(100)));
    old.push(msg(Role::Assistant, "All six pools answer."));
    let text = summarize(&old, 1_000).unwrap().text;
    // Room for about half of the statements whole.
    assert!(char_count(&text) <= 1_000, "{text}");
    for n in 1..=6 {
        assert!(
            text.contains(&format!(
                "The pool of pgbouncer-{n} … was capped at max_pool={n}03"
            )),
            "pgbouncer-{n}: {text}"
        );
    }
    assert!(text.contains("max_pool on pgbouncer-1 to 283"), "{text}");
}

#[test]
fn templated_log_noise_does_not_crowd_out_a_fact_in_the_same_output() {
    let mut dump: String = (0..400)
        .map(|i| {
            format!(
                "2026-03-14T14:{:02}:{:02}Z INFO checkout-api GET /api/cart 200 latency_ms={}\n",
                i / 60 % 60,
                i % 60,
                100 + i
            )
        })
        .collect();
    dump.push_str("2026-03-14T14:09:59Z FATAL orders_db: remaining connection slots are reserved (SQLSTATE 53300)\n");
    let old = vec![
        msg(Role::User, "Why is checkout failing?"),
        msg(Role::Assistant, "Reading the logs."),
        msg(Role::Tool, &dump),
        msg(Role::User, "And?"),
    ];
    let text = summarize_default(&old);
    assert!(text.contains("SQLSTATE 53300"), "{text}");
}

#[test]
fn ruled_out_collects_negations_from_every_role() {
    let old = vec![
        msg(
            Role::User,
            "Is it the network? The edge team says there is no sign of packet loss.",
        ),
        msg(
            Role::Assistant,
            "The replica pg-replica-2 is healthy. Disk on pg-primary-1 isn't full either.",
        ),
        msg(
            Role::Tool,
            "all 12 checks passed; nothing unusual in /var/log/syslog for host db-7\n"
                .repeat(100)
                .as_str(),
        ),
    ];
    let text = summarize_default(&old);
    let ruled = text.lines().find(|l| l.starts_with(RULED_OUT)).unwrap();
    assert!(ruled.contains("no sign of packet loss"), "{ruled}");
    assert!(ruled.contains("pg-replica-2 is healthy"), "{ruled}");
    assert!(ruled.contains("isn't full"), "{ruled}");
}

#[test]
fn the_current_state_is_whole_sentences_of_the_last_answer() {
    let long = "word ".repeat(300);
    let old = vec![
        msg(
            Role::User,
            &format!("Investigate the outage please. {long}"),
        ),
        msg(
            Role::Assistant,
            &format!(
                "{long}. Rolled back to v2.14.2 at 15:10. Error rate is back under 0.1%. Watching for an hour."
            ),
        ),
        msg(Role::User, "ok"),
    ];
    let text = summarize_default(&old);
    let state = text.lines().last().unwrap();
    assert_eq!(
        state,
        "**Current state:** Rolled back to v2.14.2 at 15:10. Error rate is back under 0.1%. Watching for an hour."
    );
}

#[test]
fn the_summary_stays_within_a_quarter_of_its_input_and_the_limit() {
    let mut old = incident();
    for i in 0..200 {
        old.push(msg(
            Role::Assistant,
            &format!(
                "Host web-{i} at 10.0.{}.{}:8080 answered in {}ms with HTTP 503.",
                i / 250,
                i % 250,
                300 + i
            ),
        ));
    }
    let input: i64 = old.iter().map(|m| m.chars).sum();
    let text = summarize(&old, 6_000).unwrap().text;
    let n = char_count(&text);
    assert!(n <= 6_000 && n <= input / 4, "{n} of {input}");
    // Findings are whole statements of the transcript, not lists of identifiers.
    let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(findings.len() > 10, "{text}");
    for finding in findings {
        let statement = &finding[2..];
        assert!(
            old.iter().any(|m| m.content.contains(statement)),
            "{finding}"
        );
    }
    let small = summarize(&old, 2_000).unwrap().text;
    assert!(char_count(&small) <= 2_000);
}

/// About `bytes` of distinct log lines, each "specific" (digits, an error word).
fn log_dump(bytes: usize) -> String {
    let mut dump = String::with_capacity(bytes + 100);
    let mut n = 0;
    while dump.len() < bytes {
        dump.push_str(&format!("{n:08} ERROR svc-{} upstream reset\n", n % 97));
        n += 1;
    }
    dump
}

#[test]
fn megabytes_of_distinct_tool_lines_are_summarized_in_linear_time() {
    // The old summarizer compared every line with every line kept before it: 5 MB of
    // distinct lines took minutes. Every step is now linear in the input.
    let mut old = incident();
    old[2] = msg(Role::Tool, &log_dump(5_000_000));
    let text = summarize_default(&old);
    assert!(text.contains("480 connections"), "{text}");
    // A templated line, however many times it repeats, is noise, not a finding.
    assert!(!text.contains("ERROR svc-"), "{text}");
}

#[test]
fn a_huge_single_line_is_judged_and_kept_by_its_start() {
    let huge = format!("{} {}", "0xdeadbeef-".repeat(500_000), "no errors");
    assert_eq!(
        units::one_line(&huge, units::MAX_SCAN_CHARS)
            .chars()
            .count(),
        units::MAX_SCAN_CHARS
    );
    let mut old = incident();
    old[2] = msg(Role::Tool, &huge);
    let text = summarize_default(&old);
    assert!(!text.contains("no errors"), "{text}");
    assert!(text.contains("480 connections"), "{text}");
}

#[test]
fn one_line_collapses_whitespace_within_the_bound() {
    assert_eq!(units::one_line("  a\t b \n\n c  ", 300), "a b c");
    assert_eq!(
        units::one_line(&"word ".repeat(1000), 300).chars().count(),
        299
    );
    assert_eq!(clauses::clip_words("alpha beta gamma", 12), "alpha beta");
    assert_eq!(clauses::clip_words("alphabet", 5), "alpha");
}

#[test]
fn fit_cuts_at_a_sentence_end_then_a_word() {
    assert_eq!(fit("One two. Three four five six.", 16), "One two.");
    assert_eq!(fit("alpha beta gamma delta", 12), "alpha beta…");
    assert_eq!(fit("short", 10), "short");
    // A decimal point ends no sentence: the old cut gave "requests wait up to 29.".
    assert_eq!(
        fit(
            "The pool is full. Requests wait up to 29.9s before they fail",
            45
        ),
        "The pool is full."
    );
    assert_eq!(
        fit("Requests wait up to 29.9s before failing", 27),
        "Requests wait up to 29.9s…"
    );
}

#[test]
fn a_tiny_old_part_is_too_small_for_the_template() {
    assert!(matches!(
        summarize(
            &[msg(Role::User, "hi"), msg(Role::Assistant, "hello")],
            6_000
        ),
        Err(LlmError::Invalid(_))
    ));
}

#[test]
fn a_small_old_part_gets_a_shorter_summary() {
    let old = vec![
        msg(
            Role::User,
            &format!("incident 42 on svc-a {}", "x".repeat(300)),
        ),
        msg(
            Role::Assistant,
            &format!("error 1 at 10:00 {}", "y".repeat(300)),
        ),
    ];
    let replaced: i64 = old.iter().map(|m| m.chars).sum();
    let s = summarize(&old, 6_000).unwrap();
    assert!(char_count(&s.text) < replaced);
    summary::accept(&s.text, replaced, 6_000).unwrap();
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn message() -> impl Strategy<Value = Message> {
        let role = prop_oneof![Just(Role::User), Just(Role::Assistant), Just(Role::Tool)];
        // Prose, identifiers, log lines, odd Unicode and markup, long runs.
        let content = prop_oneof![
            "\\PC{0,300}",
            "([a-z]{2,8}-(api|db)-[0-9] (at|saw) [0-9]{2}:[0-9]{2}:[0-9]{2} v[0-9]\\.[0-9]\\.[0-9]\\. ){1,20}",
            "(- \\*\\*Also noted:\\*\\* |→ |; |\\n|`|\"|é|\u{202e}|\u{2028}|x=1 ){0,60}",
            "[a-f0-9]{1,2000}",
        ];
        (role, content, any::<bool>()).prop_map(|(role, content, summary)| {
            let mut m = Message::text(role, &content);
            m.is_summary = summary && role == Role::User;
            m
        })
    }

    proptest! {
        /// Whatever the old part holds, the summary passes the template check (or the
        /// old part is too small for one) and never panics.
        #[test]
        fn any_old_part_gets_a_summary_that_passes_the_check(
            old in proptest::collection::vec(message(), 1..30),
            max_chars in 200usize..8_000,
        ) {
            let replaced: i64 = old.iter().map(|m| m.chars).sum();
            match summarize(&old, max_chars) {
                Ok(s) => {
                    let max = i64::try_from(max_chars).unwrap();
                    prop_assert!(
                        summary::accept(&s.text, replaced, max).is_ok(),
                        "{:?}: {}", summary::accept(&s.text, replaced, max), s.text
                    );
                }
                Err(LlmError::Invalid(_)) => {}
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}

/// A later value of a setting supersedes an earlier one: when the earlier statement does
/// not fit, its value is said with the later one rather than lost.
#[test]
fn a_later_value_of_a_setting_is_said_with_the_earlier_one() {
    let earlier = earlier_summary(
        "**Investigating:** slow payments\n**Key findings:**\n- The pool of pgbouncer-1 at 10.0.4.17:6432, shared by payments-api and ledger-api, was capped at max_pool=103 when the errors began at 14:02.\n**Ruled out:** nothing ruled out yet\n**Current state:** looking",
    );
    let old = vec![
        earlier,
        msg(
            Role::User,
            "We raised it: pgbouncer-1 now runs with max_pool=283 since 15:10.",
        ),
        msg(Role::Assistant, "Rechecking the waits."),
        msg(Role::Tool, &"12:00:01 INFO pool ok\n".repeat(30)),
        msg(Role::Assistant, "Waits are gone."),
    ];
    let text = summarize(&old, 6_000).unwrap().text;
    // Both fit: each is said where it was.
    assert!(text.contains("capped at max_pool=103 when"), "{text}");
    assert!(!text.contains("(earlier"), "{text}");

    let text = summarize(&old, 300).unwrap().text;
    assert!(
        text.contains("pgbouncer-1 now runs with max_pool=283 since 15:10. (earlier max_pool=103)"),
        "{text}"
    );
}

/// A log line that ends in `;` is still a sentence; a line of code that does is not.
#[test]
fn a_log_line_ending_in_a_semicolon_is_a_finding_and_code_is_not() {
    let padding = "The rotation handbook says to check dashboards first. ".repeat(10);
    let old = vec![
        msg(Role::User, "Why is checkout-api slow since 14:01?"),
        msg(
            Role::Assistant,
            &format!("Reading the pooler's log.\n{padding}"),
        ),
        msg(
            Role::Tool,
            "pgbouncer-14 at 10.43.7.217:6432 refused checkout-api with error E-5417: max_client_conn reached; clients queue behind it;\n\
             throw new PoolError(\"pool exhausted for tenant \" + tenantId, E_POOL_7);",
        ),
        msg(
            Role::Assistant,
            "Still looking at the pooler and its clients.",
        ),
    ];
    let text = summarize(&old, 6_000).unwrap().text;
    let tool_lines: Vec<&str> = text.lines().filter(|l| l.contains('→')).collect();
    assert_eq!(
        tool_lines,
        [
            "- tool → pgbouncer-14 at 10.43.7.217:6432 refused checkout-api with error E-5417: max_client_conn reached; clients queue behind it;"
        ],
        "{text}"
    );
}

/// A long investigation of thirty like findings: a tight summary states a few of them.
fn many_findings() -> Vec<Message> {
    let mut old = vec![msg(
        Role::User,
        "Why did checkout-api p99 latency triple at 09:40 UTC? Please investigate.",
    )];
    for i in 0..30 {
        old.push(msg(
            Role::Assistant,
            &format!(
                "Node ip-10-0-{i}-7 reported gc pauses of {}ms during the incident window, \
                 and pod checkout-api-{i:02}x restarted {} times since the deploy v2.{i}.1.",
                100 + i,
                2 + i % 3
            ),
        ));
        old.push(msg(
            Role::User,
            &format!("Noted pod checkout-api-{i:02}x; go on."),
        ));
    }
    old
}

#[test]
fn instructions_weigh_the_findings_that_share_their_words() {
    let old = many_findings();
    let finding = "Node ip-10-0-17-7 reported gc pauses of 117ms";
    let plain = summarize_focused(&old, 1_200, None).unwrap().text;
    assert!(
        !plain.contains(finding),
        "the test needs a finding a tight summary leaves out:\n{plain}"
    );
    let focused = summarize_focused(&old, 1_200, Some("What happened on IP-10-0-17-7?"))
        .unwrap()
        .text;
    assert!(
        focused.contains(finding),
        "the finding on the focus is stated whole:\n{focused}"
    );
    // Instructions that share no word with any finding change nothing.
    assert_eq!(
        summarize_focused(&old, 1_200, Some("Be brief, please."))
            .unwrap()
            .text,
        plain
    );
}
