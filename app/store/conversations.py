"""Conversations in SQLite: a schema version in PRAGMA user_version and a list of upgrade steps.

Every message is its own transaction. An answer is stored as "partial" when generation
starts and its text is updated as it streams, so a crash keeps what the user saw, marked
as interrupted. WAL mode with a busy timeout lets two app instances share one database.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import platformdirs

from specchat.errors import SpecchatError

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
    # 2: which model wrote each answer, so an old conversation says what produced it.
    """
    ALTER TABLE messages ADD COLUMN model TEXT;
    """,
    # 3: full-text search over every message (an FTS5 index kept by triggers). Triggers hold
    # semicolons, so this step is a tuple of statements rather than one script.
    (
        "CREATE VIRTUAL TABLE message_text USING fts5(content, content='messages', content_rowid='id')",
        "INSERT INTO message_text(message_text) VALUES ('rebuild')",
        "CREATE TRIGGER message_text_insert AFTER INSERT ON messages BEGIN "
        "INSERT INTO message_text(rowid, content) VALUES (new.id, new.content); END",
        "CREATE TRIGGER message_text_delete AFTER DELETE ON messages BEGIN "
        "INSERT INTO message_text(message_text, rowid, content) VALUES ('delete', old.id, old.content); END",
        "CREATE TRIGGER message_text_update AFTER UPDATE OF content ON messages BEGIN "
        "INSERT INTO message_text(message_text, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO message_text(rowid, content) VALUES (new.id, new.content); END",
    ),
    # 4: the server a conversation's answers came from (`specchat --server URL`); NULL: this machine.
    """
    ALTER TABLE conversations ADD COLUMN server TEXT;
    """,
    # 5: a reasoning model's thinking, kept apart from its answer, and searched with it.
    (
        "ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT ''",
        "DROP TRIGGER message_text_insert",
        "DROP TRIGGER message_text_delete",
        "DROP TRIGGER message_text_update",
        "DROP TABLE message_text",
        "CREATE VIRTUAL TABLE message_text USING fts5(content, thinking, content='messages', content_rowid='id')",
        "INSERT INTO message_text(message_text) VALUES ('rebuild')",
        "CREATE TRIGGER message_text_insert AFTER INSERT ON messages BEGIN "
        "INSERT INTO message_text(rowid, content, thinking) VALUES (new.id, new.content, new.thinking); END",
        "CREATE TRIGGER message_text_delete AFTER DELETE ON messages BEGIN "
        "INSERT INTO message_text(message_text, rowid, content, thinking) "
        "VALUES ('delete', old.id, old.content, old.thinking); END",
        "CREATE TRIGGER message_text_update AFTER UPDATE OF content, thinking ON messages BEGIN "
        "INSERT INTO message_text(message_text, rowid, content, thinking) "
        "VALUES ('delete', old.id, old.content, old.thinking); "
        "INSERT INTO message_text(rowid, content, thinking) VALUES (new.id, new.content, new.thinking); END",
    ),
    # 6: conversations that branch. Each message follows its parent (NULL: it opens the conversation), so an
    # edited message or a regenerated answer is a sibling of the one it replaces, which stays; the
    # conversation shows the branch that ends at its head. Until now each message followed the one before.
    (
        "ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE",
        "ALTER TABLE conversations ADD COLUMN head INTEGER",
        "UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p "
        "WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)",
        "UPDATE conversations SET head = (SELECT max(id) FROM messages WHERE conversation_id = conversations.id)",
        "CREATE INDEX messages_by_parent ON messages(parent_id)",
    ),
    # 7: tools. An answer's calls (JSON: a list of {id, name, arguments}), the call a `tool` message answers, and
    # which tools a conversation offers the model (JSON: a list of names; NULL: none, tools off).
    """
    ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '';
    ALTER TABLE messages ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE conversations ADD COLUMN tools TEXT;
    """,
]
STATUSES = ("complete", "stopped", "partial")  # partial: the app died while generating it
_BUSY_TIMEOUT_S = 10.0  # another instance's write transaction is short; wait rather than fail


def _locked(e: sqlite3.DatabaseError) -> bool:
    return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir("specchat")) / "specchat.db"


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    updated: float
    server: str | None = None  # the remote server its answers came from; None: this machine's models


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str
    status: str  # one of STATUSES
    stats: dict | None
    model: str | None = None
    thinking: str = ""  # an assistant's reasoning, apart from its answer
    parent: int | None = None  # the message it follows (None: it opens the conversation)
    branch: int = 1  # which of its siblings (the branches at this point) it is, from 1
    branches: int = 1  # how many there are
    tool_calls: tuple[dict[str, str], ...] = ()  # an answer's calls, each {"id", "name", "arguments"}
    tool_call_id: str = ""  # a `tool` message: the call whose result it is


class Store:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Set when a damaged database was moved aside: the UI tells the user where it went.
        self.notice: str | None = None
        self.deletions = 0  # conversations deleted through this Store: what remembers their text must forget it
        try:
            self.db = self._open_waiting()
        except sqlite3.DatabaseError as e:
            if _locked(e):
                raise SpecchatError(f"{self.path} is locked by another program for over "
                                    f"{_BUSY_TIMEOUT_S:.0f} s; close it and retry") from None
            try:
                aside = self._move_aside()
            except OSError as moved:
                raise SpecchatError(f"{self.path} is unreadable ({e}) and could not be moved aside "
                                    f"({moved.strerror}); move it away by hand") from None
            self.notice = (f"the conversation database was unreadable ({e}); it was moved to {aside} "
                           "and specchat started a fresh one")
            self.db = self._open()

    def _open_waiting(self) -> sqlite3.Connection:
        """`_open`, tried again while another instance holds the database. SQLite's busy timeout does
        not cover every lock met while opening: switching an old database to WAL, or a read that must
        become a write, fails at once with "database is locked" when another instance is doing the same
        (two instances started together on a database from an older schema)."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        while True:
            try:
                return self._open()
            except sqlite3.OperationalError as e:
                if not _locked(e) or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):  # checked before anything is written to the file
                raise SpecchatError(f"{self.path} was written by a newer specchat (schema {version}, this one "
                                    f"knows {len(MIGRATIONS)}); upgrade specchat, or move the file away to start "
                                    "afresh")
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a killed process (only power loss can drop the last commits),
            # and spares the streaming partial-answer updates an fsync each.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        """Keep the damaged file (the user may want to recover it) under a name that is never reused."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                os.replace(src, str(aside) + suffix)
        return aside

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        for step in range(version, len(MIGRATIONS)):
            # BEGIN IMMEDIATE: a second instance upgrading at the same moment waits, then sees the new version.
            with db:
                db.execute("BEGIN IMMEDIATE")
                if db.execute("PRAGMA user_version").fetchone()[0] != step:
                    continue
                steps = MIGRATIONS[step]
                for statement in steps if isinstance(steps, tuple) else filter(str.strip, steps.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {step + 1}")

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    def conversations(self) -> list[Conversation]:
        rows = self.db.execute("SELECT id, title, updated, server FROM conversations ORDER BY updated DESC, id DESC")
        return [Conversation(*row) for row in rows]

    def search(self, query: str, limit: int = 50, thinking: bool = True) -> list[Conversation]:
        """Conversations whose title or any message holds every word of `query` (a word may be the
        start of a longer one), most recent first; `thinking`: in a reasoning model's thinking too."""
        match = _match(query, thinking)
        if match is None:
            return self.conversations()
        rows = self.db.execute(
            "SELECT id, title, updated, server FROM conversations WHERE id IN (SELECT m.conversation_id FROM message_text "
            "JOIN messages m ON m.id = message_text.rowid WHERE message_text MATCH ?) OR title LIKE ? "
            "ORDER BY updated DESC, id DESC LIMIT ?", (match, f"%{query.strip()}%", limit))
        return [Conversation(*row) for row in rows]

    def found(self, conversation_id: int, query: str) -> list[int]:
        """The messages of one conversation, on any branch, that hold every word of `query` (as `search` finds
        them, thinking included), oldest first."""
        match = _match(query, True)
        if match is None:
            return []
        rows = self.db.execute("SELECT m.id FROM message_text JOIN messages m ON m.id = message_text.rowid "
                               "WHERE message_text MATCH ? AND m.conversation_id = ? ORDER BY m.id", (match, conversation_id))
        return [row[0] for row in rows]

    def new_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                              (title, now, now))
        return Conversation(cur.lastrowid, title, now)

    def set_server(self, conversation_id: int, server: str | None) -> None:
        """Mark the conversation with the server that answers in it (None: this machine)."""
        self.db.execute("UPDATE conversations SET server = ? WHERE id = ?", (server, conversation_id))

    def server(self, conversation_id: int) -> str | None:
        row = self.db.execute("SELECT server FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row[0] if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self.deletions += 1

    def texts(self) -> list[str]:
        """Every message's text, newest last: what a guesser may copy from (`specchat.service.history`)."""
        rows = self.db.execute("SELECT thinking, content FROM messages WHERE content != '' OR thinking != '' ORDER BY id")
        return [text for row in rows for text in row if text]

    def messages(self, conversation_id: int, head: int | None = None) -> list[StoredMessage]:
        """The branch on screen: from the first message to `head` (a window's own; where it is gone or not
        given, the conversation's head, the branch last shown), each with where it stands among its siblings."""
        rows = self.db.execute("SELECT id, role, content, status, stats, model, thinking, parent_id, tool_calls, "
                               "tool_call_id FROM messages "
                               "WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        if not rows:
            return []
        by_id = {row[0]: row for row in rows}
        children: dict[int | None, list[int]] = {}
        for row in rows:
            children.setdefault(row[7], []).append(row[0])
        at = head if head in by_id else self.head(conversation_id)
        path = []
        while at is not None:
            path.append(by_id[at])
            at = by_id[at][7]
        out = []
        for i, r, c, s, st, m, t, parent, calls, call_id in reversed(path):
            siblings = children[parent]
            out.append(StoredMessage(i, r, c, s, json.loads(st) if st else None, m, t, parent,
                                     siblings.index(i) + 1, len(siblings), tuple(json.loads(calls)) if calls else (),
                                     call_id))
        return out

    def head(self, conversation_id: int) -> int | None:
        """The last message of the branch on screen: the conversation's head, or its newest message where the
        head is not one of its messages (None: it has none)."""
        return self.db.execute(
            "SELECT coalesce((SELECT m.id FROM conversations c JOIN messages m ON m.id = c.head AND m.conversation_id = c.id"
            " WHERE c.id = ?), (SELECT max(id) FROM messages WHERE conversation_id = ?))",
            (conversation_id, conversation_id)).fetchone()[0]

    def siblings(self, message_id: int) -> list[int]:
        """The branches at a message's point of the conversation, itself included, oldest first."""
        rows = self.db.execute("SELECT s.id FROM messages m JOIN messages s ON s.conversation_id = m.conversation_id "
                               "AND s.parent_id IS m.parent_id WHERE m.id = ? ORDER BY s.id", (message_id,))
        return [row[0] for row in rows]

    def show(self, conversation_id: int, message_id: int, down: bool = True) -> int:
        """Show the branch through this message: down to the newest message written after it (or, not
        `down`, ending at it: the next message then starts a branch there). Returns the branch's last message,
        kept as the conversation's head: the branch the next window to open it shows."""
        at = message_id
        while down and (child := self.db.execute("SELECT max(id) FROM messages WHERE parent_id = ?",
                                                 (at,)).fetchone()[0]):
            at = child
        self.db.execute("UPDATE conversations SET head = ? WHERE id = ?", (at, conversation_id))
        return at

    def add_message(self, conversation_id: int, role: str, content: str, status: str = "complete",
                    stats: dict | None = None, model: str | None = None, after: int | None | str = "head",
                    tool_call_id: str = "") -> int:
        """A message at the end of the branch on screen, or, `after` a given message (None: as the first), a
        new branch there; the conversation then shows the branch it ends."""
        assert status in STATUSES, status
        now = time.time()
        with self.db:
            # IMMEDIATE: take the write lock first (waiting for another instance's), rather than read,
            # then find at the write that the other instance committed in between ("database is locked").
            self.db.execute("BEGIN IMMEDIATE")
            if after == "head":
                after = self.head(conversation_id)
            cur = self.db.execute("INSERT INTO messages (conversation_id, role, content, status, stats, created, "
                                  "model, parent_id, tool_call_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  (conversation_id, role, content, status, json.dumps(stats) if stats else None, now,
                                   model, after, tool_call_id))
            self.db.execute("UPDATE conversations SET updated = ?, head = ? WHERE id = ?",
                            (now, cur.lastrowid, conversation_id))
        return cur.lastrowid

    def update_message(self, message_id: int, content: str, status: str = "partial",
                       stats: dict | None = None, thinking: str = "",
                       tool_calls: Sequence[dict[str, str]] = ()) -> None:
        """Overwrite a streaming answer: called as it grows (partial), and once when it ends (with its calls)."""
        assert status in STATUSES, status
        self.db.execute("UPDATE messages SET content = ?, status = ?, stats = coalesce(?, stats), thinking = ?, "
                        "tool_calls = ? WHERE id = ?", (content, status, json.dumps(stats) if stats else None,
                                                        thinking, json.dumps(list(tool_calls)) if tool_calls else "",
                                                        message_id))

    def tools(self, conversation_id: int) -> list[str] | None:
        """The names of the tools this conversation offers the model; None: tools are off."""
        row = self.db.execute("SELECT tools FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] is not None else None

    def set_tools(self, conversation_id: int, names: Sequence[str] | None) -> None:
        self.db.execute("UPDATE conversations SET tools = ? WHERE id = ?",
                        (json.dumps(list(names)) if names is not None else None, conversation_id))

    def delete_message(self, message_id: int) -> None:
        """Delete a message and the branches that follow it; the conversation then shows the branch it
        came from."""
        row = self.db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            return
        conversation_id, parent = row
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            if parent is not None:
                self.show(conversation_id, parent)
            else:
                self.db.execute("UPDATE conversations SET head = (SELECT max(id) FROM messages WHERE conversation_id = ?)"
                                " WHERE id = ?", (conversation_id, conversation_id))

    def export_markdown(self, conversation_id: int, head: int | None = None) -> str:
        title = self.db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        lines = [f"# {title[0] if title else 'Conversation'}", ""]
        if server := self.server(conversation_id):
            lines += [f"Answered by the server at {server}", ""]
        names: dict[str, str] = {}  # each call's id: its tool, which the result's heading names
        for m in self.messages(conversation_id, head):
            mark = {"stopped": " (stopped)", "partial": " (interrupted)"}.get(m.status, "") + (
                f" (branch {m.branch} of {m.branches})" if m.branches > 1 else "")
            if m.role == "tool":  # a result, fenced: it is the tool's text, not Markdown of the conversation's
                lines += [f"## Tool result: {names.get(m.tool_call_id, 'a tool')}{mark}", "", "````", m.content, "````", ""]
                continue
            lines += [f"## {m.role.capitalize()}{mark}", ""]
            if m.thinking:  # marked as thinking: a quote under its own heading, apart from the answer
                lines += ["### Thinking", "", *(f"> {line}".rstrip() for line in m.thinking.splitlines()), ""]
            lines += [m.content, ""]
            for call in m.tool_calls:
                names[call["id"]] = call["name"]
                lines += [f"Calls `{call['name']}` with `{call['arguments']}`", ""]
        return "\n".join(lines)


def _match(query: str, thinking: bool) -> str | None:
    """The full-text query for every word of `query`, each also as the start of a longer one (None: no words);
    without `thinking`, in the answers' text only."""
    words = re.findall(r"\w+", query)
    if not words:
        return None
    match = " ".join(f'"{w}"*' for w in words)  # quoted: FTS5 syntax in the query is just text
    return match if thinking else f"content : ({match})"
