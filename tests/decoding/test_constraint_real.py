"""A forced tool call on real models: on the default pair, read off its own template (Hermes/Qwen
`<tool_call>`), an answer made with lookup and with the draft, greedy and sampled, parses as a call to the
named tool with arguments its schema allows; and greedy constrained output is plain constrained decoding's,
token for token (a parting excused only as a near-tie, `tests/helpers/greedy.py`), on the default pair and on
SmolLM2, whose rows must also equal plain decoding's to the bit."""

from __future__ import annotations

import json
import warnings

import pytest
from greedy import compare

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import DraftGuesser, LookupGuesser
from specchat.decoding.sampling import SamplingConfig
from specchat.decoding.toolgrammar import tool_constraint
from specchat.llama.model import Model
from specchat.llama.template import ChatPrompter, Message
from specchat.llama.toolcalls import HERMES, format_of, parse

pytestmark = pytest.mark.real

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather forecast for a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
               "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
TOOLS = [TIME, WEATHER]
# A question that asks for neither tool outright, so that the grammar, not the model, decides it is a call.
QUESTION = "Should I pack an umbrella for my trip to Bergen next week?"


def valid_weather(args: dict) -> bool:
    return (isinstance(args.get("city"), str) and 0 < len(args["city"]) <= 40 and isinstance(args.get("days"), int)
            and 1 <= args["days"] <= 14 and args.get("unit", "celsius") in ("celsius", "fahrenheit"))



def forced(model: Model, fmt=None):
    prompter = ChatPrompter(model)
    fmt = fmt or format_of(prompter.template)
    model.show([*fmt.markers, fmt.end])  # as the service does: the call's tags as text
    prompt = prompter.tokens([Message("user", QUESTION)], tools=TOOLS)
    return fmt, prompt, tool_constraint(TOOLS, "get_weather", fmt, model)


def test_a_forced_call_parses_on_the_default_pair_with_lookup_and_the_draft(pair):
    target, draft = pair
    fmt, prompt, constraint = forced(target)
    assert fmt.name == "hermes" and fmt.markers == ("<tool_call>",) and fmt.end == "</tool_call>"
    for name, guesser in (("lookup", LookupGuesser()), ("draft", DraftGuesser(draft))):
        for sampling in (SamplingConfig(), SamplingConfig(1.0, seed=1)):
            done = final(Engine(target, guesser).generate(prompt, GenerationConfig(sampling, 80, constraint=constraint)))
            parsed = parse(done.text, fmt)
            assert done.reason == "eog" and parsed.errors == () and not parsed.content.strip(), (name, done.text)
            assert [c.name for c in parsed.calls] == ["get_weather"], (name, done.text)
            assert valid_weather(json.loads(parsed.calls[0].arguments)), (name, done.text)
            assert done.stats.drafted > 0 and done.stats.accepted > 0, (name, done.stats)


@pytest.mark.parametrize("name", ["lookup", "draft"])
def test_greedy_constrained_equals_plain_constrained_on_the_default_pair(pair, qwen_paths, name):
    target, draft = pair
    _, prompt, constraint = forced(target)
    make = {"lookup": LookupGuesser, "draft": lambda: DraftGuesser(draft)}[name]
    found = compare(target, qwen_paths[0], prompt, make, 64, check_rows=False, constraint=constraint)
    for tie in found.ties:
        warnings.warn(f"{name}: {tie.report()}")
    assert found.drafted > 0 and found.accepted > 0, found


def test_greedy_constrained_equals_plain_constrained_on_smollm2_to_the_bit(smol, smol_draft, smol_path):
    """SmolLM2's template has no tools: the Hermes format is asked for all the same, the grammar alone making
    the call. Its rows move by nothing between batchings here, so every row must equal plain decoding's."""
    _, prompt, constraint = forced(smol, HERMES)
    # The draft is SmolLM2 itself: its greedy guesses are the unmasked argmax, cut where the grammar refuses them.
    for make in (LookupGuesser, lambda: DraftGuesser(smol_draft)):
        found = compare(smol, smol_path, prompt, make, 64, constraint=constraint)
        assert not found.ties and found.drafted > 0 and found.accepted > 0 and found.rows > 10, found

