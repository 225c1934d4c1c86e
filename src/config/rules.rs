//! Every rule that ties two or more settings together, in one place. Single values are
//! checked where their section reads them ([`super::sections`]).

use super::table::*;
use super::{ConfigError, Provider, Settings, redact_url};

impl Settings {
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting to change.
    pub(super) fn check_rules(&self) -> Result<(), ConfigError> {
        let fail =
            |setting: &Setting, message: String| Err(ConfigError::invalid(setting.name, message));
        if self.limits.keep_chars >= self.limits.threshold_chars {
            return fail(
                &SUMMARIZATION_KEEP_CHARS,
                format!(
                    "must be smaller than SUMMARIZATION_THRESHOLD_CHARS ({}), got {}",
                    self.limits.threshold_chars, self.limits.keep_chars
                ),
            );
        }
        self.check_bounds()?;
        let llm = &self.llm;
        if llm.provider != Provider::Extractive {
            let provider = llm.provider.as_str();
            if llm.api_key.is_empty() {
                return fail(
                    &LLM_API_KEY,
                    format!("is required when LLM_PROVIDER={provider}"),
                );
            }
            let http = url::Url::parse(&llm.base_url)
                .is_ok_and(|url| matches!(url.scheme(), "http" | "https"));
            if !http {
                // Printed before anything else is: redacted like every other URL.
                let got = redact_url(&llm.base_url);
                return fail(&LLM_BASE_URL, format!("must be an http(s) URL, got {got}"));
            }
        }
        if llm.retry_max_delay < llm.retry_min_delay {
            return fail(
                &LLM_RETRY_MAX_DELAY_MS,
                "must not be smaller than LLM_RETRY_MIN_DELAY_MS".into(),
            );
        }
        // A request holds the prompt (a few hundred tokens), the running summary (up to
        // the summary's own budget) and a chunk of the transcript, which should have at
        // least as much room again: below this, chunks would be slivers.
        let least = 2 * llm.summary_max_tokens() as usize + 1024;
        if llm.max_input_tokens < least {
            return fail(
                &LLM_MAX_INPUT_TOKENS,
                format!(
                    "must be at least {least} (twice SUMMARY_MAX_CHARS / 3, plus 1024 for the \
                     prompt), got {}",
                    llm.max_input_tokens
                ),
            );
        }
        let auth = &self.nats_auth;
        if auth.user.is_some() == auth.password.is_empty() {
            return fail(
                &NATS_PASSWORD,
                "NATS_USER and NATS_PASSWORD go together".into(),
            );
        }
        if auth.tls_cert_file.is_some() != auth.tls_key_file.is_some() {
            return fail(
                &NATS_TLS_KEY_FILE,
                "NATS_TLS_CERT_FILE and NATS_TLS_KEY_FILE go together".into(),
            );
        }
        // A stream on the request subject would answer every request with its publish ack.
        if self.jobs.transport.serves_jobs()
            && summarizer_client::jobs::subjects_overlap(
                &self.jobs.stream_subjects(),
                &self.subject,
            )
        {
            return fail(
                &JETSTREAM_SUBJECT_PREFIX,
                format!(
                    "the job stream's subjects {} overlap NATS_SUBJECT ({}): the stream would \
                     answer requests with its publish acks; choose a prefix apart from it",
                    self.jobs.stream_subjects(),
                    self.subject
                ),
            );
        }
        // Turns and recalls are told apart by subject: a subject both match (one subject
        // for both, or a wildcard) would send a recall to the turn handler (rejected) and a
        // turn to the recall handler.
        if summarizer_client::jobs::subjects_overlap(&self.recall_subject, &self.subject) {
            return fail(
                &NATS_RECALL_SUBJECT,
                format!(
                    "overlaps NATS_SUBJECT ({}): a subject matching both would reach both \
                     handlers; choose one apart from it",
                    self.subject
                ),
            );
        }
        if self.jobs.transport.serves_jobs()
            && summarizer_client::jobs::subjects_overlap(
                &self.jobs.stream_subjects(),
                &self.recall_subject,
            )
        {
            return fail(
                &JETSTREAM_SUBJECT_PREFIX,
                format!(
                    "the job stream's subjects {} overlap NATS_RECALL_SUBJECT ({}): the stream \
                     would answer recalls with its publish acks; choose a prefix apart from it",
                    self.jobs.stream_subjects(),
                    self.recall_subject
                ),
            );
        }
        if self.failure_backoff_max < self.failure_backoff {
            return fail(
                &FAILURE_BACKOFF_MAX_MS,
                "must not be smaller than FAILURE_BACKOFF_MS".into(),
            );
        }
        Ok(())
    }

    /// The bounds must leave room for at least one pair of limits with keep < threshold.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        let b = &self.bounds;
        let rules = [
            (
                b.max_threshold_chars < b.min_threshold_chars,
                &SUMMARIZATION_MAX_THRESHOLD_CHARS,
                "SUMMARIZATION_MIN_THRESHOLD_CHARS",
                b.min_threshold_chars,
            ),
            (
                b.max_keep_chars < b.min_keep_chars,
                &SUMMARIZATION_MAX_KEEP_CHARS,
                "SUMMARIZATION_MIN_KEEP_CHARS",
                b.min_keep_chars,
            ),
        ];
        for (broken, setting, other, value) in rules {
            if broken {
                return Err(ConfigError::invalid(
                    setting.name,
                    format!("must not be smaller than {other} ({value})"),
                ));
            }
        }
        if b.min_keep_chars >= b.min_threshold_chars {
            return Err(ConfigError::invalid(
                SUMMARIZATION_MIN_KEEP_CHARS.name,
                format!(
                    "must be smaller than SUMMARIZATION_MIN_THRESHOLD_CHARS ({}), got {}",
                    b.min_threshold_chars, b.min_keep_chars
                ),
            ));
        }
        Ok(())
    }
}
