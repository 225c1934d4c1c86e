//! The session data model, as the public `messages` table holds it.

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
    /// On `assistant`: `[{id, name, arguments}]`, stored as the agent wrote it.
    pub tool_calls: Option<Value>,
    /// On `tool`: the call it answers.
    pub tool_call_id: Option<String>,
    pub is_summary: bool,
    /// Computed by the database; the one definition of a message's size.
    pub chars: i64,
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
        }
    }

    /// The ids of the tool calls this message makes. Entries without a string `id` are
    /// skipped: stored data is the agent's, and odd shapes must not stop a compaction.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.tool_calls
            .as_ref()
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|call| call.get("id").and_then(Value::as_str))
    }
}

/// Characters as Postgres's `char_length` counts them (code points), so sizes computed
/// here agree with the generated `chars` column.
pub fn char_count(text: &str) -> i64 {
    i64::try_from(text.chars().count()).unwrap_or(i64::MAX)
}
