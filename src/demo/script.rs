//! The demo's incident: an on-call engineer and an agent chase 502s on a checkout
//! service. Data only; tool outputs read like the logs and metrics a real agent sees.

use serde_json::json;

use super::Scripted;
use crate::message::Role;

/// One turn: the human's message, then the agent's calls, results and answer.
pub fn turns() -> Vec<Vec<Scripted>> {
    let mut calls = 0;
    TURNS
        .iter()
        .map(|turn| {
            let mut messages = vec![say(Role::User, turn.human)];
            for (tool, args, output) in turn.tools {
                calls += 1;
                let id = format!("call_{calls:03}");
                messages.push(Scripted {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls: Some(json!([{"id": id, "name": tool, "arguments": args}])),
                    tool_call_id: None,
                });
                messages.push(Scripted {
                    role: Role::Tool,
                    content: (*output).to_owned(),
                    tool_calls: None,
                    tool_call_id: Some(id),
                });
            }
            messages.push(say(Role::Assistant, turn.answer));
            messages
        })
        .collect()
}

fn say(role: Role, text: &str) -> Scripted {
    Scripted {
        role,
        content: text.to_owned(),
        tool_calls: None,
        tool_call_id: None,
    }
}

struct Turn {
    human: &'static str,
    /// (tool, JSON arguments, output)
    tools: &'static [(&'static str, &'static str, &'static str)],
    answer: &'static str,
}

const TURNS: &[Turn] = &[
    Turn {
        human: "PagerDuty fired at 14:07 UTC: checkout-api is returning 502s to about 8% of requests in eu-west-1. Can you find out why?",
        tools: &[
            (
                "query_metrics",
                r#"{"service":"checkout-api","metric":"http_5xx_rate","window":"30m"}"#,
                "checkout-api http_5xx_rate (eu-west-1), 1m buckets\n13:50 0.1%\n13:55 0.1%\n14:00 0.2%\n14:03 1.9%\n14:05 6.8%\n14:07 8.4%\n14:10 8.1%\n14:15 7.9%\nus-east-1 over the same window: 0.1% flat\np99 latency eu-west-1: 180ms at 13:55, 30012ms at 14:05 (gateway timeout at 30s)",
            ),
            (
                "get_logs",
                r#"{"service":"api-gateway","since":"14:00","level":"error","limit":8}"#,
                "14:03:11Z ERROR api-gateway upstream checkout-api: 502 Bad Gateway (upstream timed out after 30000ms)\n14:03:12Z ERROR api-gateway upstream checkout-api: 502 Bad Gateway (connection reset by peer)\n14:04:40Z ERROR api-gateway upstream checkout-api: 502 Bad Gateway (upstream timed out after 30000ms)\n14:05:02Z ERROR api-gateway upstream checkout-api: 502 Bad Gateway (upstream timed out after 30000ms)\n14:05:09Z WARN api-gateway circuit breaker half-open for checkout-api pod checkout-api-7d9f-x2k4l\n14:06:31Z ERROR api-gateway upstream checkout-api: 502 Bad Gateway (upstream timed out after 30000ms)",
            ),
        ],
        answer: "The 502s started at 14:03 UTC and are limited to eu-west-1: error rate went from 0.1% to 8.4% by 14:07 while us-east-1 stayed flat. The gateway logs show checkout-api timing out after 30s rather than refusing connections, so the pods are up but slow. Next I will look at what checkout-api waits on.",
    },
    Turn {
        human: "Did anything get deployed around then? We had a release train this afternoon.",
        tools: &[
            (
                "list_deployments",
                r#"{"since":"12:00","region":"eu-west-1"}"#,
                "13:41Z payments-svc v2.14.0 -> v2.14.1 (config only) by ci-bot, status: healthy\n14:01Z checkout-api v5.32.0 -> v5.33.0 by release-train, status: healthy, 12/12 pods ready at 14:02:40Z\n14:20Z search-indexer v1.8.3 -> v1.8.4 by ci-bot, status: progressing\nchangelog checkout-api v5.33.0: 'move cart pricing to orders-db read replica; bump HikariCP maximumPoolSize 20 -> 40; add retry on price lookup (3 attempts)'",
            ),
            (
                "query_metrics",
                r#"{"service":"checkout-api","metric":"db_pool_active","window":"30m"}"#,
                "checkout-api db_pool_active (sum over 12 pods)\n13:55 96 of 240\n14:02 188 of 480\n14:03 470 of 480\n14:05 480 of 480\n14:10 480 of 480\nhikaricp_pending_threads p50 0 at 13:55, 312 at 14:05\nconnection acquire time p99: 4ms at 13:55, 29870ms at 14:05",
            ),
        ],
        answer: "Yes: checkout-api v5.33.0 rolled out at 14:01, two minutes before the errors. It doubled the connection pool to 40 per pod and moved pricing reads to the orders-db read replica. Since 14:05 the pools are saturated at 480 of 480 and requests wait up to 29.9s for a connection, which matches the 30s gateway timeouts.",
    },
    Turn {
        human: "Is the database itself unhealthy, or is it just the pool? Check orders-db.",
        tools: &[
            (
                "query_metrics",
                r#"{"service":"orders-db-replica-1","metrics":["connections","cpu","replication_lag"],"window":"30m"}"#,
                "orders-db-replica-1 (db.r6g.2xlarge, max_connections=500)\nconnections: 110 at 13:55, 497 at 14:04, 500 at 14:05 (limit reached)\ncpu: 22% at 13:55, 41% at 14:05\nreplication_lag: 0.3s steady\nrejected connections since 14:05: 1,922 (FATAL: sorry, too many clients already)\norders-db-primary: connections 140/800, cpu 35%, no errors",
            ),
            (
                "run_sql",
                r#"{"target":"orders-db-replica-1","sql":"select state, count(*) from pg_stat_activity group by 1"}"#,
                " state               | count\n---------------------+-------\n idle in transaction |   431\n active              |    52\n idle                |    17\n(3 rows)\nlongest idle in transaction: 00:04:51, application_name=checkout-api, query='SELECT price FROM cart_prices WHERE sku = $1 FOR SHARE'",
            ),
        ],
        answer: "The replica is not overloaded (cpu 41%, lag 0.3s), but it has hit max_connections=500: 12 pods x 40 = 480 checkout connections plus other clients. 431 sessions are idle in transaction, the oldest for almost 5 minutes, all from checkout-api running a SELECT ... FOR SHARE. So the replica is healthy and the problem is connections held open by checkout-api.",
    },
    Turn {
        human: "Why would checkout hold transactions open? Can you look at the code path?",
        tools: &[
            (
                "search_code",
                r#"{"repo":"checkout-api","query":"cart_prices FOR SHARE"}"#,
                "src/pricing/PriceRepository.kt:88\n  @Transactional(readOnly = true)\n  fun priceFor(sku: String): Price = retry(times = 3) {\n      jdbc.queryForObject(\"SELECT price FROM cart_prices WHERE sku = ? FOR SHARE\", sku)\n  }\nsrc/pricing/PriceRepository.kt:97\n  // v5.33.0: retry wraps the query inside the transaction; on timeout the\n  // connection is kept while the retry backs off (1s, 2s, 4s)",
            ),
            (
                "get_logs",
                r#"{"service":"checkout-api","since":"14:00","grep":"PriceRepository","limit":5}"#,
                "14:03:02Z WARN checkout-api-7d9f-x2k4l PriceRepository retry 1/3 after QueryTimeoutException (5000ms)\n14:03:08Z WARN checkout-api-7d9f-x2k4l PriceRepository retry 2/3 after QueryTimeoutException (5000ms)\n14:03:19Z ERROR checkout-api-7d9f-x2k4l PriceRepository gave up after 3 attempts\n14:03:19Z WARN checkout-api-7d9f-q8m2p HikariPool-1 connection is not available, request timed out after 30000ms",
            ),
        ],
        answer: "Found it: in v5.33.0 the retry wraps the query inside the @Transactional block, and FOR SHARE on a read replica waits on conflicts and times out at 5s. Each request then holds its connection through three attempts plus backoff (up to about 22s), so the bigger pool fills with idle-in-transaction sessions and the replica runs out of connections.",
    },
    Turn {
        human: "OK. What are our options to stop the bleeding right now?",
        tools: &[(
            "get_runbook",
            r#"{"service":"checkout-api","topic":"rollback"}"#,
            "Runbook checkout-api rollback: `deployctl rollback checkout-api --region eu-west-1 --to v5.32.0` takes about 4 minutes for 12 pods (maxUnavailable=2). Feature flag alternative: `pricing.read_replica.enabled=false` in flagd routes pricing reads back to orders-db-primary within 30s without a deploy. Note: primary has 800 max_connections, 140 in use.",
        )],
        answer: "Two options. Fastest: flip pricing.read_replica.enabled=false, which sends pricing reads back to the primary within about 30s; the primary has room (140 of 800 connections). Safer long term: roll back to v5.32.0, about 4 minutes. I suggest the flag now and the rollback right after, since the flag does not remove the retry-inside-transaction bug.",
    },
    Turn {
        human: "Flag is flipped as of 14:26. Is it recovering?",
        tools: &[(
            "query_metrics",
            r#"{"service":"checkout-api","metrics":["http_5xx_rate","db_pool_active"],"window":"10m"}"#,
            "checkout-api eu-west-1\n14:24 http_5xx_rate 8.0%, db_pool_active 480/480\n14:26 http_5xx_rate 7.1%, db_pool_active 455/480\n14:27 http_5xx_rate 1.2%, db_pool_active 130/480\n14:28 http_5xx_rate 0.2%, db_pool_active 88/480\norders-db-replica-1 connections: 140 at 14:28\norders-db-primary connections: 232/800 at 14:28, cpu 39%",
        )],
        answer: "Recovering: the 5xx rate fell from 8.0% at 14:24 to 0.2% at 14:28, and pool usage from 480 to 88. The replica is back to 140 connections and the primary absorbed the load at 232 of 800 connections and 39% cpu. Customer impact ran from 14:03 to about 14:27.",
    },
    Turn {
        human: "Great. Roll back too, then draft the incident summary for the postmortem.",
        tools: &[(
            "deployctl",
            r#"{"action":"rollback","service":"checkout-api","region":"eu-west-1","to":"v5.32.0"}"#,
            "rollback checkout-api eu-west-1 -> v5.32.0 started 14:31:05Z\n14:33:10Z 6/12 pods on v5.32.0\n14:35:02Z 12/12 pods on v5.32.0, healthy\nhttp_5xx_rate 0.1% at 14:36",
        )],
        answer: "Rolled back: 12 of 12 pods on v5.32.0 at 14:35, error rate 0.1%. Draft: between 14:03 and 14:27 UTC about 8% of eu-west-1 checkout requests failed with 502. Cause: v5.33.0 retried a FOR SHARE query inside a transaction, holding connections through backoff; with the pool doubled to 40 per pod this exhausted orders-db-replica-1 (500 connections). Mitigated by the pricing.read_replica flag at 14:26 and the rollback at 14:35. Follow-ups: move the retry outside the transaction, drop FOR SHARE on replica reads, alert on idle-in-transaction sessions.",
    },
];
