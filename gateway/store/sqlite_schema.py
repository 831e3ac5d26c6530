"""The SQLite store's schema (``store/sqlite.py``): its tables and indexes, and how a file made
by an earlier version is brought up to date when it is opened (indexes replaced, columns added,
daily totals summed from the records once).

Columns added since a table's first release (``ADDED_COLUMNS``) are in its ``CREATE TABLE`` for
a new file and added by ``ALTER TABLE`` to a file that lacks them, each with a default that
means what the earlier version meant: a usage record an earlier version wrote has no token
classes and no pico-units (0), an account no carry (0).
"""

from __future__ import annotations

import sqlite3

# every change the caches must see (keys, users, accounts but debits, the catalogue, sign-outs)
BUMP_VERSION = "UPDATE meta SET version = version + 1 WHERE id = 1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    id      TEXT PRIMARY KEY,
    balance INTEGER NOT NULL,
    carry   INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS keys (
    id         TEXT PRIMARY KEY,
    key_hash   TEXT NOT NULL UNIQUE,
    account    TEXT NOT NULL,
    grp        TEXT NOT NULL,
    name       TEXT NOT NULL DEFAULT '',
    status     TEXT NOT NULL DEFAULT 'enabled',
    expires_at INTEGER,
    created_at INTEGER,
    hint       TEXT NOT NULL DEFAULT '',
    quota      INTEGER,
    models     TEXT,
    allowed_ips TEXT,
    spent      INTEGER NOT NULL DEFAULT 0,
    owner      TEXT
);
CREATE INDEX IF NOT EXISTS keys_account ON keys (account);
CREATE TABLE IF NOT EXISTS usage (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    time              INTEGER NOT NULL,
    request_id        TEXT NOT NULL,
    account           TEXT NOT NULL,
    key_id            TEXT NOT NULL,
    model             TEXT NOT NULL,
    channel           TEXT,
    protocol          TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost              INTEGER NOT NULL,
    status            INTEGER NOT NULL,
    latency_ms        INTEGER NOT NULL,
    ip_range          TEXT NOT NULL,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens   INTEGER NOT NULL DEFAULT 0,
    cost_pico          INTEGER NOT NULL DEFAULT 0,
    cache_write_1h_tokens INTEGER NOT NULL DEFAULT 0
);
-- usage indexes ascend: each new row lands at their right edge, where SQLite splits a full
-- page cheaply and leaves it full, and the newest-first listings read them backwards. A file
-- of an earlier version has descending ones, which took new rows at their left edge, where a
-- split leaves two half-full pages: they are replaced once
DROP INDEX IF EXISTS usage_account_time;
DROP INDEX IF EXISTS usage_time;
CREATE INDEX IF NOT EXISTS usage_by_account ON usage (account, time, seq);
CREATE INDEX IF NOT EXISTS usage_by_time ON usage (time, seq);
-- a key's records, newest first: the usage listing's key filter, a key holder's own view
CREATE INDEX IF NOT EXISTS usage_by_key ON usage (key_id, time, seq);
-- settlement looks a batch's request ids up here: a record is stored once
CREATE INDEX IF NOT EXISTS usage_by_request ON usage (request_id);
-- the daily totals (store.DailyUsage), kept by settle in the transaction that adds records
CREATE TABLE IF NOT EXISTS usage_daily (
    day               TEXT NOT NULL,
    account           TEXT NOT NULL,
    key_id            TEXT NOT NULL,
    model             TEXT NOT NULL,
    requests          INTEGER NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost              INTEGER NOT NULL,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, account, key_id, model)
);
CREATE TABLE IF NOT EXISTS catalogue (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    payload    TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS holds (
    instance TEXT NOT NULL,
    account  TEXT NOT NULL,
    amount   INTEGER NOT NULL,
    expires  INTEGER NOT NULL,
    PRIMARY KEY (instance, account)
);
CREATE TABLE IF NOT EXISTS cooling (
    channel TEXT PRIMARY KEY,
    until   INTEGER NOT NULL
);
-- console sessions ended by sign-out, kept until they would have ended anyway
CREATE TABLE IF NOT EXISTS revoked_sessions (
    nonce   TEXT PRIMARY KEY,
    expires INTEGER NOT NULL
);
-- console users (store.UserRecord): a username is unique in any case, grps (``groups`` is a
-- keyword of SQL) a JSON list
CREATE TABLE IF NOT EXISTS users (
    id            TEXT PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE COLLATE NOCASE,
    password_hash TEXT NOT NULL,
    account       TEXT NOT NULL,
    grps          TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'enabled',
    created_at    INTEGER
);
-- redemption codes (store.RedemptionRecord), by the SHA-256 of the code, never the code
CREATE TABLE IF NOT EXISTS redemptions (
    id         TEXT PRIMARY KEY,
    code_hash  TEXT NOT NULL UNIQUE,
    hint       TEXT NOT NULL,
    amount     INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    used_at    INTEGER,
    account    TEXT,
    user       TEXT
);
-- secrets the instances share, made at random (store/sqlite_signin.py): the console's
-- session-signing secret
CREATE TABLE IF NOT EXISTS secrets (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
-- failed sign-ins and admin-token attempts per address range or account name, in a window
-- that starts at the first (store/sqlite_signin.py)
CREATE TABLE IF NOT EXISTS sign_in_failures (
    name     TEXT PRIMARY KEY,
    failures INTEGER NOT NULL,
    until    INTEGER NOT NULL
);
-- the audit log (store/audit.py, store/sqlite_audit.py): one row per operator change, the
-- newest AUDIT_KEEP kept, ``fields`` a JSON object of the change's non-secret values
CREATE TABLE IF NOT EXISTS audit (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    time        INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    object_type TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    fields      TEXT NOT NULL,
    ip_range    TEXT NOT NULL,
    status      INTEGER NOT NULL,
    via         TEXT NOT NULL,
    request_id  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, version) VALUES (1, 0);
-- the catalogue, one row per entry (store/catalogue.py): the one-row ``catalogue`` table above
-- is what earlier versions wrote, no longer read
CREATE TABLE IF NOT EXISTS catalogue_entries (
    kind    TEXT NOT NULL,
    name    TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);
"""

# columns added to a table after its first release: a file made before gets them at open
ADDED_KEY_COLUMNS = {
    "quota": "INTEGER",
    "models": "TEXT",
    "allowed_ips": "TEXT",
    "spent": "INTEGER NOT NULL DEFAULT 0",
    "owner": "TEXT",  # the user that made the key (none: every key made before users)
}
ADDED_COLUMNS = {
    "keys": ADDED_KEY_COLUMNS,
    # pico-units (1e-12) the account's records cost beyond what was debited (``Account.carry``)
    "accounts": {"carry": "INTEGER NOT NULL DEFAULT 0"},
    "usage": {
        "cache_read_tokens": "INTEGER NOT NULL DEFAULT 0",
        "cache_write_tokens": "INTEGER NOT NULL DEFAULT 0",
        "reasoning_tokens": "INTEGER NOT NULL DEFAULT 0",
        "cost_pico": "INTEGER NOT NULL DEFAULT 0",
        "cache_write_1h_tokens": "INTEGER NOT NULL DEFAULT 0",
    },
    # the days' cache classes (store.DailyUsage); 0 on the days summed before they were kept
    "usage_daily": {
        "cache_read_tokens": "INTEGER NOT NULL DEFAULT 0",
        "cache_write_tokens": "INTEGER NOT NULL DEFAULT 0",
    },
}

# what needs the added columns: run after they are added
AFTER_COLUMNS = ("CREATE INDEX IF NOT EXISTS keys_owner ON keys (owner)",)

BACKFILL_DAILY = """
INSERT INTO usage_daily (day, account, key_id, model, requests, prompt_tokens,
                         completion_tokens, cost, cache_read_tokens, cache_write_tokens)
SELECT strftime('%Y-%m-%d', time / 1000000, 'unixepoch'), account, key_id, model, COUNT(*),
       SUM(prompt_tokens), SUM(completion_tokens), SUM(cost), SUM(cache_read_tokens),
       SUM(cache_write_tokens)
FROM usage GROUP BY 1, 2, 3, 4
"""


def create_schema(conn: sqlite3.Connection, *, backfill_daily: bool) -> None:
    """Create what the file lacks, in one write transaction: tables, indexes, the columns added
    since their tables' first release (``ADDED_COLUMNS``) and, when ``backfill_daily`` (the file
    had no daily totals before this open), the daily totals of the records it holds."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        _add_missing_columns(conn)
        for statement in AFTER_COLUMNS:
            conn.execute(statement)
        if backfill_daily:  # a file from before the daily totals: sum its records once
            conn.execute(BACKFILL_DAILY)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    for table, columns in ADDED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, decl in columns.items():
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
