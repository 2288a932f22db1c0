"""The grammar of a forced tool call, on the scripted text model (bytes and the chat format's special tokens)
with llguidance's view of its vocabulary: whatever the model would rather say, a forced answer parses
(`llama.toolcalls.parse`) as a call to the tool asked for, with arguments its schema allows, in each format
covered; guessers change nothing of that. Then what is refused, in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakes import ScriptedModel
from fakes import tokenizer as toy

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import DraftGuesser, LookupGuesser
from specchat.decoding.sampling import SamplingConfig
from specchat.decoding.toolgrammar import tool_constraint
from specchat.errors import SpecchatError
from specchat.llama.toolcalls import GRANITE, HARMONY, HERMES, LLAMA3, MISTRAL, QWEN3_CODER, SEED_OSS, ToolFormat, parse

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
               "metric": {"type": "boolean"}}, "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def valid_weather(args: dict) -> bool:
    return (set(args) <= {"city", "days", "metric"} and args["city"] in ("Paris", "Oslo", "Lima")
            and isinstance(args["days"], int) and 1 <= args["days"] <= 7
            and isinstance(args.get("metric", True), bool))


def answer(constraint, guesser=None, seed: int | None = 0, max_tokens: int = 160) -> str:
    target = ScriptedModel(7, 2.0, text=True, order=1)
    prompt = target.tokenize("<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingConfig(1.0, seed=seed) if seed is not None else SamplingConfig()
    done = final(Engine(target, guesser).generate(prompt, GenerationConfig(sampling, max_tokens, constraint=constraint)))
    assert done.reason == "eog", (done.reason, done.text)  # the grammar's end, and the model's end token
    return done.text


@pytest.mark.parametrize("guesser", ["none", "lookup", "draft"])
def test_a_named_function_is_called_with_arguments_its_schema_allows(guesser):
    constraint = tool_constraint([TIME, WEATHER], "get_weather", HERMES, toy.text())
    make = {"none": lambda: None, "lookup": LookupGuesser,
            "draft": lambda: DraftGuesser(ScriptedModel(8, 1.0, text=True, order=1))}[guesser]
    for seed in (0, 1, 2, None):  # None: greedy
        text = answer(constraint, make(), seed)
        parsed = parse(text, HERMES)
        assert parsed.errors == () and parsed.content == "", text
        assert [c.name for c in parsed.calls] == ["get_weather"], text
        assert valid_weather(json.loads(parsed.calls[0].arguments)), text
        assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {') and text.endswith("}\n</tool_call>")


def test_required_calls_one_of_the_tools():
    constraint = tool_constraint([TIME, WEATHER], "required", HERMES, toy.text(), parallel=False)
    for seed in range(6):
        parsed = parse(answer(constraint, seed=seed), HERMES)
        assert parsed.errors == () and parsed.content == "" and len(parsed.calls) == 1
        args = json.loads(parsed.calls[0].arguments)
        assert valid_weather(args) if parsed.calls[0].name == "get_weather" else args == {"zone": args["zone"]}


def test_parallel_calls_follow_one_another_until_the_model_ends():
    """The scripted model would rather go on than end after a call: with parallel calls allowed it makes
    several, each whole; without, one and the end."""
    constraint = tool_constraint([TIME, WEATHER], "required", HERMES, toy.text())
    target = ScriptedModel(7, 2.0, text=True, order=1)
    done = final(Engine(target).generate(target.tokenize("<|im_start|>assistant\n"),
                                         GenerationConfig(SamplingConfig(1.0, seed=0), 400, constraint=constraint)))
    calls = parse(done.text[:done.text.rindex("</tool_call>") + len("</tool_call>")], HERMES).calls
    assert len(calls) >= 2 and all(json.loads(c.arguments) for c in calls)


@pytest.mark.parametrize("fmt", [MISTRAL, GRANITE, LLAMA3, ToolFormat("json", ("<tools>",), "</tools>")])
def test_the_other_json_formats(fmt):
    constraint = tool_constraint([TIME, WEATHER], "get_weather", fmt, toy.text())
    for seed in (0, 1):
        parsed = parse(answer(constraint, LookupGuesser(), seed), fmt)
        assert parsed.errors == () and parsed.content == "" and [c.name for c in parsed.calls] == ["get_weather"]
        assert valid_weather(json.loads(parsed.calls[0].arguments))


def test_a_marker_the_vocabulary_holds_as_one_special_token_is_asked_for_as_that_token():
    tokenizer = toy.text(extra=("<tool_call>", "</tool_call>"))  # ids 258 and 259
    matcher = tool_constraint([WEATHER], "get_weather", HERMES, tokenizer).start()
    assert np.flatnonzero(matcher.allowed()).tolist() == [258]  # not '<' spelled out
    matcher.consume([258, *tokenizer.tokenize_str('\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n')])
    assert np.flatnonzero(matcher.allowed()).tolist() == [259]
    matcher.consume([259])
    assert np.flatnonzero(matcher.allowed()).tolist() == [257]  # the end: a named function is called once


FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
    "days": {"type": "integer", "minimum": 1, "maximum": 7}, "metric": {"type": "boolean"},
    "hours": {"type": "array", "items": {"enum": [6, 12, 18]}, "maxItems": 2}}, "required": ["days"]}}}


def valid_forecast(args: dict) -> bool:
    hours = args.get("hours", [])
    return 1 <= args["days"] <= 7 and isinstance(args.get("metric", True), bool) and set(hours) <= {6, 12, 18} \
        and len(hours) <= 2


@pytest.mark.parametrize("fmt, seeds, opens, closes", [
    (QWEN3_CODER, (0, 1, 2, None), "<tool_call>\n<function=forecast>\n<parameter=days>\n",
     "\n</parameter>\n</function>\n</tool_call>"),
    (SEED_OSS, (0, 1, None), "<seed:tool_call>\n<function=forecast>\n<parameter=days>",
     "</parameter>\n</function>\n</seed:tool_call>"),
])
def test_tagged_arguments_are_held_to_their_schemas(fmt: ToolFormat, seeds: tuple[int | None, ...], opens: str,
                                                    closes: str):
    """Qwen3-Coder's form (each typed value on its own line between its tags) and Seed-OSS's (each on its tag's
    line): the typed values are JSON their schemas allow, and the call parses back (by the same schemas) whole."""
    constraint = tool_constraint([FORECAST, TIME], "forecast", fmt, toy.text())
    for seed in seeds:
        text = answer(constraint, LookupGuesser(), seed, max_tokens=400)
        parsed = parse(text, fmt, tools=[FORECAST, TIME])
        assert parsed.errors == () and parsed.content == "" and [c.name for c in parsed.calls] == ["forecast"], text
        assert valid_forecast(json.loads(parsed.calls[0].arguments)), text
        assert text.startswith(opens) and text.endswith(closes), text


# FORECAST with its parameters' schemas behind local refs, one a ref to a ref.
REFD = {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
    "days": {"$ref": "#/$defs/Days"}, "hours": {"$ref": "#/definitions/Hours"}}, "required": ["days", "hours"],
    "$defs": {"Days": {"$ref": "#/$defs/Week"}, "Week": {"type": "integer", "minimum": 1, "maximum": 7}},
    "definitions": {"Hours": {"type": "array", "items": {"enum": [6, 12, 18]}, "maxItems": 2}}}}}


def test_tagged_arguments_behind_refs_are_held_to_the_schemas_they_point_to():
    constraint = tool_constraint([REFD], "forecast", QWEN3_CODER, toy.text())
    for seed in (0, 1, None):
        text = answer(constraint, LookupGuesser(), seed, max_tokens=400)
        parsed = parse(text, QWEN3_CODER, tools=[REFD])
        assert parsed.errors == () and [c.name for c in parsed.calls] == ["forecast"], text
        args = json.loads(parsed.calls[0].arguments)
        assert isinstance(args["days"], int) and valid_forecast(args), text



# REFD closed, so that a JSON call ends (the tagged form names only the parameters there are).
CLOSED_REFD = {"type": "function", "function": {"name": "forecast", "parameters": {
    **REFD["function"]["parameters"], "additionalProperties": False}}}


@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, LLAMA3])
def test_json_arguments_behind_refs_are_held_to_the_schemas_they_point_to(fmt):
    """The arguments sit inside the call's schema, but their refs still point into their tool's parameters."""
    constraint = tool_constraint([TIME, CLOSED_REFD], "forecast", fmt, toy.text())
    for seed in (0, 1, None):
        text = answer(constraint, LookupGuesser(), seed, max_tokens=400)
        parsed = parse(text, fmt)
        assert parsed.errors == () and parsed.content == "" and [c.name for c in parsed.calls] == ["forecast"], text
        args = json.loads(parsed.calls[0].arguments)
        assert isinstance(args["days"], int) and valid_forecast(args), text


def hourly(name: str, hours: list[int]) -> dict:
    """A tool whose one argument is an hour from `hours`, behind a definition every such tool calls Hour."""
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        "at": {"$ref": "#/$defs/Hour"}}, "required": ["at"], "additionalProperties": False,
        "$defs": {"Hour": {"enum": hours}}}}}


EARLY, LATE = hourly("early", [6, 7]), hourly("late", [20, 21])


def test_two_tools_definitions_of_one_name_stay_each_its_own():
    tokenizer = toy.text()
    constraint = tool_constraint([EARLY, LATE], "required", HERMES, tokenizer, parallel=False)
    for name, digits in (("early", "67"), ("late", "2")):
        matcher = constraint.start()
        matcher.consume(tokenizer.tokenize_str(f'<tool_call>\n{{"name": "{name}", "arguments": {{"at": '))
        assert np.flatnonzero(matcher.allowed()).tolist() == [ord(d) for d in digits], name
    for seed in range(4):
        parsed = parse(answer(constraint, seed=seed), HERMES)
        assert parsed.errors == () and len(parsed.calls) == 1
        hour = json.loads(parsed.calls[0].arguments)["at"]
        assert hour in ((6, 7) if parsed.calls[0].name == "early" else (20, 21)), parsed.calls


def allowed_digits(constraint, tokenizer, name: str) -> list[int]:
    matcher = constraint.start()
    matcher.consume(tokenizer.tokenize_str(f'<tool_call>\n{{"name": "{name}", "arguments": {{"at": '))
    return np.flatnonzero(matcher.allowed()).tolist()


def with_root(tool: dict, **root) -> dict:
    """The tool with these keywords at its parameters' root (an id the schema brings, its draft)."""
    return {"type": "function", "function": {**tool["function"], "parameters": {**root, **tool["function"]["parameters"]}}}


def test_two_tools_that_bring_one_id_stay_each_its_own():
    """Both name their parameters "urn:hours" and their refs say so: each is still held to its own hours."""
    tokenizer = toy.text()
    early, late = (with_root(t, **{"$id": "urn:hours"}) for t in (EARLY, LATE))
    late["function"]["parameters"]["properties"]["at"] = {"$ref": "urn:hours#/$defs/Hour"}
    constraint = tool_constraint([early, late], "required", HERMES, tokenizer)
    assert allowed_digits(constraint, tokenizer, "early") == [ord("6"), ord("7")]
    assert allowed_digits(constraint, tokenizer, "late") == [ord("2")]


def test_a_draft_04_schema_named_by_a_url_is_read_without_fetching_it():
    """Draft-04 names a document with `id`, here a URL nothing fetches, and keeps definitions under `definitions`."""
    tokenizer = toy.text()
    tools = []
    for tool in (EARLY, LATE):
        parameters = dict(tool["function"]["parameters"])
        parameters["definitions"] = parameters.pop("$defs")
        parameters["properties"] = {"at": {"$ref": "#/definitions/Hour"}}
        tools.append(with_root({"function": {**tool["function"], "parameters": parameters}},
                               **{"$schema": "http://json-schema.org/draft-04/schema#",
                                  "id": "http://example.com/hours.json"}))
    constraint = tool_constraint(tools, "required", HERMES, tokenizer)
    assert allowed_digits(constraint, tokenizer, "early") == [ord("6"), ord("7")]
    assert allowed_digits(constraint, tokenizer, "late") == [ord("2")]


TREE = {"type": "function", "function": {"name": "tree", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}, "kid": {"$ref": "#"}}, "required": ["n"], "additionalProperties": False}}}


def test_a_ref_to_the_root_is_to_the_parameters_not_the_call():
    tokenizer = toy.text()
    matcher = tool_constraint([TREE], "tree", HERMES, tokenizer).start()
    matcher.consume(tokenizer.tokenize_str('<tool_call>\n{"name": "tree", "arguments": {"n": 1, "kid": {"n'))
    assert np.flatnonzero(matcher.allowed()).tolist() == [ord('"')]  # "n", not "name"
    matcher.consume(tokenizer.tokenize_str('": 2}}}\n</tool_call>'))
    assert np.flatnonzero(matcher.allowed()).tolist() == [257]  # the end

def test_parallel_tagged_calls_follow_one_another():
    constraint = tool_constraint([FORECAST], "required", QWEN3_CODER, toy.text())
    target = ScriptedModel(7, 2.0, text=True, order=1, n_ctx=1024)  # room for a few calls of 140 bytes
    counts = []
    for seed in range(3):
        done = final(Engine(target).generate(target.tokenize("<|im_start|>assistant\n"), GenerationConfig(
            SamplingConfig(1.0, seed=seed), 600, constraint=constraint)))
        parsed = parse(done.text[:done.text.rindex("</tool_call>") + len("</tool_call>")], QWEN3_CODER, tools=[FORECAST])
        assert parsed.errors == () and parsed.content == "", done.text
        assert all(valid_forecast(json.loads(c.arguments)) for c in parsed.calls), done.text
        counts.append(len(parsed.calls))
    assert max(counts) >= 2, counts  # the model, let to go on, calls again


def test_a_tagged_string_runs_to_the_first_closing_tag_on_its_own_line():
    """A string value is any text, tags included, until `\\n</parameter>\\n`: then the next parameter."""
    tokenizer = toy.text()
    matcher = tool_constraint([WEATHER], "required", QWEN3_CODER, tokenizer).start()
    matcher.consume(tokenizer.tokenize_str("<tool_call>\n<function=get_weather>\n<parameter=city>\nSt </parameter> Ives"))
    assert matcher.allowed()[list(b"x<\n")].all()  # any text goes on
    matcher.consume(tokenizer.tokenize_str("\n</parameter>\n"))
    assert np.flatnonzero(matcher.allowed()).tolist() == [ord("<")]  # <parameter=days>, which is required


@pytest.mark.parametrize("tools,choice,fmt,why", [
    ([WEATHER], "get_time", HERMES, "tool_choice names 'get_time', which is not among the request's tools"),
    ([], "required", HERMES, "tool_choice needs tools"),
    ([WEATHER], "required", HARMONY, "cannot be enforced for this model: gpt-oss's Harmony tool calls"),
    ([WEATHER], "required", None, "cannot be enforced for this model: its chat template's tool calls"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(?<=a)b"}}}}}], "f", HERMES, "cannot be compiled"),
    # A ref to another document: llguidance fetches none.
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"$ref": "https://example.com/x.json"}}}}}], "f", HERMES, "cannot be compiled"),
])
def test_what_cannot_be_enforced_is_one_line(tools, choice, fmt, why):
    with pytest.raises(SpecchatError) as caught:
        tool_constraint(tools, choice, fmt, toy.text())
    assert why in str(caught.value) and "\n" not in str(caught.value)
