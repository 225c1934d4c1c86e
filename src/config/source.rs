//! The merged sources (defaults from the table, then an optional file, then the
//! environment), read one setting at a time so that every error names its setting.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File};

use super::ConfigError;
use super::table::{RENAMED, SETTINGS, Setting};

pub struct Raw {
    merged: Config,
    /// One warning per old name in use (see [`RENAMED`]).
    deprecated: Vec<String>,
}

impl Raw {
    /// Defaults under `file` under `env` (the process environment when `None`).
    pub fn merge(
        file: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut deprecated = Vec::new();
        let mut builder = Config::builder();
        for setting in SETTINGS {
            builder = builder.set_default(setting.name.to_ascii_lowercase(), setting.default)?;
        }
        if let Some(path) = file {
            // File keys are case-sensitive in `config`; the environment's are lowercased.
            // Lowercase the file's too, as defaults over the defaults, so the environment
            // still wins.
            let mut table: HashMap<String, config::Value> = Config::builder()
                .add_source(File::from(path).required(true))
                .build()?
                .try_deserialize()?;
            rename(&mut table, &format!("{}", path.display()), &mut deprecated);
            for (key, value) in table {
                builder = builder.set_default(key.to_ascii_lowercase(), value)?;
            }
        }
        let mut env = env.unwrap_or_else(|| std::env::vars().collect());
        rename(&mut env, "the environment", &mut deprecated);
        let merged = builder
            .add_source(Environment::default().source(Some(env)))
            .build()?;
        Ok(Self { merged, deprecated })
    }

    /// What to warn about at start: an old setting name that is still in use.
    pub fn deprecated(&self) -> &[String] {
        &self.deprecated
    }

    /// The value, trimmed.
    pub fn text(&self, setting: &Setting) -> Result<String, ConfigError> {
        self.merged
            .get_string(&setting.name.to_ascii_lowercase())
            .map(|value| value.trim().to_owned())
            .map_err(|e| ConfigError::invalid(setting.name, e.to_string()))
    }

    /// `None` when empty (unset).
    pub fn optional(&self, setting: &Setting) -> Result<Option<String>, ConfigError> {
        Ok(Some(self.text(setting)?).filter(|value| !value.is_empty()))
    }

    pub fn non_empty(&self, setting: &Setting) -> Result<String, ConfigError> {
        self.optional(setting)?
            .ok_or_else(|| ConfigError::invalid(setting.name, "must not be empty"))
    }

    pub fn parse<T: FromStr>(&self, setting: &Setting) -> Result<T, ConfigError>
    where
        T::Err: fmt::Display,
    {
        let text = self.text(setting)?;
        text.parse()
            .map_err(|e| ConfigError::invalid(setting.name, format!("cannot parse {text:?}: {e}")))
    }

    /// A number greater than zero.
    pub fn positive<T>(&self, setting: &Setting) -> Result<T, ConfigError>
    where
        T: FromStr + PartialOrd + Default + fmt::Display,
        T::Err: fmt::Display,
    {
        let value: T = self.parse(setting)?;
        if value > T::default() {
            Ok(value)
        } else {
            Err(ConfigError::invalid(
                setting.name,
                format!("must be greater than zero, got {value}"),
            ))
        }
    }

    /// A positive number of milliseconds, at most [`MAX_MILLIS`].
    pub fn millis(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        self.positive(setting)
            .and_then(|ms| at_most_a_year(setting, ms))
    }

    /// A number of milliseconds where zero means "off", at most [`MAX_MILLIS`].
    pub fn millis_or_zero(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        self.parse(setting)
            .and_then(|ms| at_most_a_year(setting, ms))
    }
}

/// Moves each old name in `source` (`from`, for the warning) to its new one, unless the
/// new one is set there too, which then wins. Names match in any case, as `config`
/// matches them.
fn rename<V>(source: &mut HashMap<String, V>, from: &str, deprecated: &mut Vec<String>) {
    for (old, new) in RENAMED {
        let Some(key) = source.keys().find(|k| k.eq_ignore_ascii_case(old)).cloned() else {
            continue;
        };
        let Some(value) = source.remove(&key) else {
            continue;
        };
        if source.keys().any(|k| k.eq_ignore_ascii_case(new.name)) {
            deprecated.push(format!(
                "{old} (in {from}) is deprecated and ignored: {} is set beside it",
                new.name
            ));
        } else {
            deprecated.push(format!(
                "{old} (in {from}) is deprecated: rename it {}; its value is used meanwhile",
                new.name
            ));
            source.insert(new.name.to_owned(), value);
        }
    }
}

/// The longest duration a setting may hold: a year. Durations end up added to the clock,
/// in the worker (`Instant + Duration` panics past the clock's range) and in SQL (an
/// interval past Postgres's range fails every statement that uses it: a
/// `LEASE_DURATION_MS` of 2^63 made every compaction a store error); a year is past
/// any sensible lease, backoff, timeout or TTL.
pub const MAX_MILLIS: u64 = 365 * 24 * 3600 * 1000;

fn at_most_a_year(setting: &Setting, ms: u64) -> Result<Duration, ConfigError> {
    if ms > MAX_MILLIS {
        return Err(ConfigError::invalid(
            setting.name,
            format!("must be at most {MAX_MILLIS} ms (a year), got {ms}"),
        ));
    }
    Ok(Duration::from_millis(ms))
}
