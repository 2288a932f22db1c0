"""Tool calls and their results kept with the conversation: stored, read back in order, exported, searched,
and given to the model again on the next turn."""

from __future__ import annotations

from specchat.decoding.events import Stats
from specchat.llama.template import ToolCall
from specchat.service.conversation import ConversationController, ToolChoice
from specchat.service.events import Answered
from specchat.store.conversations import Store

CALL = ToolCall("notes__read_note", '{"name": "groceries"}', "call_1")


def _answered_with_a_call(tmp_path) -> ConversationController:
    conversation = ConversationController.new(Store(tmp_path / "chat.db"))
    conversation.add_user("What is on my groceries note?")
    conversation.begin_answer("fake", None)
    conversation.finish(Answered("tool_calls", "Let me look.", (1, 2), Stats(), calls=(CALL,)), "auto")
    conversation.add_tool_result(CALL.id, "eggs, flour, saffron")
    conversation.begin_answer("fake", None)
    conversation.finish(Answered("eog", "Eggs, flour and saffron.", (3,), Stats()), "auto")
    return conversation


def test_an_answers_calls_and_their_results_come_back_in_order_and_go_to_the_model_again(tmp_path):
    conversation = _answered_with_a_call(tmp_path)
    shown = ConversationController(conversation.store, conversation.id).messages()  # as a new window reads it
    assert [m.role for m in shown] == ["user", "assistant", "tool", "assistant"]
    assert shown[1].tool_calls == ({"id": "call_1", "name": "notes__read_note", "arguments": '{"name": "groceries"}'},)
    assert (shown[2].content, shown[2].tool_call_id) == ("eggs, flour, saffron", "call_1")
    prompt = conversation.prompt_messages("")
    assert prompt[1].tool_calls == (CALL,) and prompt[1].content == "Let me look."
    assert (prompt[2].role, prompt[2].tool_call_id, prompt[2].content) == ("tool", "call_1", "eggs, flour, saffron")


def test_tools_are_chosen_per_conversation_and_off_by_default(tmp_path):
    store = Store(tmp_path / "chat.db")
    one, two = ConversationController.new(store), ConversationController.new(store)
    assert one.tools is None
    one.tools = ToolChoice(("notes__read_note",))
    assert (one.tools, two.tools) == (ToolChoice(("notes__read_note",), call_first=False), None)
    one.tools = ToolChoice((), call_first=True)  # on, with every tool unticked: offered nothing, yet not off
    assert ConversationController(store, one.id).tools == ToolChoice((), True)
    one.tools = None
    assert one.tools is None


def test_the_export_names_each_call_and_fences_its_result_and_search_finds_results(tmp_path):
    conversation = _answered_with_a_call(tmp_path)
    text = conversation.store.export_markdown(conversation.id)
    assert 'Calls `notes__read_note` with `{"name": "groceries"}`' in text
    assert "## Tool result: notes__read_note\n\n````\neggs, flour, saffron\n````" in text
    assert [c.id for c in conversation.store.search("saffron")] == [conversation.id]
