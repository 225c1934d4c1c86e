//! Recall requests (`summarizer.recall`, docs/protocol.md, "Recall"): an agent searches
//! what compaction archived from its own session, or fetches it by seq. The request is
//! validated by the client crate's [`RecallRequest`]; a search's text is cut into terms
//! here, and each term is matched as text by the store, never read as query syntax.

use std::borrow::Cow;

use crate::redact::{Redactions, redact};
use crate::store::{RecallQuery, Store};
use summarizer_client::{InvalidRequest, RecallReply, RecallRequest, Wanted};

/// A term must be at least this long to be searched: the stores' trigram indexes can
/// find nothing shorter.
pub const MIN_TERM_CHARS: usize = 3;

/// A search takes at most this many terms (the first).
pub const MAX_TERMS: usize = 16;

/// The terms of a search: its words and identifiers as written (split at whitespace
/// and control characters), without the quotes and brackets around them or the sentence
/// punctuation after them (`"E-5417",` and `(E-5417).` are `E-5417`;
/// `10.43.7.217:6432` and `/etc/svc/conf.d/003-pool.yaml` stay whole), each once (case
/// aside: both stores match without case), shorter ones than [`MIN_TERM_CHARS`] left out.
pub fn terms(query: &str) -> Vec<String> {
    const AROUND: &str = "\"'`()[]{}<>";
    const AFTER: &str = "\"'`()[]{}<>,;:!?.";
    let mut terms: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for word in query.split(|c: char| c.is_whitespace() || c.is_control()) {
        let word = word
            .trim_start_matches(|c: char| AROUND.contains(c))
            .trim_end_matches(|c: char| AFTER.contains(c));
        let folded = word.to_lowercase();
        if word.chars().count() >= MIN_TERM_CHARS && !seen.contains(&folded) {
            seen.push(folded);
            terms.push(word.to_owned());
        }
        if terms.len() == MAX_TERMS {
            break;
        }
    }
    terms
}

/// The reply to one recall request payload: `ok` with the results, `rejected` for a
/// malformed request, `failed`/`store_error` when the store fails. Never panics on
/// input. With `redact_secrets` (`REDACT_SECRETS`), each result's content has its
/// secrets replaced by their markers (docs/protocol.md, "Secrets"): the archive keeps
/// the original, for restore, and recall serves what the worker derives.
pub async fn answer(store: &dyn Store, payload: &[u8], redact_secrets: bool) -> RecallReply {
    let request = match RecallRequest::decode(payload) {
        Ok(request) => request,
        Err(invalid) => return RecallReply::rejected(&invalid),
    };
    let query = match &request.wanted {
        Wanted::Search { query, limit } => {
            let terms = terms(query);
            if terms.is_empty() {
                return RecallReply::rejected(&InvalidRequest(format!(
                    "query holds no term of {MIN_TERM_CHARS} chars or more"
                )));
            }
            RecallQuery::Search {
                terms,
                limit: *limit,
            }
        }
        Wanted::Seqs(seqs) => RecallQuery::Seqs(seqs.clone()),
    };
    match store
        .recall(&request.session_id, &query, request.max_chars)
        .await
    {
        Ok(mut results) => {
            if redact_secrets {
                let mut found = Redactions::default();
                for result in &mut results {
                    if let Cow::Owned(redacted) = redact(&result.content, &mut found) {
                        result.content = redacted;
                    }
                }
            }
            RecallReply::ok(&request.session_id, results)
        }
        Err(e) => {
            tracing::error!(
                session_id = %request.session_id,
                "recall: the store failed: {}",
                crate::error_chain(&e)
            );
            RecallReply::store_error(&request.session_id, crate::error_chain(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_words_and_identifiers_as_written() {
        assert_eq!(
            terms(
                "\"E-5417\", v4.12.6 (10.43.7.217:6432) pgbouncer-14 /etc/svc/conf.d/003-pool.yaml p99=2013ms."
            ),
            [
                "E-5417",
                "v4.12.6",
                "10.43.7.217:6432",
                "pgbouncer-14",
                "/etc/svc/conf.d/003-pool.yaml",
                "p99=2013ms"
            ]
        );
        for quoted in ["(E-5417).", "'E-5417';", "[\"E-5417\"]:", "`E-5417`?!"] {
            assert_eq!(terms(quoted), ["E-5417"], "{quoted}");
        }
        // Operators and SQL are text like any other; short words and repeats (in any
        // case) go.
        assert_eq!(
            terms("pool OR Pool AND x' ; DROP TABLE messages; -- %_"),
            ["pool", "AND", "DROP", "TABLE", "messages"]
        );
        // Control characters (a NUL, which no Postgres text may hold) separate terms.
        assert_eq!(
            terms("pool\0timeout\u{7}E-5417"),
            ["pool", "timeout", "E-5417"]
        );
        assert!(terms("a b c").is_empty());
        assert_eq!(terms(&"word ".repeat(40)).len(), 1);
        let many: String = (0..40).map(|n| format!("term{n} ")).collect();
        assert_eq!(terms(&many).len(), MAX_TERMS);
    }
}
