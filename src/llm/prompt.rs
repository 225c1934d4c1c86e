//! The prompt sent to an LLM: the seed's template and a transcript in which roles and
//! tool calls cannot be mistaken for each other.

use std::fmt::Write;

use serde_json::Value;

use crate::message::{Message, Role, call_id};
use crate::summary::TEMPLATE;

pub fn system_prompt() -> String {
    format!(
        "You compress the earlier part of a conversation between a person and an AI agent \
         investigating an incident, so that the agent can go on without the original \
         messages.\n\
         Reply with exactly this template and nothing else:\n\n{TEMPLATE}\n\n\
         Keep the specifics: numbers, service and host names, timestamps, error messages, \
         commands or queries run and what they returned. If the transcript starts with an \
         [earlier summary], fold everything it says into the new summary. Be brief: the \
         summary must be much shorter than the transcript."
    )
}

/// The old part as one text: each message under a bracketed header naming its role, each
/// tool call and each tool result under a header naming its call id.
pub fn transcript(old: &[Message]) -> String {
    transcript_of(old.iter().map(message))
}

/// A transcript of messages already rendered with [`message`] (and perhaps clipped): what
/// a chunk of a long old part is sent as.
pub fn transcript_of<S: AsRef<str>>(rendered: impl IntoIterator<Item = S>) -> String {
    let mut out = String::from(TRANSCRIPT_HEADER);
    for m in rendered {
        out.push_str(m.as_ref());
    }
    out
}

/// What [`transcript_of`] puts before the messages.
pub const TRANSCRIPT_HEADER: &str = "Transcript, oldest first:\n";

/// One message of the transcript, its header first.
pub fn message(m: &Message) -> String {
    let header = match (m.role, m.is_summary) {
        (Role::User, true) => "[earlier summary]".to_owned(),
        (Role::Tool, _) => format!(
            "[tool result for call {}]",
            m.tool_call_id.as_deref().unwrap_or("(unknown)")
        ),
        (role, _) => format!("[{role}]"),
    };
    let mut out = format!("\n{header}\n");
    if !m.content.trim().is_empty() {
        out.push_str(m.content.trim());
        out.push('\n');
    }
    for call in m.calls().iter() {
        let (name, arguments) = call_parts(call);
        let id = call_id(call).unwrap_or("(no id)");
        // Writing to a String cannot fail.
        let _ = writeln!(out, "[assistant calls tool {name}, call {id}] {arguments}");
    }
    out
}

/// The running summary of a long old part's earlier chunks, rendered as the earlier
/// summary the system prompt tells the model to fold in.
pub fn running_summary(text: &str) -> String {
    message(&Message {
        seq: 0,
        role: Role::User,
        content: text.to_owned(),
        tool_calls: None,
        tool_call_id: None,
        is_summary: true,
        chars: 0,
    })
}

/// A call's name and arguments, in the flat shape (`{id, name, arguments}`), LangChain's
/// (`{id, name, args: {...}}`) or OpenAI's (`{id, type, function: {name, arguments}}`).
/// Arguments are a JSON text in some shapes and an object in others; both render as JSON.
pub fn call_parts(call: &Value) -> (&str, String) {
    let function = call.get("function").unwrap_or(call);
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)");
    let arguments = function.get("arguments").or_else(|| function.get("args"));
    let arguments = match arguments {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    (name, arguments)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn msg(role: Role, content: &str) -> Message {
        Message::text(role, content)
    }

    #[test]
    fn roles_calls_and_results_are_labelled() {
        let mut summary = msg(Role::User, "**Investigating:** earlier");
        summary.is_summary = true;
        let mut call = msg(Role::Assistant, "Checking logs.");
        call.tool_calls = Some(json!([
            {"id": "c1", "name": "get_logs", "arguments": {"service": "checkout"}},
            {"id": "c2", "function": {"name": "get_metrics", "arguments": "{\"q\":\"p99\"}"}}
        ]));
        let mut result = msg(Role::Tool, "ERROR pool exhausted");
        result.tool_call_id = Some("c1".into());
        let text = transcript(&[summary, msg(Role::User, "why 502?"), call, result]);
        assert!(text.contains("[earlier summary]\n**Investigating:** earlier"));
        assert!(text.contains("[user]\nwhy 502?"));
        assert!(
            text.contains("[assistant calls tool get_logs, call c1] {\"service\":\"checkout\"}")
        );
        assert!(text.contains("[assistant calls tool get_metrics, call c2] {\"q\":\"p99\"}"));
        assert!(text.contains("[tool result for call c1]\nERROR pool exhausted"));
    }

    #[test]
    fn every_call_shape_is_rendered_with_its_arguments() {
        let mut call = msg(Role::Assistant, "");
        call.tool_calls = Some(json!([
            {"id": "lc", "name": "get_logs", "args": {"service": "checkout"}, "type": "tool_call"},
            {"id": "oa", "type": "function",
             "function": {"name": "get_metrics", "arguments": "{\"q\":\"p99\"}"}},
            {"id": "flat", "name": "restart", "arguments": "{}"}
        ]));
        let mut legacy = msg(Role::Assistant, "");
        let double_encoded = json!([{"id": "old", "name": "get_logs", "args": {"n": 1}}]);
        legacy.tool_calls = Some(Value::String(double_encoded.to_string()));

        let text = transcript(&[call, legacy]);

        assert!(
            text.contains("[assistant calls tool get_logs, call lc] {\"service\":\"checkout\"}"),
            "{text}"
        );
        assert!(text.contains("[assistant calls tool get_metrics, call oa] {\"q\":\"p99\"}"));
        assert!(text.contains("[assistant calls tool restart, call flat] {}"));
        assert!(
            text.contains("[assistant calls tool get_logs, call old] {\"n\":1}"),
            "{text}"
        );
    }
}
