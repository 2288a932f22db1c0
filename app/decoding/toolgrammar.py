"""The grammar of a forced tool call (OpenAI's `tool_choice` "required" or a named function): the answer is one
call (or, for "required" with parallel calls, one or more) in the form the model's template writes, each
call's arguments held to its tool's JSON schema (llguidance's `%json`).

Covered: the formats that put a JSON call after a marker (`specchat.llama.toolcalls`): Hermes and Qwen's
`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>` (the default model's), any such marker-and-end pair a
template was read to use, the list forms of Mistral (`[TOOL_CALLS][{…}]`) and Granite (`<|tool_call|>[{…}]`),
and Llama 3.x's bare `{"name": …, "parameters": …}`; and Qwen3-Coder's tagged arguments
(`<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n…`), each value held to its parameter's
schema where that is not a string (`%json`), else any text up to the first `\\n</parameter>\\n`, as llama.cpp's
grammar for it has it; Seed-OSS's `<seed:tool_call>` the same, each value on its tag's line up to the first
`</parameter>\\n`. Local `$ref`s (`#/$defs/…`) keep pointing into their tool's parameters schema, in every
format. Not covered: gpt-oss's Harmony channels.

A marker that the vocabulary holds as one special token is asked for as that token: it is what the model
writes, and its text spelled out byte by byte would be another answer.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import llguidance

from specchat.decoding.constraint import Constraint, tokenizer_of
from specchat.errors import SpecchatError
from specchat.llama import xmlcalls
from specchat.llama.toolcalls import ToolFormat

if TYPE_CHECKING:
    from specchat.llama.model import Model

# JSON as templates write it (tojson, json.dumps): ", " and ": ", no other whitespace, so that the grammar
# neither invites a model to pad its arguments with newlines forever nor refuses the spacing it was trained on.
_NL = "\n"  # (no backslash in an f-string's braces before Python 3.12)
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_constraint(tools: Sequence[Mapping[str, Any]], choice: str, fmt: ToolFormat | None,
                    model: Model | llguidance.LLTokenizer, parallel: bool = True) -> Constraint:
    """The constraint for `tool_choice`: `choice` "required" (one of `tools`, or several calls in a row if
    `parallel`) or a function's name (one call to it). `tools` are OpenAI tool schemas (`{"type": "function",
    "function": {"name", "parameters", …}}`), `fmt` what `toolcalls.format_of` read off the template, `model`
    the loaded target (or llguidance's tokenizer for it). Raises SpecchatError, one line, for a choice no
    tool answers, a format not covered, or a schema llguidance cannot compile."""
    functions = [_function(tool) for tool in tools]
    if not functions:
        raise SpecchatError("tool_choice needs tools: the request lists none")
    if choice != "required":
        functions = [f for f in functions if f["name"] == choice]
        if not functions:
            raise SpecchatError(f"tool_choice names {choice!r}, which is not among the request's tools "
                                f"({', '.join(_function(t)['name'] for t in tools)})")
        parallel = False
    if fmt is None or fmt.harmony:
        what = "its chat template's tool calls" if fmt is None else "gpt-oss's Harmony tool calls"
        raise SpecchatError(f"tool_choice cannot be enforced for this model: {what} are not in a form the "
                            "grammar covers; use tool_choice \"auto\"")
    tokenizer = model if isinstance(model, llguidance.LLTokenizer) else tokenizer_of(model)
    what = f"the grammar for tool_choice {choice!r}"
    if fmt.xml:
        return Constraint.lark(_lark_tags(functions, fmt, parallel, tokenizer), tokenizer, what)
    calls = [_call_schema(f, fmt.args_key, i) for i, f in enumerate(functions)]
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    return Constraint.lark(_lark(call, fmt, parallel, tokenizer), tokenizer, what)


def _function(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function", tool)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise SpecchatError(f"a tool without a function name: {json.dumps(tool)[:120]}")
    return dict(function)


def _call_schema(function: Mapping[str, Any], args_key: str, index: int) -> dict[str, Any]:
    """One call as the template writes it: the name first, then the arguments under its key, held to the
    function's parameters schema as a document of its own (`_own_document`; `index`, the function's place
    among those offered, names it)."""
    parameters = _own_document(function.get("parameters") or {"type": "object"}, index)
    return {"type": "object", "properties": {"name": {"const": function["name"]}, args_key: parameters},
            "required": ["name", args_key], "additionalProperties": False}


def _own_document(parameters: Any, index: int) -> Any:
    """A parameters schema nested in the call's schema, with its local `$ref`s (`#/$defs/…`,
    `#/definitions/…`, `#`) still pointing into itself: an `$id` makes it a document of its own, the base
    those refs resolve against (llguidance follows JSON Schema's `$id`). Copying its definitions up to the
    call's root instead, as `_with_defs` does for one value, would let two tools' like-named definitions
    clash. The id is always this tool's own: one the schema brings (`$id`, or draft-04's `id`) may be another
    tool's too, where the later document would stand for both, or a URL llguidance would try to fetch; refs
    that name it name the new one. A ref to another document stays one that llguidance does not fetch: the
    schema cannot be compiled, as before."""
    if not isinstance(parameters, Mapping):
        return parameters
    own = f"json-schema:///specchat-tool-{index}.json"
    brought = {parameters[k].split("#")[0].rstrip("/") for k in ("$id", "id")
               if isinstance(parameters.get(k), str) and parameters[k]}
    body = {k: v for k, v in parameters.items() if k != "$id" and not (k == "id" and isinstance(v, str))}
    # Draft-04 (its `$schema` says so) names a document by `id`: both keywords, so that either draft reads it.
    draft04 = "draft-04" in str(parameters.get("$schema", ""))
    return {"$id": own, **({"id": own} if draft04 else {}), **(_renamed_refs(body, brought, own) if brought else body)}


def _renamed_refs(schema: Any, old: set[str], new: str) -> Any:
    """The schema with every `$ref` into a document of `old` (their URIs without fragment or closing slash)
    pointing into `new` instead: `URI#/pointer` becomes `new#/pointer`."""
    if isinstance(schema, list):
        return [_renamed_refs(item, old, new) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            uri = value.partition("#")[0]
            value = new + value[len(uri):] if uri.rstrip("/") in old else value
        out[key] = _renamed_refs(value, old, new)
    return out


def _lark(call: dict[str, Any], fmt: ToolFormat, parallel: bool, tokenizer: llguidance.LLTokenizer) -> str:
    if fmt.bare or not fmt.markers:  # Llama 3.x's custom tools: one call as bare JSON, nothing around it
        return "\n".join(["start: call", f"call: %json {json.dumps({**call, 'x-guidance': _LAYOUT})}"])
    marker = _literal(fmt.markers[0], tokenizer)
    if fmt.array:  # [TOOL_CALLS][{…}, …]: the list is JSON too, and parallel calls are its items
        calls = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return "\n".join([f"start: {marker} calls", f"calls: %json {json.dumps({**calls, 'x-guidance': _LAYOUT})}"])
    # As Qwen's and Hermes's templates write a call: the JSON on a line of its own between the tags.
    one = f'{marker} "\\n" call "\\n" {_literal(fmt.end, tokenizer)}' if fmt.end else f"{marker} call"
    return "\n".join(['start: one ("\\n" one)*' if parallel else "start: one", f"one: {one}",
                      f"call: %json {json.dumps({**call, 'x-guidance': _LAYOUT})}"])


def _lark_tags(functions: list[dict[str, Any]], fmt: ToolFormat, parallel: bool,
               tokenizer: llguidance.LLTokenizer) -> str:
    """Tagged calls as Qwen3-Coder's (or Seed-OSS's) template writes them: the parameters in their schema's
    order, the required ones always and the others where the model likes."""
    tags = fmt.tags or xmlcalls.QWEN
    end = tags.value_end.replace("/", "\\/").replace("\n", "\\n")  # as a lark regex: `\n<\/parameter>\n`
    lines = ['start: one ("\\n" one)*' if parallel else "start: one",
             f'one: {_literal(fmt.markers[0], tokenizer)} "\\n" call "\\n" {_literal(fmt.end, tokenizer)}',
             "call: " + " | ".join(f"f{i}" for i in range(len(functions))),
             # A value and its closing tag as one: its text ends at the first `\n</parameter>\n`, as the parser reads it.
             f"TEXT: /(?s:.*){end}/ & ~/(?s:.*){end}(?s:.+)/"]
    for i, function in enumerate(functions):
        parameters = function.get("parameters") or {}
        required = set(parameters.get("required") or ())
        names = []
        for j, (arg, schema) in enumerate((parameters.get("properties") or {}).items()):
            value = "TEXT"  # a string, or a value its schema leaves open: any text, as in llama.cpp's grammar
            if "string" not in xmlcalls.kinds_of(schema, parameters):
                lines.append(f"v{i}_{j}: %json {json.dumps({**_with_defs(schema, parameters), 'x-guidance': _LAYOUT})}")
                value = f"v{i}_{j} {json.dumps(tags.value_end)}"
            lines.append(f"p{i}_{j}: {json.dumps(f'<parameter={arg}>{tags.lead}')} {value}")
            names.append(f"p{i}_{j}" if arg in required else f"p{i}_{j}?")
        opening = json.dumps(f"<function={function['name']}>{_NL}")
        lines.append(f'f{i}: {opening} {" ".join(names)} "</function>"')
    return "\n".join(lines)


def _with_defs(schema: Mapping[str, Any], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter's schema as a document of its own, carrying the definitions its `#/$defs/…` and
    `#/definitions/…` refs name in the parameters schema it came from."""
    defs = {k: parameters[k] for k in ("$defs", "definitions") if isinstance(parameters.get(k), Mapping)}
    return {**defs, **schema}


def _literal(text: str, tokenizer: llguidance.LLTokenizer) -> str:
    """`text` in the grammar: its special token where the vocabulary has one, else the string."""
    tokens = tokenizer.tokenize_str(text, parse_special=True)
    if len(tokens) == 1 and tokenizer.is_special_token(tokens[0]):
        return f"<[{tokens[0]}]>"
    return json.dumps(text)
