//! A [`Summarizer`] over a [`Chat`] provider that sends the whole old part as ONE
//! request: the system prompt in force and the transcript, the answer capped at
//! [`MAX_TOKENS`]. It is the smallest bridge from a provider to the worker; chunking an
//! old part too large for one request is the chunking summarizer's, which replaces it.

use futures_util::future::{BoxFuture, FutureExt};

use super::chat::{Chat, ChatRequest};
use super::prompt::{self, Prompt};
use super::{LlmError, Summarizer, Summary};
use crate::message::Message;

/// The answer's room: the seed's template filled with specifics fits in far less, and a
/// provider that requires `max_tokens` (Anthropic) needs some number.
pub const MAX_TOKENS: u32 = 2048;

pub struct SingleRequest<C> {
    chat: C,
    prompt: Prompt,
}

impl<C: Chat> SingleRequest<C> {
    pub fn new(chat: C, prompt: Prompt) -> Self {
        Self { chat, prompt }
    }

    /// The request for `old`, after `context`.
    pub fn request(&self, context: &[Message], old: &[Message]) -> ChatRequest {
        ChatRequest {
            system: self.prompt.system().to_owned(),
            user: prompt::transcript_with_context(context, old),
            max_tokens: MAX_TOKENS,
            model: None,
        }
    }

    async fn summarize_with(
        &self,
        context: &[Message],
        old: &[Message],
    ) -> Result<Summary, LlmError> {
        let request = self.request(context, old);
        let mut summary = self.chat.complete(&request).await?;
        summary.prompt_version = Some(self.prompt.version().to_owned());
        Ok(summary)
    }
}

impl<C: Chat> Summarizer for SingleRequest<C> {
    fn summarize<'a>(&'a self, old: &'a [Message]) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.summarize_with(&[], old).boxed()
    }

    fn summarize_in_context<'a>(
        &'a self,
        context: &'a [Message],
        old: &'a [Message],
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.summarize_with(context, old).boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::message::Role;

    /// Records the request and answers a fixed summary.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<ChatRequest>>);

    impl Chat for Recorder {
        fn complete<'a>(
            &'a self,
            request: &'a ChatRequest,
        ) -> BoxFuture<'a, Result<Summary, LlmError>> {
            self.0.lock().unwrap().push(request.clone());
            futures_util::future::ready(Ok(Summary {
                text: "summary".into(),
                model: "m".into(),
                ..Summary::default()
            }))
            .boxed()
        }
    }

    #[tokio::test]
    async fn one_request_carries_the_prompt_the_context_and_the_old_part() {
        let text = format!("Summarize as:\n{}", crate::summary::TEMPLATE);
        let prompt = Prompt::from_file_text(text.clone()).unwrap();
        let single = SingleRequest::new(Recorder::default(), prompt.clone());
        let context = [Message::text(Role::System, "You are the checkout agent.")];
        let old = [Message::text(Role::User, "why 502?")];

        let summary = single.summarize_in_context(&context, &old).await.unwrap();

        assert_eq!(summary.prompt_version.as_deref(), Some(prompt.version()));
        let sent = single.chat.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].system, text);
        assert_eq!(sent[0].max_tokens, MAX_TOKENS);
        assert_eq!(sent[0].model, None);
        let user = &sent[0].user;
        let context_at = user.find("You are the checkout agent.").unwrap();
        assert!(context_at < user.find("why 502?").unwrap(), "{user}");
        assert!(user.contains("context only, do not summarize"), "{user}");
    }
}
