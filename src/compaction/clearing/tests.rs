use serde_json::json;

use super::*;

fn msg(seq: i64, role: Role, content: &str) -> Message {
    Message {
        seq,
        ..Message::text(role, content)
    }
}

/// An assistant message calling `tool` with id `id`.
fn call(seq: i64, id: &str, tool: &str) -> Message {
    let mut m = msg(seq, Role::Assistant, "");
    m.tool_calls = Some(json!([{"id": id, "name": tool, "arguments": {}}]));
    m.chars = char_count(&m.tool_calls.as_ref().unwrap().to_string());
    m
}

fn result(seq: i64, id: &str, chars: usize) -> Message {
    let mut m = msg(seq, Role::Tool, &"x".repeat(chars));
    m.tool_call_id = Some(id.to_owned());
    m
}

fn rules() -> Rules {
    Rules {
        keep: 1,
        min_chars: 1000,
        exclude: vec!["read_runbook".to_owned()],
    }
}

/// A session of `n` tool steps of 5,000 chars, after a human ask.
fn session(n: usize) -> Vec<Message> {
    let mut messages = vec![msg(1, Role::User, "Why is checkout slow?")];
    for k in 0..n {
        let seq = 2 + 3 * k as i64;
        let id = format!("c{k}");
        messages.push(call(seq, &id, "get_logs"));
        messages.push(result(seq + 1, &id, 5_000));
        messages.push(msg(seq + 2, Role::Assistant, "Read it."));
    }
    messages
}

fn indices(clearing: &Clearing) -> Vec<usize> {
    clearing.cleared.iter().map(|c| c.index).collect()
}

#[test]
fn clears_the_oldest_results_until_the_session_is_at_its_keep() {
    let messages = session(5);
    let total: i64 = messages.iter().map(|m| m.chars).sum();
    let already = vec![false; messages.len()];
    // Enough to come down by a little over one result.
    let clearing = plan(&messages, &already, &rules(), total - 6_000);
    assert_eq!(indices(&clearing), [2, 5]);
    let c = &clearing.cleared[0];
    assert_eq!(
        c.placeholder,
        "[tool output cleared: 5000 chars of get_logs output were here; recall seq 3 for the original]"
    );
    assert_eq!(c.saved, 5_000 - char_count(&c.placeholder));
    let mut after = messages.clone();
    clearing.apply(&mut after);
    let left: i64 = after.iter().map(|m| m.chars).sum();
    assert_eq!(left, total - clearing.saved());
    assert!(left <= total - 6_000);
    assert_eq!(after[2].content, c.placeholder);
    assert_eq!(after[2].tool_call_id.as_deref(), Some("c0"), "still paired");
    // Nothing to do at or below the target.
    assert!(plan(&messages, &already, &rules(), total).is_empty());
}

#[test]
fn the_newest_results_short_ones_excluded_tools_and_cleared_ones_stay() {
    let mut messages = session(5);
    let already: Vec<bool> = (0..messages.len()).map(|i| i == 5).collect();
    messages[8] = result(9, "c2", 999);
    messages[10] = call(11, "c3", "read_runbook");
    let clearing = plan(&messages, &already, &rules(), 0);
    // 2 is cleared; 5 was already; 8 is too short; 11 answers an excluded tool; 14 is
    // the newest. With nothing kept and no minimum, only the cleared one stays.
    assert_eq!(indices(&clearing), [2]);
    let none_kept = Rules {
        keep: 0,
        min_chars: 0,
        exclude: Vec::new(),
    };
    assert_eq!(
        indices(&plan(&messages, &already, &none_kept, 0)),
        [2, 8, 11, 14]
    );
    let all_kept = Rules {
        keep: 10,
        ..none_kept
    };
    assert!(plan(&messages, &already, &all_kept, 0).is_empty());
}

#[test]
fn a_result_of_a_call_still_waiting_or_of_no_call_is_not_cleared() {
    let mut messages = vec![msg(1, Role::User, "Check both.")];
    // One message with two calls; only the first has its result yet.
    let mut both = msg(2, Role::Assistant, "");
    both.tool_calls = Some(json!([
        {"id": "a", "name": "get_logs", "arguments": {}},
        {"id": "b", "name": "get_logs", "arguments": {}}
    ]));
    both.chars = 100;
    messages.push(both);
    messages.push(result(3, "a", 5_000));
    messages.push(result(4, "nobody", 5_000));
    messages.push(msg(5, Role::User, "And then?"));
    messages.push(call(6, "z", "get_logs"));
    messages.push(result(7, "z", 5_000));
    let already = vec![false; messages.len()];
    let rules = Rules { keep: 0, ..rules() };
    assert_eq!(indices(&plan(&messages, &already, &rules, 0)), [6]);
}

#[test]
fn a_reused_call_id_pairs_with_the_nearest_earlier_call() {
    // Some model servers number calls per turn: `call_0` twice, of two tools.
    let mut messages = vec![msg(1, Role::User, "Go.")];
    messages.push(call(2, "call_0", "read_runbook"));
    messages.push(result(3, "call_0", 5_000));
    messages.push(call(4, "call_0", "get_logs"));
    messages.push(result(5, "call_0", 5_000));
    messages.push(call(6, "call_1", "get_logs"));
    messages.push(result(7, "call_1", 5_000));
    let already = vec![false; messages.len()];
    // The first is the runbook's (excluded), the second get_logs'.
    assert_eq!(indices(&plan(&messages, &already, &rules(), 0)), [4]);
    assert!(
        plan(&messages, &already, &rules(), 0).cleared[0]
            .placeholder
            .contains("of get_logs output")
    );
}

#[test]
fn a_result_no_placeholder_could_shorten_is_left_alone() {
    let mut messages = session(3);
    messages[2] = result(3, "c0", 60);
    let already = vec![false; messages.len()];
    let rules = Rules {
        keep: 0,
        min_chars: 0,
        exclude: Vec::new(),
    };
    assert_eq!(indices(&plan(&messages, &already, &rules, 0)), [5, 8]);
}

#[test]
fn ten_thousand_results_and_one_of_twenty_megabytes_are_planned_in_one_pass() {
    let mut messages = session(10_000);
    messages[2] = result(3, "c0", 20_000_000);
    let already = vec![false; messages.len()];
    let clearing = plan(&messages, &already, &rules(), 10_000);
    // The session comes down to its target: every result but the newest goes.
    assert_eq!(clearing.cleared.len(), 9_999);
    assert_eq!(
        clearing.cleared[0].saved,
        20_000_000 - char_count(&clearing.cleared[0].placeholder)
    );
}
