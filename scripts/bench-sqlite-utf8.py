#!/usr/bin/env python3
"""What the SQLite UTF-8 triggers (migrations/sqlite/20261203000002_utf8_text.sql) cost an
append: 1,000 inserts of a 1.7 KB message, ASCII and not, and one insert of 1 M non-ASCII
characters, into an in-memory database with the SQLite migrations applied, through
Python's sqlite3 as an agent would write. Prints seconds; run from the repository root:

    python3 scripts/bench-sqlite-utf8.py
"""

import sqlite3
import time
from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations" / "sqlite"
INSERT = "INSERT INTO messages (session_id, role, content) VALUES ('s', 'tool', ?)"


def timed(conn: sqlite3.Connection, text: str, times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        conn.execute(INSERT, (text,))
    return time.perf_counter() - started


def main() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for migration in sorted(MIGRATIONS.glob("*.sql")):
        conn.executescript(migration.read_text())
    print(f"1,000 x 1.7 KB ASCII:     {timed(conn, 'checkout 502 ' * 130, 1000):.3f} s")
    print(f"1,000 x 1.7 KB non-ASCII: {timed(conn, 'checkout → 502 ✓ ' * 100, 1000):.3f} s")
    print(f"1 x 1 M chars non-ASCII:  {timed(conn, 'é→✓ ' * 250_000, 1):.3f} s")


if __name__ == "__main__":
    main()
