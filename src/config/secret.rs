//! Secrets: a wrapper `Debug` cannot print, and redaction of URLs, whose credentials
//! hide in many forms (`user:password@`, a token as the user, `?password=`,
//! `?sslpassword=`, `?api_key=`, percent-encoded). URLs are read with the `url` crate,
//! never split by hand, so IPv6 hosts and encoded characters are understood.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::percent_decode_str;
use url::{Position, Url, form_urlencoded};

/// What replaces a secret in any output.
pub const REDACTED: &str = "[redacted]";

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

/// `url` with every credential replaced by `[redacted]`: the whole userinfo (a user
/// alone may be a token, as in `nats://token@host`), the value of every query or
/// fragment parameter whose name says it is secret, in any case or encoding. Everything
/// else is kept as written. Text that is not a URL is not shown at all: it may be a
/// URL with a typo that still holds a password.
pub fn redact_url(url: &str) -> String {
    let Ok(parsed) = Url::parse(url) else {
        return format!("{REDACTED} (not a valid URL)");
    };
    let userinfo = !parsed.username().is_empty() || parsed.password().is_some();
    let query = parsed.query().map(redact_pairs);
    let fragment = parsed.fragment().map(redact_pairs);
    let unchanged = |part: &Option<Cow<'_, str>>| matches!(part, None | Some(Cow::Borrowed(_)));
    if !userinfo && unchanged(&query) && unchanged(&fragment) {
        return url.to_owned();
    }
    let mut out = parsed[..Position::BeforeUsername].to_owned();
    if userinfo {
        out.push_str(REDACTED);
        out.push('@');
    }
    out.push_str(&parsed[Position::BeforeHost..Position::AfterPath]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(&query);
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(&fragment);
    }
    out
}

/// The user and password in `scheme://user:password@host`, percent-decoded.
pub fn url_credentials(url: &str) -> Option<(String, String)> {
    let parsed = Url::parse(url).ok()?;
    let user = decode(parsed.username());
    let password = decode(parsed.password()?);
    (!user.is_empty()).then_some((user, password))
}

/// Every credential `url` holds, as written and percent-decoded, for scrubbing text that
/// other libraries log: the password, secret parameters' values, and a user given
/// without a password when `bare_user_is_secret` (a token, as NATS reads it).
pub fn url_secrets(url: &str, bare_user_is_secret: bool) -> Vec<String> {
    let Ok(parsed) = Url::parse(url) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    match parsed.password() {
        Some(password) => found.push(password.to_owned()),
        None if bare_user_is_secret => found.push(parsed.username().to_owned()),
        None => {}
    }
    for pairs in [parsed.query(), parsed.fragment()].into_iter().flatten() {
        for (name, value) in form_urlencoded::parse(pairs.as_bytes()) {
            if is_secret_name(&name) {
                found.push(value.into_owned());
            }
        }
        for segment in pairs.split('&') {
            if let Some((name, value)) = segment.split_once('=')
                && is_secret_name(&decode(name))
            {
                found.push(value.to_owned());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| decode(s)).collect();
    found.extend(decoded);
    found.retain(|s| !s.is_empty());
    found.sort();
    found.dedup();
    found
}

/// `a=1&password=x` with the secret parameters' values replaced; borrowed when nothing
/// is. Pairs are split on `&` and `=` as `application/x-www-form-urlencoded` defines
/// them, and the names are decoded before they are judged, so `pass%77ord` is caught.
fn redact_pairs(pairs: &str) -> Cow<'_, str> {
    let secret = |segment: &str| {
        let name = segment.split_once('=').map_or(segment, |(name, _)| name);
        form_urlencoded::parse(name.as_bytes())
            .next()
            .is_some_and(|(name, _)| is_secret_name(&name))
    };
    if !pairs.split('&').any(secret) {
        return Cow::Borrowed(pairs);
    }
    let redacted: Vec<Cow<'_, str>> = pairs
        .split('&')
        .map(|segment| match segment.split_once('=') {
            Some((name, _)) if secret(segment) => Cow::Owned(format!("{name}={REDACTED}")),
            _ => Cow::Borrowed(segment),
        })
        .collect();
    Cow::Owned(redacted.join("&"))
}

/// Parameter names that carry credentials: `password`, `sslpassword`, `passwd`, `pwd`,
/// `token`, `access_token`, `api_key`, `apikey`, `secret`, `client_secret`, `auth`,
/// `signature`, ... A false positive costs a hidden value in a log line; a false
/// negative, a leaked credential.
fn is_secret_name(name: &str) -> bool {
    const MARKERS: [&str; 8] = [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "auth",
        "credential",
        "signature",
    ];
    let name = name.to_ascii_lowercase();
    MARKERS.iter().any(|marker| name.contains(marker))
}

fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_credential_form_is_redacted() {
        let cases = [
            (
                "postgres://app:hunter2@db:5432/summarizer",
                "postgres://[redacted]@db:5432/summarizer",
            ),
            (
                "nats://bot:p%40ss@nats.internal:4222/x@y",
                "nats://[redacted]@nats.internal:4222/x@y",
            ),
            (
                "nats://s3cr3t-token@nats:4222",
                "nats://[redacted]@nats:4222",
            ),
            ("nats://:only-pass@nats:4222", "nats://[redacted]@nats:4222"),
            (
                "postgres://u:pw@[2001:db8::1]:5432/db",
                "postgres://[redacted]@[2001:db8::1]:5432/db",
            ),
            (
                "postgres://db/x?sslmode=require&password=pw&PassWord=pw&pass%77ord=pw&user=app",
                "postgres://db/x?sslmode=require&password=[redacted]&PassWord=[redacted]&pass%77ord=[redacted]&user=app",
            ),
            (
                "postgresql:///db?host=/run/pg&sslpassword=pw",
                "postgresql:///db?host=/run/pg&sslpassword=[redacted]",
            ),
            (
                "https://llm/v1?api_key=k&access_token=t#client_secret=s",
                "https://llm/v1?api_key=[redacted]&access_token=[redacted]#client_secret=[redacted]",
            ),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn urls_without_credentials_are_shown_as_written() {
        for url in [
            "nats://nats:4222",
            "postgres://127.0.0.1:5432/summarizer",
            "https://api.openai.com/v1",
            "http://127.0.0.1:8080",
            "postgres://h/db?sslmode=disable&statement-cache-capacity=0",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(redact_url("not a url"), "[redacted] (not a valid URL)");
    }

    #[test]
    fn credentials_are_read_from_urls_decoded() {
        let url = "nats://bot:p%40ss@nats.internal:4222/x@y";
        assert_eq!(
            url_credentials(url),
            Some(("bot".to_owned(), "p@ss".to_owned()))
        );
        assert_eq!(url_credentials("nats://bot@nats:4222"), None);
        assert_eq!(url_credentials("nats://nats:4222"), None);
        assert_eq!(url_credentials("not a url"), None);
    }

    #[test]
    fn secrets_of_a_url_come_in_every_form_a_library_may_print() {
        let found = url_secrets("postgres://app:p%40ss@db/x?sslpassword=a%2Bb&mode=x", false);
        for form in ["p%40ss", "p@ss", "a%2Bb", "a+b"] {
            assert!(found.iter().any(|f| f == form), "{form} in {found:?}");
        }
        assert!(!found.iter().any(|f| f == "app" || f == "x"), "{found:?}");
        assert_eq!(url_secrets("nats://tok@nats", true), ["tok"]);
        assert!(url_secrets("postgres://postgres@db/x", false).is_empty());
    }

    #[test]
    fn debug_never_shows_a_secret() {
        assert_eq!(format!("{:?}", Secret::new("sk-1")), "\"[redacted]\"");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
    }

    /// A password of characters a URL must encode and ones it need not; `PW` marks it,
    /// and nothing else in the generated URLs is upper case.
    fn password() -> impl Strategy<Value = String> {
        "PW[a-zA-Z0-9@:/?#%&=+ !$'()*,;\\[\\]~._-]{4,24}"
    }

    fn encode(text: &str) -> String {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    }

    proptest! {
        #[test]
        fn no_password_survives_redaction(
            password in password(),
            user in "[a-z]{0,8}",
            host in prop_oneof!["[a-z]{1,10}", Just("[::1]".to_owned()), Just("10.0.0.7".to_owned())],
            port in proptest::option::of(1u16..),
            path in "(/[a-z0-9]{0,6}){0,3}",
            param in prop_oneof!["password", "sslpassword", "token", "api_key", "PASSWORD", "pass%77ord"],
            scheme in prop_oneof!["postgres", "nats", "https", "http", "tls"],
        ) {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let encoded = encode(&password);
            for url in [
                format!("{scheme}://{user}:{encoded}@{host}{port}{path}"),
                format!("{scheme}://{encoded}@{host}{port}{path}"),
                format!("{scheme}://{host}{port}{path}?a=b&{param}={encoded}&c=d"),
                format!("{scheme}://{user}:{encoded}@{host}{port}{path}?{param}={encoded}"),
            ] {
                let shown = redact_url(&url);
                prop_assert!(!shown.contains("PW"), "{url} -> {shown}");
                let found = url_secrets(&url, true);
                prop_assert!(found.contains(&password), "{url}: {found:?}");
            }
        }

        #[test]
        fn redaction_never_panics(text in "\\PC{0,80}") {
            let _ = redact_url(&text);
            let _ = url_secrets(&text, true);
            let _ = url_credentials(&text);
        }
    }
}
