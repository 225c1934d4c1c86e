//! Typed settings, read once at start from an optional config file, the environment
//! and `.env`, and validated before anything connects.
//!
//! The setting names are the seed's flat, upper-case names (`SUMMARIZATION_THRESHOLD_CHARS`,
//! ...). A config file uses the same names as keys, in any case. The environment wins over
//! the file, and the file over the defaults. Every error names the setting it is about, so
//! `main` can print it and exit 64.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File};

/// A setting that is missing, unparsable, or inconsistent with another one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
    #[error("config file: {0}")]
    File(#[from] config::ConfigError),
}

impl ConfigError {
    fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            setting,
            message: message.into(),
        }
    }
}

/// A value that must never reach a log line or a `Debug` dump (API keys, passwords).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that sends it (an HTTP header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "\"[redacted]\""
        })
    }
}

/// Which summarizer writes the summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Built in, offline, deterministic: no key, no network.
    Extractive,
    /// Any OpenAI-compatible `/chat/completions` endpoint.
    OpenAi,
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "extractive" => Ok(Self::Extractive),
            "openai" => Ok(Self::OpenAi),
            other => Err(format!(
                "unknown provider {other:?}; expected \"extractive\" or \"openai\""
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}; expected \"text\" or \"json\""
            )),
        }
    }
}

/// When and how much to compact (DESIGN.md section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A session strictly larger than this many chars is compacted.
    pub threshold_chars: i64,
    /// The kept (newest) part holds at least this many chars.
    pub keep_chars: i64,
}

#[derive(Clone, Debug)]
pub struct LlmSettings {
    pub provider: Provider,
    pub base_url: String,
    pub model: String,
    pub api_key: Secret,
    /// One HTTP attempt, headers and body.
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
    pub retry_min_delay: Duration,
    pub retry_max_delay: Duration,
    /// The longest `Retry-After` we wait for; a longer one is cut to this.
    pub retry_after_cap: Duration,
    /// The whole summarization, every attempt and wait included.
    pub deadline: Duration,
}

/// How the worker authenticates to NATS and secures the connection. A user and password
/// may also sit in `NATS_URL` (`nats://user:password@host:4222`).
#[derive(Clone, Debug, Default)]
pub struct NatsAuth {
    pub user: Option<String>,
    pub password: Secret,
    pub token: Secret,
    /// A `.creds` file (JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// Extra root certificates (PEM) to trust for the server's certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM), for servers that verify clients.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_required: bool,
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub enabled: bool,
    pub limits: Limits,
    pub database_url: Secret,
    pub database_max_connections: u32,
    /// How long a query waits for a pooled connection before failing with `store_error`.
    pub database_acquire_timeout: Duration,
    pub nats_url: Secret,
    pub nats_auth: NatsAuth,
    pub subject: String,
    pub queue_group: String,
    pub concurrency: usize,
    /// `None` when `HTTP_ADDR` is empty: no HTTP listener.
    pub http_addr: Option<SocketAddr>,
    pub llm: LlmSettings,
    /// How long a session lease lasts before another worker may take it over.
    pub lease_duration: Duration,
    /// After an LLM failure a session waits this long before it is summarized again,
    /// doubling with each further failure up to `failure_backoff_max`. Zero: no backoff.
    pub failure_backoff: Duration,
    pub failure_backoff_max: Duration,
    /// How long SIGTERM waits for in-flight events before giving up on them.
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
}

/// Every setting with its default, in the order `.env.example` lists them.
pub const DEFAULTS: &[(&str, &str)] = &[
    ("SUMMARIZATION_ENABLED", "true"),
    ("SUMMARIZATION_THRESHOLD_CHARS", "60000"),
    ("SUMMARIZATION_KEEP_CHARS", "20000"),
    (
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/summarizer",
    ),
    ("DATABASE_MAX_CONNECTIONS", "10"),
    ("DATABASE_ACQUIRE_TIMEOUT_MS", "5000"),
    ("NATS_URL", "nats://127.0.0.1:4222"),
    ("NATS_USER", ""),
    ("NATS_PASSWORD", ""),
    ("NATS_TOKEN", ""),
    ("NATS_CREDS_FILE", ""),
    ("NATS_TLS_CA_FILE", ""),
    ("NATS_TLS_CERT_FILE", ""),
    ("NATS_TLS_KEY_FILE", ""),
    ("NATS_TLS_REQUIRED", "false"),
    ("NATS_SUBJECT", "summarizer.turn.starting"),
    ("NATS_QUEUE_GROUP", "summarizer-workers"),
    ("WORKER_CONCURRENCY", "32"),
    ("HTTP_ADDR", "127.0.0.1:8080"),
    ("LLM_PROVIDER", "extractive"),
    ("LLM_BASE_URL", "https://api.openai.com/v1"),
    ("LLM_MODEL", "gpt-4o-mini"),
    ("LLM_API_KEY", ""),
    ("LLM_TIMEOUT_MS", "30000"),
    ("LLM_MAX_RETRIES", "4"),
    ("LLM_RETRY_MIN_DELAY_MS", "500"),
    ("LLM_RETRY_MAX_DELAY_MS", "10000"),
    ("LLM_RETRY_AFTER_CAP_MS", "30000"),
    ("LLM_DEADLINE_MS", "90000"),
    ("LEASE_DURATION_MS", "120000"),
    ("FAILURE_BACKOFF_MS", "60000"),
    ("FAILURE_BACKOFF_MAX_MS", "900000"),
    ("SHUTDOWN_GRACE_MS", "30000"),
    ("LOG_FORMAT", "text"),
];

impl Settings {
    /// Reads the process environment (after `.env`) over `file`, over the defaults.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::from_sources(file, None)
    }

    /// Like [`Settings::load`], with `env` standing in for the process environment.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the file cannot be read or parsed,
    /// [`ConfigError::Invalid`] naming the first setting that is wrong.
    pub fn from_sources(
        file: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut builder = Config::builder();
        for (name, value) in DEFAULTS {
            builder = builder.set_default(name.to_ascii_lowercase(), *value)?;
        }
        if let Some(path) = file {
            // File keys are case-sensitive in `config`; the environment's are lowercased.
            // Lowercase the file's too, as defaults over the defaults, so the environment
            // still wins.
            let table: HashMap<String, config::Value> = Config::builder()
                .add_source(File::from(path).required(true))
                .build()?
                .try_deserialize()?;
            for (key, value) in table {
                builder = builder.set_default(key.to_ascii_lowercase(), value)?;
            }
        }
        let raw = builder
            .add_source(Environment::default().source(env))
            .build()?;
        Self::parse(&Raw(raw))
    }

    fn parse(raw: &Raw) -> Result<Self, ConfigError> {
        let get = |name| raw.get(name);
        let millis = |name| raw.millis(name);

        let limits = Limits {
            threshold_chars: raw.parse("SUMMARIZATION_THRESHOLD_CHARS")?,
            keep_chars: raw.parse("SUMMARIZATION_KEEP_CHARS")?,
        };
        positive("SUMMARIZATION_THRESHOLD_CHARS", limits.threshold_chars)?;
        positive("SUMMARIZATION_KEEP_CHARS", limits.keep_chars)?;
        if limits.keep_chars >= limits.threshold_chars {
            return Err(ConfigError::invalid(
                "SUMMARIZATION_KEEP_CHARS",
                format!(
                    "must be smaller than SUMMARIZATION_THRESHOLD_CHARS ({}), got {}",
                    limits.threshold_chars, limits.keep_chars
                ),
            ));
        }

        let http_addr = match get("HTTP_ADDR")?.trim() {
            "" => None,
            addr => Some(parse_value("HTTP_ADDR", addr)?),
        };

        let llm = LlmSettings {
            provider: raw.parse("LLM_PROVIDER")?,
            base_url: get("LLM_BASE_URL")?.trim().trim_end_matches('/').to_owned(),
            model: get("LLM_MODEL")?.trim().to_owned(),
            api_key: Secret::new(get("LLM_API_KEY")?.trim()),
            timeout: millis("LLM_TIMEOUT_MS")?,
            max_retries: raw.parse("LLM_MAX_RETRIES")?,
            retry_min_delay: millis("LLM_RETRY_MIN_DELAY_MS")?,
            retry_max_delay: millis("LLM_RETRY_MAX_DELAY_MS")?,
            retry_after_cap: millis("LLM_RETRY_AFTER_CAP_MS")?,
            deadline: millis("LLM_DEADLINE_MS")?,
        };
        if llm.provider == Provider::OpenAi {
            if llm.api_key.is_empty() {
                return Err(ConfigError::invalid(
                    "LLM_API_KEY",
                    "is required when LLM_PROVIDER=openai",
                ));
            }
            if !(llm.base_url.starts_with("http://") || llm.base_url.starts_with("https://")) {
                return Err(ConfigError::invalid(
                    "LLM_BASE_URL",
                    format!("must be an http(s) URL, got {:?}", llm.base_url),
                ));
            }
            non_empty("LLM_MODEL", &llm.model)?;
        }
        if llm.retry_max_delay < llm.retry_min_delay {
            return Err(ConfigError::invalid(
                "LLM_RETRY_MAX_DELAY_MS",
                "must not be smaller than LLM_RETRY_MIN_DELAY_MS",
            ));
        }

        let settings = Self {
            enabled: raw.parse("SUMMARIZATION_ENABLED")?,
            limits,
            database_url: Secret::new(get("DATABASE_URL")?.trim()),
            database_max_connections: raw.parse("DATABASE_MAX_CONNECTIONS")?,
            database_acquire_timeout: millis("DATABASE_ACQUIRE_TIMEOUT_MS")?,
            nats_url: Secret::new(get("NATS_URL")?.trim()),
            nats_auth: NatsAuth {
                user: optional(get("NATS_USER")?),
                password: Secret::new(get("NATS_PASSWORD")?.trim()),
                token: Secret::new(get("NATS_TOKEN")?.trim()),
                creds_file: optional(get("NATS_CREDS_FILE")?).map(PathBuf::from),
                tls_ca_file: optional(get("NATS_TLS_CA_FILE")?).map(PathBuf::from),
                tls_cert_file: optional(get("NATS_TLS_CERT_FILE")?).map(PathBuf::from),
                tls_key_file: optional(get("NATS_TLS_KEY_FILE")?).map(PathBuf::from),
                tls_required: raw.parse("NATS_TLS_REQUIRED")?,
            },
            subject: get("NATS_SUBJECT")?.trim().to_owned(),
            queue_group: get("NATS_QUEUE_GROUP")?.trim().to_owned(),
            concurrency: raw.parse("WORKER_CONCURRENCY")?,
            http_addr,
            lease_duration: millis("LEASE_DURATION_MS")?,
            failure_backoff: Duration::from_millis(raw.parse("FAILURE_BACKOFF_MS")?),
            failure_backoff_max: Duration::from_millis(raw.parse("FAILURE_BACKOFF_MAX_MS")?),
            shutdown_grace: millis("SHUTDOWN_GRACE_MS")?,
            log_format: raw.parse("LOG_FORMAT")?,
            llm,
        };
        positive(
            "DATABASE_MAX_CONNECTIONS",
            settings.database_max_connections,
        )?;
        positive("WORKER_CONCURRENCY", settings.concurrency)?;
        non_empty("DATABASE_URL", settings.database_url.expose())?;
        non_empty("NATS_URL", settings.nats_url.expose())?;
        non_empty("NATS_SUBJECT", &settings.subject)?;
        non_empty("NATS_QUEUE_GROUP", &settings.queue_group)?;
        let auth = &settings.nats_auth;
        if auth.user.is_some() == auth.password.is_empty() {
            return Err(ConfigError::invalid(
                "NATS_PASSWORD",
                "NATS_USER and NATS_PASSWORD go together",
            ));
        }
        if auth.tls_cert_file.is_some() != auth.tls_key_file.is_some() {
            return Err(ConfigError::invalid(
                "NATS_TLS_KEY_FILE",
                "NATS_TLS_CERT_FILE and NATS_TLS_KEY_FILE go together",
            ));
        }
        for (name, file) in [
            ("NATS_CREDS_FILE", &auth.creds_file),
            ("NATS_TLS_CA_FILE", &auth.tls_ca_file),
            ("NATS_TLS_CERT_FILE", &auth.tls_cert_file),
            ("NATS_TLS_KEY_FILE", &auth.tls_key_file),
        ] {
            if let Some(file) = file.as_ref().filter(|f| !f.is_file()) {
                return Err(ConfigError::invalid(
                    name,
                    format!("{} is not a readable file", file.display()),
                ));
            }
        }
        if settings.failure_backoff_max < settings.failure_backoff {
            return Err(ConfigError::invalid(
                "FAILURE_BACKOFF_MAX_MS",
                "must not be smaller than FAILURE_BACKOFF_MS",
            ));
        }
        Ok(settings)
    }

    /// The effective configuration as `key=value` pairs for the start-up log line, with
    /// the API key and any password in `DATABASE_URL` / `NATS_URL` redacted.
    pub fn redacted(&self) -> String {
        format!(
            "enabled={} threshold_chars={} keep_chars={} database_url={} \
             database_max_connections={} nats_url={} subject={} queue_group={} concurrency={} \
             http_addr={} llm_provider={:?} llm_base_url={} llm_model={} llm_api_key={:?} \
             llm_timeout_ms={} llm_max_retries={} llm_deadline_ms={} lease_duration_ms={} \
             shutdown_grace_ms={} log_format={:?} nats_user={:?} nats_password={:?} nats_token={:?} \
             nats_creds_file={:?} nats_tls_required={} failure_backoff_ms={} \
             failure_backoff_max_ms={} database_acquire_timeout_ms={}",
            self.enabled,
            self.limits.threshold_chars,
            self.limits.keep_chars,
            redact_url(self.database_url.expose()),
            self.database_max_connections,
            redact_url(self.nats_url.expose()),
            self.subject,
            self.queue_group,
            self.concurrency,
            self.http_addr
                .map_or_else(|| "off".to_owned(), |a| a.to_string()),
            self.llm.provider,
            self.llm.base_url,
            self.llm.model,
            self.llm.api_key,
            self.llm.timeout.as_millis(),
            self.llm.max_retries,
            self.llm.deadline.as_millis(),
            self.lease_duration.as_millis(),
            self.shutdown_grace.as_millis(),
            self.log_format,
            self.nats_auth.user,
            self.nats_auth.password,
            self.nats_auth.token,
            self.nats_auth.creds_file,
            self.nats_auth.tls_required,
            self.failure_backoff.as_millis(),
            self.failure_backoff_max.as_millis(),
            self.database_acquire_timeout.as_millis(),
        )
    }
}

/// The merged sources, read one setting at a time so each error names its setting.
struct Raw(Config);

impl Raw {
    fn get(&self, name: &'static str) -> Result<String, ConfigError> {
        self.0
            .get_string(&name.to_ascii_lowercase())
            .map_err(|e| ConfigError::invalid(name, e.to_string()))
    }

    fn parse<T: FromStr>(&self, name: &'static str) -> Result<T, ConfigError>
    where
        T::Err: fmt::Display,
    {
        parse_value(name, &self.get(name)?)
    }

    fn millis(&self, name: &'static str) -> Result<Duration, ConfigError> {
        let ms: u64 = self.parse(name)?;
        positive(name, ms)?;
        Ok(Duration::from_millis(ms))
    }
}

/// `scheme://user:password@host/...` with the password replaced.
pub fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some(info) if info.password.is_some() => {
            format!("{}://{}:[redacted]{}", info.scheme, info.user, info.rest)
        }
        _ => url.to_owned(),
    }
}

/// The user and password in `scheme://user:password@host`, as written (not
/// percent-decoded).
pub fn url_credentials(url: &str) -> Option<(&str, &str)> {
    let info = userinfo(url)?;
    Some((info.user, info.password?))
}

struct UserInfo<'a> {
    scheme: &'a str,
    user: &'a str,
    password: Option<&'a str>,
    /// From the `@` on.
    rest: &'a str,
}

fn userinfo(url: &str) -> Option<UserInfo<'_>> {
    let (scheme, after) = url.split_once("://")?;
    let authority_end = after.find('/').unwrap_or(after.len());
    let at = after[..authority_end].rfind('@')?;
    let (user, password) = match after[..at].split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (&after[..at], None),
    };
    Some(UserInfo {
        scheme,
        user,
        password,
        rest: &after[at..],
    })
}

fn parse_value<T: FromStr>(name: &'static str, raw: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    raw.trim()
        .parse()
        .map_err(|e| ConfigError::invalid(name, format!("cannot parse {raw:?}: {e}")))
}

fn positive<T: PartialOrd + Default + fmt::Display>(
    name: &'static str,
    value: T,
) -> Result<(), ConfigError> {
    if value > T::default() {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            name,
            format!("must be greater than zero, got {value}"),
        ))
    }
}

/// `None` for an empty (unset) value.
fn optional(value: String) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

fn non_empty(name: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        Err(ConfigError::invalid(name, "must not be empty"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_sources(None, Some(env))
    }

    fn setting_of(err: ConfigError) -> &'static str {
        match err {
            ConfigError::Invalid { setting, .. } => setting,
            ConfigError::File(e) => panic!("expected an invalid setting, got {e}"),
        }
    }

    #[test]
    fn defaults_are_the_seeds() {
        let s = load(&[]).unwrap();
        assert!(s.enabled);
        assert_eq!(s.limits.threshold_chars, 60_000);
        assert_eq!(s.limits.keep_chars, 20_000);
        assert_eq!(s.llm.provider, Provider::Extractive);
        assert_eq!(s.subject, "summarizer.turn.starting");
        assert_eq!(s.queue_group, "summarizer-workers");
        assert_eq!(
            s.database_url.expose(),
            "postgres://postgres@127.0.0.1:5432/summarizer"
        );
    }

    #[test]
    fn environment_overrides_defaults() {
        let s = load(&[
            ("SUMMARIZATION_ENABLED", "false"),
            ("SUMMARIZATION_THRESHOLD_CHARS", "5000"),
            ("SUMMARIZATION_KEEP_CHARS", "1000"),
            ("WORKER_CONCURRENCY", "7"),
            ("HTTP_ADDR", ""),
        ])
        .unwrap();
        assert!(!s.enabled);
        assert_eq!(
            s.limits,
            Limits {
                threshold_chars: 5000,
                keep_chars: 1000
            }
        );
        assert_eq!(s.concurrency, 7);
        assert_eq!(s.http_addr, None);
    }

    #[test]
    fn invalid_values_name_their_setting() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("SUMMARIZATION_KEEP_CHARS", "60000")],
                "SUMMARIZATION_KEEP_CHARS",
            ),
            (&[("WORKER_CONCURRENCY", "0")], "WORKER_CONCURRENCY"),
            (
                &[("SUMMARIZATION_THRESHOLD_CHARS", "lots")],
                "SUMMARIZATION_THRESHOLD_CHARS",
            ),
            (&[("LLM_PROVIDER", "magic")], "LLM_PROVIDER"),
            (&[("LLM_PROVIDER", "openai")], "LLM_API_KEY"),
            (
                &[("SUMMARIZATION_ENABLED", "maybe")],
                "SUMMARIZATION_ENABLED",
            ),
            (&[("HTTP_ADDR", "nowhere")], "HTTP_ADDR"),
            (&[("NATS_USER", "bot")], "NATS_PASSWORD"),
            (
                &[("NATS_CREDS_FILE", "/nonexistent.creds")],
                "NATS_CREDS_FILE",
            ),
            (&[("FAILURE_BACKOFF_MS", "-1")], "FAILURE_BACKOFF_MS"),
        ];
        for (env, setting) in cases {
            let err = load(env).expect_err(setting);
            assert_eq!(setting_of(err), *setting, "for {env:?}");
        }
    }

    #[test]
    fn config_file_is_read_under_the_environment() {
        let dir = std::env::temp_dir().join(format!("summarizer-config-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("summarizer.toml");
        std::fs::write(
            &path,
            "SUMMARIZATION_THRESHOLD_CHARS = 9000\nsummarization_keep_chars = 3000\nWORKER_CONCURRENCY = 4\n",
        )
        .unwrap();
        let env = HashMap::from([("WORKER_CONCURRENCY".to_owned(), "5".to_owned())]);
        let s = Settings::from_sources(Some(&path), Some(env)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            s.limits,
            Limits {
                threshold_chars: 9000,
                keep_chars: 3000
            }
        );
        assert_eq!(s.concurrency, 5);
    }

    #[test]
    fn credentials_are_read_from_and_redacted_in_urls() {
        let url = "nats://bot:p%40ss@nats.internal:4222/x@y";
        assert_eq!(url_credentials(url), Some(("bot", "p%40ss")));
        assert_eq!(
            redact_url(url),
            "nats://bot:[redacted]@nats.internal:4222/x@y"
        );
        assert_eq!(url_credentials("nats://bot@nats:4222"), None);
        assert_eq!(redact_url("nats://nats:4222"), "nats://nats:4222");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn env_example_lists_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.env.example");
        let listed: HashMap<String, String> = dotenvy::from_path_iter(path)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (name, default) in DEFAULTS {
            assert_eq!(
                listed.get(*name).map(String::as_str),
                Some(*default),
                "{name}"
            );
        }
        assert_eq!(
            listed.len(),
            DEFAULTS.len(),
            "no setting listed that does not exist"
        );
    }

    #[test]
    fn secrets_do_not_reach_debug_or_the_config_log_line() {
        let s = load(&[
            ("LLM_PROVIDER", "openai"),
            ("LLM_API_KEY", "sk-very-secret"),
            ("DATABASE_URL", "postgres://app:hunter2@db:5432/summarizer"),
            ("NATS_URL", "nats://bot:natspass@nats:4222"),
            ("NATS_USER", "bot"),
            ("NATS_PASSWORD", "other-nats-pass"),
            ("NATS_TOKEN", "nats-token-value"),
        ])
        .unwrap();
        for text in [format!("{s:?}"), s.redacted()] {
            assert!(!text.contains("sk-very-secret"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(!text.contains("natspass"), "{text}");
            assert!(!text.contains("other-nats-pass"), "{text}");
            assert!(!text.contains("nats-token-value"), "{text}");
        }
        assert!(
            s.redacted()
                .contains("postgres://app:[redacted]@db:5432/summarizer")
        );
    }
}
