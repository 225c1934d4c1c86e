//! Per-session and per-request settings: the limits one event runs with, and an
//! operator's edits of a session's settings (`summarizer session <id> --set`).
//!
//! Precedence, value by value: the request's (`threshold_chars`, `keep_chars`,
//! `tool_output_clearing`), then the session's (`session_settings`), then the configured
//! ones. A value a request or a
//! session gives is clamped to the configured [`Bounds`]; the configured limits are the
//! operator's and are taken as they are. Plain functions over plain data, so every rule
//! is tested without a database.

use serde::Serialize;

use crate::config::{Bounds, Limits, ToolOutputs};

pub use summarizer_client::protocol::Overrides;

/// A session's row of `session_settings`; `None` inherits the configured value. With no
/// row, every field is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SessionSettings {
    /// `Some(false)`: the session is answered `skipped/disabled`. `Some(true)` cannot
    /// enable a session when `SUMMARIZATION_ENABLED=false`.
    pub enabled: Option<bool>,
    pub threshold_chars: Option<i64>,
    pub keep_chars: Option<i64>,
    /// The model to summarize this session with.
    pub model: Option<String>,
    /// Whether its compactions clear old tool output first (`TOOL_OUTPUT_CLEARING`) ...
    pub tool_output_clearing: Option<bool>,
    /// ... and how many of the newest tool results they never clear (`TOOL_OUTPUT_KEEP`).
    pub tool_output_keep: Option<i64>,
    /// Compact when its tokens are over this many (`SUMMARIZATION_THRESHOLD_TOKENS`).
    pub threshold_tokens: Option<i64>,
}

impl SessionSettings {
    pub fn disabled(&self) -> bool {
        self.enabled == Some(false)
    }

    /// The settings after `changes`, in order, checked as a whole.
    ///
    /// # Errors
    /// [`InvalidSetting`] naming the key and what is wrong: a value of the wrong kind, or
    /// a keep not smaller than the threshold the session would have (its own, else
    /// `configured`'s).
    pub fn changed(
        &self,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, InvalidSetting> {
        let mut next = self.clone();
        for change in changes {
            match change {
                Change::Set(key, value) => next.set(*key, value)?,
                Change::Unset(Key::Enabled) => next.enabled = None,
                Change::Unset(Key::ThresholdChars) => next.threshold_chars = None,
                Change::Unset(Key::KeepChars) => next.keep_chars = None,
                Change::Unset(Key::Model) => next.model = None,
                Change::Unset(Key::ToolOutputClearing) => next.tool_output_clearing = None,
                Change::Unset(Key::ToolOutputKeep) => next.tool_output_keep = None,
                Change::Unset(Key::ThresholdTokens) => next.threshold_tokens = None,
            }
        }
        next.check_keep(configured)?;
        Ok(next)
    }

    fn set(&mut self, key: Key, value: &str) -> Result<(), InvalidSetting> {
        let value = value.trim();
        match key {
            Key::Enabled => {
                self.enabled = Some(value.parse().map_err(|_| {
                    InvalidSetting(format!("enabled must be true or false, got {value:?}"))
                })?);
            }
            Key::ThresholdChars => self.threshold_chars = Some(positive(key, value)?),
            Key::KeepChars => self.keep_chars = Some(positive(key, value)?),
            Key::Model if value.is_empty() => {
                return Err(InvalidSetting(
                    "model must not be empty (--unset model inherits LLM_MODEL)".to_owned(),
                ));
            }
            Key::Model => self.model = Some(value.to_owned()),
            Key::ToolOutputClearing => {
                self.tool_output_clearing = Some(match value.to_ascii_lowercase().as_str() {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    _ => {
                        return Err(InvalidSetting(format!(
                            "tool_output_clearing must be on or off, got {value:?}"
                        )));
                    }
                });
            }
            Key::ThresholdTokens => match value.parse::<i64>() {
                Ok(n) if (1..=crate::protocol::MAX_TOKENS).contains(&n) => {
                    self.threshold_tokens = Some(n);
                }
                _ => {
                    return Err(InvalidSetting(format!(
                        "threshold_tokens must be an integer from 1 to {}, got {value:?}",
                        crate::protocol::MAX_TOKENS
                    )));
                }
            },
            Key::ToolOutputKeep => match value.parse::<i64>() {
                Ok(n) if n >= 0 => self.tool_output_keep = Some(n),
                _ => {
                    return Err(InvalidSetting(format!(
                        "tool_output_keep must be an integer, 0 or more, got {value:?}"
                    )));
                }
            },
        }
        Ok(())
    }

    fn check_keep(&self, configured: Limits) -> Result<(), InvalidSetting> {
        let Some(keep) = self.keep_chars else {
            return Ok(());
        };
        let (threshold, named) = match self.threshold_chars {
            Some(threshold) => (threshold, "threshold_chars"),
            None => (
                configured.threshold_chars,
                "the configured SUMMARIZATION_THRESHOLD_CHARS",
            ),
        };
        if keep >= threshold {
            return Err(InvalidSetting(format!(
                "keep_chars ({keep}) must be smaller than {named} ({threshold})"
            )));
        }
        Ok(())
    }
}

/// A size in chars: a positive integer. One too large for an `i64` is `i64::MAX`, as on
/// the wire (docs/settings.md): the worker clamps it to its bound when it is used.
fn positive(key: Key, value: &str) -> Result<i64, InvalidSetting> {
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        Err(_) if digits && value.bytes().any(|b| b != b'0') => Ok(i64::MAX),
        _ => Err(InvalidSetting(format!(
            "{} must be a positive integer, got {value:?}",
            key.name()
        ))),
    }
}

/// A setting of `session_settings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Enabled,
    ThresholdChars,
    KeepChars,
    Model,
    ToolOutputClearing,
    ToolOutputKeep,
    ThresholdTokens,
}

impl Key {
    const ALL: [Key; 7] = [
        Key::Enabled,
        Key::ThresholdChars,
        Key::KeepChars,
        Key::Model,
        Key::ToolOutputClearing,
        Key::ToolOutputKeep,
        Key::ThresholdTokens,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Key::Enabled => "enabled",
            Key::ThresholdChars => "threshold_chars",
            Key::KeepChars => "keep_chars",
            Key::Model => "model",
            Key::ToolOutputClearing => "tool_output_clearing",
            Key::ToolOutputKeep => "tool_output_keep",
            Key::ThresholdTokens => "threshold_tokens",
        }
    }

    /// # Errors
    /// [`InvalidSetting`] listing the known keys.
    pub fn parse(name: &str) -> Result<Key, InvalidSetting> {
        let name = name.trim();
        Key::ALL
            .into_iter()
            .find(|key| key.name() == name)
            .ok_or_else(|| {
                let known: Vec<_> = Key::ALL.iter().map(|k| k.name()).collect();
                InvalidSetting(format!(
                    "unknown setting {name:?}; known: {}",
                    known.join(", ")
                ))
            })
    }
}

/// One edit of a session's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The value as written; checked by [`SessionSettings::changed`].
    Set(Key, String),
    /// Back to inheriting the configured value.
    Unset(Key),
}

impl Change {
    /// `key=value`, as `--set` takes it.
    ///
    /// # Errors
    /// [`InvalidSetting`] when there is no `=` or the key is unknown.
    pub fn set(text: &str) -> Result<Change, InvalidSetting> {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| InvalidSetting(format!("--set takes key=value, got {text:?}")))?;
        Ok(Change::Set(Key::parse(key)?, value.to_owned()))
    }

    /// # Errors
    /// [`InvalidSetting`] when the key is unknown.
    pub fn unset(key: &str) -> Result<Change, InvalidSetting> {
        Key::parse(key).map(Change::Unset)
    }
}

/// Why an edit of a session's settings was refused; nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(pub String);

/// The limits one event runs with, for a session of `total_chars` chars whose last
/// compaction measured `chars_per_token`: [`limits`], then its token threshold
/// ([`threshold_tokens`], configured as `threshold_tokens`) applied to the session's
/// tokens ([`session_tokens`]) by [`with_token_threshold`].
pub fn for_event(
    (configured, threshold_tokens): (Limits, i64),
    bounds: Bounds,
    session: &SessionSettings,
    request: Overrides,
    (total_chars, chars_per_token): (i64, Option<f64>),
) -> Limits {
    with_token_threshold(
        limits(configured, bounds, session, request),
        total_chars,
        session_tokens(total_chars, chars_per_token, request.context_tokens),
        self::threshold_tokens(threshold_tokens, bounds, session, request),
    )
}

/// The limits one event runs with: value by value, the request's, else the session's
/// (each clamped to `bounds`), else the configured one.
///
/// The result has keep < threshold, which the planner relies on for a compaction the
/// threshold triggers. When the values picked break that (say, a request's threshold
/// below the configured keep), keep becomes a third of the threshold (the seed's
/// defaults' ratio), but no less than `SUMMARIZATION_MIN_KEEP_CHARS` where that is still
/// below the threshold. A forced request's keep is its own, whatever the threshold,
/// which a forced compaction ignores: a keep it asked for is never quietly lowered.
pub fn limits(
    configured: Limits,
    bounds: Bounds,
    session: &SessionSettings,
    request: Overrides,
) -> Limits {
    let threshold = request
        .threshold_chars
        .or(session.threshold_chars)
        .map_or(configured.threshold_chars, |t| {
            t.clamp(bounds.min_threshold_chars, bounds.max_threshold_chars)
        });
    let mut keep = request
        .keep_chars
        .or(session.keep_chars)
        .map_or(configured.keep_chars, |k| {
            k.clamp(bounds.min_keep_chars, bounds.max_keep_chars)
        });
    if keep >= threshold && !request.force {
        keep = (threshold / 3).max(bounds.min_keep_chars.min(threshold - 1));
    }
    Limits {
        threshold_chars: threshold,
        keep_chars: keep,
    }
}

/// How many of the newest tool results a compaction of this event keeps when it clears
/// old tool output first; `None` when it does not clear. Whether it clears is the
/// request's `tool_output_clearing`, else the session's, else `TOOL_OUTPUT_CLEARING`;
/// the keep is the session's `tool_output_keep`, else `TOOL_OUTPUT_KEEP`.
pub fn clearing(
    configured: &ToolOutputs,
    session: &SessionSettings,
    request: Overrides,
) -> Option<usize> {
    let on = (request.tool_output_clearing)
        .or(session.tool_output_clearing)
        .unwrap_or(configured.clearing);
    on.then(|| {
        (session.tool_output_keep)
            .and_then(|keep| usize::try_from(keep).ok())
            .unwrap_or(configured.keep)
    })
}

/// The chars per token a session's tokens are estimated with before its first
/// compaction measured its own: about what `o200k_base` gives English prose. Tool output
/// (JSON, logs, code) has fewer chars per token, so a first estimate is low for it: an
/// agent that wants its trigger exact sends `context_tokens`.
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;

/// The token threshold an event runs with: the request's `threshold_tokens`, else the
/// session's, else `SUMMARIZATION_THRESHOLD_TOKENS` (`configured`; 0 is off). A request's
/// or session's is raised to at least `SUMMARIZATION_MIN_THRESHOLD_CHARS` over
/// [`DEFAULT_CHARS_PER_TOKEN`], as its `threshold_chars` would be raised to that bound.
/// `None`: no token threshold.
pub fn threshold_tokens(
    configured: i64,
    bounds: Bounds,
    session: &SessionSettings,
    request: Overrides,
) -> Option<i64> {
    let min = ((bounds.min_threshold_chars as f64 / DEFAULT_CHARS_PER_TOKEN).ceil() as i64).max(1);
    match request.threshold_tokens.or(session.threshold_tokens) {
        Some(tokens) => Some(tokens.max(min)),
        None => (configured > 0).then_some(configured),
    }
}

/// A session's tokens: the `context_tokens` its agent reported (`reported`), else its
/// `total_chars` over the chars per token measured at its last compaction
/// (`chars_per_token`), else over [`DEFAULT_CHARS_PER_TOKEN`]. O(1): no history is read.
pub fn session_tokens(
    total_chars: i64,
    chars_per_token: Option<f64>,
    reported: Option<i64>,
) -> i64 {
    reported.unwrap_or_else(|| {
        let ratio = chars_per_token
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(DEFAULT_CHARS_PER_TOKEN);
        // A float to int cast saturates.
        (total_chars as f64 / ratio).ceil() as i64
    })
}

/// `limits` for a session of `total_chars` chars and `tokens` tokens, with the token
/// threshold `threshold_tokens`: as they are when it is off or not passed; when the
/// session is over it, the threshold in chars becomes the chars at which it would have
/// met it at its own chars per token, so that the planner (and a clearing's "has it made
/// room enough") weigh the session as the trigger did.
pub fn with_token_threshold(
    limits: Limits,
    total_chars: i64,
    tokens: i64,
    threshold_tokens: Option<i64>,
) -> Limits {
    match threshold_tokens {
        Some(threshold) if tokens > threshold => {
            let at = i128::from(total_chars) * i128::from(threshold) / i128::from(tokens);
            Limits {
                threshold_chars: limits
                    .threshold_chars
                    .min(i64::try_from(at).unwrap_or(i64::MAX)),
                ..limits
            }
        }
        _ => limits,
    }
}

#[cfg(test)]
mod tests;
