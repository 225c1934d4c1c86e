//! The session data model, as the public `messages` table holds it.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    /// A human turn, or a summary written by the worker (`is_summary`).
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "system" => Ok(Self::System),
            "user" => Ok(Self::User),
            "assistant" => Ok(Self::Assistant),
            "tool" => Ok(Self::Tool),
            other => Err(format!("unknown role {other:?}")),
        }
    }
}

/// One row of `messages`.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub seq: i64,
    pub role: Role,
    pub content: String,
    /// On `assistant`: the calls it made, stored as the agent wrote them: a JSON array of
    /// calls in the flat, LangChain or OpenAI shape. Read it through [`Message::calls`].
    pub tool_calls: Option<Value>,
    /// On `tool`: the call it answers.
    pub tool_call_id: Option<String>,
    pub is_summary: bool,
    /// Computed by the database; the one definition of a message's size.
    pub chars: i64,
    /// `messages.pinned`: never summarized, cleared or archived; it keeps its place, as a
    /// system message does (docs/compaction.md, "Pinned messages").
    pub pinned: bool,
}

impl Message {
    /// A human turn: a `user` message that is not a summary.
    pub fn is_human_turn(&self) -> bool {
        self.role == Role::User && !self.is_summary
    }

    /// A plain message for tests: no tool calls, not a summary, `chars` as the
    /// database would compute it.
    #[cfg(test)]
    pub(crate) fn text(role: Role, content: &str) -> Self {
        Self {
            seq: 0,
            role,
            content: content.to_owned(),
            tool_calls: None,
            tool_call_id: None,
            is_summary: false,
            chars: char_count(content),
            pinned: false,
        }
    }

    /// The calls this message makes. `tool_calls` holds a JSON array of calls; rows
    /// written before the `tool_calls_is_array` constraint may hold that array
    /// double-encoded as a JSON string, which is decoded here so its ids are not hidden.
    /// Any other shape holds no call the worker can read.
    pub fn calls(&self) -> Cow<'_, [Value]> {
        match &self.tool_calls {
            Some(Value::Array(calls)) => Cow::Borrowed(calls.as_slice()),
            Some(Value::String(text)) => match serde_json::from_str(text) {
                Ok(Value::Array(calls)) => Cow::Owned(calls),
                _ => Cow::Borrowed(&[]),
            },
            _ => Cow::Borrowed(&[]),
        }
    }

    /// The ids of the tool calls this message makes, in every stored shape (see
    /// [`Message::calls`] and [`ToolCall`]). Entries without a string `id` are skipped:
    /// stored data is the agent's, and odd shapes must not stop a compaction.
    pub fn tool_call_ids(&self) -> Vec<Cow<'_, str>> {
        match self.calls() {
            Cow::Borrowed(calls) => calls
                .iter()
                .filter_map(|call| ToolCall(call).id())
                .map(Cow::Borrowed)
                .collect(),
            Cow::Owned(calls) => calls
                .iter()
                .filter_map(|call| ToolCall(call).id())
                .map(|id| Cow::Owned(id.to_owned()))
                .collect(),
        }
    }

    /// The text of `tool_calls` as `chars` counts it (docs/protocol.md, "The schema"):
    /// a string as it is, any other JSON as its text. Empty without calls.
    pub fn tool_calls_text(&self) -> Cow<'_, str> {
        match &self.tool_calls {
            None => Cow::Borrowed(""),
            Some(Value::String(text)) => Cow::Borrowed(text),
            Some(other) => Cow::Owned(other.to_string()),
        }
    }
}

/// One stored tool call, read the same way everywhere: the three shapes agents write are
/// the flat `{id, name, arguments}`, LangChain's `{id, name, args, type: "tool_call"}`
/// and OpenAI's `{id, type: "function", function: {name, arguments}}`. Each part is
/// `None` where the call does not hold it as expected: stored data is the agent's, and an
/// odd shape must not stop a compaction.
#[derive(Clone, Copy, Debug)]
pub struct ToolCall<'a>(pub &'a Value);

impl<'a> ToolCall<'a> {
    /// The call's id: a top-level `id` string in every shape.
    pub fn id(self) -> Option<&'a str> {
        self.0.get("id").and_then(Value::as_str)
    }

    /// The tool's name: `name`, else OpenAI's `function.name`.
    pub fn name(self) -> Option<&'a str> {
        (self.0.get("name"))
            .or_else(|| self.0.get("function").and_then(|f| f.get("name")))
            .and_then(Value::as_str)
    }

    /// The arguments as text: LangChain's `args` object, the flat `arguments`, OpenAI's
    /// `function.arguments` string, in that order; a string as it is, any other JSON as
    /// its text.
    pub fn arguments(self) -> Option<Cow<'a, str>> {
        let args = (self.0.get("args"))
            .or_else(|| self.0.get("arguments"))
            .or_else(|| self.0.get("function").and_then(|f| f.get("arguments")))?;
        Some(match args {
            Value::String(text) => Cow::Borrowed(text),
            other => Cow::Owned(other.to_string()),
        })
    }
}

/// Characters as Postgres's `char_length` counts them (code points), so sizes computed
/// here agree with the generated `chars` column.
pub fn char_count(text: &str) -> i64 {
    i64::try_from(text.chars().count()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn calling(tool_calls: Value) -> Message {
        let mut m = Message::text(Role::Assistant, "");
        m.tool_calls = Some(tool_calls);
        m
    }

    fn ids(m: &Message) -> Vec<String> {
        m.tool_call_ids().into_iter().map(Cow::into_owned).collect()
    }

    #[test]
    fn ids_are_read_from_every_call_shape() {
        let m = calling(json!([
            {"id": "flat", "name": "get_logs", "arguments": "{}"},
            {"id": "langchain", "name": "get_logs", "args": {"service": "api"}, "type": "tool_call"},
            {"id": "openai", "type": "function",
             "function": {"name": "get_logs", "arguments": "{\"service\":\"api\"}"}}
        ]));
        assert_eq!(ids(&m), ["flat", "langchain", "openai"]);
    }

    #[test]
    fn names_and_arguments_are_read_from_every_call_shape() {
        let m = calling(json!([
            {"id": "flat", "name": "a", "arguments": "{\"x\":1}"},
            {"id": "langchain", "name": "b", "args": {"x": 2}, "type": "tool_call"},
            {"id": "openai", "type": "function", "function": {"name": "c", "arguments": "{}"}},
            {"id": "odd", "name": 7}
        ]));
        let calls = m.calls();
        let read: Vec<_> = (calls.iter().map(ToolCall))
            .map(|c| (c.name(), c.arguments().map(Cow::into_owned)))
            .collect();
        assert_eq!(
            read,
            [
                (Some("a"), Some("{\"x\":1}".to_owned())),
                (Some("b"), Some("{\"x\":2}".to_owned())),
                (Some("c"), Some("{}".to_owned())),
                (None, None),
            ]
        );
    }

    #[test]
    fn a_double_encoded_array_is_decoded() {
        let calls = json!([{"id": "c1", "name": "get_logs", "args": {}}]);
        let m = calling(Value::String(calls.to_string()));
        assert_eq!(ids(&m), ["c1"]);
        assert_eq!(m.calls().len(), 1);
    }

    #[test]
    fn other_shapes_hold_no_calls() {
        for odd in [
            json!({"id": "not in an array"}),
            json!("not json"),
            json!("{\"id\": \"an object, encoded\"}"),
            json!(42),
            Value::Null,
            json!([{"name": "no id"}, 42, null, {"id": 7}]),
        ] {
            assert!(ids(&calling(odd.clone())).is_empty(), "{odd}");
        }
        assert!(ids(&Message::text(Role::Assistant, "no calls")).is_empty());
    }
}
