"""The chat screen's answers: each generated in a worker thread from the conversation on screen, its batches drawn
as they come (into the transcript and the stats panel) and stored through the conversation's controller; and the
figures around them: the stats panel reset for the backend, the context meter, the guesser and thinking settings
as the backend takes them.

With tools, one generation is several answers, the calls that ran between them shown (and stored) as results.
`Pump` posts the batches to the screen, which hands each to `Answers.show`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from textual.widgets import Static

from specchat.llama.template import Message
from specchat.mcptools.agent import RoundsSpent, ToolRan
from specchat.service import choices
from specchat.service.choices import Answering
from specchat.service.conversation import ToolChoice, thinking_line
from specchat.service.events import ENGINE_FIGURES, BackendEvent
from specchat.ui.conversations import ConversationList
from specchat.ui.streaming import GenerationBatch, Pump
from specchat.ui.widgets import MessageView, StatsPanel, ToolView, call_line

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp
    from specchat.ui.chat import ChatScreen

CONTEXT_WARNING = 0.8  # share of the context after which the meter warns that old turns will be left out


class Answers:
    """The answers of the chat screen's conversation, one generation at a time (the screen's `busy` says one runs,
    and the screen sets it: it starts the generation and hears of its end).

    The screen calls in here, and what is here uses Textual's methods and the screen's widgets, not the screen's own
    methods (its `chat_app`, `status`, `busy`'s watcher): calling them back would enter ui.chat twice on one stack,
    the two modules one role split in two (tests/test_layout.py traces a send and checks). One call back is left,
    off that path: `open`, after a failed regenerate."""

    def __init__(self, screen: ChatScreen) -> None:
        self.screen = screen
        self.thinking_noticed = False  # the thinking setting was said not to apply to this model
        self._answer: tuple[MessageView, list[str]] | None = None  # the streaming answer's view, its notices
        self._guesser = ""  # the guesser of the generation under way: its answers are stored and shown as its

    @property
    def app(self) -> SpecchatApp:
        return self.screen.app  # type: ignore[return-value]

    def _status(self, text: str) -> None:
        self.screen.query_one("#status", Static).update(text)

    async def start(self) -> None:
        """Answer the conversation as it stands: its view first, then the generation, in a worker."""
        screen, app = self.screen, self.app
        assert screen.conversation is not None and app.backend is not None
        self.reset_stats()
        answering = self.answering()
        self._guesser = answering.guesser
        server = app.backend.server
        self._status(f"generating on {server}… (Esc stops)" if server else
                      f"generating with {answering.guesser}… (Esc stops)")
        messages = screen.conversation.prompt_messages(answering.system)
        marked = screen.conversation.server
        await self._begin()
        if server is not None and marked != server:  # the conversation says where its answers came from
            screen.sub_title = f"answered by {server}"
            screen.query_one(ConversationList).refresh_list()
        screen.run_worker(partial(self._generate, messages, answering, screen.conversation.tools), thread=True,
                          group="generate")

    async def _begin(self) -> None:
        """A view for the next answer, and the answer stored before its first token."""
        app, conversation = self.app, self.screen.conversation
        assert conversation is not None and app.backend is not None
        view = await self.screen.transcript.begin_answer()
        stored = conversation.begin_answer(app.backend.name, app.backend.server)
        view.branches = stored.branch, stored.branches
        view.relabel()
        self._answer = (view, [])

    def _generate(self, messages: list[Message], answering: Answering, tools: ToolChoice | None) -> None:
        """The generation, in the worker thread: its events go to the screen in batches."""
        screen, settings = self.screen, self.app.settings
        assert self.app.backend is not None
        backend, config, guesser, think = self.app.backend, answering.config, answering.guesser, answering.think

        def answer(conversation: Sequence[Message], offered: list[dict[str, Any]] | None,
                   choice: str = "auto") -> Iterator[BackendEvent]:
            return backend.chat(conversation, config, guesser, screen.cancel, think, offered, choice)

        Pump(screen).run(answer(messages, None) if tools is None else
                         screen.tools.answer(messages, tools, answer, settings.tool_rounds, screen.cancel))

    async def show(self, batch: GenerationBatch) -> None:
        """Draw a batch: the answer's pieces and figures, its end (stored, summed up), or its failure."""
        screen, conversation = self.screen, self.screen.conversation
        assert conversation is not None
        if self._answer is None and (batch.pieces or batch.done is not None):
            await self._begin()  # the answer after a round of tool calls
        if self._answer is None:  # between answers: what the calls gave, or a failure before the next began
            await self._show_calls(batch)
            return
        view, notices = self._answer
        stats = screen.query_one(StatsPanel)
        if batch.prefill is not None:
            stats.prefill(batch.prefill.seconds)
        for text in batch.notices:
            notices.append(text)
            screen.notify(text, severity="warning", timeout=10)
        if batch.pieces:
            stats.add(batch.pieces)
            await view.append(batch.pieces)
            conversation.stream(batch.text, batch.thinking)
        if batch.last:
            stats.flush()
        if batch.done is not None:
            done = batch.done
            stats.finish(done)
            # A stopped answer is kept, marked as such, so nothing the user saw is lost.
            summary = conversation.finish(done, self._guesser, notices)
            status = "stopped" if done.reason == "cancelled" else "complete"
            await view.finish(done.text, summary, status, done.thinking,
                              thinking_line(done) if done.thinking_tokens else "")
            source = f"guesser {self._guesser}" if done.figures == ENGINE_FIGURES else \
                f"figures: {done.figures}"
            self._status(f"{'stopped' if status == 'stopped' else 'done'} · {source} · Ctrl+R regenerates" if batch.last
                          else f"{len(done.calls)} tool call{'s' if len(done.calls) != 1 else ''}… (Esc stops)")
            self.show_context(done.stats.n_prompt + done.stats.n_tokens)
            self._answer = None
        elif batch.error is not None:
            # Whatever streamed before the failure stays, marked stopped; an empty answer goes.
            if not conversation.fail():
                await view.remove()
                await screen.open(conversation)  # a failed regenerate: the branch it left shows again
        await self._show_calls(batch)

    async def _show_calls(self, batch: GenerationBatch) -> None:
        """The tool calls that ran (each stored, and shown folded), and the end of the generation (or its failure,
        said once whatever of the answer was kept)."""
        screen = self.screen
        assert screen.conversation is not None
        for event in batch.ran:
            if isinstance(event, ToolRan):
                call, result, failed = event.call, event.result, event.result.error and not event.refused
                screen.conversation.add_tool_result(call.id, result.text, event.refused, failed)
                await screen.transcript.mount(ToolView(result.text, call_line(call.name, call.arguments),
                                                       event.refused, failed))
            elif isinstance(event, RoundsSpent):
                screen.notify(f"The answer reached the bound of {event.rounds} rounds of tool calls: it answers "
                              "without tools now (Settings: tool rounds)", severity="warning", timeout=10)
        if batch.error is not None:
            self.app.fail(batch.error)
        if batch.last:
            self._answer = None
            screen.transcript.answer_ended()

    # --- the figures around the answers -------------------------------------------------------

    def reset_stats(self) -> None:
        """Clear the panel for the next answer (or a new backend). A server runs the guesser it is asked
        for, if it can; the panel says so."""
        backend = self.app.backend
        if backend is None:
            return
        self.screen.query_one(StatsPanel).reset(backend.name, backend.baseline(), self.guesser_label())

    def guesser_label(self) -> str:
        """The guesser setting as the backend takes it: what runs, or what a server is asked to run."""
        backend, guesser = self.app.backend, self.app.settings.guesser
        return f"{guesser} (asked)" if backend is not None and backend.guesser_asked else guesser

    def answering(self) -> Answering:
        """What the next answer runs with: the settings, as the backend can take them (the app names nothing of
        its own). Where the model's template has no switch for the thinking setting, the model's own default, and a
        notice says so once; the guesser's line was said when the models loaded (`SpecchatApp._backend_ready`)."""
        backend = self.app.backend
        assert backend is not None
        answering = choices.answering(self.app.settings, backend.guessers, backend.thinking_switch)
        if answering.guesser_notice is not None:  # chosen in Settings opened while the models loaded: auto runs
            self.screen.notify(answering.guesser_notice, severity="warning", timeout=10)
        if answering.thinking_notice is not None and not self.thinking_noticed:
            self.thinking_noticed = True
            self.screen.notify(answering.thinking_notice, severity="warning", timeout=10)
        return answering

    def show_context(self, used: int | None) -> None:
        """Tokens used out of the context: exact after an answer (its prompt plus the answer),
        estimated from the messages' text when a conversation is opened."""
        app, conversation = self.app, self.screen.conversation
        backend, meter = app.backend, self.screen.query_one("#context-meter", Static)
        if backend is None or not app.ready:
            meter.update("")
            return
        estimated = used is None
        if used is None:
            used = conversation.estimated_tokens(app.settings.system_prompt, backend.count_tokens) \
                if conversation else 0
        share = used / backend.n_ctx
        text = f"context {'≈' if estimated else ''}{used:,} / {backend.n_ctx:,} tokens ({share:.0%})"
        if share >= CONTEXT_WARNING:
            text += ": the oldest turns will soon be left out (Ctrl+N starts a new chat; Settings sets the size)"
        meter.update(text)
        meter.set_class(share >= CONTEXT_WARNING, "warning")
