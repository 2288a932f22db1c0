"""Tool calls whose arguments are tagged text rather than one JSON value: Qwen3-Coder's (the form Nemotron 3
Nano, Qwen3.5 and StepFun 3.5 Flash write too), and Seed-OSS's, the same tags in other words:

    <tool_call>                       <seed:tool_call>
    <function=NAME>                   <function=NAME>
    <parameter=ARG>                   <parameter=ARG>VALUE</parameter>
    VALUE                             </function>
    </parameter>                      </seed:tool_call>
    </function>
    </tool_call>

As llama.cpp reads them (in the sources llama-cpp-python 0.3.36 vendors: common/parsers/qwen3-coder.cpp for
Qwen3-Coder's; Seed-OSS's has no parser of its own, the autoparser reads its template's tags, as
common/chat-auto-parser-generator.cpp's build_tool_parser_tag_tagged and tests/test-chat.cpp show). Qwen3-Coder's
value runs from its tag's newline to the next `\\n</parameter>\\n` and becomes JSON by its parameter's schema: a
string parameter's value is its text as written, a number's, boolean's, object's or array's is parsed as JSON,
and one the schema leaves open (several types, or none) is JSON where it parses as one of them, else text.
Seed-OSS's runs from right after its tag to the next `</parameter>\\n`, and is text wherever the schema lets it be
a string (llama.cpp's may_be_string), else JSON; its template writes an object or list as Python does
(`{'a': None}`), which reads as JSON's (llama.cpp's normalize_container_value). Where the schema is not known (a
function or parameter the tools do not name), the value is taken as open.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Tags:
    """One template's spelling of the tags: what opens and ends a call, what ends a value (a value may hold
    `</parameter>` that this does not match), what the template writes between a value's tag and the value, and
    whether its values read as Seed-OSS's do (text wherever a string is allowed; Python's containers taken)."""

    open: str
    end: str
    value_end: str
    lead: str
    seed: bool = False


# llama.cpp's value ends: Qwen3-Coder's value may hold a `</parameter>` that no newline surrounds.
QWEN = Tags("<tool_call>", "</tool_call>", "\n</parameter>\n", "\n")
SEED = Tags("<seed:tool_call>", "</seed:tool_call>", "</parameter>\n", "", seed=True)

PARAMETER = "<parameter="
KINDS = frozenset({"string", "number", "boolean", "object", "array", "null"})
REF_DEPTH = 32  # $refs followed one through another before the schema is taken as open
REF_BUDGET = 256  # $refs followed in all for one parameter (refs to refs in unions could multiply without end)

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>")
_CLOSE = re.compile(r"\s*</function>\s*")
# The template writes a boolean or null argument with Jinja's `string`, Python's spelling: read back as JSON's.
_PYTHON = {"True": True, "False": False, "None": None}


class XmlCallError(ValueError):
    """Call text that is not a call; its message is one line saying why."""


class EndScan:
    """Where a call ends, found a piece at a time: at its end tag (`</tool_call>`), where no parameter's value
    holds it (a value is any text, code that writes tool calls included). `start` is where the call's tags
    begin."""

    def __init__(self, start: int, tags: Tags = QWEN) -> None:
        self.pos, self.value, self.tags = start, False, tags

    def end(self, text: str) -> int | None:
        value_end, end = self.tags.value_end, self.tags.end
        while True:
            if self.value:
                at = text.find(value_end, self.pos)
                if at < 0:
                    self.pos = max(self.pos, len(text) - len(value_end) + 1)
                    return None
                self.pos, self.value = at + len(value_end), False
                continue
            hits = [(at, tag) for tag in (PARAMETER, end) if (at := text.find(tag, self.pos)) >= 0]
            if not hits:
                self.pos = max(self.pos, len(text) - max(len(PARAMETER), len(end)) + 1)
                return None
            at, tag = min(hits)
            self.pos = at + len(tag)
            if tag == end:
                return self.pos
            self.value = True


def schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each offered function's parameters schema (the document its parameters' `$ref`s point into), by the
    function's name."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            out[function["name"]] = dict(parameters) if isinstance(parameters, Mapping) else {}
    return out


def read(body: str, known: Mapping[str, Mapping[str, Any]], tags: Tags = QWEN) -> tuple[str, dict[str, Any]]:
    """A call's name and arguments from the text between its opening and end tags, each value made JSON by
    `known` (`schemas`). Raises XmlCallError where the text is not a call."""
    m = _FUNCTION.match(body)
    if m is None:
        raise XmlCallError("no <function=NAME> opens it")
    name, pos = m.group(1).strip(), m.end()
    root = known.get(name, {})
    properties = root.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    args: dict[str, Any] = {}
    while p := _PARAMETER.match(body, pos):
        end = body.find(tags.value_end, p.end())
        if end < 0:
            raise XmlCallError(f"the parameter {p.group(1).strip()} of {name} never closes")
        text = body[p.end():end]
        arg = p.group(1).strip()
        text = text[len(tags.lead):] if tags.lead and text.startswith(tags.lead) else text
        args[arg] = typed(text, properties.get(arg), f"{arg} of {name}", root, tags)
        pos = end + len(tags.value_end)
    if not _CLOSE.fullmatch(body, pos):
        raise XmlCallError(f"{body[pos:].strip()[:40]!r} where {name}'s parameters or </function> should be")
    return name, args


def typed(text: str, schema: Any, what: str, root: Any = None, tags: Tags = QWEN) -> Any:
    """A parameter's text as the JSON value its schema says it is (`what` names it in the error; `root`, the
    parameters schema, is where its `$ref`s point)."""
    kinds = kinds_of(schema, root)
    if kinds == {"string"} or (tags.seed and "string" in kinds and kinds != KINDS):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = _PYTHON.get(text.strip(), text)
        if value is text and tags.seed:
            value = _python_literal(text)
    if value is not text and _kind(value) in kinds - {"string"}:
        return value
    if "string" in kinds:
        return text
    raise XmlCallError(f"the value of {what} is not JSON of type {' or '.join(sorted(kinds))}")


def _python_literal(text: str) -> Any:
    """An object or list as Jinja's `string` writes one (Python's repr: quotes, True, None), as JSON's; else the
    text itself."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    try:  # only what JSON holds: no tuples, sets or bytes
        return json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else text
    except (TypeError, ValueError):
        return text


def kinds_of(schema: Any, root: Any = None) -> frozenset[str]:
    """The JSON types a schema allows, as llama.cpp's common_chat_schema::value_types reads them ("integer" is a
    number); an open schema allows every type. A `$ref` into the parameters schema `root` (`#/$defs/…`,
    `#/definitions/…`, any JSON pointer from `#`) is followed; one that points elsewhere (another document) or
    nowhere, or refs nested past REF_DEPTH, are open. A cycle of refs adds no type, as in llama.cpp, and a
    schema no value meets (that cycle alone, an allOf of disjoint types) is read as open rather than refusing
    every call. Past REF_DEPTH refs in a chain, or REF_BUDGET in all, the rest is open."""
    return _kinds(schema, root, (), [REF_BUDGET]) or KINDS


def _kinds(schema: Any, root: Any, refs: tuple[str, ...], budget: list[int]) -> frozenset[str]:
    if not isinstance(schema, Mapping):
        return KINDS
    if "$ref" in schema:  # as in llama.cpp, a $ref's siblings are not read
        ref = schema["$ref"]
        if ref in refs:
            return frozenset()
        target = _resolve(ref, root)
        budget[0] -= 1
        if target is None or len(refs) >= REF_DEPTH or budget[0] < 0:
            return KINDS
        return _kinds(target, root, (*refs, ref), budget)
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(_kinds(s, root, refs, budget) for s in schema[key]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return frozenset().union(*(_kinds({**schema, "type": k}, root, refs, budget) for k in kind))
    if "const" in schema:
        return frozenset({_kind(schema["const"])})
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(_kind(v) for v in schema["enum"])
    if isinstance(kind, str):
        return frozenset({"number" if kind == "integer" else kind}) & KINDS or KINDS  # a type JSON lacks: open
    if "properties" in schema:
        return frozenset({"object"})
    if isinstance(schema.get("allOf"), list):
        return KINDS.intersection(*(_kinds(s, root, refs, budget) for s in schema["allOf"]))
    if "items" in schema or "prefixItems" in schema:
        return frozenset({"array"})
    if any(k in schema for k in ("pattern", "minLength", "maxLength", "format")):
        return frozenset({"string"})
    return KINDS


def _resolve(ref: Any, root: Any) -> Any:
    """The schema a local `$ref` (`#`, `#/$defs/Name`: a JSON pointer into `root`) points to, or None."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    target = root
    for token in ref[2:].split("/") if ref != "#" else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            return None
    return target if isinstance(target, Mapping) else None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")
