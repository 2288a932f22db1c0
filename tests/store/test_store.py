"""The conversation database under faults: damage, old and new schemas, two instances at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from reliability import tally

from specchat.errors import SpecchatError
from specchat.store.conversations import MIGRATIONS, Store


def _v1_database(path: Path) -> None:
    """A database exactly as the first released schema left it, with one conversation in it."""
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO conversations VALUES (1, 'old chat', 1.0, 2.0)")
    db.execute("INSERT INTO messages (conversation_id, role, content, status, created) "
               "VALUES (1, 'user', 'hello from v1', 'complete', 1.5)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


RELEASE_DB = Path(__file__).resolve().parent / "data" / "schema4-release.db"


def test_a_database_the_last_release_wrote_gains_thinking_and_branches_and_loses_nothing(tmp_path):
    """data/schema4-release.db was written by the release before thinking and branches were stored (schema
    4, commit 5f20314's Store): two conversations, one answered by a server, an answer killed mid-stream."""
    path = tmp_path / "chat.db"
    path.write_bytes(RELEASE_DB.read_bytes())
    before = sqlite3.connect(path)
    rows = before.execute("SELECT id, conversation_id, role, content, status, stats, model FROM messages").fetchall()
    conversations = before.execute("SELECT id, title, server FROM conversations").fetchall()
    assert before.execute("PRAGMA user_version").fetchone()[0] == 4 and len(rows) == 7
    before.close()
    store = Store(path)
    assert store.version == len(MIGRATIONS) == 7
    after = store.db.execute("SELECT id, conversation_id, role, content, status, stats, model FROM messages")
    assert after.fetchall() == rows
    assert store.db.execute("SELECT id, title, server FROM conversations").fetchall() == conversations
    assert all(m.thinking == "" and m.tool_calls == () and m.tool_call_id == "" for c in store.conversations()
               for m in store.messages(c.id))
    assert all(store.tools(c.id) is None for c in store.conversations())  # tools stay off until turned on
    assert [m.status for m in store.messages(1)][-1] == "partial"  # still marked interrupted
    # Each message now follows the one before it: one branch, in the order it was written.
    shown = store.messages(1)
    assert [m.id for m in shown] == [r[0] for r in rows if r[1] == 1]
    assert [m.parent for m in shown] == [None] + [m.id for m in shown[:-1]]
    assert all((m.branch, m.branches) == (1, 1) for m in shown)
    assert [c.title for c in store.search("Rome")] == ["Capital cities"]  # the index, rebuilt, still finds
    answer = store.add_message(1, "assistant", "", "partial")
    store.update_message(answer, "Rome.", "complete", thinking="Italy's capital is Rome, not Milan.")
    assert store.messages(1)[-1].thinking == "Italy's capital is Rome, not Milan."
    assert [c.title for c in store.search("Milan")] == ["Capital cities"]  # thinking is searched too
    assert store.search("Milan", thinking=False) == [] and len(store.search("Rome", thinking=False)) == 1
    assert "### Thinking\n\n> Italy's capital is Rome, not Milan.\n\nRome." in store.export_markdown(1)
    store.delete_message(answer)
    assert store.search("Milan") == []  # the index forgets a deleted message's thinking
    store.close()


def test_old_schema_is_upgraded_in_place(tmp_path):
    path = tmp_path / "chat.db"
    _v1_database(path)
    store = Store(path)
    assert store.version == len(MIGRATIONS) > 1
    [message] = store.messages(1)
    assert (message.content, message.model) == ("hello from v1", None)
    store.add_message(1, "assistant", "hi", model="some-model")
    assert store.messages(1)[-1].model == "some-model"
    assert store.notice is None
    store.close()
    assert Store(path).messages(1)[0].content == "hello from v1"  # reopening migrates nothing twice


def test_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "chat.db"
    _v1_database(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(SpecchatError, match="newer specchat"):
        Store(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", ["garbage", "zeroed header", "torn middle", "truncated"])
def test_damaged_database_is_moved_aside_and_a_fresh_one_starts(tmp_path, damage):
    path = tmp_path / "chat.db"
    store = Store(path)
    conv = store.new_conversation("precious")
    for n in range(300):  # enough pages that damage in the middle hits real data
        store.add_message(conv.id, "user", f"message {n} " + "x" * 200)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"this is not a database at all" * 100)
    elif damage == "zeroed header":
        data[:100] = bytes(100)
    elif damage == "torn middle":
        middle = len(data) // 2 // 4096 * 4096
        data[middle:middle + 4096] = b"\xff" * 4096
    else:
        data = data[:len(data) // 2 + 123]
    path.write_bytes(bytes(data))

    store = Store(path)
    assert store.notice is not None and "moved to" in store.notice
    [aside] = tmp_path.glob("chat.db.corrupt-*")
    assert aside.read_bytes() == bytes(data)  # the damaged file is kept untouched for recovery
    assert store.conversations() == []
    store.add_message(store.new_conversation().id, "user", "works again")
    tally("damaged database moved aside", faults=1, lost=0)


def _writer(path: str, who: str, n: int, barrier) -> None:
    store = Store(Path(path))
    conv = store.new_conversation(who)
    barrier.wait(60)  # bounded: if the other writer died, this one fails instead of waiting forever
    for i in range(n):
        store.add_message(conv.id, "user", f"{who} {i}")
        if i % 10 == 0:
            store.rename(conv.id, f"{who} after {i}")
    store.close()


def test_two_instances_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "chat.db"
    _v1_database(path)  # both instances also race to upgrade it
    n = 300
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(path), who, n, barrier)) for who in ("left", "right")]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:  # a writer left running would hold up pytest's exit (multiprocessing joins its children)
        for p in procs:
            p.kill()
            p.join()
    store = Store(path)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert store.version == len(MIGRATIONS)
    by_title = {c.title.split()[0]: c for c in store.conversations()}
    for who in ("left", "right"):
        assert [m.content for m in store.messages(by_title[who].id)] == [f"{who} {i}" for i in range(n)]
    tally("two instances on one database", trials=1, lost=2 * n - sum(
        len(store.messages(c.id)) for c in store.conversations() if c.title.split()[0] in ("left", "right")))


def test_a_lock_met_while_opening_is_waited_out(tmp_path, monkeypatch):
    """SQLite answers some locks at once, without its busy timeout (two instances switching an old
    database to WAL together): opening tries again instead of failing."""
    real_open, failures = Store._open, []

    def contended(self):
        if len(failures) < 3:
            failures.append(1)
            raise sqlite3.OperationalError("database is locked")
        return real_open(self)

    monkeypatch.setattr(Store, "_open", contended)
    store = Store(tmp_path / "chat.db")
    assert len(failures) == 3 and store.version == len(MIGRATIONS)


def test_full_text_search_finds_conversations_by_any_message(tmp_path):
    store = Store(tmp_path / "chat.db")
    fruit, code, empty = (store.new_conversation(t) for t in ("Fruit", "Code", "Empty"))
    store.add_message(fruit.id, "user", "Name three fruits.")
    answer = store.add_message(fruit.id, "assistant", "", "partial")
    store.update_message(answer, "Apples, bananas and cherries.", "complete")  # indexed as it streams
    store.add_message(code.id, "user", 'How do I reverse a list in Python? "quotes" AND (syntax*')
    assert [c.id for c in store.search("banana")] == [fruit.id]  # a word's start finds the word
    assert [c.id for c in store.search("python reverse")] == [code.id]  # every word, any order
    assert [c.id for c in store.search('"quotes" AND (syntax*')] == [code.id]  # FTS5 syntax is just text
    assert [c.id for c in store.search("empty")] == [empty.id]  # titles too
    assert store.search("kiwi") == []
    store.delete(fruit.id)
    assert store.search("banana") == []  # deleted messages leave the index


def test_an_old_database_gets_its_messages_indexed(tmp_path):
    path = tmp_path / "chat.db"
    _v1_database(path)
    store = Store(path)
    assert [c.title for c in store.search("hello")] == ["old chat"]
