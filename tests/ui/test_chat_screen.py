"""The chat screen's features and its concurrency guarantees, driven by Textual's Pilot on the
scripted backend: never two generations at once, prompt history, copying code, the context
meter, attaching files, search, the remembered theme and the speculation chart."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from fakes import FakeBackend
from pilot import answered, make_app, regenerated, send, settled, until
from textual.widgets import Input, Markdown, ProgressBar, Static
from textual.widgets.markdown import MarkdownFence

from specchat.llama.template import Message
from specchat.service.choices import ModelChoice
from specchat.service.events import BackendEvent
from specchat.service.reasoning import Reasoning
from specchat.service.settings import load_settings
from specchat.service.thinking import ThinkingSplit
from specchat.store.conversations import Store
from specchat.ui.answers import Answers
from specchat.ui.app import SpecchatApp
from specchat.ui.chat import ChatInput, ChatScreen, after
from specchat.ui.conversations import ConversationList, ConversationSearch
from specchat.ui.screens import PromptScreen
from specchat.ui.widgets import SPARK, MessageView, StatsPanel

STORY = "Once upon a time there was a small model that guessed the words of a bigger one."


def text_of(app: SpecchatApp, selector: str) -> str:
    return str(app.chat.query_one(selector, Static).render())


def notices(app: SpecchatApp, severity: str) -> list[str]:
    return [n.message for n in app._notifications if n.severity == severity]


async def streaming(pilot, app: SpecchatApp, backend: FakeBackend, pauses: int = 1) -> None:
    """Wait until the answer has shown its first tokens and the backend holds it (pause_after)."""
    await until(pilot, lambda: backend.pauses == pauses and app.generating
                and app.query(MessageView).last().content, "the answer to pause mid-stream")


# --- 1. never two generations at once ---------------------------------------------------------------


async def test_ctrl_o_while_an_answer_streams_opens_nothing_and_the_answer_finishes(tmp_path):
    backend = FakeBackend(STORY, pause_after=1)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        await streaming(pilot, app, backend)
        await pilot.press("ctrl+o")
        await app.chat.run_action("rewrite")  # the command palette's way in (SystemCommand) is shut too
        await settled(pilot, app)
        assert app.screen is app.chat and not isinstance(app.screen, PromptScreen)
        assert len(backend.calls) == 1 and app.generating
        backend.resume()
        await until(pilot, lambda: answered(app), "the answer to finish")
        user, answer = app.store.messages(app.conversation_id)
        assert (user.content, answer.content, answer.status) == ("Tell me a story", STORY, "complete")
        assert app.query(MessageView).last().content == STORY
        assert len(backend.calls) == 1 and backend.max_running == 1
        await pilot.press("ctrl+o")  # once the answer is over, the same key opens the prompt
        await until(pilot, lambda: isinstance(app.screen, PromptScreen), "the rewrite prompt")
        await pilot.press("escape")


async def test_a_pair_change_while_an_answer_streams_waits_for_it(tmp_path):
    made: list[tuple[ModelChoice, FakeBackend]] = []

    def factory(choice: ModelChoice) -> FakeBackend:
        made.append((choice, FakeBackend(STORY, pause_after=1 if not made else None)))
        return made[-1][1]

    app = SpecchatApp(backend_factory=factory, store=Store(tmp_path / "chat.db"), settings_path=tmp_path / "config.toml")
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        old = made[0][1]
        await streaming(pilot, app, old)
        app.apply_settings(replace(app.settings, pair="smollm2-self"))
        await until(pilot, lambda: old.closing.is_set(), "the reload to reach the old backend's close")
        # The reload waits in old.close() for the answer: nothing is freed or made under it.
        assert len(made) == 1 and not old.closed and app.generating
        old.resume()
        await until(pilot, lambda: answered(app) and len(made) == 2 and app.ready, "the answer and the new pair")
        user, answer = app.store.messages(app.conversation_id)
        assert (answer.content, answer.status) == (STORY, "complete")
        assert app.query(MessageView).last().content == STORY
        assert old.closed and old.log == ["start", "done", "end", "close"]  # closed only after the answer ended
        choice, new = made[1]
        assert choice.pair == "smollm2-self" and app.backend is new and not new.closed
        await send(pilot, app, "And another")  # the next answer comes from the new pair
        await until(pilot, lambda: answered(app), "the next answer")
        assert len(old.calls) == 1 and len(new.calls) == 1
        assert old.max_running == 1 and new.max_running == 1


async def test_ctrl_r_hammered_while_streaming_and_after_regenerates_once(tmp_path):
    backend = FakeBackend(STORY, pause_after=1)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        await streaming(pilot, app, backend)
        await pilot.press(*["ctrl+r"] * 10)
        await settled(pilot, app)
        assert len(backend.calls) == 1
        backend.resume()
        await until(pilot, lambda: answered(app), "the answer to finish")
        await pilot.press(*["ctrl+r"] * 10)  # the first regenerates; the rest find it streaming
        await streaming(pilot, app, backend, pauses=2)
        await settled(pilot, app)
        assert len(backend.calls) == 2
        backend.resume()
        await until(pilot, lambda: answered(app), "the regeneration to finish")
        await pilot.pause()
        assert len(backend.calls) == 2 and backend.max_running == 1
        messages = app.store.messages(app.conversation_id)
        assert [(m.role, m.status) for m in messages] == [("user", "complete"), ("assistant", "complete")]
        assert messages[1].content == STORY
        assert [v.role for v in app.query(MessageView)] == ["user", "assistant"]


async def test_enter_while_busy_starts_nothing_and_keeps_the_text(tmp_path):
    backend = FakeBackend(STORY, pause_after=1)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        await streaming(pilot, app, backend)
        box = app.query_one("#input", ChatInput)
        box.text = "a second question"
        await pilot.press("enter")
        await until(pilot, lambda: notices(app, "warning"), "the warning")
        assert "Esc stops it" in notices(app, "warning")[-1]
        assert box.text == "a second question"  # not lost: it can be sent once the answer ends
        assert [m.role for m in app.store.messages(app.conversation_id)] == ["user", "assistant"]
        assert len(backend.calls) == 1
        backend.resume()
        await until(pilot, lambda: answered(app), "the answer to finish")
        assert [m.content for m in app.store.messages(app.conversation_id)] == ["Tell me a story", STORY]
        assert backend.max_running == 1



async def test_esc_while_the_answer_is_being_set_up_stops_it(tmp_path, monkeypatch):
    stopped = asyncio.Event()
    stop = ChatScreen.action_stop

    def action_stop(self) -> None:
        stop(self)
        stopped.set()

    monkeypatch.setattr(ChatScreen, "action_stop", action_stop)
    on_mount = Markdown._on_mount

    async def esc_while_mounting(self, event):
        if isinstance(self.parent, MessageView) and self.parent.role == "assistant":
            self.app.simulate_key("escape")  # the user stops the answer as its view appears
            await stopped.wait()
        await on_mount(self, event)

    monkeypatch.setattr(Markdown, "_on_mount", esc_while_mounting)
    backend = FakeBackend(STORY)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        await until(pilot, lambda: answered(app), "the answer to end")
        assert stopped.is_set()
        assert app.store.messages(app.conversation_id)[-1].status == "stopped"


# --- 2. prompt history --------------------------------------------------------------------------------


async def test_up_and_down_walk_the_prompts_sent(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        for prompt in ("first prompt", "second prompt"):
            await send(pilot, app, prompt)
            await until(pilot, lambda: answered(app) and len(app.store.messages(app.conversation_id)) % 2 == 0,
                        "the answer")
        box = app.query_one("#input", ChatInput)
        assert box.has_focus and box.text == ""
        seen = []
        for key in ("up", "up", "up", "down", "down", "down"):
            await pilot.press(key)
            seen.append(box.text)
        assert seen == ["second prompt", "first prompt", "first prompt", "second prompt", "", ""]
        box.text = "my own words"
        await pilot.press("up", "down")  # text of one's own is never replaced by a recalled prompt
        assert box.text == "my own words"


async def test_up_and_down_move_the_cursor_in_text_of_ones_own(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "first prompt")
        await until(pilot, lambda: answered(app), "the answer")
        box = app.query_one("#input", ChatInput)
        box.text = "typed line one\ntyped line two"
        box.move_cursor(box.document.end)
        await pilot.press("up")
        assert box.text == "typed line one\ntyped line two"
        assert box.cursor_location == (0, len("typed line one"))
        await pilot.press("down")
        assert box.cursor_location == (1, len("typed line two"))


# --- 3. copying code --------------------------------------------------------------------------------

CODE_ANSWER = ("Two ways:\n\n```python\nprint('one')\n```\n\nor in the shell:\n\n```sh\necho two\nls -l\n```\n\n"
               "Either works.")


async def test_f3_cycles_through_the_code_blocks_and_a_click_copies_one(tmp_path):
    app = make_app(tmp_path, FakeBackend(CODE_ANSWER))
    async with app.run_test(size=(120, 50)) as pilot:
        await send(pilot, app, "Print something")
        await until(pilot, lambda: answered(app), "the answer")
        copied = []
        for _ in range(3):
            await pilot.press("f3")
            copied.append(app.clipboard)
        assert copied == ["print('one')", "echo two\nls -l", "print('one')"]  # as a click copies them
        fences = list(app.query(MessageView).last().query(MarkdownFence))
        assert [f.code for f in fences] == ["print('one')", "echo two\nls -l"]
        await until(pilot, lambda: fences[1].region.height > 0, "the code block on screen")
        await pilot.click(fences[1])  # lands on the fence's Label: the click bubbles up to the screen
        assert app.clipboard == "echo two\nls -l"
        await pilot.click(fences[0], offset=(2, 1))
        assert app.clipboard == "print('one')"


async def test_an_answer_that_streams_before_its_body_is_ready_shows_each_block_once(tmp_path, monkeypatch):
    # When the first batches reached a Markdown body still mounting, its first (empty) render ran
    # after they had queued, and Textual's MarkdownStream.stop appended the rest from a stale offset:
    # the first blocks showed twice (about one answer in three, by chance). Made certain here: if a
    # generation is already under way when the answer's body mounts, that first render is held until
    # the whole answer has reached the view. A generation started only once its view is mounted (as
    # Answers.start does now) is never held.
    started, full = [], asyncio.Event()
    generate = Answers._generate
    monkeypatch.setattr(Answers, "_generate",
                        lambda self, *args: (started.append(True), generate(self, *args)))
    append = MessageView.append

    async def append_and_tell(self, steps):
        await append(self, steps)
        if self.content == CODE_ANSWER:
            full.set()

    monkeypatch.setattr(MessageView, "append", append_and_tell)
    on_mount, held = Markdown._on_mount, []

    async def slow_first_render(self, event):
        if isinstance(self.parent, MessageView) and self.parent.role == "assistant" and started:
            async def hold() -> None:  # takes the lock ahead of the body's first update, as a slow render would
                async with self.lock:
                    await full.wait()

            held.append(asyncio.create_task(hold()))
        await on_mount(self, event)

    monkeypatch.setattr(Markdown, "_on_mount", slow_first_render)
    app = make_app(tmp_path, FakeBackend(CODE_ANSWER))
    async with app.run_test(size=(120, 50)) as pilot:
        await send(pilot, app, "Print something")
        await until(pilot, lambda: answered(app), "the answer")
        await pilot.pause()
        body = app.query(MessageView).last().query_one(Markdown)
        assert [f.code for f in body.query(MarkdownFence)] == ["print('one')", "echo two\nls -l"]
        assert len(body.children) == 5  # paragraph, code, paragraph, code, paragraph


# --- 4. the context meter -----------------------------------------------------------------------------


async def test_context_meter_counts_the_answer_and_warns_near_full(tmp_path):
    backend = FakeBackend()
    app = make_app(tmp_path / "a", backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "hi")
        await until(pilot, lambda: answered(app), "the answer")
        used = backend.last_done.stats.n_prompt + backend.last_done.stats.n_tokens
        assert used == 12 + len(backend.answer.split())
        meter = app.chat.query_one("#context-meter", Static)
        assert text_of(app, "#context-meter").startswith(f"context {used:,} / 4,096 tokens")
        assert "left out" not in text_of(app, "#context-meter") and not meter.has_class("warning")

    small = FakeBackend()
    small.n_ctx = 20  # the answer's 19 tokens are 95% of it
    app = make_app(tmp_path / "b", small)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        meter = app.chat.query_one("#context-meter", Static)
        assert text_of(app, "#context-meter").startswith("context ≈") and not meter.has_class("warning")
        await send(pilot, app, "hi")
        await until(pilot, lambda: answered(app), "the answer")
        assert text_of(app, "#context-meter").startswith("context 19 / 20 tokens (95%)")
        assert "the oldest turns will soon be left out" in text_of(app, "#context-meter")
        assert meter.has_class("warning")


# --- 5. attaching a file --------------------------------------------------------------------------------


async def attach_path(pilot, app: SpecchatApp, path: Path) -> None:
    await pilot.press("ctrl+l")
    await until(pilot, lambda: isinstance(app.screen, PromptScreen), "the path prompt")
    app.screen.query_one("#prompt-input", Input).value = str(path)
    await pilot.press("enter")
    await until(pilot, lambda: app.screen is app.chat, "the prompt to close")


async def test_attach_a_file_to_the_next_message(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("alpha beta\ngamma delta\n")
    backend = FakeBackend()
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        await attach_path(pilot, app, tmp_path / "missing.txt")
        await until(pilot, lambda: notices(app, "error"), "the error")
        assert "missing.txt" in notices(app, "error")[-1]
        assert app.chat.attachments == [] and "attached" not in text_of(app, "#attached")

        await attach_path(pilot, app, doc)
        await until(pilot, lambda: "attached notes.txt" in text_of(app, "#status"), "the status line")
        assert "4 tokens" in text_of(app, "#status")  # the fake counts words
        assert "notes.txt" in text_of(app, "#attached")
        await send(pilot, app, "summarise it")
        await until(pilot, lambda: answered(app), "the answer")
        expected = "File `notes.txt`:\n\n````\nalpha beta\ngamma delta\n````\n\nsummarise it"
        assert app.store.messages(app.conversation_id)[0].content == expected
        assert backend.calls[-1][0][-1] == Message("user", expected)
        assert app.query(MessageView).first().content == expected

        await send(pilot, app, "and again")  # an attachment goes with one message only
        await until(pilot, lambda: answered(app) and len(app.store.messages(app.conversation_id)) == 4,
                    "the second answer")
        assert backend.calls[-1][0][-1] == Message("user", "and again")


async def test_the_attached_list_empties_once_the_message_is_sent(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("alpha beta\n")
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        await attach_path(pilot, app, doc)
        await until(pilot, lambda: "notes.txt" in text_of(app, "#attached"), "the attached list")
        await send(pilot, app, "summarise it")
        await until(pilot, lambda: answered(app), "the answer")
        assert app.chat.attachments == []
        assert "notes.txt" not in text_of(app, "#attached")  # it no longer goes with the next message



async def test_an_edit_and_the_selection_stay_when_their_conversation_is_chosen_again(tmp_path):
    """Choosing the conversation on screen in the list opens it anew: the selected message and the edit under way
    are still this window's, and Esc still gives back what was typed before the edit."""
    app = make_app(tmp_path, FakeBackend("An answer."))
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "The question")
        await until(pilot, lambda: answered(app), "the answer")
        box = app.query_one("#input")
        box.text = "half a thought"
        await pilot.press("alt+up", "alt+up", "ctrl+e")
        await until(pilot, lambda: box.text == "The question", "the question in the input")
        before = app.chat.conversation
        app.chat.query_one(ConversationList).post_message(ConversationList.Chosen(app.conversation_id))
        await until(pilot, lambda: app.chat.conversation is not before, "the conversation opened again")
        assert app.chat.conversation.selected == 0 and box.text == "The question"
        await until(pilot, lambda: [v.has_class("selected") for v in app.query(MessageView)] == [True, False],
                    "the selected message marked again")
        await pilot.press("escape")
        await until(pilot, lambda: box.text == "half a thought", "what was typed before the edit")


def test_a_key_that_cycles_a_setting_goes_round_and_starts_where_the_setting_is_not_an_option():
    assert [after(["default", "on", "off"], now) for now in ("default", "on", "off")] == ["on", "off", "default"]
    assert after(["lookup", "none"], "draft") == "lookup"  # e.g. a guesser this backend cannot run

# --- 6. search ------------------------------------------------------------------------------------------


def three_conversations(store: Store) -> list[int]:
    ids = []
    for title, text in (("Dinner", "how do I cook spaghetti carbonara"), ("Garden", "when to plant tomatoes"),
                        ("Lisbon", "a train trip past fields of tomatoes")):
        conv = store.new_conversation(title)
        store.add_message(conv.id, "user", text)
        store.add_message(conv.id, "assistant", "Here is what I know.")
        ids.append(conv.id)
    return ids


def listed(app: SpecchatApp) -> list[int]:
    return sorted(app.chat.query_one(ConversationList).listed)


async def test_sidebar_search_filters_the_conversations(tmp_path):
    store = Store(tmp_path / "chat.db")
    dinner, garden, lisbon = three_conversations(store)
    app = SpecchatApp(backend_factory=lambda choice: FakeBackend(), store=store, settings_path=tmp_path / "config.toml")
    async with app.run_test(size=(140, 36)) as pilot:
        await until(pilot, lambda: listed(app) == [dinner, garden, lisbon], "all three listed")
        await pilot.press("ctrl+f")
        search = app.chat.query_one("#search", Input)
        assert search.has_focus
        await pilot.press(*"carbonara")
        await until(pilot, lambda: search.value == "carbonara" and listed(app) == [dinner], "one match")
        search.value = ""
        await until(pilot, lambda: listed(app) == [dinner, garden, lisbon], "all three again")
        await pilot.press(*"tomat")  # the start of a word finds it
        await until(pilot, lambda: listed(app) == [garden, lisbon], "two matches")
        search.value = "zebra"
        await until(pilot, lambda: listed(app) == [], "no match")


async def test_command_palette_finds_and_opens_a_conversation(tmp_path):
    store = Store(tmp_path / "chat.db")
    dinner, garden, lisbon = three_conversations(store)
    app = SpecchatApp(backend_factory=lambda choice: FakeBackend(), store=store, settings_path=tmp_path / "config.toml")
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        assert app.conversation_id == lisbon  # the most recent
        provider = ConversationSearch(app.screen)
        assert [hit async for hit in provider.search("  ")] == []
        hits = [hit async for hit in provider.search("carbonara")]
        assert [hit.text for hit in hits] == ["Open conversation: Dinner"]
        hits[0].command()
        await pilot.pause()
        assert app.conversation_id == dinner
        assert [v.content for v in app.query(MessageView)] == ["how do I cook spaghetti carbonara",
                                                               "Here is what I know."]
        hits = [hit async for hit in provider.search("tomatoes")]
        assert sorted(hit.text for hit in hits) == ["Open conversation: Garden", "Open conversation: Lisbon"]



async def test_a_conversation_found_by_search_opens_on_the_branch_that_holds_it(tmp_path):
    store = Store(tmp_path / "chat.db")
    conv = store.new_conversation("Animals").id
    question = store.add_message(conv, "user", "name an animal")
    store.add_message(conv, "assistant", "A zebra.")
    store.add_message(conv, "assistant", "A cat.", after=question)  # regenerated: the cat's branch is on screen
    app = SpecchatApp(backend_factory=lambda choice: FakeBackend(), store=store, settings_path=tmp_path / "config.toml")
    async with app.run_test(size=(140, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        assert [v.content for v in app.query(MessageView)] == ["name an animal", "A cat."]
        await pilot.press("ctrl+f", *"zebra")
        await until(pilot, lambda: listed(app) == [conv], "the match")
        await pilot.click("#conversations", offset=(4, 1))  # the first line inside its border
        await until(pilot, lambda: [v.content for v in app.query(MessageView)] == ["name an animal", "A zebra."],
                    "the zebra's branch")
        assert "holds “zebra”" in str(app.chat.query_one("#status").render())
        # The command palette's search does the same, and a branch that holds it already stays.
        hits = [hit async for hit in ConversationSearch(app.screen).search("cat")]
        hits[0].command()
        await until(pilot, lambda: [v.content for v in app.query(MessageView)] == ["name an animal", "A cat."],
                    "the cat's branch")


# --- 7. the theme -----------------------------------------------------------------------------------------


async def test_the_theme_chosen_is_remembered(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        assert app.theme != "nord"
        app.theme = "nord"
        await pilot.pause()
        assert app.settings.theme == "nord"
    assert 'theme = "nord"' in (tmp_path / "config.toml").read_text()
    assert load_settings(tmp_path / "config.toml")[0].theme == "nord"
    again = make_app(tmp_path)
    async with again.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: again.ready, "models to load")
        assert again.theme == "nord"


# --- 8. the speculation chart and the loading bar -----------------------------------------------------------


async def test_tokens_per_step_chart_is_empty_then_shows_the_steps(tmp_path):
    backend = FakeBackend()
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        assert text_of(app, "#spark") == "·"
        await send(pilot, app, "hi")
        await until(pilot, lambda: answered(app), "the answer")
        steps = app.chat.query_one(StatsPanel).steps
        assert [len(s.tokens) for s in steps] == [3, 3, 1]  # 7 words, 3 a step
        chart = text_of(app, "#spark")
        assert len(chart) == 3 and set(chart) <= set(SPARK[1:])
        assert chart[0] == chart[1] == SPARK[-1] and chart[2] < chart[0]  # 3 is the top; 1 is a low bar


async def test_loading_without_a_size_shows_an_indeterminate_bar(tmp_path):
    gate = threading.Event()
    backend = FakeBackend(load_gate=gate)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: backend.loading.is_set(), "the load to begin")
        await pilot.pause()
        bar = app.chat.query_one("#progress", ProgressBar)
        assert bar.display and bar.total is None
        assert text_of(app, "#status") == "loading fake models…"
        assert not app.ready
        gate.set()
        await until(pilot, lambda: app.ready, "models to load")
        assert not bar.display and text_of(app, "#status").startswith("ready")



async def test_fast_typing_keeps_newlines_and_enter_in_order(tmp_path):
    """Keys that arrive faster than the box handles them (a fast typist, a paste, tmux send-keys):
    the newlines land where they were typed and Enter sends everything typed before it."""
    from textual import events

    backend = FakeBackend()
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        for key in [*"Rewrite this:", "ctrl+j", "ctrl+j", *"some text", "enter"]:
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        await until(pilot, lambda: answered(app), "the answer")
        assert app.store.messages(app.conversation_id)[0].content == "Rewrite this:\n\nsome text"


# --- the command palette ------------------------------------------------------------------------------


async def run_from_palette(pilot, app: SpecchatApp, query: str, title: str) -> None:
    """Ctrl+P, type, wait until the command is the one highlighted, Enter: as a user does it."""
    from textual.command import CommandList, CommandPalette

    await pilot.press("ctrl+p")
    await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the command palette")
    await pilot.press(*query)

    def highlighted() -> bool:
        found = app.screen.query(CommandList)
        if not found or found.first().highlighted is None:
            return False
        commands = found.first()
        return str(commands.get_option_at_index(commands.highlighted).prompt).startswith(title)

    await until(pilot, highlighted, f"{title!r} highlighted in the palette")
    await pilot.press("enter")


async def test_the_palettes_settings_and_help_open_their_screens(tmp_path):
    from specchat.ui.screens import HelpScreen, SettingsScreen

    app = make_app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        for query, title, screen in (("settings", "Settings", SettingsScreen), ("help", "Help", HelpScreen)):
            await run_from_palette(pilot, app, query, title)
            await until(pilot, lambda: isinstance(app.screen, screen), f"the {title} screen")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.chat, "the chat screen again")


async def test_every_palette_command_runs_or_says_why_it_cannot(tmp_path, monkeypatch):
    """Each command of the keys' actions, run from the palette, reaches its action, or, where the key
    is disabled now, runs nothing and says why: idle, and while an answer streams."""
    backend = FakeBackend(STORY, pause_after=1)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        ran: list[str] = []
        # An action with arguments ("branch(1)") is its name's: it counts once however many keys run it.
        owners = {b.action.split("(")[0]: app.chat for b in ChatScreen.BINDINGS} | \
            {b.action: app for b in SpecchatApp.BINDINGS}
        ours = [c for c in app.get_system_commands(app.screen) if c.help.endswith(")")]  # "Title (key)"
        assert {c.title for c in ours} == {b.description for b in [*ChatScreen.BINDINGS, *SpecchatApp.BINDINGS]
                                           if b.action != "quit"}

        async def run_all(refusals: int) -> dict[str, str]:
            """Every command once; the actions it reached, and the reasons given for the others (once the
            expected number of refusals has been shown: a notification arrives as a message)."""
            ran.clear()
            app._notifications.clear()
            for command in ours:
                await command.callback()

            def said() -> list[str]:
                return [n.message for n in app._notifications if n.message.startswith("Cannot ")]

            await until(pilot, lambda: len(said()) >= refusals, f"{refusals} refusals")
            await pilot.pause()  # and no more than that
            return {action: reason for action, reason in ((m.split(" now: ")[0].removeprefix("Cannot ")
                                                           .replace(" ", "_"), m.split(" now: ")[1]) for m in said())}

        await send(pilot, app, "Tell me a story")  # an answer to regenerate, copy and export
        await streaming(pilot, app, backend)
        # Recorded instead of run: what each action does is tested on its own elsewhere.
        for action, owner in owners.items():
            monkeypatch.setattr(owner, f"action_{action}", lambda *args, action=action: ran.append(action))
        keys = Counter(b.action.split("(")[0] for b in ChatScreen.BINDINGS)
        refused = await run_all(sum(keys[a] for a in ChatScreen.NOT_WHILE_BUSY))
        assert refused == {a: "an answer is streaming: Esc stops it" for a in ChatScreen.NOT_WHILE_BUSY}
        assert sorted(set(ran)) == sorted(set(owners) - ChatScreen.NOT_WHILE_BUSY - {"quit"})
        backend.resume()
        await until(pilot, lambda: answered(app), "the answer to finish")
        refused = await run_all(1)
        assert refused == {"stop": "nothing is being generated"}
        assert sorted(set(ran)) == sorted(set(owners) - {"stop", "quit"})


# --- a reasoning model's thinking -----------------------------------------------------------------------

THOUGHT = "The user wants a story. One about a small model guessing a big one's words will do."


def fold(app: SpecchatApp):
    from textual.widgets import Collapsible

    return app.query(MessageView).last().query_one(Collapsible)


class Thinker(FakeBackend):
    """A reasoning model's answer as its engine streams it, the thinking in tags within the text, a step of three
    words at a time, passed through the service's own ThinkingSplit: what the screen shows of the thinking is
    what the split made of it, not a figure of the fake's."""

    def __init__(self, answer: str, thinking: str, pause_after: int | None = None) -> None:
        super().__init__(f"<think>{thinking}</think>\n\n{answer}", pause_after=pause_after)

    def _generate(self, cancel: threading.Event) -> Iterator[BackendEvent]:
        split = ThinkingSplit(Reasoning())
        for event in super()._generate(cancel):
            yield from split(event)


async def test_thinking_streams_open_folds_when_the_answer_begins_and_ctrl_b_opens_it(tmp_path):
    # THOUGHT's 17 words: 5 steps of thinking alone, then one that closes it and begins the answer.
    backend = Thinker(STORY, THOUGHT, pause_after=5)  # pauses between the thinking and the answer
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Tell me a story")
        # (The steps the pump holds while the backend waits are shown after it: the first went out at once.)
        await until(pilot, lambda: backend.pauses == 1 and app.query(MessageView).last().thinking, "the thinking")
        view = app.query(MessageView).last()
        assert fold(app).display and not fold(app).collapsed and view.content == ""
        backend.resume()
        await until(pilot, lambda: answered(app), "the answer to end")
        assert fold(app).collapsed and view.content == STORY  # folded once the answer began
        # Its own count and speed: the 5 steps' 15 tokens in their 0.2 s (the step that began the answer is the
        # answer's), counted by the split as the tokens streamed.
        assert fold(app).title == "Thinking · 15 tokens · 75.0 tok/s"
        [stored] = [m for m in app.store.messages(app.conversation_id) if m.role == "assistant"]
        assert (stored.content, stored.thinking) == (STORY, THOUGHT)  # kept apart from the answer
        await pilot.press("ctrl+b")
        await until(pilot, lambda: not fold(app).collapsed, "Ctrl+B to open the thinking")
        # The next question sends the thinking back apart from the answer: the template decides.
        backend.resume()  # its answer passes its pause (it would wait out PAUSE_S there, 10 s, and then go on)
        await send(pilot, app, "Another")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the second answer")
        assert backend.calls[1][0][-2] == Message("assistant", STORY, THOUGHT)
    reopened = make_app(tmp_path, FakeBackend())
    async with reopened.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: reopened.ready and len(reopened.query(MessageView)) == 4, "the conversation")
        first = reopened.query(MessageView)[1]
        assert first.thinking == THOUGHT and first.query_one("Collapsible").collapsed


async def test_ctrl_b_without_thinking_says_there_is_none(tmp_path):
    app = make_app(tmp_path, FakeBackend(STORY))
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "Hi")
        await until(pilot, lambda: answered(app), "the answer")
        assert not fold(app).display
        await pilot.press("ctrl+b")
        await until(pilot, lambda: any("No thinking" in n for n in notices(app, "information")), "the notice")


async def test_the_settings_answer_and_a_thinking_setting_without_a_switch_is_said_once_at_the_first_answer(tmp_path):
    """What an answer runs with is service/choices.py's `answering`: the settings' system prompt and thinking, the
    line about a template without a switch said once (not at load), and again once the setting is cycled (F4)."""
    (tmp_path / "config.toml").write_text("thinking = 'on'\nsystem_prompt = 'Be kind.'\nguesser = 'lookup'\n")
    backend = FakeBackend(STORY)  # its template reads no switch for thinking

    def said() -> list[str]:
        return [n for n in notices(app, "warning") if "no switch for thinking" in n]

    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        assert said() == []  # the line waits for an answer
        for n, text in enumerate(("Hi", "Again", "Once more"), 1):
            if n == 3:
                await pilot.press("f4", "f4", "f4")  # round to on again: a new choice, said again
                await settled(pilot, app)
            await send(pilot, app, text)
            await until(pilot, lambda: answered(app) and len(backend.calls) == n, "an answer")
            assert len(said()) == (1 if n < 3 else 2), said()
        assert backend.thinks == [None, None, None]  # the model's own default
        assert [messages[0] for messages, _ in backend.calls] == [Message("system", "Be kind.")] * 3
        assert [guesser for _, guesser in backend.calls] == ["lookup"] * 3
        backend.thinking_switch = "enable_thinking"  # as a template that has one takes the setting
        await send(pilot, app, "And with a switch")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 4, "the fourth answer")
        assert backend.thinks[-1] is True and len(said()) == 2


# --- branches -----------------------------------------------------------------------------------------


def labels(app: SpecchatApp) -> list[str]:
    return [str(view.query_one(".role", Static).render()) for view in app.query(MessageView)]


async def test_regenerate_and_edit_make_branches_that_alt_arrows_walk(tmp_path):
    backend = FakeBackend("A first story.")
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await regenerated(pilot, app, backend)
        assert labels(app) == ["You", "Assistant  ← 2/2 →"]
        await pilot.press("alt+left")
        await until(pilot, lambda: app.query(MessageView).last().content == "A first story.", "the first branch")
        assert labels(app) == ["You", "Assistant  ← 1/2 →"]
        # Select the question (Alt+Up twice from the end) and edit it: a new branch of the question.
        await pilot.press("alt+up", "alt+up", "ctrl+e")
        await until(pilot, lambda: app.query_one("#input").text == "Tell me a story", "the question in the input")
        backend.answer = "A poem, then."
        app.query_one("#input").text = "Tell me a poem"
        await pilot.press("enter")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 3, "the answer to the edit")
        assert labels(app) == ["You  ← 2/2 →", "Assistant"]
        assert backend.calls[2][0][-1].content == "Tell me a poem"  # the edit went without the old answers
        assert [m.content for m in app.store.messages(app.conversation_id)] == ["Tell me a poem", "A poem, then."]
        await pilot.press("alt+up", "alt+up", "alt+left")  # the question's first branch, and its newest answer
        await until(pilot, lambda: app.query(MessageView).last().content == "A second story.", "the old question")
        assert labels(app) == ["You  ← 1/2 →", "Assistant  ← 2/2 →"]
        export = app.chat.conversation.export().read_text()  # the branch on screen
        assert "A second story." in export and "poem" not in export


async def test_the_thinking_folds_as_the_first_words_of_the_answer_arrive():
    from textual.app import App

    from specchat.decoding.events import Source, Token
    from specchat.service.events import Said

    def step(text: str = "", thinking: str = "") -> Said:
        return Said((Token(0, thinking or text, Source.PLAIN),), text, 0, 0, 0.0, 0.01, thinking=thinking)

    class One(App):
        def compose(self):
            yield MessageView("assistant")

    app = One()
    async with app.run_test() as pilot:
        view = app.query_one(MessageView)
        await view.append([step(thinking="Weighing it up")])
        await pilot.pause()
        assert fold(app).display and not fold(app).collapsed  # open while the thinking streams
        await view.append([step(thinking=" still"), step(text="The answer")])
        await pilot.pause()
        assert fold(app).collapsed and view.content == "The answer" and view.thinking == "Weighing it up still"


async def test_an_edit_begun_in_one_conversation_is_not_sent_into_another(tmp_path):
    backend = FakeBackend("An answer.")
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "First chat")
        await until(pilot, lambda: answered(app), "the first answer")
        first = app.conversation_id
        await pilot.press("ctrl+e")  # an edit of "First chat" begun...
        await until(pilot, lambda: app.chat.conversation.editing is not None, "the edit")
        await pilot.press("ctrl+n")  # ...and left for a new conversation
        await until(pilot, lambda: app.conversation_id != first, "the new chat")
        await send(pilot, app, "Second chat")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the second answer")
        assert [(m.content, m.branches) for m in app.store.messages(app.conversation_id)] == \
            [("Second chat", 1), ("An answer.", 1)]
        assert [m.content for m in app.store.messages(first)] == ["First chat", "An answer."]


async def test_esc_cancels_an_edit_and_what_was_typed_before_it_comes_back(tmp_path):
    backend = FakeBackend("An answer.")
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await send(pilot, app, "The question")
        await until(pilot, lambda: answered(app), "the answer")
        box = app.query_one("#input")
        box.text = "half a thought"
        await pilot.press("ctrl+e")
        await until(pilot, lambda: box.text == "The question", "the question in the input")
        await pilot.press("escape")
        await until(pilot, lambda: app.chat.conversation.editing is None, "the edit to be cancelled")
        assert box.text == "half a thought" and "edit cancelled" in str(app.chat.query_one("#status").render())
        await pilot.press("enter")  # now a new message after the answer, not an edit
        await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the second answer")
        assert [(m.content, m.branches) for m in app.store.messages(app.conversation_id)] == \
            [("The question", 1), ("An answer.", 1), ("half a thought", 1), ("An answer.", 1)]
        # An edit that is sent gives the box back what was typed before it began, too.
        box.text = "another draft"
        await pilot.press("ctrl+e")
        await until(pilot, lambda: box.text == "half a thought", "the last question in the input")
        box.text = "a whole thought"
        await pilot.press("enter")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 3, "the answer to the edit")
        assert box.text == "another draft"
        assert [m.content for m in app.store.messages(app.conversation_id)][-2] == "a whole thought"
