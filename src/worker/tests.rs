//! [`decide`]'s rules, without a store: each test is a session's counters and a request.

use super::*;
use crate::overrides::SessionSettings;
use crate::protocol::InstructionsFrom;

/// The seed's limits (60,000 / 20,000), precompute at half the threshold.
fn policy() -> Policy {
    Policy {
        enabled: true,
        limits: Limits {
            threshold_chars: 60_000,
            keep_chars: 20_000,
        },
        threshold_tokens: 0,
        bounds: Bounds::default(),
        lease_duration: Duration::from_secs(60),
        failure_backoff: Duration::from_secs(30),
        failure_backoff_max: Duration::from_secs(600),
        summary_max_chars: 6_000,
        user_words_chars: crate::summary::words::DEFAULT_CHARS,
        fact_check: FactCheck::default(),
        llm_deadline: Duration::from_secs(60),
        concurrency: 8,
        precompute: Precompute {
            at: 0.5,
            ..Precompute::default()
        },
        idle: Idle::default(),
        redact_secrets: true,
    }
}

fn counters(total_chars: i64, human_turns: i64) -> Counters {
    Counters {
        total_chars,
        message_count: 40,
        human_turns,
        backing_off: false,
        remembered_skip: None,
        last_compaction_id: None,
        skip_at_keep: None,
        chars_per_token: None,
        largest_output_chars: 0,
        settings: SessionSettings::default(),
    }
}

fn event(overrides: Overrides) -> Event {
    Event::new("s".to_owned(), None).with_overrides(overrides)
}

fn decided(counters: &Counters, event: &Event) -> Decision {
    decide(&policy(), &ToolOutputs::default(), counters, event)
}

fn forced() -> Overrides {
    Overrides {
        force: true,
        ..Overrides::default()
    }
}

#[test]
fn over_the_threshold_it_compacts_from_a_pending_summary_first() {
    let decision = decided(&counters(70_000, 5), &event(Overrides::default()));
    let Action::Compact { job, pending_first } = decision.action else {
        panic!("{decision:?}");
    };
    assert!(pending_first);
    assert_eq!(job.limits, policy().limits);
    assert_eq!(decision.precompute, None);
}

#[test]
fn below_it_skips_and_in_the_band_prepares_a_summary() {
    let far = decided(&counters(10_000, 5), &event(Overrides::default()));
    assert_eq!(far.action, Action::Skip(Reason::BelowThreshold));
    assert_eq!(far.precompute, None);
    let near = decided(&counters(40_000, 5), &event(Overrides::default()));
    assert_eq!(near.action, Action::Skip(Reason::BelowThreshold));
    assert!(near.precompute.is_some());
}

#[test]
fn the_other_rules_hold_over_the_threshold_and_keep_the_band_from_precomputing() {
    let mut backing_off = counters(70_000, 5);
    backing_off.backing_off = true;
    let mut remembered = counters(70_000, 5);
    remembered.remembered_skip = Some(Reason::NoSafeBoundary);
    remembered.skip_at_keep = Some(20_000);
    for (counters, reason) in [
        (counters(70_000, 1), Reason::TooFewTurns),
        (backing_off, Reason::BackingOff),
        (remembered, Reason::NoSafeBoundary),
    ] {
        let over = decided(&counters, &event(Overrides::default()));
        assert_eq!(over.action, Action::Skip(reason));
        let in_band = Counters {
            total_chars: 40_000,
            ..counters
        };
        let band = decided(&in_band, &event(Overrides::default()));
        assert_eq!(band.action, Action::Skip(Reason::BelowThreshold));
        assert_eq!(band.precompute, None, "{reason:?}");
    }
}

#[test]
fn a_remembered_skip_holds_only_for_the_keep_it_was_planned_with() {
    let mut remembered = counters(70_000, 5);
    remembered.remembered_skip = Some(Reason::NoSafeBoundary);
    remembered.skip_at_keep = Some(20_000);
    let other_keep = Overrides {
        keep_chars: Some(5_000),
        ..Overrides::default()
    };
    assert!(matches!(
        decided(&remembered, &event(other_keep)).action,
        Action::Compact { .. }
    ));
}

#[test]
fn a_forced_request_compacts_below_the_threshold_without_a_pending_summary() {
    let decision = decided(&counters(10_000, 3), &event(forced()));
    let Action::Compact { job, pending_first } = decision.action else {
        panic!("{decision:?}");
    };
    assert!(
        !pending_first,
        "a pending summary was planned for another threshold"
    );
    assert_eq!(job.limits.threshold_chars, 0);
    assert!(job.forced);
    // Forced, the other rules still hold.
    assert_eq!(
        decided(&counters(10_000, 1), &event(forced())).action,
        Action::Skip(Reason::TooFewTurns)
    );
}

#[test]
fn instructions_and_clearing_never_apply_a_pending_summary() {
    let mut instructed = event(Overrides::default());
    instructed.instructions = Some(Instructions {
        text: "keep the ticket".to_owned(),
        from: InstructionsFrom::Operator,
    });
    let Action::Compact { pending_first, .. } = decided(&counters(70_000, 5), &instructed).action
    else {
        panic!("compacts");
    };
    assert!(!pending_first);
    let clearing = ToolOutputs {
        clearing: true,
        ..ToolOutputs::default()
    };
    // One human turn is enough when the compaction clears first; no precompute then.
    let one_turn = decide(
        &policy(),
        &clearing,
        &counters(70_000, 1),
        &event(Overrides::default()),
    );
    let Action::Compact { job, pending_first } = one_turn.action else {
        panic!("{one_turn:?}");
    };
    assert!(!pending_first);
    assert_eq!(job.clearing, Some(ToolOutputs::default().keep));
    let band = decide(
        &policy(),
        &clearing,
        &counters(40_000, 5),
        &event(Overrides::default()),
    );
    assert_eq!(band.precompute, None);
}

#[test]
fn a_disabled_session_is_skipped_before_any_other_rule() {
    let mut disabled = counters(70_000, 5);
    disabled.settings.enabled = Some(false);
    assert_eq!(
        decided(&disabled, &event(forced())).action,
        Action::Skip(Reason::Disabled)
    );
}

#[test]
fn the_token_threshold_triggers_through_the_reported_tokens() {
    let reported = Overrides {
        threshold_tokens: Some(10_000),
        context_tokens: Some(12_000),
        ..Overrides::default()
    };
    let Action::Compact { job, .. } = decided(&counters(30_000, 5), &event(reported)).action else {
        panic!("over its token threshold");
    };
    // The chars at which the session met its token threshold, at its own ratio.
    assert_eq!(job.limits.threshold_chars, 25_000);
}

/// An idle pass's event compacts over the idle threshold (half the session's, by
/// default), never below the keep, and neither applies nor prepares a pending summary.
#[test]
fn an_idle_event_compacts_over_the_idle_threshold_without_pending_summaries() {
    let idle = Event {
        idle: true,
        ..event(Overrides::default())
    };
    let policy = Policy {
        idle: Idle {
            after: Duration::from_secs(300),
            threshold_chars: 0,
        },
        ..policy()
    };
    let decide_idle = |counters: &Counters, policy: &Policy| {
        decide(policy, &ToolOutputs::default(), counters, &idle)
    };

    let small = decide_idle(&counters(30_000, 5), &policy);
    assert_eq!(small.action, Action::Skip(Reason::BelowThreshold));
    assert_eq!(small.precompute, None, "in the precompute band, but idle");
    let Action::Compact { job, pending_first } = decide_idle(&counters(31_000, 5), &policy).action
    else {
        panic!("over half the threshold: compacted");
    };
    assert_eq!(job.limits.threshold_chars, 30_000);
    assert_eq!(job.limits.keep_chars, 20_000);
    assert!(!pending_first);

    // A configured idle threshold below the keep is the keep.
    let low = Policy {
        idle: Idle {
            threshold_chars: 5_000,
            ..policy.idle
        },
        ..policy
    };
    let at_keep = decide_idle(&counters(20_000, 5), &low);
    assert_eq!(at_keep.action, Action::Skip(Reason::BelowThreshold));
    // The other rules hold.
    let one_turn = decide_idle(&counters(50_000, 1), &policy);
    assert_eq!(one_turn.action, Action::Skip(Reason::TooFewTurns));
}
