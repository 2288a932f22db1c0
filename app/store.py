"""Conversations in SQLite: a schema version in PRAGMA user_version and a list of upgrade steps.

Every message is written when it completes (or is stopped), in its own transaction, so a
crash loses at most the answer being generated.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

# Each step upgrades the schema from version i to i + 1. Append; never edit a shipped step.
MIGRATIONS = [
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'complete',
        stats TEXT,
        created REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
]


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir("specchat")) / "specchat.db"


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str
    status: str  # "complete" or "stopped"
    stats: dict | None


class Store:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        for step in range(version, len(MIGRATIONS)):
            with self.db:
                self.db.execute("BEGIN")
                for statement in filter(str.strip, MIGRATIONS[step].split(";")):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {step + 1}")

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    def conversations(self) -> list[Conversation]:
        rows = self.db.execute("SELECT id, title, updated FROM conversations ORDER BY updated DESC, id DESC")
        return [Conversation(*row) for row in rows]

    def new_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                              (title, now, now))
        return Conversation(cur.lastrowid, title, now)

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute("SELECT id, role, content, status, stats FROM messages "
                               "WHERE conversation_id = ? ORDER BY id", (conversation_id,))
        return [StoredMessage(i, r, c, s, json.loads(st) if st else None) for i, r, c, s, st in rows]

    def add_message(self, conversation_id: int, role: str, content: str, status: str = "complete",
                    stats: dict | None = None) -> int:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            cur = self.db.execute("INSERT INTO messages (conversation_id, role, content, status, stats, created) "
                                  "VALUES (?, ?, ?, ?, ?, ?)",
                                  (conversation_id, role, content, status, json.dumps(stats) if stats else None, now))
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return cur.lastrowid

    def delete_message(self, message_id: int) -> None:
        self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def export_markdown(self, conversation_id: int) -> str:
        title = self.db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        lines = [f"# {title[0] if title else 'Conversation'}", ""]
        for m in self.messages(conversation_id):
            mark = " (stopped)" if m.status == "stopped" else ""
            lines += [f"## {m.role.capitalize()}{mark}", "", m.content, ""]
        return "\n".join(lines)
