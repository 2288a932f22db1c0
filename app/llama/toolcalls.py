"""Tool calls in a model's answer: the format read off the chat template, a whole answer split into its
content and its calls, and the same split as the text streams.

The formats (llama.cpp's common/chat.cpp, chat-diff-analyzer.cpp and parsers/ in the sources llama-cpp-python
0.3.36 vendors are the reference):

- **JSON after a marker**: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Qwen2.5, Qwen3, Hermes),
  `[TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}]` (Mistral Nemo) and `[TOOL_CALLS]NAME[ARGS]{…}`
  (Ministral 3, Devstral; Mistral Small 3.2 puts `[CALL_ID]ID` before `[ARGS]`), `<|python_tag|>{"name": …,
  "parameters": {…}}` and the same JSON bare at the answer's start (Llama 3.x), `<|tool_call|>[{…}]` (Granite
  3.3). Which marker, end and keys a template uses is read off how it writes an earlier answer's call, as
  llama.cpp's chat-diff-analyzer does (Granite 3.3 writes none back: its system prompt names the marker).
- **Tagged arguments** (Qwen3-Coder; Nemotron 3 Nano, Qwen3.5 and StepFun 3.5 Flash write the same):
  `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n…</function>\n</tool_call>`, each value
  made JSON by its parameter's schema in the offered tools (`specchat.llama.xmlcalls`). Qwen3-Coder itself (a
  template with no `<think>`, as llama.cpp tells it apart) sometimes leaves out its first call's `<tool_call>`:
  there, as in llama.cpp, `<function=NAME>\n` opens a call too where NAME is an offered tool's, before any
  other call; a mere mention of `<function=` (unnamed, another name, no newline after it) is content. Seed-OSS
  writes the same tags in `<seed:tool_call>` with each value on its tag's line: `<parameter=ARG>VALUE</parameter>`.
- **Harmony** (gpt-oss): a message to a function, `<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{…}<|call|>`, or with the recipient in the role header (`<|start|>assistant to=functions.NAME
  <|channel|>commentary json<|message|>{…}`; the first message's `<|start|>assistant` is the generation prompt's).

Not detected (`format_of` answers None): the other forms whose arguments are not one JSON value (DeepSeek's and
Kimi's special-token forms, Gemma 4's `call:`), and templates that cannot write an earlier answer's call at all.

`Splitter` is pure text in, text out, as `service.reasoning.Splitter` is: the engine's released text goes in a
piece at a time and comes back as content and finished calls, holding back only what may be a call marker's
start, or a call under way. For JSON formats and tagged arguments it reads the answer after the thinking is
split off (as llama.cpp parses tool calls in the content); for Harmony it reads the raw text before the
reasoning splitter (a call is a commentary message, which that splitter would take for thinking), and passes
every other message on as it came. Malformed call text is never dropped: it stays content, with a one-line error
beside it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from specchat.errors import SpecchatError
from specchat.llama import xmlcalls
from specchat.llama.template import ChatTemplate, Message, ToolCall, held_back

__all__ = ["GRANITE", "HARMONY", "HERMES", "LLAMA3", "MISTRAL", "QWEN3_CODER", "SEED_OSS", "XML_TAGS", "Delta", "Parsed",
           "Splitter", "ToolCall", "ToolFormat", "format_of", "new_id", "parse"]


@dataclass(frozen=True)
class ToolFormat:
    """How one template's answers carry calls. JSON formats: the markers that open a call (or a list of them),
    what closes it ("": the JSON value's own end), whether the calls are a JSON list, the key the arguments are
    under, and whether a call may also stand bare at the answer's start (Llama 3.x). Tagged arguments: `tags`,
    their spelling, and `bare_function`, whether the first call may leave out its opening tag (Qwen3-Coder).
    Harmony: `harmony`."""

    name: str
    markers: tuple[str, ...] = ()
    end: str = ""
    array: bool = False
    args_key: str = "arguments"
    bare: bool = False
    tags: xmlcalls.Tags | None = None
    bare_function: bool = False
    harmony: bool = False

    @property
    def xml(self) -> bool:
        """Arguments in tags (`specchat.llama.xmlcalls`), not JSON."""
        return self.tags is not None


HERMES = ToolFormat("hermes", ("<tool_call>",), "</tool_call>")
MISTRAL = ToolFormat("mistral", ("[TOOL_CALLS]",), array=True)
GRANITE = ToolFormat("granite", ("<|tool_call|>",), array=True)
LLAMA3 = ToolFormat("llama3", ("<|python_tag|>",), args_key="parameters", bare=True)
HARMONY = ToolFormat("harmony", harmony=True)
QWEN3_CODER = ToolFormat("qwen3-coder", (xmlcalls.QWEN.open,), xmlcalls.QWEN.end, tags=xmlcalls.QWEN, bare_function=True)
XML_TAGS = ToolFormat("xml-tags", (xmlcalls.QWEN.open,), xmlcalls.QWEN.end, tags=xmlcalls.QWEN)  # Nemotron 3 Nano, Qwen3.5
SEED_OSS = ToolFormat("seed-oss", (xmlcalls.SEED.open,), xmlcalls.SEED.end, tags=xmlcalls.SEED)

START, CHANNEL, MESSAGE, END, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"
RECIPIENT = " to=functions."
PYTHON_TAG = "<|python_tag|>"

# A function the probe renders a call to, and its argument: text no template holds.
_NAME, _ARG, _ANSWER = "specchat_probe_7f3a", "specchat_arg_7f3a", "SPECCHAT_ANSWER_7f3a"
PROBE_TOOL = {"type": "function", "function": {
    "name": _NAME, "description": "Looks something up.",
    "parameters": {"type": "object", "properties": {_ARG: {"type": "string"}}, "required": [_ARG]}}}
# How Qwen3-Coder's and Seed-OSS's templates write the probe call.
_XML_PROBE = f"<tool_call>\n<function={_NAME}>\n<parameter={_ARG}>\nv\n</parameter>\n</function>\n</tool_call>"
_SEED_PROBE = f"<seed:tool_call>\n<function={_NAME}>\n<parameter={_ARG}>v</parameter>\n</function>\n</seed:tool_call>"


def new_id() -> str:
    """A call id: 9 letters and digits, which every template takes (Mistral's refuse any other length)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def format_of(template: ChatTemplate) -> ToolFormat | None:
    """How `template`'s answers carry calls, or None where they are not one of the formats above."""
    if CHANNEL in template.source:  # as llama.cpp tells gpt-oss apart
        return HARMONY
    if "[TOOL_CALLS]" in template.source:  # either of Mistral's forms; some write the name outside the JSON
        return MISTRAL
    user = Message("user", "Hi")
    call = ToolCall(_NAME, json.dumps({_ARG: "v"}), "abcDEF123")
    try:
        plain = template.render([user, Message("assistant", _ANSWER)], False, tools=[PROBE_TOOL])
        called = template.render([user, Message("assistant", "", tool_calls=(call,))], False, tools=[PROBE_TOOL])
    except SpecchatError:
        return None
    head = len(os.path.commonprefix([plain, called]))
    after = plain[plain.find(_ANSWER) + len(_ANSWER):] if _ANSWER in plain else ""
    tail = called[head:]
    body = tail[:len(tail) - len(os.path.commonprefix([after[::-1], tail[::-1]]))]  # less what closes the turn either way
    if body.strip() == _XML_PROBE:  # llama.cpp's qwen3-coder.cpp: no <think>, Qwen3-Coder, which may drop <tool_call>
        return XML_TAGS if "<think>" in template.source else QWEN3_CODER
    if body.strip() == _SEED_PROBE:
        return SEED_OSS
    at = body.find(_NAME)
    if at < 0:  # it drops an earlier answer's calls; Granite 3.3's system prompt still names its marker
        return GRANITE if GRANITE.markers[0] in template.source else None
    found = _json_around(body, at)
    if found is None:
        return None
    value, start, stop = found
    obj = value[0] if isinstance(value, list) and value else value
    if not isinstance(obj, dict):
        return None
    obj = obj["function"] if isinstance(obj.get("function"), dict) else obj
    args_key = next((k for k, v in obj.items() if _ARG in json.dumps(v)), "arguments")
    marker, end = body[:start].strip(), body[stop:].strip()
    markers = tuple(m for m in (marker, PYTHON_TAG if PYTHON_TAG in template.source else "") if m)
    name = {"<tool_call>": "hermes", "[TOOL_CALLS]": "mistral"}.get(marker, "llama3" if not marker else "json")
    return ToolFormat(name, markers, end, isinstance(value, list), args_key, bare=not marker)


def _json_around(text: str, at: int) -> tuple[Any, int, int] | None:
    """The outermost JSON value in text that holds position `at`: (value, start, end)."""
    decoder = json.JSONDecoder()
    for i in range(at):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                continue
            if end > at:
                return value, i, end
    return None


@dataclass
class Delta:
    """What one piece of text released: content, finished calls, and one line for each malformed call (whose
    text is in `content`)."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, other: Delta) -> None:
        self.content += other.content
        self.calls += other.calls
        self.errors += other.errors


@dataclass(frozen=True)
class Parsed:
    content: str
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]


class _Malformed(Exception):
    pass


class _Scan:
    """Where a JSON value that starts at `start` ends, found a piece at a time (strings and escapes heeded)."""

    def __init__(self, start: int) -> None:
        self.pos, self.depth, self.string, self.escape = start, 0, False, False

    def end(self, text: str) -> int | None:
        for i in range(self.pos, len(text)):
            c = text[i]
            if self.string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.string = False
            elif c == '"':
                self.string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return i + 1
        self.pos = len(text)
        return None


_BARE = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"(?:name|function)"\s*:')
_BARE_DECIDED = 48  # characters after which a bare answer that has not matched _BARE never will
_MISTRAL_NAME = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\]([\w\-]+))?\[ARGS\]")


class Splitter:
    """One answer's text, split into content and calls as it streams. `ids` makes each call's id where the
    model wrote none (default: `new_id`); `tools`, the offered tools' OpenAI schemas, type tagged arguments."""

    def __init__(self, fmt: ToolFormat, ids: Callable[[], str] = new_id, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self.format, self._ids = fmt, ids
        self._schemas = xmlcalls.schemas(tools)
        # Qwen3-Coder's first call without its <tool_call>: the whole opener, an offered name and its newline, as
        # llama.cpp asks for, so that prose naming a tag (`<function=`, #include <functional>) stays prose.
        self._functions = tuple(f"<function={name}>\n" for name in self._schemas) if fmt.bare_function else ()
        self._held = ""
        self._marker: str | None = None  # the marker of the call under way ("" bare), None: none is
        self._scan: _Scan | xmlcalls.EndScan | None = None
        self._start_at = 0  # where the call's JSON starts in the held text
        self._named: tuple[str, str | None] | None = None  # Mistral's NAME[CALL_ID]ID[ARGS] before the JSON
        self._searched = 0  # where the search for the call's end goes on from
        self._fresh = True  # nothing released yet: a bare call (or Harmony's recipient) may still open
        self._space = ""  # whitespace after a call, released only if content follows it
        self.called = False  # the answer made a call (so far)

    def push(self, text: str) -> Delta:
        """More of the answer's text; returns what it releases."""
        self._held += text
        out = Delta()
        while self._held and self._advance(out, final=False):
            pass
        return out

    def flush(self) -> Delta:
        """The answer ended: a call under way is finished as it stands (or kept as text, with an error), and
        whatever was held back is released."""
        out = Delta()
        while self._held and self._advance(out, final=True):
            pass
        if self._held:
            self._content(self._held, out)
        self._held, self._space, self._marker = "", "", None
        return out

    # --- content -------------------------------------------------------------------------------------

    def _content(self, text: str, out: Delta) -> None:
        if not text:
            return
        self._fresh = False
        if self.called and not self.format.harmony:  # the whitespace between and after calls is no content
            if not text.strip():
                self._space += text
                return
            text, self._space = self._space + text, ""
        out.content += text

    def _malformed(self, raw: str, why: str, out: Delta) -> None:
        out.errors.append(f"malformed tool call ({why}); its text is kept as the answer's")
        self._content(raw, out)

    def _calls(self, value: Any, out: Delta) -> None:
        items = value if isinstance(value, list) else [value]
        calls = [self._call(item) for item in items]
        if not calls:
            raise _Malformed("an empty list of calls")
        out.calls += calls
        self.called = True

    def _call(self, obj: Any, name: str | None = None) -> ToolCall:
        if name is not None:  # name written outside the JSON: obj is the arguments
            if not isinstance(obj, dict):
                raise _Malformed(f"the arguments to {name} are not a JSON object")
            return ToolCall(name, json.dumps(obj, ensure_ascii=False), self._ids())
        if not isinstance(obj, dict):
            raise _Malformed(f"a call is a JSON object, not {type(obj).__name__}")
        fn = obj["function"] if isinstance(obj.get("function"), dict) else obj
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _Malformed("no function name")
        key = next((k for k in (self.format.args_key, "arguments", "parameters") if k in fn), None)
        args = fn.get(key, {}) if key else {}
        if isinstance(args, str):  # arguments written as JSON text, as OpenAI's API carries them
            try:
                json.loads(args)
            except ValueError:
                raise _Malformed("its arguments are text that is not JSON") from None
            text = args
        elif isinstance(args, dict):
            text = json.dumps(args, ensure_ascii=False)
        else:
            raise _Malformed("its arguments are not a JSON object")
        given = obj.get("id")
        return ToolCall(name, text, given if isinstance(given, str) and given else self._ids())

    def _read(self, raw: str, payload: str, record: Callable[[Any], None], out: Delta, not_json: str = "not JSON") -> None:
        """Decode a call's JSON and give it to `record`; where either fails, `raw` (the call's text) stays content."""
        try:
            record(json.loads(payload))
        except ValueError as e:
            self._malformed(raw, f"{not_json}: {e}", out)
        except _Malformed as e:
            self._malformed(raw, str(e), out)

    def _named_call(self, args: Any, name: str, given_id: str | None, out: Delta) -> None:
        """A call whose name (and maybe id) was written outside its JSON, which holds only the arguments."""
        call = self._call(args, name)
        out.calls.append(ToolCall(call.name, call.arguments, given_id or call.id))
        self.called = True

    # --- the state machine ---------------------------------------------------------------------------

    def _advance(self, out: Delta, final: bool) -> bool:
        """Consume what can be decided of the held text: True to go on, False when the rest must wait."""
        if self.format.harmony:
            return self._harmony(out, final)
        if self._marker is None:
            return self._outside(out, final)
        return self._inside(out, final)

    def _outside(self, out: Delta, final: bool) -> bool:
        held, fmt = self._held, self.format
        if self._fresh and fmt.bare:
            first = held.lstrip()
            if not first:
                return False
            if first[0] == "{":
                if _BARE.match(first):
                    lead = len(held) - len(first)
                    self._begin("", lead, out)
                    return True
                if len(first) < _BARE_DECIDED and not final:
                    return False
            self._fresh = False
        markers = fmt.markers if self.called else fmt.markers + self._functions
        hits = [(i, m) for m in markers if (i := held.find(m)) >= 0]
        if hits:
            at, marker = min(hits)
            self._begin(marker, at, out)
            return True
        keep = 0 if final else held_back(held, markers)
        self._content(held[:len(held) - keep], out)
        self._held = held[len(held) - keep:]
        return False

    def _begin(self, marker: str, at: int, out: Delta) -> None:
        self._content(self._held[:at], out)
        self._held, self._marker, self._scan = self._held[at:], marker, None
        self._searched = len(marker)

    def _finish(self, raw_len: int) -> None:
        self._held, self._marker, self._scan = self._held[raw_len:], None, None

    def _give_up(self, why: str, out: Delta) -> None:
        """The call under way is no call: all of its held text stays content, with an error."""
        self._malformed(self._held, why, out)
        self._finish(len(self._held))

    def _inside(self, out: Delta, final: bool) -> bool:
        marker = self._marker or ""
        if self.format.xml:
            return self._until_tags_end(marker, out, final)
        if self.format.end and marker in self.format.markers and marker != PYTHON_TAG:
            return self._until_end(marker, out, final)
        return self._until_value_end(marker, out, final)

    def _until_end(self, marker: str, out: Delta, final: bool) -> bool:
        """A call that its format's end closes (`</tool_call>`): its JSON is all that lies between."""
        held, end = self._held, self.format.end
        at = held.find(end, max(len(marker), self._searched - len(end)))
        if at < 0 and not final:
            self._searched = len(held)
            return False
        payload, raw_len = (held[len(marker):at], at + len(end)) if at >= 0 else (held[len(marker):], len(held))
        self._read(held[:raw_len], payload, lambda value: self._calls(value, out), out)
        self._finish(raw_len)
        return True

    def _until_tags_end(self, marker: str, out: Delta, final: bool) -> bool:
        """A call with tagged arguments: it ends at the `</tool_call>` no value holds (or, ended at EOG without
        one, where the answer does, as a JSON call may). Opened by a bare `<function=NAME>`, that is its own
        first tag."""
        tags = self.format.tags or xmlcalls.QWEN
        skip = len(marker) if marker in self.format.markers else 0
        if self._scan is None:
            self._scan = xmlcalls.EndScan(skip, tags)
        held = self._held
        end = self._scan.end(held)
        if end is None and not final:
            return False
        raw_len, body_end = (end, end - len(self.format.end)) if end is not None else (len(held), len(held))
        try:
            name, args = xmlcalls.read(held[skip:body_end], self._schemas, tags)
        except xmlcalls.XmlCallError as e:
            self._malformed(held[:raw_len], str(e), out)
        else:
            out.calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False), self._ids()))
            self.called = True
        self._finish(raw_len)
        return True

    def _until_value_end(self, marker: str, out: Delta, final: bool) -> bool:
        """A call that ends where its JSON value does (or Mistral's NAME[ARGS]{...}'s arguments do)."""
        if self._scan is None:
            try:
                start = self._value_start(marker, final)
            except _Malformed as e:
                self._give_up(str(e), out)
                return True
            if start is None:
                return False
            self._scan, self._start_at = _Scan(start), start
        held = self._held
        end = self._scan.end(held)
        if end is None:
            if not final:
                return False
            self._give_up("its JSON never closed", out)
            return True
        self._read(held[:end], held[self._start_at:end], lambda value: self._record(value, marker, held[:end], out), out)
        self._finish(end)
        return True

    def _value_start(self, marker: str, final: bool) -> int | None:
        """Where the call's JSON starts in the held text (Mistral's NAME[CALL_ID]ID[ARGS] before it kept in
        `_named`), or None while that cannot be told yet. Raises _Malformed where no JSON follows the marker."""
        held = self._held
        payload = held[len(marker):]
        first = payload.lstrip()
        if not first:
            if final:
                raise _Malformed("nothing after its marker")
            return None
        self._named = None
        if first[0] in "{[":
            return len(held) - len(first)
        if marker == "[TOOL_CALLS]" and (m := _MISTRAL_NAME.match(payload)):
            self._named = (m.group(1), m.group(2))
            return len(marker) + m.end()
        if marker == "[TOOL_CALLS]" and not final and len(first) < 256 and "{" not in first:
            return None  # maybe NAME[ARGS], still arriving
        raise _Malformed("no JSON after its marker")

    def _record(self, value: Any, marker: str, raw: str, out: Delta) -> None:
        """A decoded JSON value after a marker as the calls it makes; one bare at the answer's start that is no
        call is the answer itself, content."""
        if self._named:
            self._named_call(value, *self._named, out)
        elif marker == "" and not _is_call(value):
            self._content(raw, out)  # an answer in JSON, not a call
        else:
            self._calls(value, out)

    # --- Harmony ---------------------------------------------------------------------------------------

    def _harmony(self, out: Delta, final: bool) -> bool:
        if self._marker is None:
            return self._harmony_header(out, final)
        return self._harmony_arguments(self._marker, out, final)

    def _harmony_header(self, out: Delta, final: bool) -> bool:
        """Between calls: text up to the next message's header passes on; a header that names a function opens a
        call, whose arguments follow its <|message|>."""
        held = self._held
        starts = [i for i in (held.find(START), held.find(CHANNEL)) if i >= 0]
        if self._fresh and held.startswith(RECIPIENT):
            starts.append(0)  # the recipient right after the generation prompt's <|start|>assistant
        if not starts:
            keep = 0 if final else max(held_back(held, (START, CHANNEL)),
                                       len(held) if self._fresh and RECIPIENT.startswith(held) else 0)
            self._content(held[:len(held) - keep], out)
            self._held = held[len(held) - keep:]
            return False
        at = min(starts)
        self._content(held[:at], out)
        held = self._held = held[at:]
        m = held.find(MESSAGE)
        if m < 0:
            if not final:
                return False
            self._content(held, out)
            self._held = ""
            return False
        header = held[:m]
        r = header.find(RECIPIENT)
        if r < 0:  # a message to nobody (analysis, final, a preamble): passed on as it came
            self._content(held[:m + len(MESSAGE)], out)
            self._held = held[m + len(MESSAGE):]
            return True
        self._marker = re.split(r"[\s<]", header[r + len(RECIPIENT):], maxsplit=1)[0]
        self._searched = m + len(MESSAGE)
        return True

    def _harmony_arguments(self, name: str, out: Delta, final: bool) -> bool:
        """In a call's arguments: they end at <|call|>, <|end|>, the next header, or the answer's end."""
        held = self._held
        ends = [i for i in (held.find(x, self._searched) for x in (CALL, END, START, CHANNEL)) if i >= 0]
        if not ends and not final:
            self._searched = max(self._searched, len(held) - len(CHANNEL))
            return False
        at = min(ends) if ends else len(held)
        body_at = held.find(MESSAGE) + len(MESSAGE)
        raw_len = at + len(CALL) if held.startswith(CALL, at) else at
        self._read(held[:raw_len], held[body_at:at], lambda args: self._named_call(args, name, None, out), out,
                   f"the arguments to {name} are not JSON")
        self._finish(raw_len)
        return True


def _is_call(value: Any) -> bool:
    return isinstance(value, dict) and (isinstance(value.get("name"), str) or isinstance(value.get("function"), dict))


def parse(text: str, fmt: ToolFormat, ids: Callable[[], str] = new_id, tools: Sequence[Mapping[str, Any]] = ()) -> Parsed:
    """A whole answer's content and calls (what the streaming splitter gives, at once)."""
    splitter = Splitter(fmt, ids, tools)
    out = splitter.push(text)
    out.add(splitter.flush())
    return Parsed(out.content, tuple(out.calls), tuple(out.errors))
