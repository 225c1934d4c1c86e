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
    // A fact only a tool printed is kept, in its line or in a list of its own.
    assert!(text.contains("14:05:12") && text.contains("30s"), "{text}");
    assert!(text.contains("480 connections"), "{text}");
    // A user message other than the first carries facts too.
    assert!(text.contains("v15.4.2"), "{text}");
    assert!(
        text.contains("**Ruled out:** DNS resolution looks normal, so DNS is ruled out\n"),
        "{text}"
    );
    assert!(
        text.ends_with("**Current state:** The pool is saturated. Checking pgbouncer next."),
        "{text}"
    );
    assert_eq!(s.model, "extractive");
    assert_eq!(
        FactSet::of_messages(&old).recall(&text).missing,
        Vec::<String>::new()
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
        "**Investigating:** 502s on checkout\n**Key findings:**\n- pool at 100/100 at 14:05 on pg-primary-1\n- Also noted: a3f9c21, INC-4821\n**Ruled out:** DNS is not involved\n**Current state:** checking db",
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
    for fact in ["pg-primary-1", "a3f9c21", "INC-4821", "480 connections"] {
        assert!(text.contains(fact), "{fact} lost: {text}");
    }
    assert!(
        text.contains("DNS is not involved; DNS resolution looks normal"),
        "{text}"
    );
    assert_eq!(text.matches("Also noted").count(), 1, "{text}");
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
    old.push(msg(Role::User, "Anything new since the deploy of v2.14.3?"));
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
    assert!(text.contains("- Also noted: "), "{text}");
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
    assert!(text.contains("ERROR svc-"), "{text}");
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
    assert_eq!(units::clip_words("alpha beta gamma", 12), "alpha beta");
    assert_eq!(units::clip_words("alphabet", 5), "alpha");
}

#[test]
fn fit_cuts_at_a_sentence_end_then_a_word() {
    assert_eq!(fit("One two. Three four five six.", 16), "One two.");
    assert_eq!(fit("alpha beta gamma delta", 12), "alpha beta…");
    assert_eq!(fit("short", 10), "short");
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
