"""Tool calls: the formats read off real templates (tests/templates/), whole answers and streamed ones split into
content and calls, calls and results rendered back through the templates, and malformed call text kept.
Pure text and the sandboxed renderer: no model is loaded."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.llama.template import ChatTemplate, Message, ToolCall
from specchat.llama.toolcalls import (
    GRANITE,
    HARMONY,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    SEED_OSS,
    XML_TAGS,
    Splitter,
    ToolFormat,
    format_of,
    parse,
)

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
APRIEL = ToolFormat("json", ("<tool_calls>",), "</tool_calls>", array=True)
LLAMA32 = ToolFormat("llama3", (), args_key="parameters", bare=True)
FORMATS = {  # template file -> what format_of reads off it (None: a format not handled, see the module)
    "Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja": HERMES,
    "Qwen-Qwen3-0.6B.jinja": HERMES,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": HERMES,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": MISTRAL,
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": MISTRAL,
    "meta-llama-Llama-3.1-8B-Instruct.jinja": LLAMA3,
    "meta-llama-Llama-3.2-3B-Instruct.jinja": LLAMA32,
    "openai-gpt-oss-120b.jinja": HARMONY,
    "ibm-granite-granite-3.3-2B-Instruct.jinja": GRANITE,
    "Apriel-1.6-15b-Thinker-fixed.jinja": APRIEL,
    "Qwen3-Coder.jinja": QWEN3_CODER,  # <function=NAME><parameter=…> tags; no <think>, so <tool_call> may be left out
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": XML_TAGS,  # the same tags, after <think></think>
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": None,  # special-token calls
    "ByteDance-Seed-OSS.jinja": SEED_OSS,  # the same tags in <seed:tool_call>, each value on its tag's line
}


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(), name, "<s>", "</s>")


def ids():
    n = itertools.count()
    return lambda: f"call{next(n):05d}"


@pytest.mark.parametrize("name", FORMATS)
def test_the_format_is_read_off_the_template(name):
    assert format_of(template(name)) == FORMATS[name]


W = ("get_weather", '{"city": "Paris"}')
XML_W = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
SEED_W = "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>"
T = ("get_time", "{}")
CASES = [  # (text, format, content, [(name, arguments)], number of errors)
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', HERMES, "", [W], 0),
    ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', HERMES, "Let me look.\n", [W, T], 0),
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', HERMES, "", [W], 0),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', HERMES, "", [W], 0),  # ended at EOG
    ("A <tool_call> tag is how Qwen calls.", HERMES, "A <tool_call> tag is how Qwen calls.", [], 1),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> and on', HERMES,
     '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> and on', [], 1),
    ('<tool_call>{"arguments": {}}</tool_call>', HERMES, '<tool_call>{"arguments": {}}</tool_call>', [], 1),
    ("<tool_ca is not a marker", HERMES, "<tool_ca is not a marker", [], 0),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, '
     '{"name": "get_time", "arguments": {}}]', MISTRAL, "", [W, T], 0),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]xyz987654[ARGS]{}', MISTRAL, "",
     [W, T], 0),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par', MISTRAL,
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par', [], 1),
    ('[TOOL_CALLS][{"name": "search", "arguments": {"q": "a]}\\"["}}] then text', MISTRAL, " then text",
     [("search", '{"q": "a]}\\"["}')], 0),  # brackets and a quote inside a string do not end the JSON
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', LLAMA3, "", [W], 0),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', LLAMA3, "", [W], 0),
    ('{"city": "Paris", "temperature": 21}', LLAMA3, '{"city": "Paris", "temperature": 21}', [], 0),
    ('  Sure: {"name": "x"} is JSON.', LLAMA3, '  Sure: {"name": "x"} is JSON.', [], 0),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', GRANITE, "", [W], 0),
    ("<|channel|>analysis<|message|>Weather wanted.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>', HARMONY,
     "<|channel|>analysis<|message|>Weather wanted.<|end|>", [W], 0),
    (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>', HARMONY, "", [W], 0),
    ("<|channel|>final<|message|>It is sunny.", HARMONY, "<|channel|>final<|message|>It is sunny.", [], 0),
    ("<|channel|>commentary to=functions.get_weather json<|message|>{city: Paris}<|call|>", HARMONY,
     "<|channel|>commentary to=functions.get_weather json<|message|>{city: Paris}<|call|>", [], 1),
    (XML_W, QWEN3_CODER, "", [W], 0),
    ("Let me look.\n" + XML_W + "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>", QWEN3_CODER,
     "Let me look.\n", [W, T], 0),
    ('<tool_call>\n<function=python>\n<parameter=code>\nprint("</tool_call>")\nx = "</parameter>"\n\n</parameter>\n'
     "</function>\n</tool_call> Ran it.", QWEN3_CODER, " Ran it.",
     [("python", json.dumps({"code": 'print("</tool_call>")\nx = "</parameter>"\n'}))], 0),  # tags in a value
    (XML_W[:-len("\n</tool_call>")], QWEN3_CODER, "", [W], 0),  # ended at EOG
    ("<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter></function></tool_call> and on",
     QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter></function></tool_call> and on",
     [], 1),  # a value that never closes as llama.cpp closes one
    ('<tool_call>\nget_weather(city="Paris")\n</tool_call>', QWEN3_CODER,
     '<tool_call>\nget_weather(city="Paris")\n</tool_call>', [], 1),
    # Seed-OSS's, as llama.cpp's tests/test-chat.cpp writes them: a value on its tag's line, up to `</parameter>\n`.
    (SEED_W, SEED_OSS, "", [W], 0),
    ("I'll check.\n" + SEED_W + "\n<seed:tool_call>\n<function=get_time>\n</function>\n</seed:tool_call>", SEED_OSS,
     "I'll check.\n", [W, T], 0),
    ("<seed:tool_call>\n<function=python>\n<parameter=code>x = '</parameter>'\nprint(x)\n</parameter>\n</function>\n"
     "</seed:tool_call> Ran it.", SEED_OSS, " Ran it.", [("python", json.dumps({"code": "x = '</parameter>'\nprint(x)\n"}))],
     0),  # `</parameter>` with no newline after it is the value's
    (SEED_W[:-len("\n</seed:tool_call>")], SEED_OSS, "", [W], 0),  # ended at EOG
    ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter></function></seed:tool_call>", SEED_OSS,
     "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter></function></seed:tool_call>", [], 1),
    ("A <tool_call> is not Seed's.", SEED_OSS, "A <tool_call> is not Seed's.", [], 0),
]


@pytest.mark.parametrize("text, fmt, content, calls, errors", CASES)
def test_a_whole_answer_comes_apart_into_content_and_calls(text, fmt, content, calls, errors):
    parsed = parse(text, fmt, ids())
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(n, json.loads(a)) for n, a in calls]
    assert len(parsed.errors) == errors
    assert all("\n" not in e and e.startswith("malformed tool call") for e in parsed.errors)
    assert len({c.id for c in parsed.calls}) == len(parsed.calls)


def test_ids_the_model_wrote_are_kept_and_the_rest_made():
    assert parse(CASES[8][0], MISTRAL).calls[0].id == "abcDEF123"
    parsed = parse(CASES[9][0], MISTRAL)
    assert parsed.calls[1].id == "xyz987654"
    assert len(parsed.calls[0].id) == 9 and parsed.calls[0].id.isalnum()  # as Mistral's templates insist


def streamed(text, fmt, cuts, tools=()):
    splitter = Splitter(fmt, ids(), tools)
    out = [splitter.push(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])] + [splitter.flush()]
    return "".join(d.content for d in out), [(c.name, c.arguments, c.id) for d in out for c in d.calls], \
        [e for d in out for e in d.errors]


def whole(text, fmt, tools=()):
    p = parse(text, fmt, ids(), tools)
    return p.content, [(c.name, c.arguments, c.id) for c in p.calls], list(p.errors)


@pytest.mark.parametrize("text, fmt, content, calls, errors", CASES)
def test_every_split_point_gives_the_same_content_and_calls(text, fmt, content, calls, errors):
    """A marker, a call's JSON and its end split anywhere across the engine's pieces (a step brings several
    tokens, a token part of a marker): the same content and calls, cut once at every point, or a character
    at a time."""
    expected = whole(text, fmt)
    for cut in range(1, len(text)):
        assert streamed(text, fmt, [cut]) == expected, cut
    assert streamed(text, fmt, list(range(1, len(text)))) == expected


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_any_cutting_gives_the_same_content_and_calls(case, data):
    text, fmt = case[0], case[1]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=20)))
    assert streamed(text, fmt, cuts) == whole(text, fmt)


@pytest.mark.parametrize("fmt, text", [
    (HERMES, "Paris is sunny <b>today</b>, <toolbox> and all."),
    (MISTRAL, "Lists [1, 2] and [TOOL] words."),
    (LLAMA3, "Not JSON at the start, then {\"name\": 1} <|python in text."),
    (HARMONY, "<|channel|>final<|message|>It is <|sunny|> today"),
    (QWEN3_CODER, "Write <function=f> and <tool> or <tool_cal in text."),
])
def test_only_what_may_start_a_marker_is_held_back(fmt, text):
    """Content streams as it comes: after each character, all of it is out but a tail that is a marker's
    start."""
    markers = fmt.markers + (("<|start|>", "<|channel|>") if fmt.harmony else ())
    splitter, out = Splitter(fmt), ""
    for i in range(len(text)):
        out += splitter.push(text[i]).content
        held = text[:i + 1][len(out):]
        assert text[:i + 1].startswith(out)
        header = fmt.harmony and held.startswith(markers) and "<|message|>" not in held  # Harmony's, being read
        assert held == "" or any(m.startswith(held) for m in markers) or header, held
    assert out + splitter.flush().content == text


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = ToolCall("get_weather", '{"city": "Paris"}', "abcDEF123")
RESULT = "RESULT-7f3a: 21 degrees and sunny"


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f is not None and f is not GRANITE])
def test_a_call_and_its_result_render_where_the_template_puts_them(name):
    """The tools, an answer's call and the tool's result, as the template renders them: the tool's name in the
    prompt, the call written back as the template writes it (and parsed back to the same call), the result
    after it and before the next answer's start."""
    t = template(name)
    conversation = [Message("user", "Weather in Paris?"), Message("assistant", "", tool_calls=(CALL,)),
                    Message("tool", RESULT, tool_call_id=CALL.id)]
    prompt = t.render(conversation, tools=[WEATHER])
    assert "The weather in a city now." in prompt  # the tools, described
    asked = prompt.index("Weather in Paris?")
    result = prompt.index(RESULT)
    assert asked < result and prompt.rindex("get_weather") < result
    assert "Paris" in prompt[asked + len("Weather in Paris?"):result]  # the call's arguments, between them
    written = {QWEN3_CODER: "<parameter=city>\nParis\n</parameter>", XML_TAGS: "<parameter=city>\nParis\n</parameter>",
               SEED_OSS: "<parameter=city>Paris</parameter>"}.get(FORMATS[name], '"city": "Paris"')
    assert written in prompt and '\\"city\\"' not in prompt  # arguments as an object, not text

    user = [Message("user", "Weather in Paris?")]
    plain = t.render(user + [Message("assistant", "SPECCHAT_ANSWER")], False, tools=[WEATHER])
    called = t.render(user + [Message("assistant", "", tool_calls=(CALL,))], False, tools=[WEATHER])
    head = next((i for i, (a, b) in enumerate(zip(plain, called)) if a != b), 0)
    parsed = parse(called[head:], FORMATS[name])
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Paris"})]
    assert not parsed.errors


def test_a_template_without_tools_renders_as_before():
    t = template("Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja")
    assert "<tools>" not in t.render([Message("user", "Hi")])
    assert "<tools>" in t.render([Message("user", "Hi")], tools=[WEATHER])


def test_a_megabyte_tool_result_renders_whole():
    result = ("line of a big file, " * 52_429)[:1_048_576]
    t = template("Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja")
    prompt = t.render([Message("user", "Read it"), Message("assistant", "", tool_calls=(CALL,)),
                       Message("tool", result, tool_call_id=CALL.id)], tools=[WEATHER])
    assert "<tool_response>\n" + result + "\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


TYPED = {"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "scale": {"type": "number"}, "dry": {"type": "boolean"},
    "opts": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}, "mode": {"enum": ["a", "b"]},
    "limit": {"type": ["integer", "string"]}, "note": {"anyOf": [{"type": "null"}, {"type": "object"}]}}}}}
TYPED_ARGS = {"path": "42", "line": 7, "scale": 1.5, "dry": True, "opts": {"deep": [1, {"x": None}]},
              "tags": ["a", "b"], "mode": "a", "limit": "none", "note": None, "extra": 3}
TYPED_TEXT = ("I will edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\n42\n</parameter>\n<parameter=line>\n7\n"
              "</parameter>\n<parameter=scale>\n1.5\n</parameter>\n<parameter=dry>\ntrue\n</parameter>\n<parameter=opts>\n"
              '{"deep": [1, {"x": null}]}\n</parameter>\n<parameter=tags>\n["a", "b"]\n</parameter>\n<parameter=mode>\na\n'
              "</parameter>\n<parameter=limit>\nnone\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
              "<parameter=extra>\n3\n</parameter>\n</function>\n</tool_call>")


def test_tagged_arguments_take_the_types_their_schemas_give():
    """Strings as written (a number's digits too), numbers, booleans, objects, arrays and null as JSON, a value
    two types allow as the JSON one where it parses, else text; a parameter no schema names as JSON where it
    parses, as llama.cpp reads an open schema."""
    parsed = parse(TYPED_TEXT, QWEN3_CODER, tools=[TYPED])
    assert parsed.content == "I will edit it.\n" and not parsed.errors
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("edit", TYPED_ARGS)]
    assert list(json.loads(parsed.calls[0].arguments)) == list(TYPED_ARGS)  # in the order written


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_tagged_arguments_stream_to_the_same_call_in_any_pieces(data):
    expected = whole(TYPED_TEXT, QWEN3_CODER, [TYPED])
    assert streamed(TYPED_TEXT, QWEN3_CODER, list(range(1, len(TYPED_TEXT))), [TYPED]) == expected
    cuts = sorted(data.draw(st.sets(st.integers(1, len(TYPED_TEXT) - 1), max_size=30)))
    assert streamed(TYPED_TEXT, QWEN3_CODER, cuts, [TYPED]) == expected


@pytest.mark.parametrize("value", ["seven", '"7"', "[7]"])
def test_a_value_its_schema_refuses_keeps_the_call_as_text(value):
    text = f"<tool_call>\n<function=edit>\n<parameter=line>\n{value}\n</parameter>\n</function>\n</tool_call>"
    parsed = parse(text, QWEN3_CODER, tools=[TYPED])
    assert parsed.content == text and parsed.calls == ()
    assert parsed.errors == ("malformed tool call (the value of line of edit is not JSON of type number); its text is "
                             "kept as the answer's",)


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f is not None and f.xml])
def test_typed_arguments_come_back_the_same_through_the_template(name):
    """A call written back by the template (a boolean as Jinja writes it, `True`; Seed-OSS's an object or list
    as Python's repr, `{'x': None}`) reads as the same call."""
    call = ToolCall("edit", json.dumps(TYPED_ARGS), "abcDEF123")
    user = [Message("user", "Edit it.")]
    plain = template(name).render(user + [Message("assistant", "SPECCHAT_ANSWER")], False, tools=[TYPED])
    called = template(name).render(user + [Message("assistant", "", tool_calls=(call,))], False, tools=[TYPED])
    head = next((i for i, (a, b) in enumerate(zip(plain, called)) if a != b), 0)
    parsed = parse(called[head:], FORMATS[name], tools=[TYPED])
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("edit", TYPED_ARGS)] and not parsed.errors


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
BARE_W = XML_W[len("<tool_call>\n"):]
BARE = [  # (text, format, content, [(name, arguments)]): Qwen3-Coder's first call without its <tool_call>, offered
    # get_weather and get_time, as llama.cpp's qwen3-coder.cpp reads it
    ("Let me look.\n" + BARE_W, QWEN3_CODER, "Let me look.\n", [W]),
    (BARE_W[:-len("\n</tool_call>")], QWEN3_CODER, "", [W]),  # and without its end, ended at EOG
    (BARE_W + "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>", QWEN3_CODER, "", [W, T]),
    # Only the first call may leave it out: after one, a bare opener is text.
    (XML_W + "\n<function=get_time>\n</function>\n</tool_call>", QWEN3_CODER, "\n<function=get_time>\n</function>\n</tool_call>",
     [W]),
    # Prose that names the tag: not the whole opener of an offered function, its newline included.
    ("Write `<function=get_weather>` or <function=\nor <function=delete_all>\nto call; #include <functional>\n",
     QWEN3_CODER, "Write `<function=get_weather>` or <function=\nor <function=delete_all>\nto call; #include <functional>\n",
     []),
    # Templates that think (Nemotron 3 Nano, Qwen3.5) are not given the leniency, as in llama.cpp, nor is Seed-OSS.
    ("Let me look.\n" + BARE_W, XML_TAGS, "Let me look.\n" + BARE_W, []),
    ("<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>", SEED_OSS,
     "<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>", []),
]


@pytest.mark.parametrize("text, fmt, content, calls", BARE)
def test_qwen3_coder_may_leave_out_its_first_calls_opening_tag(text, fmt, content, calls):
    tools = [WEATHER, TIME]
    parsed = parse(text, fmt, ids(), tools)
    assert (parsed.content, parsed.errors) == (content, ())
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(n, json.loads(a)) for n, a in calls]
    expected = whole(text, fmt, tools)
    for cut in range(1, len(text)):
        assert streamed(text, fmt, [cut], tools) == expected, cut
    assert streamed(text, fmt, list(range(1, len(text))), tools) == expected


def test_without_tools_offered_no_bare_opener_is_a_call():
    assert parse(BARE_W, QWEN3_CODER).calls == ()


def test_only_the_start_of_a_bare_opener_is_held_back():
    """While streaming, only a tail that may become `<function=get_weather>\\n` (or `<tool_call>`) waits."""
    text = "See <function=get_weathe> and <function=get_weather>` here"
    splitter, out = Splitter(QWEN3_CODER, ids(), [WEATHER]), ""
    for i in range(len(text)):
        out += splitter.push(text[i]).content
        held = text[:i + 1][len(out):]
        assert held == "" or any(m.startswith(held) for m in ("<tool_call>", "<function=get_weather>\n")), held
    assert out + splitter.flush().content == text


DEFS = {"type": "function", "function": {"name": "plot", "parameters": {
    "type": "object",
    "properties": {"label": {"$ref": "#/$defs/Label"}, "count": {"$ref": "#/definitions/Count"},
                   "at": {"$ref": "#/$defs/Point"}, "mode": {"$ref": "#/$defs/Mode"},
                   "loop": {"$ref": "#/$defs/A"}, "far": {"$ref": "https://example.com/schemas/far.json"},
                   "nowhere": {"$ref": "#/$defs/Missing"}, "cycle": {"$ref": "#/$defs/Self"}},
    "$defs": {"Label": {"type": "string"}, "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
              "Mode": {"$ref": "#/$defs/Label"},  # a ref to a ref
              "A": {"$ref": "#/$defs/B"}, "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "integer"}]},  # a cycle
              "Self": {"$ref": "#/$defs/Self"}},
    "definitions": {"Count": {"type": "integer"}}}}}
DEFS_TEXT = ("<tool_call>\n<function=plot>\n<parameter=label>\n42\n</parameter>\n<parameter=count>\n7\n</parameter>\n"
             '<parameter=at>\n{"x": 1.5}\n</parameter>\n<parameter=mode>\ntrue\n</parameter>\n<parameter=loop>\n5\n'
             "</parameter>\n<parameter=far>\n[1]\n</parameter>\n<parameter=nowhere>\nnull\n</parameter>\n"
             "<parameter=cycle>\nabc\n</parameter>\n</function>\n</tool_call>")
DEFS_ARGS = {"label": "42", "count": 7, "at": {"x": 1.5}, "mode": "true", "loop": 5, "far": [1], "nowhere": None,
             "cycle": "abc"}


def test_a_parameters_local_refs_are_followed_when_typing_its_values():
    """`#/$defs/…` and `#/definitions/…` in the tool's parameters schema, through refs to refs and a cycle, type a
    value as what they point to: digits a string where the ref's schema is one. A ref to another document, or to
    nothing, and a cycle that is nothing else, leave the value open (JSON where it parses, else text)."""
    expected = whole(DEFS_TEXT, QWEN3_CODER, [DEFS])
    assert [(n, json.loads(a)) for n, a, _ in expected[1]] == [("plot", DEFS_ARGS)] and expected[2] == []
    for cut in range(1, len(DEFS_TEXT)):
        assert streamed(DEFS_TEXT, QWEN3_CODER, [cut], [DEFS]) == expected, cut


@pytest.mark.parametrize("arg, value", [("count", "seven"), ("loop", '"5"'), ("at", "[1]")])
def test_a_value_its_refd_schema_refuses_keeps_the_call_as_text(arg, value):
    text = f"<tool_call>\n<function=plot>\n<parameter={arg}>\n{value}\n</parameter>\n</function>\n</tool_call>"
    parsed = parse(text, QWEN3_CODER, tools=[DEFS])
    assert parsed.content == text and parsed.calls == () and len(parsed.errors) == 1


def test_refs_are_followed_a_bounded_number_of_times():
    from specchat.llama import xmlcalls
    chain = {f"D{i}": {"$ref": f"#/$defs/D{i + 1}"} for i in range(100)} | {"D100": {"type": "integer"}}
    assert xmlcalls.kinds_of({"$ref": "#/$defs/D90"}, {"$defs": chain}) == {"number"}
    assert xmlcalls.kinds_of({"$ref": "#/$defs/D0"}, {"$defs": chain}) == xmlcalls.KINDS  # past the depth: open
    # Each def a union of two refs to the next: 2**40 paths, cut off by the budget, not walked.
    fan = {f"F{i}": {"anyOf": [{"$ref": f"#/$defs/F{i + 1}"}, {"$ref": f"#/$defs/F{i + 1}"}]} for i in range(40)}
    assert xmlcalls.kinds_of({"$ref": "#/$defs/F0"}, {"$defs": fan | {"F40": {"type": "null"}}}) == xmlcalls.KINDS


SEED_TYPED = ("<seed:tool_call>\n<function=edit>\n<parameter=path>42</parameter>\n<parameter=line>7</parameter>\n"
              "<parameter=dry>True</parameter>\n<parameter=opts>{'deep': [1, {'x': None}]}</parameter>\n"
              "<parameter=tags>[\"a\", \"b\"]</parameter>\n<parameter=limit>12</parameter>\n"
              "<parameter=extra>3</parameter>\n</function>\n</seed:tool_call>")


def test_seed_oss_values_are_text_where_a_string_is_allowed_else_json():
    """As llama.cpp's autoparser types Seed-OSS's values: text wherever the schema lets a value be a string
    (`limit`, integer or string: "12"), JSON (or Python's spelling, as its template writes) where it does not."""
    expected = whole(SEED_TYPED, SEED_OSS, [TYPED])
    args = {"path": "42", "line": 7, "dry": True, "opts": {"deep": [1, {"x": None}]}, "tags": ["a", "b"],
            "limit": "12", "extra": 3}
    assert [(n, json.loads(a)) for n, a, _ in expected[1]] == [("edit", args)] and expected[2] == []
    assert streamed(SEED_TYPED, SEED_OSS, list(range(1, len(SEED_TYPED))), [TYPED]) == expected
