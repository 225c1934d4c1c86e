use proptest::prelude::*;
use serde_json::json;

use super::*;

const LIMITS: Limits = Limits {
    threshold_chars: 100,
    keep_chars: 40,
};

/// Builds a session in order; each message's content is `chars` characters long.
#[derive(Default)]
struct Session(Vec<Message>);

impl Session {
    fn push(mut self, role: Role, chars: i64, edit: impl FnOnce(&mut Message)) -> Self {
        let mut m = Message {
            seq: self.0.len() as i64 + 1,
            role,
            content: "x".repeat(chars as usize),
            tool_calls: None,
            tool_call_id: None,
            is_summary: false,
            chars,
        };
        edit(&mut m);
        self.0.push(m);
        self
    }
    fn system(self, chars: i64) -> Self {
        self.push(Role::System, chars, |_| {})
    }
    fn user(self, chars: i64) -> Self {
        self.push(Role::User, chars, |_| {})
    }
    fn summary(self, chars: i64) -> Self {
        self.push(Role::User, chars, |m| m.is_summary = true)
    }
    fn assistant(self, chars: i64) -> Self {
        self.push(Role::Assistant, chars, |_| {})
    }
    fn call(self, chars: i64, id: &str) -> Self {
        self.push(Role::Assistant, chars, |m| {
            m.tool_calls = Some(json!([{"id": id, "name": "get_logs", "arguments": "{}"}]))
        })
    }
    fn result(self, chars: i64, id: &str) -> Self {
        self.push(Role::Tool, chars, |m| m.tool_call_id = Some(id.to_owned()))
    }
}

fn plan_of(s: Session) -> (Vec<Message>, Result<Split, Reason>) {
    let result = plan(&s.0, LIMITS);
    (s.0, result)
}

#[test]
fn at_the_threshold_is_below_it() {
    let (_, p) = plan_of(Session::default().user(50).assistant(25).user(25));
    assert_eq!(p, Err(Reason::BelowThreshold));
}

#[test]
fn one_human_turn_is_too_few() {
    let (_, p) = plan_of(Session::default().user(10).assistant(200).summary(50));
    assert_eq!(p, Err(Reason::TooFewTurns));
}

#[test]
fn keeps_from_the_latest_human_turn_that_holds_keep_chars() {
    // Walking back: 20 + 15 = 35 < 40, + user(10) = 45 >= 40 at index 3.
    let (m, p) = plan_of(
        Session::default()
            .user(30)
            .assistant(40)
            .assistant(10)
            .user(10)
            .assistant(15)
            .assistant(20),
    );
    let split = p.unwrap();
    assert_eq!(split.cut, 3);
    assert_eq!(split.removed, vec![0, 1, 2]);
    assert_eq!(split.chars_removed(&m), 80);
    assert_eq!(split.messages_kept(&m), 3);
}

#[test]
fn cut_moves_back_to_a_human_turn() {
    // keep reached at index 4 (an assistant message); the nearest human turn before is 2.
    let (_, p) = plan_of(
        Session::default()
            .user(40)
            .assistant(40)
            .user(5)
            .assistant(5)
            .assistant(30)
            .assistant(30),
    );
    assert_eq!(p.unwrap().cut, 2);
}

#[test]
fn no_human_turn_after_the_first_message_is_no_safe_boundary() {
    let (_, p) = plan_of(Session::default().user(10).assistant(200).user(10));
    assert_eq!(p, Err(Reason::NoSafeBoundary));
}

#[test]
fn a_session_smaller_than_keep_chars_has_no_boundary() {
    let limits = Limits {
        threshold_chars: 10,
        keep_chars: 1000,
    };
    let s = Session::default().user(20).user(20);
    assert_eq!(plan(&s.0, limits), Err(Reason::NoSafeBoundary));
}

#[test]
fn an_old_part_of_only_a_summary_is_nothing_to_compact() {
    let (_, p) = plan_of(Session::default().summary(60).user(5).assistant(60).user(5));
    assert_eq!(p, Err(Reason::NothingToCompact));
}

#[test]
fn an_earlier_summary_is_folded_into_the_next() {
    let (_, p) = plan_of(
        Session::default()
            .summary(30)
            .user(10)
            .assistant(40)
            .user(10)
            .assistant(40),
    );
    assert_eq!(p.unwrap().removed, vec![0, 1, 2]);
}

#[test]
fn system_messages_are_never_removed() {
    let (m, p) = plan_of(
        Session::default()
            .system(20)
            .user(30)
            .system(5)
            .assistant(40)
            .user(10)
            .assistant(40),
    );
    let split = p.unwrap();
    assert_eq!(split.cut, 4);
    assert_eq!(split.removed, vec![1, 3]);
    assert_eq!(split.messages_kept(&m), 4);
}

#[test]
fn only_system_messages_before_the_first_human_turn_is_no_safe_boundary() {
    let (_, p) = plan_of(Session::default().system(80).user(10).assistant(50).user(5));
    assert_eq!(p, Err(Reason::NoSafeBoundary));
}

#[test]
fn a_cut_never_separates_a_tool_call_from_its_result() {
    // A malformed order: a human message between a call and its result. Cutting at
    // index 3 would strand the result; the cut moves back to index 1.
    let (_, p) = plan_of(
        Session::default()
            .user(30)
            .user(5)
            .call(30, "c1")
            .user(5)
            .result(30, "c1")
            .assistant(20),
    );
    assert_eq!(p.unwrap().cut, 1);
}

#[test]
fn dangling_tool_results_do_not_block_a_cut() {
    let (_, p) = plan_of(
        Session::default()
            .user(60)
            .result(10, "nobody-called-me")
            .user(10)
            .assistant(40),
    );
    assert_eq!(p.unwrap().cut, 2);
}

// ---- properties over random sessions ----

#[derive(Clone, Debug)]
enum Step {
    System(i64),
    Human(i64),
    Summary(i64),
    Reply(i64),
    /// An assistant message making `n` calls, then their results in order.
    Calls(i64, Vec<i64>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..50i64).prop_map(Step::System),
        4 => (0..80i64).prop_map(Step::Human),
        1 => (0..120i64).prop_map(Step::Summary),
        4 => (0..120i64).prop_map(Step::Reply),
        3 => (0..60i64, prop::collection::vec(0..200i64, 1..4))
            .prop_map(|(c, r)| Step::Calls(c, r)),
    ]
}

fn build(steps: &[Step]) -> Vec<Message> {
    let mut s = Session::default();
    for (n, step) in steps.iter().enumerate() {
        s = match step {
            Step::System(c) => s.system(*c),
            Step::Human(c) => s.user(*c),
            Step::Summary(c) => s.summary(*c),
            Step::Reply(c) => s.assistant(*c),
            Step::Calls(c, results) => {
                let ids: Vec<String> = (0..results.len()).map(|k| format!("c{n}-{k}")).collect();
                let calls: Vec<_> = ids
                    .iter()
                    .map(|id| json!({"id": id, "name": "t"}))
                    .collect();
                s = s.push(Role::Assistant, *c, |m| m.tool_calls = Some(json!(calls)));
                results
                    .iter()
                    .zip(&ids)
                    .fold(s, |s, (r, id)| s.result(*r, id))
            }
        };
    }
    s.0
}

fn limits() -> impl Strategy<Value = Limits> {
    (1..400i64, 1..1500i64).prop_map(|(keep, extra)| Limits {
        threshold_chars: keep + extra,
        keep_chars: keep,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_plan_keeps_the_rules(steps in prop::collection::vec(step(), 0..40), limits in limits()) {
        let messages = build(&steps);
        let total: i64 = messages.iter().map(|m| m.chars).sum();
        match plan(&messages, limits) {
            Err(Reason::BelowThreshold) => prop_assert!(total <= limits.threshold_chars),
            Err(Reason::TooFewTurns) => {
                prop_assert!(messages.iter().filter(|m| m.is_human_turn()).count() < 2)
            }
            Err(reason) => prop_assert!(
                matches!(reason, Reason::NoSafeBoundary | Reason::NothingToCompact),
                "unexpected {reason:?}"
            ),
            Ok(split) => {
                let kept = &messages[split.cut..];
                // The kept part starts at a human turn and holds at least KEEP chars.
                prop_assert!(kept[0].is_human_turn());
                prop_assert!(kept.iter().map(|m| m.chars).sum::<i64>() >= limits.keep_chars);
                // No kept tool result answers a removed call.
                let removed_calls: Vec<&str> =
                    split.removed(&messages).flat_map(Message::tool_call_ids).collect();
                for m in kept {
                    if let Some(id) = &m.tool_call_id {
                        prop_assert!(!removed_calls.contains(&id.as_str()));
                    }
                }
                // Removed + system messages before the cut + kept = the input, in order.
                let before: Vec<usize> = (0..split.cut).collect();
                let mut rebuilt = split.removed.clone();
                rebuilt.extend(before.iter().filter(|&&i| messages[i].role == Role::System));
                rebuilt.sort_unstable();
                prop_assert_eq!(rebuilt, before);
                // System messages are never removed; something real is summarized.
                prop_assert!(split.removed(&messages).all(|m| m.role != Role::System));
                prop_assert!(split.removed(&messages).any(|m| !m.is_summary));
                prop_assert_eq!(split.messages_kept(&messages), messages.len() - split.removed.len());
            }
        }
    }

    #[test]
    fn a_plan_is_found_whenever_a_safe_boundary_exists(
        steps in prop::collection::vec(step(), 0..40), limits in limits()
    ) {
        // Brute force: any human turn i > 0 with KEEP chars from i on, no call spanning i,
        // and a non-summary, non-system message before it, is a valid cut.
        let messages = build(&steps);
        let total: i64 = messages.iter().map(|m| m.chars).sum();
        let turns = messages.iter().filter(|m| m.is_human_turn()).count();
        prop_assume!(total > limits.threshold_chars && turns >= 2);
        let valid = (1..messages.len()).filter(|&i| {
            let kept = &messages[i..];
            let calls: Vec<&str> = messages[..i].iter().flat_map(Message::tool_call_ids).collect();
            messages[i].is_human_turn()
                && kept.iter().map(|m| m.chars).sum::<i64>() >= limits.keep_chars
                && kept.iter().all(|m| m.tool_call_id.as_deref().is_none_or(|id| !calls.contains(&id)))
        });
        let best = valid.max();
        match (plan(&messages, limits), best) {
            (Ok(split), Some(best)) => prop_assert_eq!(split.cut, best),
            (Err(Reason::NoSafeBoundary), None) => {}
            (Err(Reason::NoSafeBoundary | Reason::NothingToCompact), Some(best)) => {
                // Only acceptable when everything before the best cut is system or summary.
                prop_assert!(messages[..best].iter().all(|m| m.role == Role::System || m.is_summary));
            }
            (other, best) => prop_assert!(false, "plan {other:?} but best cut {best:?}"),
        }
    }
}
