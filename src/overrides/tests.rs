//! Precedence, clamping and the edits of a session's settings.

use proptest::prelude::*;

use super::*;

const CONFIGURED: Limits = Limits {
    threshold_chars: 60_000,
    keep_chars: 20_000,
};

fn bounds() -> Bounds {
    Bounds::default()
}

fn request(threshold_chars: Option<i64>, keep_chars: Option<i64>) -> Overrides {
    Overrides {
        threshold_chars,
        keep_chars,
        ..Overrides::default()
    }
}

fn session(threshold_chars: Option<i64>, keep_chars: Option<i64>) -> SessionSettings {
    SessionSettings {
        threshold_chars,
        keep_chars,
        ..SessionSettings::default()
    }
}

fn limits_of(threshold_chars: i64, keep_chars: i64) -> Limits {
    Limits {
        threshold_chars,
        keep_chars,
    }
}

#[test]
fn with_nothing_given_the_configured_limits_apply() {
    let got = limits(
        CONFIGURED,
        bounds(),
        &SessionSettings::default(),
        Overrides::default(),
    );
    assert_eq!(got, CONFIGURED);
}

#[test]
fn the_request_wins_over_the_session_which_wins_over_the_configuration() {
    let tuned = session(Some(30_000), Some(9_000));
    assert_eq!(
        limits(CONFIGURED, bounds(), &tuned, Overrides::default()),
        limits_of(30_000, 9_000)
    );
    assert_eq!(
        limits(CONFIGURED, bounds(), &tuned, request(Some(40_000), None)),
        limits_of(40_000, 9_000),
        "value by value: the session's keep stays"
    );
    assert_eq!(
        limits(
            CONFIGURED,
            bounds(),
            &session(None, Some(5_000)),
            request(Some(8_000), Some(2_000))
        ),
        limits_of(8_000, 2_000)
    );
}

#[test]
fn requested_and_session_values_are_clamped_to_the_bounds() {
    let none = SessionSettings::default();
    assert_eq!(
        limits(CONFIGURED, bounds(), &none, request(Some(10), Some(1))),
        limits_of(1_000, 500)
    );
    assert_eq!(
        limits(
            CONFIGURED,
            bounds(),
            &none,
            request(Some(i64::MAX), Some(i64::MAX))
        ),
        limits_of(10_000_000, 5_000_000)
    );
    assert_eq!(
        limits(
            CONFIGURED,
            bounds(),
            &session(Some(-5), Some(0)),
            Overrides::default()
        ),
        limits_of(1_000, 500)
    );
}

#[test]
fn the_configured_limits_are_not_clamped() {
    let small = limits_of(600, 200);
    assert_eq!(
        limits(
            small,
            bounds(),
            &SessionSettings::default(),
            Overrides::default()
        ),
        small
    );
}

#[test]
fn a_keep_not_below_the_threshold_becomes_a_third_of_it() {
    let none = SessionSettings::default();
    // A request's small threshold under the configured keep.
    assert_eq!(
        limits(CONFIGURED, bounds(), &none, request(Some(3_000), None)),
        limits_of(3_000, 1_000)
    );
    // A third would be under the minimum keep: the minimum, still below the threshold.
    assert_eq!(
        limits(
            CONFIGURED,
            bounds(),
            &none,
            request(Some(1_200), Some(5_000))
        ),
        limits_of(1_200, 500)
    );
}

proptest! {
    #[test]
    fn the_limits_always_keep_less_than_the_threshold(
        configured_keep in 1..100_000i64,
        extra in 1..100_000i64,
        min_keep in 1..5_000i64,
        keep_span in 0..100_000i64,
        threshold_gap in 1..5_000i64,
        threshold_span in 0..100_000i64,
        session_t in proptest::option::of(-10i64..1_000_000),
        session_k in proptest::option::of(-10i64..1_000_000),
        request_t in proptest::option::of(-10i64..1_000_000),
        request_k in proptest::option::of(-10i64..1_000_000),
    ) {
        let configured = limits_of(configured_keep + extra, configured_keep);
        let bounds = Bounds {
            min_threshold_chars: min_keep + threshold_gap,
            max_threshold_chars: min_keep + threshold_gap + threshold_span,
            min_keep_chars: min_keep,
            max_keep_chars: min_keep + keep_span,
        };
        let got = limits(configured, bounds, &session(session_t, session_k), request(request_t, request_k));
        prop_assert!(got.keep_chars >= 1 && got.keep_chars < got.threshold_chars, "{got:?}");
        // An overridden threshold lies within its bounds; an inherited one is the configured.
        match request_t.or(session_t) {
            Some(_) => prop_assert!(
                (bounds.min_threshold_chars..=bounds.max_threshold_chars).contains(&got.threshold_chars)
            ),
            None => prop_assert_eq!(got.threshold_chars, configured.threshold_chars),
        }
        // An overridden keep lies within its bounds, except that it gives way to the
        // threshold (down to a third of it, never under the minimum while that fits).
        if request_k.or(session_k).is_some() {
            if bounds.min_keep_chars < got.threshold_chars {
                prop_assert!(got.keep_chars >= bounds.min_keep_chars, "{got:?}");
            }
            prop_assert!(got.keep_chars <= bounds.max_keep_chars.max(got.threshold_chars / 3));
        }
    }
}

fn change(text: &str) -> Change {
    Change::set(text).unwrap()
}

#[test]
fn edits_apply_in_order_and_unset_inherits() {
    let start = SessionSettings {
        model: Some("gpt-a".into()),
        ..SessionSettings::default()
    };
    let next = start
        .changed(
            &[
                change("threshold_chars=9000"),
                change("keep_chars= 3000 "),
                change("enabled=false"),
                Change::unset("model").unwrap(),
                change("model=gpt-b"),
                change("tool_output_clearing=ON"),
                change("tool_output_keep=0"),
            ],
            CONFIGURED,
        )
        .unwrap();
    assert_eq!(
        next,
        SessionSettings {
            threshold_tokens: None,
            enabled: Some(false),
            threshold_chars: Some(9000),
            keep_chars: Some(3000),
            model: Some("gpt-b".into()),
            tool_output_clearing: Some(true),
            tool_output_keep: Some(0),
        }
    );
    assert!(next.disabled());
    let back = next
        .changed(&[Change::unset("enabled").unwrap()], CONFIGURED)
        .unwrap();
    assert_eq!(back.enabled, None);
}

/// As on the wire: a size too large for an `i64` is the largest one, clamped to the
/// bounds when used, not refused as "not a positive integer" though it is one.
#[test]
fn a_session_size_past_two_to_the_64_is_clamped_not_rejected() {
    let huge = "1".repeat(400);
    for value in ["18446744073709551616", huge.as_str()] {
        let set = SessionSettings::default()
            .changed(&[change(&format!("threshold_chars={value}"))], CONFIGURED)
            .unwrap();
        assert_eq!(set.threshold_chars, Some(i64::MAX), "{value}");
        let got = limits(CONFIGURED, bounds(), &set, Overrides::default());
        assert_eq!(got.threshold_chars, bounds().max_threshold_chars);
    }
    for bad in [
        "-18446744073709551616",
        "1e30",
        "000",
        "18446744073709551616.0",
    ] {
        assert!(
            SessionSettings::default()
                .changed(&[change(&format!("threshold_chars={bad}"))], CONFIGURED)
                .is_err(),
            "{bad}"
        );
    }
}

#[test]
fn bad_edits_say_what_is_wrong() {
    let err = |changes: &[Change]| {
        SessionSettings::default()
            .changed(changes, CONFIGURED)
            .unwrap_err()
            .0
    };
    assert!(Change::set("colour=blue").unwrap_err().0.contains(
        "unknown setting \"colour\"; known: enabled, threshold_chars, keep_chars, model, tool_output_clearing, tool_output_keep, threshold_tokens"
    ));
    assert!(
        Change::set("keep_chars")
            .unwrap_err()
            .0
            .contains("key=value")
    );
    assert!(Change::unset("nope").is_err());
    assert!(
        err(&[change("threshold_chars=0")]).contains("threshold_chars must be a positive integer")
    );
    assert!(err(&[change("keep_chars=1.5")]).contains("keep_chars must be a positive integer"));
    assert!(err(&[change("enabled=yes")]).contains("enabled must be true or false"));
    assert!(err(&[change("model=")]).contains("model must not be empty"));
    assert!(
        err(&[change("tool_output_clearing=1")]).contains("tool_output_clearing must be on or off")
    );
    for bad in ["-1", "x", "2.5"] {
        assert!(
            err(&[change(&format!("tool_output_keep={bad}"))])
                .contains("tool_output_keep must be an integer, 0 or more"),
            "{bad}"
        );
    }
    assert_eq!(
        err(&[change("threshold_chars=2000"), change("keep_chars=2000")]),
        "keep_chars (2000) must be smaller than threshold_chars (2000)"
    );
    assert_eq!(
        err(&[change("keep_chars=60000")]),
        "keep_chars (60000) must be smaller than the configured SUMMARIZATION_THRESHOLD_CHARS (60000)"
    );
}

#[test]
fn clearing_is_the_requests_then_the_sessions_then_the_configured_choice() {
    let off = ToolOutputs::default();
    let on = ToolOutputs {
        clearing: true,
        ..ToolOutputs::default()
    };
    let plain = SessionSettings::default();
    let ask = |clear: Option<bool>| Overrides {
        tool_output_clearing: clear,
        ..Overrides::default()
    };
    assert_eq!(clearing(&off, &plain, ask(None)), None);
    assert_eq!(clearing(&on, &plain, ask(None)), Some(3));
    let session_on = SessionSettings {
        tool_output_clearing: Some(true),
        tool_output_keep: Some(7),
        ..SessionSettings::default()
    };
    assert_eq!(clearing(&off, &session_on, ask(None)), Some(7));
    assert_eq!(clearing(&off, &session_on, ask(Some(false))), None);
    let session_off = SessionSettings {
        tool_output_clearing: Some(false),
        ..SessionSettings::default()
    };
    assert_eq!(clearing(&on, &session_off, ask(None)), None);
    assert_eq!(clearing(&on, &session_off, ask(Some(true))), Some(3));
}

#[test]
fn the_token_threshold_is_the_requests_then_the_sessions_then_the_configured_one() {
    let bounds = bounds();
    let none = SessionSettings::default();
    let own = SessionSettings {
        threshold_tokens: Some(50_000),
        ..SessionSettings::default()
    };
    let asks = |tokens| Overrides {
        threshold_tokens: Some(tokens),
        ..Overrides::default()
    };
    assert_eq!(
        threshold_tokens(0, bounds, &none, Overrides::default()),
        None
    );
    assert_eq!(
        threshold_tokens(80_000, bounds, &none, Overrides::default()),
        Some(80_000)
    );
    assert_eq!(
        threshold_tokens(80_000, bounds, &own, Overrides::default()),
        Some(50_000)
    );
    assert_eq!(
        threshold_tokens(0, bounds, &own, asks(20_000)),
        Some(20_000)
    );
    // Raised to the chars bound at the default ratio, as threshold_chars is clamped.
    let floor = (bounds.min_threshold_chars as f64 / DEFAULT_CHARS_PER_TOKEN).ceil() as i64;
    assert_eq!(threshold_tokens(0, bounds, &none, asks(1)), Some(floor));
}

#[test]
fn a_sessions_tokens_are_reported_or_estimated_from_its_own_ratio() {
    assert_eq!(session_tokens(40_000, None, None), 10_000);
    assert_eq!(session_tokens(40_000, Some(2.5), None), 16_000);
    assert_eq!(session_tokens(40_000, Some(2.5), Some(7)), 7);
    // A ratio that is not a positive number is not used.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(session_tokens(40_000, Some(bad), None), 10_000, "{bad}");
    }
    assert_eq!(
        session_tokens(i64::MAX, Some(f64::MIN_POSITIVE), None),
        i64::MAX
    );
}

#[test]
fn over_its_token_threshold_a_sessions_chars_threshold_is_where_it_met_it() {
    let limits = limits_of(60_000, 20_000);
    // 40,000 chars in 20,000 tokens, over 10,000: 20,000 chars was the threshold.
    assert_eq!(
        with_token_threshold(limits, 40_000, 20_000, Some(10_000)).threshold_chars,
        20_000
    );
    // At or under it, or with no token threshold: the limits as they were.
    assert_eq!(
        with_token_threshold(limits, 40_000, 10_000, Some(10_000)),
        limits
    );
    assert_eq!(with_token_threshold(limits, 40_000, 90_000, None), limits);
    // Never above the chars threshold, whatever the ratio.
    assert_eq!(
        with_token_threshold(limits, i64::MAX, 2, Some(1)).threshold_chars,
        60_000
    );
}
