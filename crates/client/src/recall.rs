//! Recall: the agent searches and fetches what compaction removed from its session
//! (docs/protocol.md, "Recall"). The request and reply on `summarizer.recall`, with the
//! request's validation, and [`RecallClient`], which asks the fleet and fails with a
//! typed error instead of panicking.

use std::time::Duration;

use async_nats::RequestErrorKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::outcome::Reason;
use crate::protocol::{InvalidRequest, MAX_REQUEST_BYTES, MAX_SESSION_ID_BYTES};

/// The most results a search returns ...
pub const MAX_LIMIT: usize = 50;
/// ... and when the request names none.
pub const DEFAULT_LIMIT: usize = 5;
/// The longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = 1024;
/// The most seqs a fetch names.
pub const MAX_SEQS: usize = 50;
/// A result's content is cut at this many chars unless the request asks for fewer ...
pub const DEFAULT_MAX_CHARS: usize = 4_000;
/// ... or more, up to this.
pub const MAX_MAX_CHARS: usize = 20_000;

/// What a recall request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// The archived messages that best match `query`, at most `limit`.
    Search { query: String, limit: usize },
    /// The archived messages of these seqs, in seq order (a seq archived twice, as a
    /// cleared result's original and later as its placeholder, removed by a summary,
    /// comes once: the original).
    Seqs(Vec<i64>),
}

/// A validated recall request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallRequest {
    pub session_id: String,
    pub wanted: Wanted,
    /// Each result's content is cut at this many chars.
    pub max_chars: usize,
}

impl RecallRequest {
    /// A search of `session_id`'s archive.
    pub fn search(session_id: impl Into<String>, query: impl Into<String>, limit: usize) -> Self {
        Self {
            session_id: session_id.into(),
            wanted: Wanted::Search {
                query: query.into(),
                limit,
            },
            max_chars: DEFAULT_MAX_CHARS,
        }
    }

    /// A fetch of `seqs` from `session_id`'s archive.
    pub fn seqs(session_id: impl Into<String>, seqs: Vec<i64>) -> Self {
        Self {
            session_id: session_id.into(),
            wanted: Wanted::Seqs(seqs),
            max_chars: DEFAULT_MAX_CHARS,
        }
    }

    /// Parses and validates a request payload. Unknown fields are ignored.
    ///
    /// # Errors
    /// [`InvalidRequest`] naming the field: a payload over 64 KiB or not a JSON object;
    /// a `session_id` missing, not a string, empty, over 256 bytes or with control
    /// characters; neither or both of `query` and `seqs`; a `query` not a string, blank
    /// or over 1 KiB; `seqs` not an array of at most 50 integers; a `limit` not an
    /// integer from 1 to 50; a `max_chars` not an integer from 1 to 20,000.
    pub fn decode(payload: &[u8]) -> Result<Self, InvalidRequest> {
        let invalid = |msg: String| Err(InvalidRequest(msg));
        if payload.len() > MAX_REQUEST_BYTES {
            return invalid(format!(
                "request is {} bytes; the limit is {MAX_REQUEST_BYTES}",
                payload.len()
            ));
        }
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(payload) else {
            return invalid("request must be a JSON object".to_owned());
        };
        let session_id = match fields.get("session_id") {
            Some(Value::String(id)) => id.clone(),
            None | Some(Value::Null) => return invalid("session_id is required".to_owned()),
            Some(_) => return invalid("session_id must be a string".to_owned()),
        };
        if session_id.is_empty()
            || session_id.len() > MAX_SESSION_ID_BYTES
            || session_id.chars().any(char::is_control)
        {
            return invalid(format!(
                "session_id must be 1 to {MAX_SESSION_ID_BYTES} bytes without control characters"
            ));
        }
        let max_chars = bounded(&fields, "max_chars", MAX_MAX_CHARS)?.unwrap_or(DEFAULT_MAX_CHARS);
        let query = fields.get("query").filter(|v| !v.is_null());
        let seqs = fields.get("seqs").filter(|v| !v.is_null());
        let wanted = match (query, seqs) {
            (Some(_), Some(_)) => return invalid("give query or seqs, not both".to_owned()),
            (None, None) => return invalid("query or seqs is required".to_owned()),
            (Some(query), None) => {
                let Value::String(query) = query else {
                    return invalid("query must be a string".to_owned());
                };
                if query.trim().is_empty() {
                    return invalid("query must not be blank".to_owned());
                }
                if query.len() > MAX_QUERY_BYTES {
                    return invalid(format!(
                        "query is {} bytes; the limit is {MAX_QUERY_BYTES}",
                        query.len()
                    ));
                }
                let limit = bounded(&fields, "limit", MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT);
                Wanted::Search {
                    query: query.clone(),
                    limit,
                }
            }
            (None, Some(seqs)) => {
                let Value::Array(seqs) = seqs else {
                    return invalid("seqs must be an array of integers".to_owned());
                };
                if seqs.is_empty() || seqs.len() > MAX_SEQS {
                    return invalid(format!("seqs must hold 1 to {MAX_SEQS} integers"));
                }
                let seqs: Option<Vec<i64>> = seqs.iter().map(Value::as_i64).collect();
                let Some(seqs) = seqs else {
                    return invalid("seqs must be an array of integers".to_owned());
                };
                Wanted::Seqs(seqs)
            }
        };
        Ok(Self {
            session_id,
            wanted,
            max_chars,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut json = serde_json::json!({
            "session_id": self.session_id,
            "max_chars": self.max_chars,
        });
        match &self.wanted {
            Wanted::Search { query, limit } => {
                json["query"] = query.as_str().into();
                json["limit"] = (*limit).into();
            }
            Wanted::Seqs(seqs) => json["seqs"] = seqs.clone().into(),
        }
        json.to_string().into_bytes()
    }
}

/// An optional integer field from 1 to `max`.
fn bounded(
    fields: &serde_json::Map<String, Value>,
    field: &str,
    max: usize,
) -> Result<Option<usize>, InvalidRequest> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(n) if (1..=max as u64).contains(&n) => Ok(Some(n as usize)),
            _ => Err(InvalidRequest(format!(
                "{field} must be an integer from 1 to {max}"
            ))),
        },
        Some(_) => Err(InvalidRequest(format!(
            "{field} must be an integer from 1 to {max}"
        ))),
    }
}

/// One archived message, as a recall reply gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recalled {
    pub seq: i64,
    pub role: String,
    /// For a tool result, the name of the call it answers, where that is known.
    pub tool_name: Option<String>,
    pub tool_call_id: Option<String>,
    /// At most the request's `max_chars` chars of it ...
    pub content: String,
    /// ... and whether it was cut there.
    pub truncated: bool,
    /// The compaction that archived it (the usage event's id).
    pub compaction_id: i64,
    /// RFC 3339, UTC.
    pub archived_at: String,
}

/// The `status` of a recall reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecallStatus {
    Ok,
    Rejected,
    Failed,
    /// A status this version does not know (from a newer worker); kept so clients never
    /// fail to decode a reply.
    #[serde(other)]
    Other,
}

impl RecallStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Other => "other",
        }
    }
}

/// The reply to a recall request: `ok` with results (best first for a query, in seq
/// order for seqs), or `rejected`/`invalid_request` or `failed`/`store_error` with a
/// message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallReply {
    pub status: RecallStatus,
    /// Why it was not `ok`, in the turn reply's vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default)]
    pub results: Vec<Recalled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl RecallReply {
    pub fn ok(session_id: &str, results: Vec<Recalled>) -> Self {
        Self {
            status: RecallStatus::Ok,
            reason: None,
            session_id: Some(session_id.to_owned()),
            results,
            message: None,
        }
    }

    pub fn rejected(invalid: &InvalidRequest) -> Self {
        Self {
            status: RecallStatus::Rejected,
            reason: Some(Reason::InvalidRequest),
            session_id: None,
            results: Vec::new(),
            message: Some(invalid.0.clone()),
        }
    }

    pub fn store_error(session_id: &str, message: String) -> Self {
        Self {
            status: RecallStatus::Failed,
            reason: Some(Reason::StoreError),
            session_id: Some(session_id.to_owned()),
            results: Vec::new(),
            message: Some(message),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain fields cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The reply encoded in at most `max_bytes` (the NATS server's `max_payload`: a
    /// larger message is refused, and the agent would wait out its timeout for
    /// nothing). When it is longer, the contents share the room left beside the other
    /// fields evenly: each result longer than its share is cut to it (and marked
    /// `truncated`), so every result keeps its seq, by which it can be fetched alone. In
    /// the unlikely case that the other fields alone are too long, the last (worst)
    /// results go.
    pub fn encode_within(mut self, max_bytes: usize) -> Vec<u8> {
        let encoded = self.encode();
        if encoded.len() <= max_bytes {
            return encoded;
        }
        let mut contents: Vec<String> = (self.results.iter_mut())
            .map(|r| std::mem::take(&mut r.content))
            .collect();
        let mut bare = self.encode().len();
        while bare > max_bytes && self.results.pop().is_some() {
            contents.pop();
            bare = self.encode().len();
        }
        let sizes: Vec<usize> = contents.iter().map(|c| escaped_len(c)).collect();
        let share = even_share(&sizes, max_bytes.saturating_sub(bare));
        for ((result, content), size) in self.results.iter_mut().zip(contents).zip(sizes) {
            result.content = content;
            if size > share {
                cut_to_escaped(&mut result.content, share);
                result.truncated = true;
            }
        }
        self.encode()
    }
}

/// How many bytes `c` takes in a JSON string as serde_json writes it.
fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if u32::from(c) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

fn escaped_len(text: &str) -> usize {
    text.chars().map(escaped_char_len).sum()
}

/// `text` cut to the longest prefix that takes at most `max` bytes escaped.
fn cut_to_escaped(text: &mut String, max: usize) {
    let mut used = 0;
    let end = text
        .char_indices()
        .find_map(|(at, c)| {
            used += escaped_char_len(c);
            (used > max).then_some(at)
        })
        .unwrap_or(text.len());
    text.truncate(end);
}

/// The most each of `sizes` may take for all to fit in `room` when the ones under it
/// keep all theirs (water-filling): `usize::MAX` when all fit whole.
fn even_share(sizes: &[usize], room: usize) -> usize {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let mut left = room;
    for (i, &size) in sorted.iter().enumerate() {
        let share = left / (sorted.len() - i);
        if size > share {
            return share;
        }
        left -= size;
    }
    usize::MAX
}

/// Why a recall brought nothing back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallError {
    /// No worker answered within the timeout.
    TimedOut,
    /// No worker is subscribed to the recall subject.
    NoWorkers,
    /// NATS could not be reached, or the reply could not be read.
    Unavailable(String),
    /// The worker refused the request (`rejected`) or failed (`failed`): its reason and
    /// message.
    Refused {
        status: RecallStatus,
        reason: Option<Reason>,
        message: String,
    },
}

impl std::fmt::Display for RecallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("no worker answered within the timeout"),
            Self::NoWorkers => f.write_str("no worker serves recall"),
            Self::Unavailable(why) => write!(f, "transport error: {why}"),
            Self::Refused {
                status,
                reason,
                message,
            } => write!(
                f,
                "{}/{}: {message}",
                status.as_str(),
                reason.map_or("", Reason::as_str)
            ),
        }
    }
}

impl std::error::Error for RecallError {}

/// What Rust agents call to search or fetch their session's archive.
#[derive(Clone, Debug)]
pub struct RecallClient {
    nats: async_nats::Client,
    subject: String,
}

impl RecallClient {
    /// A client of the fleet on `subject` (`summarizer.recall` by default).
    pub fn new(nats: async_nats::Client, subject: impl Into<String>) -> Self {
        Self {
            nats,
            subject: subject.into(),
        }
    }

    /// The archived messages of `session_id` that best match `query`, at most `limit`.
    ///
    /// # Errors
    /// [`RecallError`]; never panics.
    pub async fn search(
        &self,
        session_id: &str,
        query: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<Recalled>, RecallError> {
        self.ask(&RecallRequest::search(session_id, query, limit), timeout)
            .await
    }

    /// The archived messages of `session_id` with these seqs.
    ///
    /// # Errors
    /// [`RecallError`]; never panics.
    pub async fn fetch(
        &self,
        session_id: &str,
        seqs: &[i64],
        timeout: Duration,
    ) -> Result<Vec<Recalled>, RecallError> {
        self.ask(&RecallRequest::seqs(session_id, seqs.to_vec()), timeout)
            .await
    }

    /// Sends `request` and waits at most `timeout` for the results.
    ///
    /// # Errors
    /// [`RecallError`]; never panics.
    pub async fn ask(
        &self,
        request: &RecallRequest,
        timeout: Duration,
    ) -> Result<Vec<Recalled>, RecallError> {
        let asked = async_nats::Request::new()
            .payload(request.encode().into())
            .timeout(Some(timeout));
        let message = self
            .nats
            .send_request(self.subject.clone(), asked)
            .await
            .map_err(|e| match e.kind() {
                RequestErrorKind::TimedOut => RecallError::TimedOut,
                RequestErrorKind::NoResponders => RecallError::NoWorkers,
                _ => RecallError::Unavailable(crate::error_chain(&e)),
            })?;
        let reply: RecallReply = serde_json::from_slice(&message.payload)
            .map_err(|e| RecallError::Unavailable(format!("unreadable reply: {e}")))?;
        if reply.status == RecallStatus::Ok {
            return Ok(reply.results);
        }
        Err(RecallError::Refused {
            status: reply.status,
            reason: reply.reason,
            message: reply.message.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects(payload: &str, why: &str) {
        let err = RecallRequest::decode(payload.as_bytes()).expect_err(payload);
        assert!(
            err.0.contains(why),
            "{payload}: {:?} should say {why:?}",
            err.0
        );
    }

    #[test]
    fn a_search_and_a_fetch_are_read_with_their_defaults() {
        let r = RecallRequest::decode(br#"{"session_id":"s","query":"E-5417"}"#).unwrap();
        assert_eq!(r, RecallRequest::search("s", "E-5417", DEFAULT_LIMIT));
        let r = RecallRequest::decode(br#"{"session_id":"s","seqs":[12,7],"max_chars":100,"x":1}"#)
            .unwrap();
        assert_eq!(r.wanted, Wanted::Seqs(vec![12, 7]));
        assert_eq!(r.max_chars, 100);
        for r in [
            RecallRequest::search("s", "pool \"x\" OR 1=1; --", 50),
            RecallRequest::seqs("s", vec![1, 2, 3]),
        ] {
            assert_eq!(RecallRequest::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn a_reply_too_long_for_nats_is_cut_evenly_to_fit() {
        let result = |seq: i64, content: String| Recalled {
            seq,
            role: "tool".to_owned(),
            tool_name: None,
            tool_call_id: Some(format!("c{seq}")),
            content,
            truncated: false,
            compaction_id: 1,
            archived_at: "2026-12-06T00:00:00.000Z".to_owned(),
        };
        // 50 results of 20,000 chars, some of them escaped six times over: far past
        // the default 1 MiB payload.
        let results: Vec<Recalled> = (0..50)
            .map(|n| match n % 3 {
                0 => result(n, "\u{1}".repeat(20_000)),
                1 => result(n, "é".repeat(20_000)),
                _ => result(n, "short".to_owned()),
            })
            .collect();
        let full = RecallReply::ok("s", results.clone()).encode();
        assert!(full.len() > 1 << 20, "{}", full.len());
        let max = 256 * 1024;
        let cut = RecallReply::ok("s", results.clone()).encode_within(max);
        assert!(cut.len() <= max, "{}", cut.len());
        let cut: RecallReply = serde_json::from_slice(&cut).unwrap();
        let seqs: Vec<i64> = cut.results.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (0..50).collect::<Vec<_>>(), "every result is kept");
        for (cut, whole) in cut.results.iter().zip(&results) {
            assert!(whole.content.starts_with(&cut.content));
            assert_eq!(cut.truncated, cut.content != whole.content);
        }
        assert!(cut.results.iter().any(|r| r.truncated));
        assert!(
            cut.results
                .iter()
                .any(|r| r.content == "short" && !r.truncated)
        );
        // The room is shared evenly: no cut result is left empty while another is whole.
        let cut_lens: Vec<usize> = (cut.results.iter())
            .filter(|r| r.truncated)
            .map(|r| escaped_len(&r.content))
            .collect();
        let (least, most) = (
            cut_lens.iter().min().unwrap(),
            cut_lens.iter().max().unwrap(),
        );
        assert!(*least > 0 && most - least <= 6, "{least}..{most}");
        // Fields too long to fit even without contents: the last results go.
        let tiny = RecallReply::ok("s", results.clone()).encode_within(2_000);
        assert!(tiny.len() <= 2_000, "{}", tiny.len());
        let tiny: RecallReply = serde_json::from_slice(&tiny).unwrap();
        assert!(!tiny.results.is_empty() && tiny.results.len() < 50);
        assert_eq!(tiny.results[0].seq, 0);
        // A reply that fits is left alone.
        let small = RecallReply::ok("s", results[2..3].to_vec());
        assert_eq!(small.clone().encode_within(max), small.encode());
    }

    #[test]
    fn each_bad_field_is_named() {
        rejects("[1]", "JSON object");
        rejects(r#"{"query":"x"}"#, "session_id is required");
        rejects(
            r#"{"session_id":"","query":"x"}"#,
            "session_id must be 1 to 256 bytes",
        );
        rejects(r#"{"session_id":"s"}"#, "query or seqs is required");
        rejects(r#"{"session_id":"s","query":"x","seqs":[1]}"#, "not both");
        rejects(r#"{"session_id":"s","query":7}"#, "query must be a string");
        rejects(
            r#"{"session_id":"s","query":"  "}"#,
            "query must not be blank",
        );
        let long = format!(r#"{{"session_id":"s","query":"{}"}}"#, "x".repeat(1025));
        rejects(&long, "the limit is 1024");
        for bad in ["0", "51", "-1", "2.5", "\"5\""] {
            rejects(
                &format!(r#"{{"session_id":"s","query":"x","limit":{bad}}}"#),
                "limit must be an integer from 1 to 50",
            );
        }
        for bad in ["0", "20001", "-1", "2.5", "\"5\"", "1e9"] {
            rejects(
                &format!(r#"{{"session_id":"s","seqs":[1],"max_chars":{bad}}}"#),
                "max_chars must be an integer from 1 to 20000",
            );
        }
        rejects(r#"{"session_id":"s","seqs":[]}"#, "1 to 50 integers");
        rejects(
            r#"{"session_id":"s","seqs":"1"}"#,
            "seqs must be an array of integers",
        );
        rejects(
            r#"{"session_id":"s","seqs":[1.5]}"#,
            "seqs must be an array of integers",
        );
        let many: Vec<i64> = (0..51).collect();
        rejects(
            &format!(r#"{{"session_id":"s","seqs":{many:?}}}"#),
            "1 to 50 integers",
        );
    }
}
