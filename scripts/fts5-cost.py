#!/usr/bin/env python3
"""What an FTS5 trigram index costs the writes that feed it, apart from the worker: rows
of log-like text (40 rows of 1,000 chars per transaction, then 400) inserted into a
table alone, and into one whose insert trigger feeds a contentless FTS5 trigram index as
SQLite migration 5 does, at each `detail` level. Prints transactions/s and file size.

    python3 scripts/fts5-cost.py

Uses Python's own SQLite (3.34 or later for the trigram tokenizer); its files go in the
temporary directory and are removed. docs/benchmarks.md, "Recall", cites it.
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
import time

WORDS = ["pool", "timeout", "checkout-api", "v5.33.0", "E-5417", "latency", "p99=2013ms",
         "10.43.7.217:6432", "saturated", "retry"]


def run(detail: str | None, transactions: int, rows: int, size: int = 1_000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fts.db")
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=wal")
        db.execute("PRAGMA synchronous=normal")
        db.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, s TEXT, content TEXT)")
        if detail is not None:
            db.execute(
                "CREATE VIRTUAL TABLE f USING fts5(session, body, tokenize='trigram', "
                f"content='', detail={detail})"
            )
            db.execute(
                "CREATE TRIGGER t AFTER INSERT ON a BEGIN "
                "INSERT INTO f (rowid, session, body) VALUES (new.id, new.s, new.content); END"
            )
        rng = random.Random(1)
        started = time.perf_counter()
        for i in range(transactions):
            db.execute("BEGIN IMMEDIATE")
            for _ in range(rows):
                text = " ".join(
                    rng.choice(WORDS) + str(rng.randint(0, 99_999)) for _ in range(size // 12)
                )
                db.execute("INSERT INTO a (s, content) VALUES (?, ?)", (f"s{i}", text))
            db.execute("COMMIT")
        took = time.perf_counter() - started
        db.close()
        kb = os.path.getsize(path) // 1024
        index = "no index" if detail is None else f"fts5 trigram, detail={detail}"
        print(f"{index:32} {rows:4} rows/transaction: {transactions / took:7.1f} transactions/s, "
              f"{rows * transactions / took:7.0f} rows/s, {kb} KB")


if __name__ == "__main__":
    for detail in [None, "full", "column", "none"]:
        run(detail, transactions=150, rows=40)
    for detail in [None, "full"]:
        run(detail, transactions=15, rows=400)
