//! The lexer: quoted phrases, and tokens with one token of lookahead, each a fact when
//! [`classify`](super::classify::classify) says what it is.

use super::Fact;
use super::Kind;
use super::classify::{classify, is_plain_number, is_setting_key};
use super::words::*;

/// Quoted strings of several words, within one line: `"too many clients already"`,
/// `` `kubectl rollout undo` ``, `'connection reset'`. The words inside are also
/// tokens, found by [`tokens`].
pub(super) fn quoted<'a>(text: &'a str, out: &mut Vec<Fact<'a>>) {
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
pub(super) struct Token<'a> {
    text: &'a str,
    start: usize,
    end: usize,
}

/// Characters that end a token. `:` `.` `/` `-` `_` `@` `=` stay inside: times, versions,
/// paths, names, settings. A `,` between digits stays too (`1,843`).
pub(super) fn is_delimiter(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '"' | '\'' | '`' | '(' | ')' | '[' | ']' | '{' | '}' | '<' | '>' | ';' | '|' | '*'
        )
}

pub(super) fn split_tokens(text: &str) -> impl Iterator<Item = Token<'_>> {
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

pub(super) fn tokens<'a>(text: &'a str, out: &mut Vec<Fact<'a>>) {
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
pub(super) fn unit_kind(word: &str) -> Option<Kind> {
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
pub(super) fn inner<'a>(kind: Kind, token: &'a str, out: &mut Vec<Fact<'a>>) {
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
