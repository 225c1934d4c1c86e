-- As the Postgres migration of the same name: a pending summary's metadata is the usage
-- event's whole metadata as the worker built it when it prepared the summary; applying
-- it adds only the applying turn's ids and what that transaction measures. Pending rows
-- in the former shape are dropped (a pending summary is a cache: the turn compacts
-- afresh), and any a worker of the previous release saves later is treated as expired.
DELETE FROM pending_summaries;
