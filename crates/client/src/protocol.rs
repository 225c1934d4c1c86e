//! The wire contract (docs/protocol.md): the turn-starting request and its reply, as
//! JSON. Agents in any language depend on these shapes; fields are only ever added.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::outcome::{Outcome, Reason, Status};

/// A request larger than this is rejected before it is parsed.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Session ids longer than this (in UTF-8 bytes) are rejected; the schema has the same limit.
pub const MAX_SESSION_ID_BYTES: usize = 256;
/// A longer `request_id` is rejected: it is echoed into every log line of the event.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// A valid turn-starting request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// This request's limits, if it asks for its own.
    #[serde(flatten)]
    pub overrides: Overrides,
    /// The operator's or the agent's focus for this compaction's summary: at most
    /// [`MAX_INSTRUCTIONS_CHARS`] chars, no control characters but newlines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Who wrote `instructions`: the agent's own model (the default, since it is the
    /// lesser authority), or the operator.
    #[serde(default, skip_serializing_if = "InstructionsFrom::is_agent")]
    pub instructions_from: InstructionsFrom,
}

/// Who wrote a request's `instructions` (docs/protocol.md, "Forced compactions"). The
/// summarizer's prompt presents an operator's as the operator's focus, and an agent's as
/// the agent's request about focus: its model may have been steered by text in a tool
/// output, so it never has the authority to drop facts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstructionsFrom {
    /// The agent's own model: `compact_tool`, or a request that does not say.
    #[default]
    Agent,
    /// A person running the deployment: the CLI's `summarizer compact`, `client.compact`.
    Operator,
}

impl InstructionsFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Operator => "operator",
        }
    }

    fn is_agent(&self) -> bool {
        *self == Self::Agent
    }
}

/// A request's `instructions` with who wrote them: what the summarizer is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instructions {
    pub text: String,
    pub from: InstructionsFrom,
}

/// A longer `instructions` is rejected.
pub const MAX_INSTRUCTIONS_CHARS: usize = 4_000;

/// `threshold_tokens` and `context_tokens` above this are rejected: no model's context
/// comes near it, so a larger number is a mistake, not a setting.
pub const MAX_TOKENS: i64 = 1_000_000_000;

/// Limits one request asks for instead of the session's or the configured ones. The
/// worker clamps each to its configured bounds (`SUMMARIZATION_MIN_*`/`MAX_*`), so an
/// agent can tune, never disable or overload, compaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// Compact when the session holds more than this many chars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_chars: Option<i64>,
    /// Keep at least this many of the newest chars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_chars: Option<i64>,
    /// Clear old tool output before summarizing (`TOOL_OUTPUT_CLEARING`), or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_output_clearing: Option<bool>,
    /// Compact now, even below the threshold (the other skip rules hold).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// This compaction answers a model call the provider refused as too long (a context
    /// overflow): recorded as `overflow` in its usage event and counted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overflow: bool,
    /// Compact when the session's tokens are over this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_tokens: Option<i64>,
    /// The prompt tokens the agent's model reported on its last call: the session's
    /// tokens for `threshold_tokens`, instead of the worker's estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<i64>,
}

/// Why a request was rejected; the text goes back to the sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidRequest {}

impl Request {
    /// Parses and validates a request payload. Unknown fields are ignored.
    ///
    /// # Errors
    /// [`InvalidRequest`] saying what is wrong: too large, not a JSON object, a missing
    /// or non-string `session_id`, an empty, oversized or control-character id, a
    /// `threshold_chars` or `keep_chars` that is not a positive integer, a
    /// `tool_output_clearing`, `force` or `overflow` that is not a boolean, a `threshold_tokens` that
    /// is not a positive integer up to [`MAX_TOKENS`], a `context_tokens` that is not an
    /// integer from 0 to it, an `instructions` that is not a string, is longer than
    /// [`MAX_INSTRUCTIONS_CHARS`] or holds a control character other than a newline, an
    /// `instructions_from` other than `"agent"` or `"operator"`.
    pub fn decode(payload: &[u8]) -> Result<Self, InvalidRequest> {
        let invalid = |msg: String| Err(InvalidRequest(msg));
        if payload.len() > MAX_REQUEST_BYTES {
            return invalid(format!(
                "request is {} bytes; the limit is {MAX_REQUEST_BYTES}",
                payload.len()
            ));
        }
        let fields = Fields::parse(payload)?;
        let session_id = match fields.get("session_id") {
            Some(Ok(Value::String(id))) => id,
            None | Some(Ok(Value::Null)) => return invalid("session_id is required".to_owned()),
            Some(_) => return invalid("session_id must be a string".to_owned()),
        };
        check_id("session_id", &session_id, MAX_SESSION_ID_BYTES)?;
        let request_id = match fields.get("request_id") {
            None | Some(Ok(Value::Null)) => None,
            Some(Ok(Value::String(id))) => {
                check_id("request_id", &id, MAX_REQUEST_ID_BYTES)?;
                Some(id)
            }
            Some(_) => return invalid("request_id must be a string".to_owned()),
        };
        let overrides = Overrides {
            threshold_chars: size(&fields, "threshold_chars")?,
            keep_chars: size(&fields, "keep_chars")?,
            tool_output_clearing: flag(&fields, "tool_output_clearing")?,
            force: flag(&fields, "force")?.unwrap_or(false),
            overflow: flag(&fields, "overflow")?.unwrap_or(false),
            threshold_tokens: tokens(&fields, "threshold_tokens", 1)?,
            context_tokens: tokens(&fields, "context_tokens", 0)?,
        };
        Ok(Self {
            session_id,
            request_id,
            overrides,
            instructions: instructions(&fields)?,
            instructions_from: instructions_from(&fields)?,
        })
    }

    /// The request's instructions, if it gave any, with who wrote them.
    pub fn focus(&self) -> Option<Instructions> {
        self.instructions.as_ref().map(|text| Instructions {
            text: text.clone(),
            from: self.instructions_from,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing a struct of strings cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A request's fields as written. Each is parsed by its own reader, so that a number no
/// float can hold (a size of 400 digits) fails only the field that cannot take it, and
/// an unknown field is never parsed past its syntax.
struct Fields<'a>(HashMap<String, &'a RawValue>);

impl<'a> Fields<'a> {
    fn parse(payload: &'a [u8]) -> Result<Self, InvalidRequest> {
        match serde_json::from_slice(payload) {
            Ok(fields) => Ok(Self(fields)),
            // Valid JSON, just not an object.
            Err(_) if serde_json::from_slice::<&RawValue>(payload).is_ok() => {
                Err(InvalidRequest("request must be a JSON object".to_owned()))
            }
            Err(e) => Err(InvalidRequest(format!("request is not valid JSON: {e}"))),
        }
    }

    /// The field's value; `Err` when it is a number beyond what a float holds. Of a key
    /// written twice, the last (as serde_json's own maps keep it).
    fn get(&self, field: &str) -> Option<Result<Value, serde_json::Error>> {
        (self.0.get(field)).map(|raw| serde_json::from_str(raw.get()))
    }

    /// The field's text as written.
    fn raw(&self, field: &str) -> Option<&str> {
        self.0.get(field).map(|raw| raw.get())
    }
}

/// An optional size in chars: absent or null, or a positive integer. One too large for
/// an `i64` reads as `i64::MAX`, however many digits it has: the worker clamps it to its
/// bound anyway. Only an integer as written counts (`5000`, not `5000.0` or `5e3`).
fn size(fields: &Fields<'_>, field: &str) -> Result<Option<i64>, InvalidRequest> {
    let large = match fields.get(field) {
        None | Some(Ok(Value::Null)) => return Ok(None),
        Some(Ok(Value::Number(n))) => match n.as_i64() {
            Some(n) if n > 0 => return Ok(Some(n)),
            Some(_) => false,
            // Past i64: a u64, or a float past u64 (which may have been written as an
            // integer, or not: the text says).
            None => positive_digits(fields.raw(field)),
        },
        // A number no float holds.
        Some(Err(_)) => positive_digits(fields.raw(field)),
        Some(Ok(_)) => false,
    };
    if large {
        Ok(Some(i64::MAX))
    } else {
        Err(InvalidRequest(format!(
            "{field} must be a positive integer (a number of chars)"
        )))
    }
}

/// Whether `raw` is a positive integer written in digits alone, however many.
fn positive_digits(raw: Option<&str>) -> bool {
    raw.is_some_and(|text| {
        !text.is_empty()
            && text.bytes().all(|b| b.is_ascii_digit())
            && text.bytes().any(|b| b != b'0')
    })
}

/// An optional count of tokens: absent or null, or an integer from `min` to
/// [`MAX_TOKENS`]. Unlike a size in chars, a number past the bound is rejected, not
/// clamped: a token count is what a model reported, and one that large is a bug.
fn tokens(fields: &Fields<'_>, field: &str, min: i64) -> Result<Option<i64>, InvalidRequest> {
    match fields.get(field) {
        None | Some(Ok(Value::Null)) => Ok(None),
        Some(Ok(Value::Number(n)))
            if n.as_i64().is_some_and(|n| (min..=MAX_TOKENS).contains(&n)) =>
        {
            Ok(n.as_i64())
        }
        Some(_) => Err(InvalidRequest(format!(
            "{field} must be an integer from {min} to {MAX_TOKENS} (a number of tokens)"
        ))),
    }
}

/// The optional `instructions`: absent, null, or a string of at most
/// [`MAX_INSTRUCTIONS_CHARS`] chars with no control character but a newline. Blank
/// instructions are none.
fn instructions(fields: &Fields<'_>) -> Result<Option<String>, InvalidRequest> {
    let text = match fields.get("instructions") {
        None | Some(Ok(Value::Null)) => return Ok(None),
        Some(Ok(Value::String(text))) => text,
        Some(_) => return Err(InvalidRequest("instructions must be a string".to_owned())),
    };
    let chars = text.chars().count();
    if chars > MAX_INSTRUCTIONS_CHARS {
        return Err(InvalidRequest(format!(
            "instructions is {chars} chars; the limit is {MAX_INSTRUCTIONS_CHARS}"
        )));
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(InvalidRequest(
            "instructions must not contain control characters other than newlines".to_owned(),
        ));
    }
    Ok((!text.trim().is_empty()).then_some(text))
}

/// The optional `instructions_from`: absent or null (the agent), `"agent"` or `"operator"`.
fn instructions_from(fields: &Fields<'_>) -> Result<InstructionsFrom, InvalidRequest> {
    match fields.get("instructions_from") {
        None | Some(Ok(Value::Null)) => Ok(InstructionsFrom::Agent),
        Some(Ok(Value::String(from))) if from == "agent" => Ok(InstructionsFrom::Agent),
        Some(Ok(Value::String(from))) if from == "operator" => Ok(InstructionsFrom::Operator),
        Some(_) => Err(InvalidRequest(
            "instructions_from must be \"agent\" or \"operator\"".to_owned(),
        )),
    }
}

/// An optional flag: absent or null, or a JSON boolean (not `"true"`, not `1`).
fn flag(fields: &Fields<'_>, field: &str) -> Result<Option<bool>, InvalidRequest> {
    match fields.get(field) {
        None | Some(Ok(Value::Null)) => Ok(None),
        Some(Ok(Value::Bool(b))) => Ok(Some(b)),
        Some(_) => Err(InvalidRequest(format!(
            "{field} must be a boolean (true or false)"
        ))),
    }
}

fn check_id(field: &str, id: &str, max_bytes: usize) -> Result<(), InvalidRequest> {
    if id.is_empty() {
        Err(InvalidRequest(format!("{field} must not be empty")))
    } else if id.len() > max_bytes {
        Err(InvalidRequest(format!(
            "{field} is {} bytes; the limit is {max_bytes}",
            id.len()
        )))
    } else if id.chars().any(char::is_control) {
        Err(InvalidRequest(format!(
            "{field} must not contain control characters"
        )))
    } else {
        Ok(())
    }
}

/// The reply to a turn-starting request. Every status but `compacted` means "proceed with
/// the history as it is"; so does no reply at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub status: Status,
    pub reason: Reason,
    pub session_id: Option<String>,
    pub request_id: Option<String>,
    /// The session's size when the worker checked it (before any compaction).
    #[serde(default)]
    pub session_chars: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_removed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars_removed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_kept: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_chars: Option<i64>,
    /// For `compacted`: tool results cleared in place (their content replaced by a
    /// placeholder, the original archived) and the chars that saved; 0 when none were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_outputs_cleared: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars_cleared: Option<i64>,
    /// The keep the event ran with, on the replies of a compaction and of the planner's
    /// refusals (`within_keep`, `no_safe_boundary`, `nothing_to_compact`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_chars: Option<i64>,
    /// The `usage_events.id` of the compaction, also its `archived_messages.compaction_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_id: Option<i64>,
    /// The compaction in force for the session when the worker answered (this one, for
    /// `compacted`), `None` when it has none or was not read. On every reply, so that a
    /// client whose earlier request timed out notices a compaction that committed after
    /// it stopped waiting, even on a `below_threshold` turn.
    #[serde(default)]
    pub latest_compaction_id: Option<i64>,
    /// Time the worker spent on the event.
    #[serde(default)]
    pub duration_ms: u64,
    /// A human-readable detail for `failed` and `rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Reply {
    pub fn new(
        outcome: &Outcome,
        session_id: Option<&str>,
        request_id: Option<&str>,
        session_chars: Option<i64>,
        duration_ms: u64,
    ) -> Self {
        let compaction = match outcome {
            Outcome::Compacted(c) => Some(c),
            _ => None,
        };
        let message = match outcome {
            Outcome::Failed { detail, .. } | Outcome::Rejected { detail } => Some(detail.clone()),
            _ => None,
        };
        Self {
            status: outcome.status(),
            reason: outcome.reason(),
            session_id: session_id.map(str::to_owned),
            request_id: request_id.map(str::to_owned),
            session_chars,
            messages_removed: compaction.map(|c| c.messages_removed),
            chars_removed: compaction.map(|c| c.chars_removed),
            messages_kept: compaction.map(|c| c.messages_kept),
            summary_chars: compaction.map(|c| c.summary_chars),
            tool_outputs_cleared: compaction.map(|c| c.tool_outputs_cleared),
            chars_cleared: compaction.map(|c| c.chars_cleared),
            keep_chars: None,
            compaction_id: compaction.map(|c| c.compaction_id),
            latest_compaction_id: compaction.map(|c| c.compaction_id),
            duration_ms,
            message,
        }
    }

    /// Reports `id` as the session's compaction in force, unless this reply is the
    /// compaction's own (which reports itself).
    #[must_use]
    pub fn with_latest_compaction_id(mut self, id: Option<i64>) -> Self {
        if self.compaction_id.is_none() {
            self.latest_compaction_id = id;
        }
        self
    }

    /// With the keep the event ran with, on a compaction's reply or a planner refusal's.
    #[must_use]
    pub fn with_keep_chars(mut self, keep_chars: Option<i64>) -> Self {
        let planned = matches!(
            self.reason,
            Reason::Compacted
                | Reason::Cleared
                | Reason::WithinKeep
                | Reason::NoSafeBoundary
                | Reason::NothingToCompact
        );
        self.keep_chars = keep_chars.filter(|_| planned);
        self
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain fields cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn rejects(payload: &[u8], why: &str) {
        let err = Request::decode(payload).expect_err(why);
        assert!(err.0.contains(why), "{:?} should say {why:?}", err.0);
    }

    #[test]
    fn accepts_a_request_and_ignores_unknown_fields() {
        let r =
            Request::decode(br#"{"session_id":"s-1","request_id":"ab12","future":[1]}"#).unwrap();
        assert_eq!(
            r,
            Request {
                session_id: "s-1".into(),
                request_id: Some("ab12".into()),
                overrides: Overrides::default(),
                instructions: None,
                instructions_from: InstructionsFrom::Agent,
            }
        );
        let r = Request::decode("{\"session_id\":\"🦀 séance\"}".as_bytes()).unwrap();
        assert_eq!(r.session_id, "🦀 séance");
    }

    #[test]
    fn rejects_each_kind_of_bad_request_with_a_reason() {
        rejects(b"not json", "not valid JSON");
        rejects(b"", "not valid JSON");
        rejects(b"[1,2]", "JSON object");
        rejects(b"{}", "session_id is required");
        rejects(br#"{"session_id":42}"#, "must be a string");
        rejects(br#"{"session_id":""}"#, "must not be empty");
        rejects(br#"{"session_id":"a\u0000b"}"#, "control characters");
        rejects(
            br#"{"session_id":"s","request_id":7}"#,
            "request_id must be a string",
        );
        let long = format!(
            r#"{{"session_id":"{}"}}"#,
            "x".repeat(MAX_SESSION_ID_BYTES + 1)
        );
        rejects(long.as_bytes(), "the limit is 256");
        rejects(&vec![b' '; MAX_REQUEST_BYTES + 1], "the limit is 65536");
    }

    #[test]
    fn overrides_are_read_when_they_are_positive_integers() {
        let r = Request::decode(br#"{"session_id":"s","threshold_chars":5000,"keep_chars":null}"#)
            .unwrap();
        assert_eq!(
            r.overrides,
            Overrides {
                threshold_chars: Some(5000),
                ..Overrides::default()
            }
        );
        let huge = Request::decode(br#"{"session_id":"s","keep_chars":18446744073709551615}"#);
        assert_eq!(huge.unwrap().overrides.keep_chars, Some(i64::MAX));
        for bad in [r#""5000""#, "5000.5", "0", "-3", "true", "[1]"] {
            let payload = format!(r#"{{"session_id":"s","keep_chars":{bad}}}"#);
            rejects(payload.as_bytes(), "keep_chars must be a positive integer");
        }
        rejects(
            br#"{"session_id":"s","threshold_chars":1e3}"#,
            "threshold_chars must be a positive integer",
        );
    }

    #[test]
    fn a_size_past_two_to_the_64_is_clamped_not_rejected() {
        for huge in [
            "18446744073709551616",
            "99999999999999999999999999999999999999999999999999999999999999",
            &"9".repeat(400),
        ] {
            let payload = format!(r#"{{"session_id":"s","threshold_chars":{huge}}}"#);
            let r = Request::decode(payload.as_bytes()).unwrap_or_else(|e| panic!("{huge}: {e}"));
            assert_eq!(r.overrides.threshold_chars, Some(i64::MAX), "{huge}");
        }
        // A float, an exponent or a negative number that large is still not a size.
        for bad in [
            "18446744073709551616.0",
            "1.8446744073709552e19",
            "1e400",
            "-18446744073709551616",
        ] {
            let payload = format!(r#"{{"session_id":"s","keep_chars":{bad}}}"#);
            rejects(payload.as_bytes(), "keep_chars must be a positive integer");
        }
        // The field read is the one the parse kept: the last of duplicated keys.
        let twice = br#"{"session_id":"s","keep_chars":1.5,"keep_chars":18446744073709551616}"#;
        assert_eq!(
            Request::decode(twice).unwrap().overrides.keep_chars,
            Some(i64::MAX)
        );
        // An unknown field is ignored whatever number it holds.
        assert!(Request::decode(br#"{"session_id":"s","future":1e400}"#).is_ok());
        let escaped = br#"{"session_id":"s","keep\u005fchars":18446744073709551616}"#;
        assert_eq!(
            Request::decode(escaped).unwrap().overrides.keep_chars,
            Some(i64::MAX)
        );
    }

    #[test]
    fn instructions_from_is_the_agent_unless_it_says_the_operator() {
        for (payload, expected) in [
            (r#"{"session_id":"s"}"#, InstructionsFrom::Agent),
            (
                r#"{"session_id":"s","instructions_from":null}"#,
                InstructionsFrom::Agent,
            ),
            (
                r#"{"session_id":"s","instructions_from":"agent"}"#,
                InstructionsFrom::Agent,
            ),
            (
                r#"{"session_id":"s","instructions_from":"operator"}"#,
                InstructionsFrom::Operator,
            ),
        ] {
            let r = Request::decode(payload.as_bytes()).unwrap();
            assert_eq!(r.instructions_from, expected, "{payload}");
        }
        for bad in [
            r#""Operator""#,
            r#""admin""#,
            r#""""#,
            "true",
            "1",
            r#"["operator"]"#,
        ] {
            let payload = format!(r#"{{"session_id":"s","instructions_from":{bad}}}"#);
            rejects(
                payload.as_bytes(),
                r#"instructions_from must be "agent" or "operator""#,
            );
        }
    }

    #[test]
    fn tool_output_clearing_is_a_boolean_or_absent() {
        for (payload, expected) in [
            (
                r#"{"session_id":"s","tool_output_clearing":true}"#,
                Some(true),
            ),
            (
                r#"{"session_id":"s","tool_output_clearing":false}"#,
                Some(false),
            ),
            (r#"{"session_id":"s","tool_output_clearing":null}"#, None),
            (r#"{"session_id":"s"}"#, None),
        ] {
            let r = Request::decode(payload.as_bytes()).unwrap();
            assert_eq!(r.overrides.tool_output_clearing, expected, "{payload}");
        }
        for bad in [r#""true""#, "1", "0", r#""on""#, "[true]", "{}"] {
            let payload = format!(r#"{{"session_id":"s","tool_output_clearing":{bad}}}"#);
            rejects(payload.as_bytes(), "tool_output_clearing must be a boolean");
        }
    }

    #[test]
    fn force_threshold_tokens_context_tokens_and_instructions_are_checked_by_name() {
        let ok = Request::decode(
            br#"{"session_id":"s","force":true,"threshold_tokens":1,"context_tokens":0,
                 "instructions":"Keep the plan.\nAnd the ticket."}"#,
        )
        .unwrap();
        assert!(ok.overrides.force);
        assert_eq!(ok.overrides.threshold_tokens, Some(1));
        assert_eq!(ok.overrides.context_tokens, Some(0));
        assert_eq!(
            ok.instructions.as_deref(),
            Some("Keep the plan.\nAnd the ticket.")
        );
        let at_limits = format!(
            r#"{{"session_id":"s","threshold_tokens":{MAX_TOKENS},"context_tokens":{MAX_TOKENS},"instructions":"{}"}}"#,
            "é".repeat(MAX_INSTRUCTIONS_CHARS)
        );
        assert!(Request::decode(at_limits.as_bytes()).is_ok());
        let blank = Request::decode(br#"{"session_id":"s","instructions":" \n "}"#).unwrap();
        assert_eq!(blank.instructions, None, "blank instructions are none");

        for bad in [r#""true""#, "1", "0", "[]", "{}"] {
            let payload = format!(r#"{{"session_id":"s","force":{bad}}}"#);
            rejects(payload.as_bytes(), "force must be a boolean");
        }
        let huge = (MAX_TOKENS + 1).to_string();
        for bad in [
            r#""100""#,
            "1.5",
            "1.0",
            "-1",
            "0",
            "1e12",
            "true",
            &huge,
            "18446744073709551616",
        ] {
            let payload = format!(r#"{{"session_id":"s","threshold_tokens":{bad}}}"#);
            rejects(
                payload.as_bytes(),
                "threshold_tokens must be an integer from 1",
            );
        }
        for bad in [r#""100""#, "2.5", "-1", "1e12", "false", &huge] {
            let payload = format!(r#"{{"session_id":"s","context_tokens":{bad}}}"#);
            rejects(
                payload.as_bytes(),
                "context_tokens must be an integer from 0",
            );
        }
        for (bad, why) in [
            ("42", "instructions must be a string"),
            (r#"["a"]"#, "instructions must be a string"),
            (
                r#""tab\there""#,
                "instructions must not contain control characters",
            ),
            (
                r#""cr\rhere""#,
                "instructions must not contain control characters",
            ),
            (
                r#""nul\u0000here""#,
                "instructions must not contain control characters",
            ),
        ] {
            let payload = format!(r#"{{"session_id":"s","instructions":{bad}}}"#);
            rejects(payload.as_bytes(), why);
        }
        let long = format!(
            r#"{{"session_id":"s","instructions":"{}"}}"#,
            "a".repeat(MAX_INSTRUCTIONS_CHARS + 1)
        );
        rejects(
            long.as_bytes(),
            "instructions is 4001 chars; the limit is 4000",
        );
    }

    #[test]
    fn a_request_with_overrides_round_trips_and_one_without_has_none_on_the_wire() {
        let request = Request {
            session_id: "s".into(),
            request_id: None,
            overrides: Overrides {
                threshold_chars: Some(9000),
                keep_chars: Some(3000),
                tool_output_clearing: Some(true),
                force: true,
                overflow: true,
                threshold_tokens: Some(100_000),
                context_tokens: Some(0),
            },
            instructions: Some("Focus on the pool.\nKeep the ticket.".into()),
            instructions_from: InstructionsFrom::Operator,
        };
        assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        let from_agent = Request {
            instructions_from: InstructionsFrom::Agent,
            ..request.clone()
        };
        assert!(
            !String::from_utf8_lossy(&from_agent.encode()).contains("instructions_from"),
            "the default goes unsaid"
        );
        let plain = Request {
            session_id: "s".into(),
            ..Request::default()
        };
        assert_eq!(plain.encode(), br#"{"session_id":"s"}"#);
    }

    #[test]
    fn replies_round_trip_and_unknown_reasons_decode() {
        let reply = Reply::new(&Outcome::Busy, Some("s"), Some("r"), Some(10), 3);
        assert_eq!(
            serde_json::from_slice::<Reply>(&reply.encode()).unwrap(),
            reply
        );
        let newer: Reply = serde_json::from_str(
            r#"{"status":"skipped","reason":"some_new_reason","session_id":"s","request_id":null}"#,
        )
        .unwrap();
        assert_eq!(newer.reason, Reason::Other);
        assert_eq!(newer.latest_compaction_id, None);
    }

    #[test]
    fn every_reply_carries_the_latest_compaction_and_a_compaction_reports_itself() {
        let skipped = Reply::new(
            &Outcome::Skipped(Reason::BelowThreshold),
            None,
            None,
            None,
            0,
        )
        .with_latest_compaction_id(Some(7));
        let json: Value = serde_json::from_slice(&skipped.encode()).unwrap();
        assert_eq!(json["latest_compaction_id"], 7);
        let none = Reply::new(&Outcome::Busy, None, None, None, 0).with_latest_compaction_id(None);
        let json: Value = serde_json::from_slice(&none.encode()).unwrap();
        assert!(
            json.as_object()
                .unwrap()
                .contains_key("latest_compaction_id")
        );
        let compaction = crate::outcome::Compaction {
            compaction_id: 9,
            messages_removed: 1,
            chars_removed: 1,
            messages_kept: 1,
            summary_chars: 1,
            summarized: true,
            tool_outputs_cleared: 0,
            chars_cleared: 0,
        };
        let compacted = Reply::new(&Outcome::Compacted(compaction), None, None, None, 0)
            .with_latest_compaction_id(Some(7));
        assert_eq!(compacted.latest_compaction_id, Some(9));
    }

    proptest! {
        #[test]
        fn decode_never_panics(payload in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = Request::decode(&payload);
        }

        #[test]
        fn a_request_is_accepted_exactly_when_its_id_is_valid(
            id in any::<String>(),
            extra in prop::collection::btree_map("[a-z_]{1,8}", any::<i64>(), 0..4),
        ) {
            let mut fields = serde_json::Map::new();
            for (k, v) in extra {
                fields.insert(k, Value::from(v));
            }
            fields.insert("session_id".to_owned(), Value::String(id.clone()));
            let payload = serde_json::to_vec(&Value::Object(fields)).unwrap();
            let valid = !id.is_empty()
                && id.len() <= MAX_SESSION_ID_BYTES
                && !id.chars().any(char::is_control);
            match Request::decode(&payload) {
                Ok(request) => prop_assert!(valid && request.session_id == id),
                Err(InvalidRequest(why)) => prop_assert!(!valid && why.contains("session_id")),
            }
        }

        #[test]
        fn any_valid_id_round_trips(id in "[^\\p{Cc}]{1,60}") {
            prop_assume!(id.len() <= MAX_SESSION_ID_BYTES);
            let request = Request { session_id: id, ..Request::default() };
            prop_assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        }
    }
}
