"""Qwen3-Coder's tool calls, whose arguments are tagged text rather than one JSON value (the form Nemotron 3 Nano,
Qwen3.5 and StepFun 3.5 Flash write too):

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

As llama.cpp's parser for it (common/parsers/qwen3-coder.cpp in the sources llama-cpp-python 0.3.36 vendors) reads
them: a value runs from its tag's newline to the next `\\n</parameter>\\n`, and becomes JSON by its parameter's
schema: a string parameter's value is its text as written, a number's, boolean's, object's or array's is parsed as
JSON, and one the schema leaves open (several types, or none) is JSON where it parses as one of them, else text.
Where the schema is not known (a function or parameter the tools do not name), the value is taken as open.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

OPEN, END = "<tool_call>", "</tool_call>"
PARAMETER = "<parameter="
VALUE_END = "\n</parameter>\n"  # llama.cpp's: a value may hold `</parameter>` that no newline surrounds
KINDS = frozenset({"string", "number", "boolean", "object", "array", "null"})

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>")
_CLOSE = re.compile(r"\s*</function>\s*")
# The template writes a boolean or null argument with Jinja's `string`, Python's spelling: read back as JSON's.
_PYTHON = {"True": True, "False": False, "None": None}


class XmlCallError(ValueError):
    """Call text that is not a call; its message is one line saying why."""


class EndScan:
    """Where a call ends, found a piece at a time: at its `</tool_call>`, where no parameter's value holds it
    (a value is any text, code that writes tool calls included). `start` is where the call's tags begin."""

    def __init__(self, start: int) -> None:
        self.pos, self.value = start, False

    def end(self, text: str) -> int | None:
        while True:
            if self.value:
                at = text.find(VALUE_END, self.pos)
                if at < 0:
                    self.pos = max(self.pos, len(text) - len(VALUE_END) + 1)
                    return None
                self.pos, self.value = at + len(VALUE_END), False
                continue
            hits = [(at, tag) for tag in (PARAMETER, END) if (at := text.find(tag, self.pos)) >= 0]
            if not hits:
                self.pos = max(self.pos, len(text) - max(len(PARAMETER), len(END)) + 1)
                return None
            at, tag = min(hits)
            self.pos = at + len(tag)
            if tag == END:
                return self.pos
            self.value = True


def schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each offered function's parameters' schemas, by the function's name."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            properties = (function.get("parameters") or {}).get("properties")
            out[function["name"]] = dict(properties) if isinstance(properties, Mapping) else {}
    return out


def read(body: str, known: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A call's name and arguments from the text between its `<tool_call>` and `</tool_call>`, each value made
    JSON by `known` (`schemas`). Raises XmlCallError where the text is not a call."""
    m = _FUNCTION.match(body)
    if m is None:
        raise XmlCallError("no <function=NAME> opens it")
    name, pos = m.group(1).strip(), m.end()
    properties = known.get(name, {})
    args: dict[str, Any] = {}
    while p := _PARAMETER.match(body, pos):
        end = body.find(VALUE_END, p.end())
        if end < 0:
            raise XmlCallError(f"the parameter {p.group(1).strip()} of {name} never closes")
        text = body[p.end():end]
        arg = p.group(1).strip()
        args[arg] = typed(text[1:] if text.startswith("\n") else text, properties.get(arg), f"{arg} of {name}")
        pos = end + len(VALUE_END)
    if not _CLOSE.fullmatch(body, pos):
        raise XmlCallError(f"{body[pos:].strip()[:40]!r} where {name}'s parameters or </function> should be")
    return name, args


def typed(text: str, schema: Any, what: str) -> Any:
    """A parameter's text as the JSON value its schema says it is (`what` names it in the error)."""
    kinds = kinds_of(schema)
    if kinds == {"string"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = _PYTHON.get(text.strip(), text)
    if value is not text and _kind(value) in kinds - {"string"}:
        return value
    if "string" in kinds:
        return text
    raise XmlCallError(f"the value of {what} is not JSON of type {' or '.join(sorted(kinds))}")


def kinds_of(schema: Any) -> frozenset[str]:
    """The JSON types a schema allows, as llama.cpp's common_chat_schema::value_types reads them ("integer" is a
    number); an open schema allows every type. A `$ref` is not followed here: it is taken as open."""
    if not isinstance(schema, Mapping) or "$ref" in schema:
        return KINDS
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(kinds_of(s) for s in schema[key]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return frozenset().union(*(kinds_of({**schema, "type": k}) for k in kind))
    if "const" in schema:
        return frozenset({_kind(schema["const"])})
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(_kind(v) for v in schema["enum"])
    if isinstance(kind, str):
        return frozenset({"number" if kind == "integer" else kind}) & KINDS or KINDS  # a type JSON lacks: open
    if "properties" in schema:
        return frozenset({"object"})
    if isinstance(schema.get("allOf"), list):
        return KINDS.intersection(*(kinds_of(s) for s in schema["allOf"]))
    if "items" in schema or "prefixItems" in schema:
        return frozenset({"array"})
    if any(k in schema for k in ("pattern", "minLength", "maxLength", "format")):
        return frozenset({"string"})
    return KINDS


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")
