//! Logging: `tracing` with an env filter (`RUST_LOG`, default `info`), as readable text
//! for people or JSON lines for production (`LOG_FORMAT`).
//!
//! Every line passes through one writer on its way to stderr, whoever formatted it (our
//! code, sqlx, async-nats): it replaces the settings' secret values, should a library
//! print one.

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, REDACTED};

/// Installs the global subscriber; logs go to stderr so that command output on stdout
/// stays parseable. `secrets` (see `Settings::secret_values`) never reach a log line.
/// A second call (tests) is a no-op.
pub fn init(format: LogFormat, secrets: Vec<String>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let writer = SafeStderr {
        secrets: secrets_longest_first(secrets),
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
}

impl SafeStderr {
    fn clean(&self, line: &str) -> String {
        let mut line = line.to_owned();
        for secret in self.secrets.iter() {
            if line.contains(secret.as_str()) {
                line = line.replace(secret.as_str(), REDACTED);
            }
        }
        line
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

    #[test]
    fn no_secret_reaches_a_line_whoever_formatted_it() {
        let writer = SafeStderr {
            secrets: secrets_longest_first(
                ["hunter2", "hunter22", "INFO"].map(String::from).to_vec(),
            ),
        };
        let line = "INFO url=ServerAddr(password: Some(\"hunter22\")) pw=hunter2\n";
        assert_eq!(
            writer.clean(line),
            "INFO url=ServerAddr(password: Some(\"[redacted]\")) pw=[redacted]\n"
        );
    }
}
