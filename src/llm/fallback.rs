//! `LLM_FALLBACK=extractive`: when the LLM cannot summarize (its error after retries, or
//! a summary that fails [`summary::accept`]), the extractive summarizer compacts instead,
//! so a session whose LLM is down cannot overflow its agent's context. The summary says
//! so ([`Summary::fallback_reason`]), and the usage event with it.
//!
//! A summary that fails the check falls back too: the worker would reject it, and the
//! session would grow exactly as it does when the LLM is down.

use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt};

use crate::extractive::Extractive;
use crate::metrics::Metrics;
use crate::summarizer::{LlmError, Summarizer, SummaryRequest};
use crate::summary;
use crate::summary::Summary;

pub struct Fallback {
    llm: Box<dyn Summarizer>,
    metrics: Arc<Metrics>,
    /// `SUMMARY_MAX_CHARS`: an LLM summary longer than this would be rejected.
    max_chars: i64,
}

impl Fallback {
    pub fn new(llm: Box<dyn Summarizer>, metrics: Arc<Metrics>, max_chars: usize) -> Self {
        Self {
            llm,
            metrics,
            max_chars: i64::try_from(max_chars).unwrap_or(i64::MAX),
        }
    }

    async fn summarize_with(&self, request: SummaryRequest<'_>) -> Result<Summary, LlmError> {
        // The LLM's answers that came to nothing were paid for all the same: the
        // request's meter counted them.
        let reason = match self.llm.summarize(request).await {
            Ok(summary) => {
                let replaced: i64 = request.old.iter().map(|m| m.chars).sum();
                match summary::accept(&summary.text, replaced, self.max_chars) {
                    Ok(_) => return Ok(summary),
                    Err(rejected) => {
                        self.metrics.llm_failed("invalid_summary");
                        rejected.to_string()
                    }
                }
            }
            Err(e) => {
                self.metrics.llm_failed(e.metric_cause());
                e.to_string()
            }
        };
        tracing::warn!(
            error = %reason,
            "LLM summarization failed, compacting with the extractive summarizer"
        );
        let extractive = SummaryRequest {
            model: None,
            ..request
        };
        let mut summary = Extractive::new(self.max_chars as usize)
            .summarize(extractive)
            .await?;
        summary.fallback_reason = Some(reason);
        Ok(summary)
    }
}

impl Summarizer for Fallback {
    /// A second attempt is the LLM's own, with no fallback: it is asked only when the
    /// LLM wrote the first summary, which stays if this fails.
    fn summarize<'a>(
        &'a self,
        request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        if request.missing.is_empty() {
            self.summarize_with(request).boxed()
        } else {
            self.llm.summarize(request)
        }
    }

    fn can_do_better(&self, model: Option<&str>) -> bool {
        self.llm.can_do_better(model)
    }

    fn retried(&self, model: Option<&str>, improved: bool) {
        self.llm.retried(model, improved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::MissingFact;
    use crate::message::{Message, Role};

    struct Answers(Result<Summary, fn() -> LlmError>);

    impl Summarizer for Answers {
        fn summarize<'a>(
            &'a self,
            _request: SummaryRequest<'a>,
        ) -> BoxFuture<'a, Result<Summary, LlmError>> {
            futures_util::future::ready(self.0.clone().map_err(|e| e())).boxed()
        }
    }

    fn old() -> Vec<Message> {
        let ask = "Why does checkout-api return 502 since 14:01? ".repeat(20);
        let found = "ERROR orders-db pool exhausted at 14:02, 100/100 connections. ".repeat(20);
        vec![
            Message::text(Role::User, &ask),
            Message::text(Role::Assistant, &found),
        ]
    }

    fn fallback(answer: Result<Summary, fn() -> LlmError>) -> Fallback {
        Fallback::new(
            Box::new(Answers(answer)),
            Arc::new(Metrics::default()),
            6_000,
        )
    }

    #[tokio::test]
    async fn an_llm_error_is_replaced_by_an_extractive_summary_that_says_why() {
        let down = || LlmError::Transient {
            cause: "HTTP 503: upstream down".into(),
            retry_after: None,
        };
        let summary = fallback(Err(down))
            .summarize(SummaryRequest::of(&old()))
            .await
            .unwrap();
        assert_eq!(summary.model, "extractive");
        assert_eq!(
            summary.fallback_reason.as_deref(),
            Some("HTTP 503: upstream down")
        );
        assert!(
            summary::accept(&summary.text, 10_000, 6_000).is_ok(),
            "{}",
            summary.text
        );
    }

    #[tokio::test]
    async fn a_summary_the_check_would_reject_is_replaced_too() {
        let unusable = Summary {
            text: "The pool was full.".into(),
            model: "m".into(),
            ..Summary::default()
        };
        let summary = fallback(Ok(unusable))
            .summarize(SummaryRequest::of(&old()))
            .await
            .unwrap();
        assert_eq!(summary.model, "extractive");
        let reason = summary.fallback_reason.unwrap();
        assert!(
            reason.contains("an acknowledgement, not a summary"),
            "{reason}"
        );
    }

    /// An LLM whose second attempts fail.
    struct FailsAgain;

    impl Summarizer for FailsAgain {
        fn summarize<'a>(
            &'a self,
            request: SummaryRequest<'a>,
        ) -> BoxFuture<'a, Result<Summary, LlmError>> {
            let values: Vec<&str> = request.missing.iter().map(|f| f.value.as_str()).collect();
            let error = LlmError::Invalid(format!("asked to keep {}", values.join(", ")));
            futures_util::future::ready(Err(error)).boxed()
        }

        fn can_do_better(&self, _model: Option<&str>) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_second_attempt_is_the_llms_own_and_does_not_fall_back() {
        let missing = [MissingFact {
            value: "orders-db".to_owned(),
            said: "orders-db is at max_connections".to_owned(),
        }];
        let over_llm = Fallback::new(Box::new(FailsAgain), Arc::new(Metrics::default()), 6_000);

        let old = old();
        assert!(over_llm.can_do_better(None));
        let again = over_llm
            .summarize(SummaryRequest::of(&old).again(&missing))
            .await;

        let error = again.expect_err("no extractive summary stands in");
        assert_eq!(
            error.to_string(),
            "invalid response: asked to keep orders-db"
        );
        let unable = fallback(Err(|| LlmError::Invalid("down".into())));
        assert!(!unable.can_do_better(None));
    }

    #[tokio::test]
    async fn a_good_llm_summary_is_kept_as_it_is() {
        let good = Summary {
            text: "**Investigating:** 502s\n**Key findings:**\n- pool 100/100\n**Ruled out:** DNS\n**Current state:** raising the pool".into(),
            model: "m".into(),
            prompt_version: Some("default-v2".into()),
            ..Summary::default()
        };
        let summary = fallback(Ok(good.clone()))
            .summarize(SummaryRequest::of(&old()))
            .await
            .unwrap();
        assert_eq!(summary, good);
    }
}
