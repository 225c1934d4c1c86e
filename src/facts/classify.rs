//! What kind of identifier a token is, if any: one test per kind, biased towards
//! precision (an ordinary English word is never a fact).

use super::Kind;
use super::words::*;

/// The kind of identifier `token` is, if it is one. `previous` is the token before it
/// (`HTTP` before `502`).
pub(super) fn classify(token: &str, previous: Option<&str>) -> Option<Kind> {
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
pub(super) fn is_camel_case(token: &str) -> bool {
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
pub(super) fn is_setting_key(key: &str) -> bool {
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

pub(super) fn is_plain_number(token: &str) -> bool {
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

pub(super) fn is_path(token: &str) -> bool {
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
pub(super) fn is_time(token: &str) -> bool {
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

pub(super) fn is_date(token: &str) -> bool {
    let parts: Vec<&str> = token.split(['-', '/']).collect();
    parts.len() == 3
        && parts[0].len() == 4
        && parts[1].len() == 2
        && parts[2].len() == 2
        && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit()))
}

pub(super) fn is_time_of_day(token: &str) -> bool {
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
pub(super) fn is_address(token: &str) -> bool {
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
pub(super) fn is_version(token: &str) -> bool {
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
pub(super) fn is_duration(token: &str) -> bool {
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
pub(super) fn is_quantity(token: &str) -> bool {
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

pub(super) fn is_status_plural(token: &str) -> bool {
    token.len() == 4
        && token.ends_with('s')
        && token[..3]
            .parse::<u16>()
            .is_ok_and(|n| (100..600).contains(&n))
}

/// `ConnectionResetError`, `java.lang.OutOfMemoryError`, `OOMKilled`,
/// `CrashLoopBackOff`, `psycopg2.errors.TooManyConnections`? (no: it names no failure).
pub(super) fn is_exception(token: &str) -> bool {
    let last = token.rsplit('.').next().unwrap_or(token);
    last.starts_with(|c: char| c.is_ascii_uppercase())
        && last.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && EXCEPTION_ENDINGS
            .iter()
            .any(|end| last.len() > end.len() && last.ends_with(end))
        && token.split('.').all(|p| !p.is_empty())
}

/// Hashes, UUIDs and tickets: `a3f9c21`, `INC-4821`.
pub(super) fn is_id(token: &str) -> bool {
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
pub(super) fn is_mixed_id(token: &str) -> bool {
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
pub(super) fn is_code(token: &str) -> bool {
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
pub(super) fn is_name(token: &str) -> bool {
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
