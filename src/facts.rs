//! The identifiers in a conversation: the facts a summary must not lose.
//!
//! An investigation turns on specifics: the error code, the version, the host, the
//! timestamp. [`extract`] finds them in text, as written, with a kind each; [`FactSet`]
//! holds the distinct ones of a removed part, and [`FactSet::recall`] says how many of
//! them a summary still carries. The worker's fact check, the extractive summarizer and
//! `summarizer eval` all measure with this one definition.
//!
//! Extraction is a single pass over the text, with one token of lookahead: linear in the
//! input, whatever its shape. It is a heuristic tuned for incident transcripts (logs,
//! metrics, tool output and the agent's prose), biased towards precision: an ordinary
//! English word is never a fact, so a summary is not asked to keep noise.

use std::collections::HashSet;
use std::fmt;

use crate::message::Message;

/// What an identifier is; for reports and tests, matching ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A number with a unit, a percentage, a ratio, or a number of three digits or more
    /// (four with a decimal point).
    Quantity,
    Version,
    /// A timestamp, a time of day or a date.
    Time,
    Duration,
    /// An IP address (v4, with a port or a prefix length, or v6), or `host:port`.
    Address,
    /// A host, pod, service, table or setting name.
    Name,
    /// An error code, an HTTP status, an errno or a signal.
    Code,
    /// An exception or error type.
    Exception,
    /// A file path or a URL.
    Path,
    /// A commit hash, a UUID, a ticket or any other id.
    Id,
    /// A quoted string of several words: an error message, a command.
    Quoted,
    /// A setting with its value: `max_connections=500`, `maxReplicas: 30`.
    Setting,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One identifier, as written in the text it was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fact<'a> {
    pub kind: Kind,
    pub text: &'a str,
}

/// Every identifier in `text`, in order of appearance, repeats included.
pub fn extract(text: &str) -> Vec<Fact<'_>> {
    let mut facts = Vec::new();
    quoted(text, &mut facts);
    tokens(text, &mut facts);
    facts
}

/// The text of a message that carries facts: its content, and the arguments of the
/// tool calls it makes (an agent's query names the service and the time range).
pub fn message_texts(m: &Message) -> impl Iterator<Item = String> + '_ {
    let calls = m.calls().into_owned();
    std::iter::once(m.content.clone())
        .chain(calls.iter().filter_map(call_arguments).collect::<Vec<_>>())
}

/// A tool call's arguments as text, in each stored shape: LangChain's `args` object,
/// the flat `arguments`, OpenAI's `function.arguments` string.
pub fn call_arguments(call: &serde_json::Value) -> Option<String> {
    let args = call
        .get("args")
        .or_else(|| call.get("arguments"))
        .or_else(|| call.get("function").and_then(|f| f.get("arguments")))?;
    Some(match args {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    })
}

/// The distinct identifiers of some messages, in order of first appearance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactSet {
    facts: Vec<(Kind, String)>,
    seen: HashSet<String>,
}

impl FactSet {
    /// The facts of `messages` (an earlier summary among them included).
    pub fn of_messages(messages: &[Message]) -> Self {
        let mut set = Self::default();
        for m in messages {
            for text in message_texts(m) {
                set.add_text(&text);
            }
        }
        set
    }

    pub fn of_text(text: &str) -> Self {
        let mut set = Self::default();
        set.add_text(text);
        set
    }

    pub fn add_text(&mut self, text: &str) {
        for fact in extract(text) {
            if !self.seen.contains(fact.text) {
                self.seen.insert(fact.text.to_owned());
                self.facts.push((fact.kind, fact.text.to_owned()));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.facts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }

    pub fn contains(&self, text: &str) -> bool {
        self.seen.contains(text)
    }

    /// The facts, in order of first appearance.
    pub fn iter(&self) -> impl Iterator<Item = (Kind, &str)> {
        self.facts.iter().map(|(kind, text)| (*kind, text.as_str()))
    }

    /// How many of these facts `summary` carries, and which it lacks.
    pub fn recall(&self, summary: &str) -> Recall {
        let in_summary = FactSet::of_text(summary);
        let grams = Grams::of(summary);
        let kept = |text: &str| {
            in_summary.contains(text) || (grams.may_hold(text) && contains_word(summary, text))
        };
        let missing: Vec<String> = self
            .iter()
            .filter(|(_, text)| !kept(text))
            .map(|(_, text)| text.to_owned())
            .collect();
        Recall {
            total: self.len(),
            kept: self.len() - missing.len(),
            missing,
        }
    }
}

/// The 4-byte windows of a text, hashed into a 64 Kibit set: a prefilter for
/// [`contains_word`]. A needle with a window the text lacks cannot occur in it, which a few
/// lookups tell, where a search reads the whole text: against a full summary, 160,000
/// facts of a 5 MB log dump took 300 ms searched one by one. A hash collision only lets
/// a needle through to the search, so the answer is exactly the search's.
struct Grams(Vec<u64>);

impl Grams {
    const BITS: u32 = 16;

    fn of(text: &str) -> Self {
        let mut bits = vec![0u64; (1 << Self::BITS) / 64];
        for window in text.as_bytes().windows(4) {
            let i = Self::index(window);
            bits[i / 64] |= 1 << (i % 64);
        }
        Self(bits)
    }

    fn index(window: &[u8]) -> usize {
        let gram = u32::from_le_bytes([window[0], window[1], window[2], window[3]]);
        // Fibonacci hashing: the top bits of a multiplication by 2^32 / phi.
        (gram.wrapping_mul(0x9E37_79B9) >> (32 - Self::BITS)) as usize
    }

    /// False only when `needle` cannot occur in the text.
    fn may_hold(&self, needle: &str) -> bool {
        needle.as_bytes().windows(4).all(|window| {
            let i = Self::index(window);
            self.0[i / 64] & (1 << (i % 64)) != 0
        })
    }
}

/// What a summary kept of the facts it replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recall {
    pub total: usize,
    pub kept: usize,
    /// The facts it lacks, in order of first appearance.
    pub missing: Vec<String>,
}

impl Recall {
    /// `kept / total`; 1 when there was nothing to keep.
    pub fn ratio(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.kept as f64 / self.total as f64
        }
    }
}

/// Whether `needle` occurs in `haystack` as a whole identifier: not inside a longer
/// word or number (`500` is not in `5000`, `pg-1` is not in `pg-10`), though a plural
/// or unit may follow a number (`502` is in `502s`).
pub fn contains_word(haystack: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let ends_in_digit = needle.ends_with(|c: char| c.is_ascii_digit());
    haystack.match_indices(needle).any(|(at, _)| {
        let before = haystack[..at].chars().next_back();
        let after = haystack[at + needle.len()..].chars().next();
        let free_before = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let free_after = after.is_none_or(|c| {
            if ends_in_digit {
                !c.is_ascii_digit()
            } else {
                !(c.is_alphanumeric() || c == '_')
            }
        });
        free_before && free_after
    })
}

/// Quoted strings of several words, within one line: `"too many clients already"`,
/// `` `kubectl rollout undo` ``, `'connection reset'`. The words inside are also
/// tokens, found by [`tokens`].
fn quoted<'a>(text: &'a str, out: &mut Vec<Fact<'a>>) {
    const MAX_INNER: usize = 160;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let quote = bytes[i];
        if !matches!(quote, b'"' | b'`' | b'\'') {
            i += 1;
            continue;
        }
        // An apostrophe inside a word (don't, service's) opens nothing.
        if quote == b'\'' && i > 0 && bytes[i - 1].is_ascii_alphanumeric() {
            i += 1;
            continue;
        }
        let start = i + 1;
        let limit = (start + MAX_INNER).min(bytes.len());
        let close = bytes[start..limit]
            .iter()
            .position(|&b| b == quote || b == b'\n')
            .map(|p| start + p);
        match close {
            Some(end) if bytes[end] == quote => {
                let closes_a_word = quote != b'\''
                    || bytes
                        .get(end + 1)
                        .is_none_or(|b| !b.is_ascii_alphanumeric());
                let inner = text[start..end].trim();
                if closes_a_word
                    && inner.contains(' ')
                    && inner.len() >= 4
                    && inner.chars().filter(|c| c.is_alphabetic()).count() >= 3
                {
                    out.push(Fact {
                        kind: Kind::Quoted,
                        text: inner,
                    });
                }
                i = end + 1;
            }
            _ => i = start,
        }
    }
}

/// A maximal run of characters that are not delimiters, trimmed of punctuation.
#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    text: &'a str,
    start: usize,
    end: usize,
}

/// Characters that end a token. `:` `.` `/` `-` `_` `@` `=` stay inside: times, versions,
/// paths, names, settings. A `,` between digits stays too (`1,843`).
fn is_delimiter(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '"' | '\'' | '`' | '(' | ')' | '[' | ']' | '{' | '}' | '<' | '>' | ';' | '|' | '*'
        )
}

fn split_tokens(text: &str) -> impl Iterator<Item = Token<'_>> {
    let mut rest = text.char_indices().peekable();
    let bytes = text.as_bytes();
    std::iter::from_fn(move || {
        loop {
            let (start, _) = rest.find(|&(_, c)| !is_delimiter(c) && c != ',')?;
            let mut end = text.len();
            while let Some(&(i, c)) = rest.peek() {
                let digit_comma = c == ','
                    && i > 0
                    && bytes[i - 1].is_ascii_digit()
                    && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
                if is_delimiter(c) || (c == ',' && !digit_comma) {
                    end = i;
                    break;
                }
                rest.next();
            }
            let raw = &text[start..end];
            // `#` stays before a number or a name: `#3317` is a pull request,
            // `#ledger-alerts` a channel.
            let trimmed_front = raw.trim_start_matches([':', '!', '?', '&', '+', ',', '=']);
            let trimmed_front = match trimmed_front.strip_prefix('#') {
                Some(rest) if rest.starts_with(|c: char| c.is_ascii_alphanumeric()) => {
                    trimmed_front
                }
                _ => trimmed_front.trim_start_matches('#'),
            };
            let trimmed = trimmed_front.trim_end_matches(['.', ',', ':', '!', '?', '#', '\\', '=']);
            if trimmed.is_empty() {
                continue;
            }
            let offset = start + (raw.len() - trimmed_front.len());
            return Some(Token {
                text: trimmed,
                start: offset,
                end: offset + trimmed.len(),
            });
        }
    })
}

/// Words after a number that make it a quantity (`480 connections`, `3 replicas`).
const COUNT_UNITS: [&str; 34] = [
    "%",
    "percent",
    "b",
    "bytes",
    "kb",
    "mb",
    "gb",
    "tb",
    "kib",
    "mib",
    "gib",
    "tib",
    "rps",
    "qps",
    "req/s",
    "ops/s",
    "connections",
    "conns",
    "requests",
    "errors",
    "retries",
    "restarts",
    "rows",
    "queries",
    "sessions",
    "clients",
    "threads",
    "workers",
    "replicas",
    "pods",
    "nodes",
    "cores",
    "messages",
    "events",
];

/// Words after a number that make it a duration (`30 s`, `4 minutes`).
const TIME_UNITS: [&str; 20] = [
    "ns", "us", "µs", "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute",
    "minutes", "h", "hr", "hrs", "hour", "hours", "days",
];

/// Words after a time of day that belong to it (`14:05 UTC`).
const TIME_ZONES: [&str; 8] = ["UTC", "GMT", "Z", "CET", "CEST", "PST", "PDT", "EST"];

/// Words before a number that make it a status or an error code (`HTTP 502`,
/// `SQLSTATE 53300`, `exit code 137`).
const CODE_WORDS: [&str; 10] = [
    "http",
    "status",
    "code",
    "sqlstate",
    "errno",
    "exit",
    "returned",
    "returning",
    "returns",
    "rc",
];

/// errno names, signals and DNS codes: all capitals, no digit, yet facts.
const SYMBOLIC_CODES: [&str; 28] = [
    "ECONNREFUSED",
    "ECONNRESET",
    "ECONNABORTED",
    "ETIMEDOUT",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "ENOSPC",
    "ENOMEM",
    "EACCES",
    "EPERM",
    "ENOENT",
    "EEXIST",
    "EPIPE",
    "EAGAIN",
    "EMFILE",
    "ENFILE",
    "EADDRINUSE",
    "EADDRNOTAVAIL",
    "EDQUOT",
    "EROFS",
    "SIGKILL",
    "SIGTERM",
    "SIGSEGV",
    "SIGABRT",
    "SIGHUP",
    "NXDOMAIN",
    "SERVFAIL",
    "REFUSED",
];

/// Name parts that mark a hyphenated word as infrastructure (`checkout-api`), not
/// English (`follow-up`).
const INFRA_PARTS: [&str; 88] = [
    "api",
    "db",
    "svc",
    "service",
    "server",
    "srv",
    "worker",
    "web",
    "app",
    "proxy",
    "gateway",
    "gw",
    "lb",
    "cache",
    "redis",
    "queue",
    "kafka",
    "pg",
    "postgres",
    "mysql",
    "prod",
    "production",
    "staging",
    "stg",
    "dev",
    "primary",
    "replica",
    "node",
    "pod",
    "cluster",
    "ingress",
    "etcd",
    "vault",
    "auth",
    "backend",
    "frontend",
    "canary",
    "pool",
    "bouncer",
    "controller",
    "pgbouncer",
    "nginx",
    "envoy",
    "istio",
    "coredns",
    "kube",
    "k8s",
    "argo",
    "grafana",
    "prometheus",
    "mongo",
    "elastic",
    "rabbitmq",
    "nats",
    "consul",
    "export",
    "sync",
    "job",
    "cron",
    "batch",
    "edge",
    "cdn",
    "dns",
    "payments",
    "checkout",
    "orders",
    "cart",
    "billing",
    "search",
    "inventory",
    "shipping",
    "ledger",
    "scheduler",
    "router",
    "mesh",
    "sidecar",
    "agent",
    "daemon",
    "operator",
    "dlq",
    "topic",
    "stream",
    "bucket",
    "alerts",
    "webhook",
    "ci",
    "cd",
    "deployer",
];

/// Endings of exception and error type names.
const EXCEPTION_ENDINGS: [&str; 13] = [
    "Error",
    "Exception",
    "Fault",
    "Failure",
    "Panic",
    "Timeout",
    "Exceeded",
    "Killed",
    "BackOff",
    "Refused",
    "Denied",
    "Interrupt",
    "Unavailable",
];

fn tokens<'a>(text: &'a str, out: &mut Vec<Fact<'a>>) {
    let mut tokens = split_tokens(text).peekable();
    let mut previous: Option<Token<'a>> = None;
    while let Some(token) = tokens.next() {
        let peeked = tokens.peek().copied();
        let gap = |next: &Token<'_>| &text[token.end..next.start];
        let next = peeked.filter(|next| {
            let gap = gap(next);
            gap.len() <= 2 && gap.chars().all(|c| c == ' ' || c == '\t')
        });
        // `maxReplicas: 30`: a setting and its value, as YAML and logs write them.
        let value = peeked.filter(|next| {
            let gap = gap(next);
            gap.len() <= 3
                && gap.starts_with(':')
                && gap[1..].chars().all(|c| c == ' ')
                && gap.len() >= 2
                && !text[next.end..].starts_with(':')
                && next.text.chars().count() <= 40
        });
        let mut consumed_next = false;
        if let Some(value) = value
            && is_setting_key(token.text)
            && token.text.starts_with(|c: char| c.is_ascii_lowercase())
            && !token.text.contains('.')
        {
            out.push(Fact {
                kind: Kind::Setting,
                text: &text[token.start..value.end],
            });
            consumed_next = true;
        } else if let Some(next) = next
            && is_plain_number(token.text)
            && let Some(kind) = unit_kind(next.text)
        {
            // A number takes its unit along: `30 s`, `1.12 GiB`, `180 MiB/h`, `3 replicas`.
            out.push(Fact {
                kind,
                text: &text[token.start..next.end],
            });
            consumed_next = true;
        } else if let Some(kind) = classify(token.text, previous.map(|p| p.text)) {
            match next {
                // A time of day takes its zone along: `14:05 UTC`.
                Some(next) if kind == Kind::Time && TIME_ZONES.contains(&next.text) => {
                    out.push(Fact {
                        kind,
                        text: &text[token.start..next.end],
                    });
                    consumed_next = true;
                }
                _ => {
                    out.push(Fact {
                        kind,
                        text: token.text,
                    });
                    inner(kind, token.text, out);
                }
            }
        } else if token.text.contains(['/', ':']) {
            // An ARN, a role path, a finding type (`UnauthorizedAccess:IAMUser/...`), a
            // condition key (`aws:TokenIssueTime`): an id as a whole when a part is one,
            // and its parts found too.
            let parts: Vec<(Kind, &str)> = (token.text.split(['/', ':']))
                .filter_map(|part| classify(part, None).map(|kind| (kind, part)))
                .collect();
            if !parts.is_empty() && token.text.chars().count() <= 100 {
                out.push(Fact {
                    kind: Kind::Id,
                    text: token.text,
                });
            }
            out.extend(parts.into_iter().map(|(kind, text)| Fact { kind, text }));
        }
        previous = Some(token);
        if consumed_next {
            previous = tokens.next();
        }
    }
}

/// The kind a number takes with `word` after it as its unit, if `word` is one.
fn unit_kind(word: &str) -> Option<Kind> {
    let unit = word.to_ascii_lowercase();
    // A rate: `MiB/h`, `req/s`.
    let base = ["/s", "/sec", "/m", "/min", "/h", "/hr", "/day"]
        .iter()
        .find_map(|per| unit.strip_suffix(per))
        .unwrap_or(&unit);
    if TIME_UNITS.contains(&unit.as_str()) {
        Some(Kind::Duration)
    } else if COUNT_UNITS.contains(&unit.as_str()) || COUNT_UNITS.contains(&base) {
        Some(Kind::Quantity)
    } else {
        None
    }
}

/// The identifiers inside a composite one, found as well, so that a summary that writes
/// one alone still keeps it: the value of `request_id=req-0be47f12`, the host and port
/// of `postgresql://ro@10.42.3.17:5432/ledger`, the names of a resource path.
fn inner<'a>(kind: Kind, token: &'a str, out: &mut Vec<Fact<'a>>) {
    let part = match kind {
        Kind::Setting => token.split_once('=').map(|(_, value)| value),
        // `2026-04-02T15:32:10Z`: the time of day, as an agent quotes it.
        Kind::Time => token
            .split_once('T')
            .map(|(_, time)| time.trim_end_matches('Z'))
            .filter(|time| !time.contains(['+', '-'])),
        Kind::Path => token.split_once("://").map(|(_, rest)| {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host)
        }),
        _ => None,
    };
    if let Some(part) = part
        && let Some(kind) = classify(part, None)
        && kind != Kind::Setting
    {
        out.push(Fact { kind, text: part });
    }
    // A resource path's names: `assumed-role/terraform-ci-network/atlantis-1779199916`.
    if kind == Kind::Path && !token.contains("://") && !token.starts_with(['/', '.', '~']) {
        for segment in token.split('/') {
            if let Some(kind) = classify(segment, None)
                && kind != Kind::Path
            {
                out.push(Fact {
                    kind,
                    text: segment,
                });
            }
        }
    }
}

/// The kind of identifier `token` is, if it is one. `previous` is the token before it
/// (`HTTP` before `502`).
fn classify(token: &str, previous: Option<&str>) -> Option<Kind> {
    if token.chars().count() < 2 {
        return None;
    }
    // `=` is a strong sign: any name before it makes a setting (`pid=48213`,
    // `--tls-cert=/etc/tls.crt`).
    if let Some((key, value)) = token.split_once('=')
        && !value.is_empty()
        && !token.contains("://")
        && let key = key.trim_start_matches('-')
        && key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Some(Kind::Setting);
    }
    // `#3317` (a pull request), `#ledger-alerts` (a channel).
    if let Some(rest) = token.strip_prefix('#') {
        if rest.chars().all(|c| c.is_ascii_digit()) {
            return Some(Kind::Id);
        }
        let channel = rest.contains(['-', '_'])
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'));
        return channel.then_some(Kind::Name);
    }
    // `$184,220.55`, `€12`.
    if let Some(amount) = token.strip_prefix(['$', '€', '£'])
        && is_plain_number(amount)
    {
        return Some(Kind::Quantity);
    }
    if is_path(token) {
        return Some(Kind::Path);
    }
    if is_time(token) {
        return Some(Kind::Time);
    }
    if is_address(token) {
        return Some(Kind::Address);
    }
    if is_version(token) {
        return Some(Kind::Version);
    }
    if is_status_plural(token) {
        return Some(Kind::Code);
    }
    if is_duration(token) {
        return Some(Kind::Duration);
    }
    if is_plain_number(token) {
        let code_word = previous.is_some_and(|p| {
            CODE_WORDS
                .iter()
                .any(|w| p.eq_ignore_ascii_case(w.trim_end_matches(':')))
        });
        if code_word && token.len() >= 3 {
            return Some(Kind::Code);
        }
        // Small numbers and short decimals (`0.00`, `3.91` in a table) are everywhere and
        // mean little without a unit; three digits, or four with a point, are specific.
        let digits = token.chars().filter(char::is_ascii_digit).count();
        let enough = if token.contains('.') { 4 } else { 3 };
        return (digits >= enough).then_some(Kind::Quantity);
    }
    if is_quantity(token) {
        return Some(Kind::Quantity);
    }
    if is_exception(token) {
        return Some(Kind::Exception);
    }
    if is_id(token) {
        return Some(Kind::Id);
    }
    if is_code(token) {
        return Some(Kind::Code);
    }
    if is_mixed_id(token) {
        return Some(Kind::Id);
    }
    if is_name(token) || is_camel_case(token) {
        return Some(Kind::Name);
    }
    None
}

/// A code symbol: `PrometheusMeterRegistry`, `ReplaceNetworkAclEntry`,
/// `maximumAllowableTags`, `ImmutableTag`; not a word (`Postgres`) nor an acronym (`HTTP`).
fn is_camel_case(token: &str) -> bool {
    let bytes = token.as_bytes();
    token.len() >= 6
        && token.chars().all(|c| c.is_ascii_alphanumeric())
        && token.starts_with(|c: char| c.is_ascii_alphabetic())
        && bytes
            .windows(2)
            .any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase())
        && token.chars().any(|c| c.is_ascii_lowercase())
}

/// A setting's name: `max_connections`, `maxReplicas`, `pool.size`, `EXPORT_WORKERS`;
/// not a sentence's word before a colon (`Reason:` is a word, `reason_code:` is not).
/// Before a colon, only a lower-case name counts (an exception type is not a setting).
fn is_setting_key(key: &str) -> bool {
    let identifier = key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    let camel = key
        .as_bytes()
        .windows(2)
        .any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
    identifier && (key.contains(['_', '.']) || camel)
}

fn is_plain_number(token: &str) -> bool {
    let digits = token.strip_prefix('-').unwrap_or(token);
    let mut seen_dot = false;
    !digits.is_empty()
        && digits.starts_with(|c: char| c.is_ascii_digit())
        && digits.ends_with(|c: char| c.is_ascii_digit())
        && digits.chars().all(|c| match c {
            '.' if !seen_dot => {
                seen_dot = true;
                true
            }
            ',' => true,
            c => c.is_ascii_digit(),
        })
}

fn is_path(token: &str) -> bool {
    let has_letter = token.chars().any(char::is_alphabetic);
    if token.contains("://") {
        return has_letter && token.len() > 8;
    }
    if let Some(rest) = token.strip_prefix('/') {
        return has_letter && !rest.is_empty() && !rest.starts_with('/');
    }
    if token.starts_with("./") || token.starts_with("../") || token.starts_with("~/") {
        return has_letter;
    }
    // `shopco-labs/deploy-helpers`: a repository or a resource path of names, one of
    // them hyphenated (`and/or` is prose).
    let segments: Vec<&str> = token.split('/').collect();
    if segments.len() >= 2
        && segments.iter().all(|s| {
            !s.is_empty()
                && s.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
                })
        })
        && segments.iter().any(|s| s.contains(['-', '_']))
    {
        return true;
    }
    // `registry.internal/finance/ledger-export`, `node.kubernetes.io/unreachable`.
    if let Some((host, rest)) = token.split_once('/')
        && host.contains('.')
        && host
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        && host.chars().any(|c| c.is_ascii_alphabetic())
        && !rest.is_empty()
    {
        return true;
    }
    if token.len() > 3 && token.as_bytes()[1] == b':' && token.as_bytes()[2] == b'\\' {
        return true;
    }
    // A relative path with a file name: `src/main.rs`, `conf/app.yaml:42`.
    let without_line = match token.rsplit_once(':') {
        Some((path, line)) if !line.is_empty() && line.chars().all(|c| c.is_ascii_digit()) => path,
        _ => token,
    };
    match without_line.rsplit_once('/') {
        Some((dir, file)) => {
            dir.chars().any(char::is_alphabetic)
                && file.rsplit_once('.').is_some_and(|(stem, ext)| {
                    !stem.is_empty()
                        && (1..=5).contains(&ext.len())
                        && ext.chars().all(|c| c.is_ascii_alphanumeric())
                        && ext.chars().any(|c| c.is_ascii_alphabetic())
                })
        }
        None => false,
    }
}

/// `2026-03-14`, `2026/03/14`, `14:05`, `14:05:12.345`, `2026-03-14T14:05:12Z`.
fn is_time(token: &str) -> bool {
    let (date, time) = match token.split_once('T') {
        Some((date, time)) if is_date(date) => (Some(date), Some(time)),
        _ if is_date(token) => (Some(token), None),
        _ => (None, Some(token)),
    };
    match (date, time) {
        (Some(_), None) => true,
        (_, Some(time)) => is_time_of_day(time) || (date.is_some() && time.is_empty()),
        (None, None) => false,
    }
}

fn is_date(token: &str) -> bool {
    let parts: Vec<&str> = token.split(['-', '/']).collect();
    parts.len() == 3
        && parts[0].len() == 4
        && parts[1].len() == 2
        && parts[2].len() == 2
        && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit()))
}

fn is_time_of_day(token: &str) -> bool {
    // An offset or a Z may end it: 14:05:12Z, 14:05:12+02:00, 14:05:12.345-0700.
    let core = token.trim_end_matches('Z');
    let core = match core.find(['+', '-']) {
        Some(at) if at >= 5 => &core[..at],
        _ => core,
    };
    let (hms, fraction) = core.split_once('.').unwrap_or((core, ""));
    let parts: Vec<&str> = hms.split(':').collect();
    (2..=3).contains(&parts.len())
        && (1..=2).contains(&parts[0].len())
        && parts[1..].iter().all(|p| p.len() == 2)
        && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit()))
        && parts[0].parse::<u8>().is_ok_and(|h| h < 24)
        && parts[1].parse::<u8>().is_ok_and(|m| m < 60)
        && fraction.chars().all(|c| c.is_ascii_digit())
}

/// IPv4 (with a port or a prefix length), IPv6, `host:port`.
fn is_address(token: &str) -> bool {
    let (host, port) = match token.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty() && port.len() <= 5 && port.chars().all(|c| c.is_ascii_digit()) =>
        {
            (host, Some(port))
        }
        _ => (token, None),
    };
    let host = host.split_once('/').map_or(host, |(ip, prefix)| {
        if prefix.chars().all(|c| c.is_ascii_digit()) && !prefix.is_empty() {
            ip
        } else {
            host
        }
    });
    let octets: Vec<&str> = host.split('.').collect();
    if octets.len() == 4
        && octets
            .iter()
            .all(|o| !o.is_empty() && o.len() <= 3 && o.parse::<u8>().is_ok())
    {
        return true;
    }
    let groups = token.matches(':').count();
    if (token.contains("::") || groups >= 4)
        && token.len() >= 4
        && token.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
        && token.chars().any(|c| c.is_ascii_hexdigit())
    {
        return true;
    }
    // `pg-primary-1:5432`: a name and a port.
    port.is_some() && !host.is_empty() && is_name(host)
}

/// `v2.14.3`, `1.2.3`, `3.0.0-rc.1`, `v18`, `openssl@3.0.2`.
fn is_version(token: &str) -> bool {
    let token = token.rsplit_once('@').map_or(token, |(_, v)| v);
    let (numbered, prefixed) = match token.strip_prefix(['v', 'V']) {
        Some(rest) => (rest, true),
        None => (token, false),
    };
    let core = numbered.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    numeric && (parts.len() >= 3 || (prefixed && !core.is_empty()))
}

/// `250ms`, `30s`, `4m30s`, `1.5h`, `2d`.
fn is_duration(token: &str) -> bool {
    let mut rest = token;
    let mut parts = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 || !rest.starts_with(|c: char| c.is_ascii_digit()) {
            return false;
        }
        rest = &rest[number_len..];
        let unit = ["ms", "us", "µs", "ns", "s", "m", "h", "d"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
        parts += 1;
    }
    parts > 0
}

/// A number with a unit attached: `97%`, `1.8GiB`, `512Mi`, `1200rps`, `100/100`, `3x`,
/// `502s` (a status in the plural).
fn is_quantity(token: &str) -> bool {
    let number_len = token
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(token.len());
    if number_len == 0 || !token.starts_with(|c: char| c.is_ascii_digit()) {
        return false;
    }
    let unit = &token[number_len..];
    if let Some(denominator) = unit.strip_prefix('/') {
        return !denominator.is_empty() && denominator.chars().all(|c| c.is_ascii_digit());
    }
    const ATTACHED: [&str; 22] = [
        "%", "b", "kb", "mb", "gb", "tb", "kib", "mib", "gib", "tib", "ki", "mi", "gi", "k", "rps",
        "qps", "req/s", "ops/s", "x", "mbps", "gbps", "s",
    ];
    let unit = unit.to_ascii_lowercase();
    ATTACHED.contains(&unit.as_str())
}

fn is_status_plural(token: &str) -> bool {
    token.len() == 4
        && token.ends_with('s')
        && token[..3]
            .parse::<u16>()
            .is_ok_and(|n| (100..600).contains(&n))
}

/// `ConnectionResetError`, `java.lang.OutOfMemoryError`, `OOMKilled`,
/// `CrashLoopBackOff`, `psycopg2.errors.TooManyConnections`? (no: it names no failure).
fn is_exception(token: &str) -> bool {
    let last = token.rsplit('.').next().unwrap_or(token);
    last.starts_with(|c: char| c.is_ascii_uppercase())
        && last.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && EXCEPTION_ENDINGS
            .iter()
            .any(|end| last.len() > end.len() && last.ends_with(end))
        && token.split('.').all(|p| !p.is_empty())
}

/// Hashes, UUIDs and tickets: `a3f9c21`, `INC-4821`.
fn is_id(token: &str) -> bool {
    let hex = token.len() >= 7
        && token
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_ascii_alphabetic());
    let uuid = token.len() == 36
        && token.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && token.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    let ticket = token.split_once('-').is_some_and(|(project, number)| {
        project.len() >= 2
            && project.chars().all(|c| c.is_ascii_uppercase())
            && !number.is_empty()
            && number.chars().all(|c| c.is_ascii_digit())
            // Error codes are zero-padded (`ORA-00060`); tickets are not.
            && !number.starts_with('0')
    });
    hex || uuid || ticket
}

/// Ids that mix letters and digits: `req-8f3a2c91`, `i-0abc123def`, `x2k4p`.
fn is_mixed_id(token: &str) -> bool {
    let mixed = |part: &str| {
        part.len() >= 5
            && part.chars().all(|c| c.is_ascii_alphanumeric())
            && part.chars().filter(char::is_ascii_digit).count() >= 2
            && part.chars().any(|c| c.is_ascii_alphabetic())
    };
    token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        && token.split(['-', '_']).any(mixed)
}

/// `E1101`, `ORA-00060`, `CVE-2024-3094`, `ERR_CONN_RESET`, `ECONNREFUSED`, `SIGKILL`.
fn is_code(token: &str) -> bool {
    if SYMBOLIC_CODES.contains(&token) {
        return true;
    }
    let shaped = token
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && token.chars().any(|c| c.is_ascii_uppercase())
        && token.len() >= 3;
    let has_digit = token.chars().any(|c| c.is_ascii_digit());
    let snake = token.contains('_') && token.split('_').all(|p| p.len() >= 2);
    shaped && (has_digit || snake)
}

/// `checkout-api`, `pg-primary-1`, `orders_db`, `max_connections`,
/// `db1.prod.internal`, `spring.datasource.hikari.maximum-pool-size`.
fn is_name(token: &str) -> bool {
    if !token
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        || !token.starts_with(|c: char| c.is_alphanumeric())
        || !token.ends_with(|c: char| c.is_alphanumeric())
        || !token.chars().any(char::is_alphabetic)
        || token.contains('/')
    {
        return false;
    }
    let parts: Vec<&str> = token.split(['-', '_', '.']).collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        return false;
    }
    let dots = token.matches('.').count();
    token.contains('_')
        || token.chars().any(|c| c.is_ascii_digit())
        || parts.len() >= 3
        || dots >= 2
        || parts
            .iter()
            .any(|p| INFRA_PARTS.contains(&p.to_ascii_lowercase().as_str()))
}

#[cfg(test)]
mod tests;
