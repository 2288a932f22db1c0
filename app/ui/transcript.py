"""The conversation on the chat screen: a view per message of the branch shown, the answer streaming into the last.

The transcript draws what the conversation's controller holds and acts on its views: the selected message
marked, provenance and thinking shown or folded, an answer or its code blocks copied. Which message is selected,
and every store call, are the controller's; starting an answer and streaming it are `Answers`' (ui/answers.py).
"""

from __future__ import annotations

from typing import Callable

from textual import events, on
from textual.containers import VerticalScroll
from textual.widgets.markdown import MarkdownFence

from specchat.service.conversation import ConversationController
from specchat.store.conversations import StoredMessage
from specchat.ui.widgets import MessageView, ToolView, call_line, code_blocks


def message_view(message: StoredMessage, calls: dict[str, str]) -> MessageView:
    """A stored message's view; a tool's result is titled with its call's line (`calls`, by the call's id)."""
    stats = message.stats or {}
    branches = message.branch, message.branches
    if message.role == "tool":
        return ToolView(message.content, calls.get(message.tool_call_id, "a tool"), stats.get("refused", False),
                        stats.get("failed", False), branches)
    return MessageView(message.role, message.content, stats.get("summary", ""), message.status, message.thinking,
                       stats.get("thinking", ""), branches)


def last_answer(conversation: ConversationController | None) -> str | None:
    """The last answer of the branch on screen, as stored (None where there is none)."""
    last = conversation.last("assistant") if conversation is not None else None
    return last.content if last is not None else None


class Transcript(VerticalScroll):
    """The messages of the branch on screen, oldest first; `say` puts a line on the screen's status line."""

    def __init__(self, say: Callable[[str], None], **kwargs) -> None:
        super().__init__(**kwargs)
        self.say = say
        self.provenance = False  # each token coloured by where it came from (Ctrl+T), in every answer shown
        self._code_cursor = -1  # which code block of the last answer F3 copied last

    async def show(self, conversation: ConversationController) -> None:
        """The conversation's branch on show, in place of what was: scrolled to its end where no message is
        selected, else the selected one marked once laid out. The old views are gone before the new come: until
        their removal is done they still answer a query, and the mark would land on one of them."""
        await self.remove_children()
        calls: dict[str, str] = {}
        views = []
        for message in conversation.messages():
            calls.update((c["id"], call_line(c["name"], c["arguments"])) for c in message.tool_calls)
            views.append(message_view(message, calls))
        await self.mount_all(views)
        if conversation.selected is None:
            self.scroll_end(animate=False)
        else:
            self.call_after_refresh(self.mark, conversation)

    async def begin_answer(self) -> MessageView:
        """A view for the next answer, mounted before anything streams into it: the Markdown body's first (empty)
        render, run on mount, would otherwise land after the first blocks and show them twice."""
        view = MessageView("assistant")
        await self.mount(view)
        self.anchor()
        return view

    def answer_ended(self) -> None:
        """A generation ended: F3 copies from the first code block of its answer."""
        self._code_cursor = -1

    # --- the selection ----------------------------------------------------------------------

    def select(self, conversation: ConversationController, step: int) -> None:
        """Move the conversation's selection up or down the messages shown, and mark it."""
        shown = len(self.query(MessageView))
        if shown:
            conversation.select(step, shown)
            self.mark(conversation)

    def mark(self, conversation: ConversationController | None) -> None:
        """Mark the conversation's selected message, in view, and say what it is and what acts on it."""
        views, selected = list(self.query(MessageView)), conversation.selected if conversation else None
        for n, view in enumerate(views):
            view.set_class(n == selected, "selected")
        if selected is not None and selected < len(views):
            view = views[selected]
            view.scroll_visible()
            self.say(f"selected: {'your message' if view.role == 'user' else 'an answer'} "
                     f"{selected + 1} of {len(views)} · Ctrl+E edits, Ctrl+R regenerates, Alt+←/→ its branches")
        else:
            self.say("")

    # --- what the answers show --------------------------------------------------------------

    def toggle_provenance(self) -> None:
        self.provenance = not self.provenance
        for view in self.query(MessageView):
            view.show_provenance(self.provenance)
        self.say("provenance " + ("on: green accepted guess, red target correction, cyan bonus token"
                                  if self.provenance else "off"))

    def toggle_thinking(self) -> None:
        """Fold or open the thinking of the latest answer that has some."""
        if not any(view.toggle_thinking() for view in reversed(list(self.query(MessageView)))):
            self.notify("No thinking to show: the answers here have none")

    # --- copying ----------------------------------------------------------------------------

    def copy_answer(self, conversation: ConversationController | None) -> None:
        answer = last_answer(conversation)
        if answer is not None:
            self.app.copy_to_clipboard(answer)  # OSC 52: works over SSH too
            self.notify("Answer copied to the clipboard")

    def copy_code(self, conversation: ConversationController | None) -> None:
        """Copy the next code block of the last answer (F3 again: the one after it)."""
        answer = last_answer(conversation)
        blocks = code_blocks(answer) if answer is not None else []
        if not blocks:
            self.notify("The last answer has no code block")
            return
        self._code_cursor = (self._code_cursor + 1) % len(blocks)
        language, code = blocks[self._code_cursor]
        self._copy_code(code, f"code block {self._code_cursor + 1} of {len(blocks)}" + (f" ({language})" if language else ""))

    @on(events.Click)
    def _clicked(self, event: events.Click) -> None:
        """A click on a code block copies it."""
        widget = event.widget
        while widget is not None and not isinstance(widget, MarkdownFence):
            widget = widget.parent if widget.parent is not self else None
        if isinstance(widget, MarkdownFence):
            self._copy_code(widget.code, "code block" + (f" ({widget.lexer})" if widget.lexer else ""))

    def _copy_code(self, code: str, what: str) -> None:
        self.app.copy_to_clipboard(code)
        self.notify(f"Copied {what}: {len(code.splitlines())} lines")
