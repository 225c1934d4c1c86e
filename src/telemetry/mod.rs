//! Logging: `tracing` with an env filter (`RUST_LOG`, default `info`), as readable text
//! for people or JSON lines for production (`LOG_FORMAT`).
//!
//! Every line passes through one writer on its way to stderr, whoever formatted it (our
//! code, sqlx, async-nats): it replaces the settings' secret values, should a library
//! print one, and in text logs escapes what could forge or disguise a line (line
//! breaks, control and bidi characters in client text such as session ids). JSON lines
//! need no escaping: their strings are quoted.

mod escape;
mod limit;

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, REDACTED};

pub use escape::{Escaped, needs_escape};
pub use limit::{
    REJECTED_WARNING_INTERVAL, REJECTED_WARNINGS_PER_INTERVAL, Verdict, WarningLimit,
    warn_rejected_request,
};

/// Installs the global subscriber; logs go to stderr so that command output on stdout
/// stays parseable. `secrets` (see `Settings::secret_values`) never reach a log line.
/// A second call (tests) is a no-op.
pub fn init(format: LogFormat, secrets: Vec<String>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let writer = SafeStderr {
        secrets: secrets_longest_first(secrets),
        escape: format == LogFormat::Text,
        ansi,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || writer.clone())
        .with_ansi(ansi);
    let _already_set = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Shorter secrets are not scrubbed from library output: a two-letter password would
/// blank out every occurrence of those letters and leave the log unreadable. Our own
/// output redacts them all the same (URLs through `redact_url`, secrets by their type).
pub const MIN_SCRUBBED_CHARS: usize = 6;

/// Longest first, so that a secret containing another is replaced whole.
fn secrets_longest_first(mut secrets: Vec<String>) -> Arc<[String]> {
    secrets.retain(|s| s.chars().count() >= MIN_SCRUBBED_CHARS);
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.into()
}

/// Stderr, one formatted event per `write` call (tracing-subscriber formats an event
/// into a buffer and writes it with one `write_all`, which our `write` takes whole).
#[derive(Clone)]
struct SafeStderr {
    secrets: Arc<[String]>,
    escape: bool,
    /// The formatter colours its own output with ESC sequences (and escapes ESC in
    /// fields and messages itself), so ESC is left alone then.
    ansi: bool,
}

impl SafeStderr {
    fn clean(&self, line: &str) -> String {
        let mut line = line.to_owned();
        for secret in self.secrets.iter() {
            if line.contains(secret.as_str()) {
                line = line.replace(secret.as_str(), REDACTED);
            }
        }
        if !self.escape {
            return line;
        }
        // The event's own line break stays; any other is escaped.
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line.as_str(), ""),
        };
        let escaped = Escaped::new(body);
        let escaped = if self.ansi {
            escaped.keeping_esc()
        } else {
            escaped
        };
        format!("{escaped}{end}")
    }
}

impl Write for SafeStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        io::stderr()
            .lock()
            .write_all(self.clean(&line).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(secrets: &[&str], escape: bool) -> SafeStderr {
        SafeStderr {
            secrets: secrets_longest_first(secrets.iter().map(|s| (*s).to_owned()).collect()),
            escape,
            ansi: false,
        }
    }

    #[test]
    fn a_text_line_stays_one_line_and_shows_no_secret() {
        let line = "INFO event{session_id=a\u{2028}b\nc\u{202e}d}: pw=hunter2 and hunter22\n";
        assert_eq!(
            writer(&["hunter2", "hunter22", "INFO"], true).clean(line),
            "INFO event{session_id=a\\u{2028}b\\nc\\u{202e}d}: pw=[redacted] and [redacted]\n"
        );
    }

    #[test]
    fn json_lines_are_scrubbed_but_not_escaped() {
        let line = "{\"session_id\":\"a\u{2028}b\",\"url\":\"x:hunter2@h\"}\n";
        assert_eq!(
            writer(&["hunter2"], false).clean(line),
            "{\"session_id\":\"a\u{2028}b\",\"url\":\"x:[redacted]@h\"}\n"
        );
    }
}
