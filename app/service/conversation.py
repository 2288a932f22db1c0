"""One conversation as the store keeps it: what the chat screen does with it, without a screen.

The controller makes every store call of a conversation: the user's message (with its attached
files), the answer stored before its first token and updated as it streams (so that a killed app
keeps what was shown, marked interrupted), its end with its figures, regenerate and edit (each a branch
beside what it replaces, which stays), the branch on screen, and export. It keeps the window's place too: the
message the keys act on, the edit under way, and the walks of the tree they need. The screen only draws; this
is tested headless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.service.events import ENGINE_FIGURES, Answered
from specchat.store.conversations import Store, StoredMessage
from specchat.store.files import atomic_write

SAVE_INTERVAL_S = 0.25  # how often a streaming answer is written to the database
TITLE_LENGTH = 40

# How an answer ended, when that is not the model's own choice: a cut answer always says so.
ENDINGS = {"cancelled": "stopped", "max_tokens": "cut at the max_tokens setting",
           "context_full": "cut: the context is full"}


def summary_line(done: Answered, guesser: str) -> str:
    """One line under an answer: its figures, how it ended when not by itself, and its speedup (said
    to be uncertain when the machine was busy while it was written)."""
    stats, reason = done.stats, done.reason
    ending = f"  [{ENDINGS[reason]}]" if reason in ENDINGS else ""
    against = against_plain(done)
    against = f" · {against}" if against else ""
    # With nothing guessed there is no acceptance to show: "0%" would read as every guess rejected.
    acceptance = f"acceptance {stats.acceptance:.0%}" if stats.drafted else "nothing guessed"
    return (f"{stats.n_tokens} tokens · {stats.decode_s:.1f}s · {stats.tokens_per_s:.1f} tok/s · "
            f"{stats.tokens_per_step:.2f} tok/step · {acceptance}{against} · {guesser}{ending}")


def thinking_line(done: Answered) -> str:
    """The thinking's own figures: its tokens (counted in the answer's too) and their speed."""
    return f"{done.thinking_tokens} tokens · {done.thinking_tokens_per_s:.1f} tok/s"


def against_plain(done: Answered) -> str:
    """The answer's speedup as every front end words it ("" where it is not known), said to be uncertain
    when the machine was busy while it was written."""
    if done.speedup is None:
        return ""
    return f"{done.speedup:.2f}x plain" + (f" (uncertain: the machine was busy, {done.busy_why})" if done.busy else "")


@dataclass(frozen=True)
class ToolChoice:
    """The tools a conversation offers the model, by name, and whether each reply must begin with a round of
    calls (`call_first`: the first answer is made to call one, the next answers in words), for a model too small to
    decide to call by itself."""

    names: tuple[str, ...]
    call_first: bool = False


def calls_of(message: StoredMessage) -> tuple[ToolCall, ...]:
    """A stored answer's tool calls, as the template renders them."""
    return tuple(ToolCall(c["name"], c["arguments"], c["id"]) for c in message.tool_calls)


def _last(messages: Sequence[StoredMessage], role: str) -> StoredMessage | None:
    return next((m for m in reversed(messages) if m.role == role), None)


class Sent(NamedTuple):
    """A message of the user's as stored (its files first), whether it was the conversation's first (which names
    it), and, after an edit, what the input held before the edit began (None: it was no edit)."""

    content: str
    first: bool
    draft: str | None


def attach(text: str, files: Sequence[tuple[Path, str]]) -> str:
    """The message with its attached files ahead of it, each fenced and named, so the model can
    refer to them and prompt lookup can copy from them."""
    parts = [f"File `{path.name}`:\n\n````\n{content.rstrip()}\n````" for path, content in files]
    return "\n\n".join([*parts, text])


class ConversationController:
    """One conversation of the store, as one window shows it, and the answer being written into it (at most
    one at a time). The window keeps its own branch (`head`): another window on the same conversation that
    switches branch changes what opens next, never what this one shows, sends or adds to."""

    def __init__(self, store: Store, conversation_id: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.id, self._clock = store, conversation_id, clock
        self.head = store.head(conversation_id)  # the last message of the branch on screen (None: none yet)
        self._answer: int | None = None  # the streaming answer's message id
        self._text = ""
        self._saved = float("-inf")
        self.selected: int | None = None  # the message the keys act on (its place on the branch on screen); None: the last
        self.editing: StoredMessage | None = None  # the user's message being edited (sent: a branch beside it)
        self.draft = ""  # what the input held when the edit began: it goes back there when the edit ends

    @classmethod
    def latest(cls, store: Store) -> ConversationController:
        """The most recent conversation, or a new one if there is none."""
        conversations = store.conversations()
        return cls(store, conversations[0].id if conversations else store.new_conversation().id)

    @classmethod
    def new(cls, store: Store) -> ConversationController:
        return cls(store, store.new_conversation().id)

    # --- reading --------------------------------------------------------------------------

    def messages(self) -> list[StoredMessage]:
        """The branch on screen, which stays this window's from the first read on (`head`)."""
        messages = self.store.messages(self.id, self.head)
        self.head = messages[-1].id if messages else None
        return messages

    def _add(self, role: str, content: str, status: str = "complete", model: str | None = None,
             after: int | None | str = "end", tool_call_id: str = "", stats: dict | None = None) -> int:
        """A message at the end of the branch on screen (or `after` a given message: a branch there)."""
        self.head = self.store.add_message(self.id, role, content, status, stats, model=model,
                                           after=self._tail() if after == "end" else after, tool_call_id=tool_call_id)
        return self.head

    def _tail(self) -> int | None:
        shown = self.messages()
        return shown[-1].id if shown else None

    @property
    def server(self) -> str | None:
        """The server this conversation's answers came from; None: this machine."""
        return self.store.server(self.id)

    def prompt_messages(self, system_prompt: str) -> list[Message]:
        """What the model is given: the system prompt, then every message so far. ("History" in this
        project is the index of past conversations the history guesser copies from.)"""
        system = [Message("system", system_prompt)] if system_prompt else []
        return system + [Message(m.role, m.content, m.thinking, tool_calls=calls_of(m), tool_call_id=m.tool_call_id)
                         for m in self.messages()]

    def estimated_tokens(self, system_prompt: str, count: Callable[[str], int]) -> int:
        """The size of the prompt the next answer is given, from its messages' text before the template lays it out
        (`count`: the model's tokenizer; 4 tokens a message for the template's own)."""
        return sum(count(m.content) + 4 for m in self.prompt_messages(system_prompt))

    def last(self, role: str) -> StoredMessage | None:
        return _last(self.messages(), role)

    # --- the selection and the edit (this window's) ----------------------------------------

    def select(self, step: int, shown: int) -> None:
        """Move the selection `step` messages up (-1) or down among the `shown` ones: past the last, none is
        selected, which means the last."""
        at = (shown if self.selected is None else self.selected) + step
        self.selected = None if at >= shown else max(0, at)

    def acted_on(self, role: str) -> StoredMessage | None:
        """The selected message if it is of this role, else the last such message of the branch on screen: what
        regenerate (an answer) and edit (a message of the user's) act on."""
        messages = self.messages()
        if self.selected is not None and self.selected < len(messages) and messages[self.selected].role == role:
            return messages[self.selected]
        return _last(messages, role)

    def regenerate(self) -> bool:
        """Let the branch on screen end at the question of the answer acted on, so that the next answer is a new
        branch beside it (which stays); the selection goes back to the last message. False where there is no
        answer to regenerate."""
        answer = self.acted_on("assistant")
        if answer is None or answer.parent is None:
            return False
        self.end_at(next(m for m in self.messages() if m.id == answer.parent))
        self.selected = None
        return True

    def branch_point(self) -> int | None:
        """Where Alt+←/→ switch branches (a place in the branch on screen): the selected message, else the last
        one that has branches; None where none has."""
        messages = self.messages()
        if self.selected is not None and self.selected < len(messages):
            return self.selected
        return next((n for n in range(len(messages) - 1, -1, -1) if messages[n].branches > 1), None)

    def switch_at(self, at: int, step: int) -> StoredMessage | None:
        """`switch` at the `at`-th message of the branch on screen, which is then selected: the message there now;
        None where there is no branch that way."""
        if not self.switch(self.messages()[at], step):
            return None
        self.selected = at
        return self.messages()[at]

    def edit(self, typed: str) -> StoredMessage | None:
        """Begin an edit of the user's message acted on (None: there is none); sent, it is stored as a new branch
        beside that message. `typed` is what the input holds now, kept to go back there when the edit ends (an edit
        begun over another keeps what was typed before the first)."""
        message = self.acted_on("user")
        if message is not None:
            self.draft = typed if self.editing is None else self.draft
            self.editing = message
        return message

    def cancel_edit(self) -> str | None:
        """Drop the edit under way: returns what the input held before it began, to put back (None: there was
        no edit)."""
        if self.editing is None:
            return None
        draft, self.editing, self.draft = self.draft, None, ""
        return draft

    def send(self, text: str, attachments: Sequence[tuple[Path, str]] = ()) -> Sent:
        """The user's message (`add_user`): the edit under way, if any, else the next message; the selection goes
        back to the last message."""
        first, editing = not self.messages(), self.editing
        draft, self.selected = self.cancel_edit(), None
        return Sent(self.add_user(text, attachments, instead_of=editing), first, draft)

    def keep_place(self, before: ConversationController) -> None:
        """This window opened its conversation again (from the list, or a search): the selection and an edit under
        way stay as `before` had them."""
        self.selected, self.editing, self.draft = before.selected, before.editing, before.draft

    # --- writing --------------------------------------------------------------------------

    def add_user(self, text: str, attachments: Sequence[tuple[Path, str]] = (),
                 instead_of: StoredMessage | None = None) -> str:
        """Store the user's message, files first; the first message names the conversation. `instead_of`: an
        edit of that message, stored as a new branch beside it (the original and its answers stay)."""
        if not self.messages():
            self.store.rename(self.id, text.splitlines()[0][:TITLE_LENGTH])
        content = attach(text, attachments)
        self._add("user", content, after=instead_of.parent if instead_of else "end")
        return content

    def end_at(self, message: StoredMessage) -> None:
        """Let the branch on screen end at this message: the next answer becomes a branch beside what
        followed it (regenerate), which stays."""
        self.head = self.store.show(self.id, message.id, down=False)

    def show_found(self, query: str) -> bool:
        """Where the branch on screen holds nothing that a search for `query` found, show the branch through the
        newest message that holds it (down to that branch's newest message): what was searched for is then in
        view. True where the branch changed."""
        found = self.store.found(self.id, query)
        if not found or set(found) & {m.id for m in self.messages()}:
            return False
        self.head = self.store.show(self.id, found[-1])
        return True

    def switch(self, message: StoredMessage, step: int) -> bool:
        """Show the branch `step` places from this message's (-1: the one before); False where there is none."""
        siblings = self.store.siblings(message.id)
        if message.id not in siblings:
            raise SpecchatError("that message is gone: the conversation was changed or deleted in another "
                                "specchat window; open it again from the list")
        at = siblings.index(message.id) + step
        if not 0 <= at < len(siblings):
            return False
        self.head = self.store.show(self.id, siblings[at])
        return True

    def begin_answer(self, model: str, server: str | None) -> StoredMessage:
        """Store the answer before its first token, as partial: if specchat is killed, the answer so far
        survives, marked interrupted. A server that answers marks the conversation. Returns the answer as
        stored (empty, with where it stands among its siblings)."""
        if server is not None and self.server != server:
            self.store.set_server(self.id, server)
        self._asked = self._tail()  # where the branch on screen goes back to if the answer comes to nothing
        self._answer = self._add("assistant", "", "partial", model=model, after=self._asked)
        self._text, self._thinking, self._saved = "", "", float("-inf")
        return self.messages()[-1]

    def stream(self, text: str, thinking: str = "") -> None:
        """More of the answer (and of its thinking) arrived: written now and then (at most every
        SAVE_INTERVAL_S)."""
        assert self._answer is not None, "no answer is being written"
        self._text += text
        self._thinking += thinking
        if self._clock() - self._saved >= SAVE_INTERVAL_S:
            self.store.update_message(self._answer, self._text, thinking=self._thinking.strip())
            self._saved = self._clock()

    def finish(self, done: Answered, guesser: str, notices: Sequence[str] = ()) -> str:
        """The answer ended (or was stopped: kept, marked so): stored whole with its figures. Returns its
        summary line, which names where the figures come from when they are not the engine's."""
        assert self._answer is not None, "no answer is being written"
        label = guesser if done.figures == ENGINE_FIGURES else done.figures
        # A notice (e.g. old turns dropped to fit the context) stays with the answer it concerns.
        summary = " · ".join([summary_line(done, label), *notices])
        s = done.stats
        stats = {"summary": summary, "reason": done.reason, "tokens": s.n_tokens, "acceptance": s.acceptance,
                 "guesser": label, "tokens_per_s": s.tokens_per_s, "tokens_per_step": s.tokens_per_step,
                 "wall_tokens_per_s": s.wall_tokens_per_s}
        if done.thinking_tokens:
            stats["thinking"] = thinking_line(done)
        self.store.update_message(self._answer, done.text, "stopped" if done.reason == "cancelled" else "complete",
                                  stats, thinking=done.thinking,
                                  tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in done.calls])
        self._answer = None
        return summary

    def add_tool_result(self, call_id: str, text: str, refused: bool = False, failed: bool = False) -> None:
        """A call's result (or the line saying why there is none: the user `refused` the call, or it `failed`),
        after the answer that made the call."""
        self._add("tool", text, tool_call_id=call_id, stats={"refused": refused, "failed": failed})

    @property
    def tools(self) -> ToolChoice | None:
        """The tools this conversation offers the model; None: tools are off."""
        stored = self.store.tools(self.id)
        return ToolChoice(tuple(stored.get("names", ())), bool(stored.get("call_first"))) if stored is not None else None

    @tools.setter
    def tools(self, choice: ToolChoice | None) -> None:
        self.store.set_tools(self.id, {"names": list(choice.names), "call_first": choice.call_first}
                             if choice is not None else None)

    def fail(self) -> bool:
        """The generation failed: what streamed before stays, marked stopped; an empty answer goes.
        Returns whether anything was kept."""
        assert self._answer is not None, "no answer is being written"
        if self._text or self._thinking:
            self.store.update_message(self._answer, self._text, "stopped", thinking=self._thinking.strip())
        else:
            self.store.delete_message(self._answer)
            self.head = self._asked
        self._answer = None
        return bool(self._text or self._thinking)

    def rename(self, title: str) -> None:
        self.store.rename(self.id, title)

    def delete(self) -> ConversationController:
        """Delete this conversation; returns the one to show next (the latest, or a new one)."""
        self.store.delete(self.id)
        return self.latest(self.store)

    def export(self) -> Path:
        """Write the conversation as Markdown next to the database, under exports/."""
        out = self.store.path.parent / "exports" / f"conversation-{self.id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, self.store.export_markdown(self.id, self.head))
        return out
