"""Chat templates are untrusted input: real ones render as before, hostile ones fail as one SpecchatError."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from reliability import tally

from specchat.errors import SpecchatError
from specchat.llama.renderer import _RENDERER, TIME_LIMIT_S
from specchat.llama.template import ChatTemplate, Message

CHATML = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{ message['content'] | trim }}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# What newer templates (Qwen3, DeepSeek, tool calling) lean on: namespace, string methods, tojson, loop
# controls, HuggingFace's {% generation %} tag, and the tool variables being defined but empty.
FEATURES = """{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{{- ns.last_user }}|{{ messages[0].content.split(' ')|join(',') }}|{{ messages[0].content.startswith('Hi') }}
|{{ messages[-1].content.strip().upper() }}|{{ {'k': 'é<&', 'n': [1, none]}|tojson }}|{{ messages|length }}
|{% for i in range(4) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}
|{% generation %}g{% endgeneration %}|{{ tools is defined }}{{ tools is none }}|{{ eos_token }}
"""

CONVERSATION = [Message("system", "Be brief."), Message("user", "Hi there"), Message("assistant", "Hello! "),
                Message("user", " What is 2+2? é \U0001f600 ")]
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "gemma3": GEMMA3, "features": FEATURES}


def template(source: str, **kwargs) -> ChatTemplate:
    return ChatTemplate(source, "evil.gguf", bos_token="<s>", eos_token="</s>", **kwargs)


def test_chatml_renders_expected_text():
    assert template(CHATML).render(CONVERSATION[1:3]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello! <|im_end|>\n"
        "<|im_start|>assistant\n")


def test_llama3_renders_expected_text():
    today = datetime.now().strftime("%d %b %Y")
    assert template(LLAMA3).render(CONVERSATION[:2], add_generation_prompt=False) == (
        f"<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: {today}\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>")


def test_template_features_render():
    assert template(FEATURES).render(CONVERSATION[1:]) == (
        '2|Hi,there|True\n|WHAT IS 2+2? É \U0001f600|{"k": "é<&", "n": [1, null]}|3\n|02|g|TrueTrue|</s>')


def test_template_rejecting_a_conversation_says_so():
    with pytest.raises(SpecchatError, match=r"^the chat template of evil.gguf rejected this conversation: "
                                            r"Conversation roles must alternate"):
        template(GEMMA3).render([Message("user", "a"), Message("user", "b")])


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renders_exactly_as_llama_cpp_python_did(name):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    for turns in (CONVERSATION[1:2], CONVERSATION[1:3], CONVERSATION[1:], CONVERSATION):
        if name == "gemma3" and turns is CONVERSATION[1:3]:
            continue  # ends on the assistant: gemma would reject it on both
        old = Jinja2ChatFormatter(TEMPLATES[name], eos_token="</s>", bos_token="<s>")(
            messages=[{"role": m.role, "content": m.content} for m in turns]).prompt
        assert template(TEMPLATES[name]).render(turns) == old


@pytest.mark.real
def test_the_smollm2_gguf_template_renders_as_before(smol_path):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from specchat.llama.model import Model

    path = smol_path  # fetched if no earlier test did: whether it runs must not hang on the order
    model = Model(path, n_ctx=256)
    try:
        source, bos, eos = model.metadata["tokenizer.chat_template"], model.bos_text, model.eos_text
    finally:
        model.close()
    old = Jinja2ChatFormatter(source, eos_token=eos, bos_token=bos)(
        messages=[{"role": m.role, "content": m.content} for m in CONVERSATION]).prompt
    new = ChatTemplate(source, path.name, bos, eos).render(CONVERSATION)
    assert new == old and "<|im_start|>assistant\n" in new


ENDLESS = "{% for a in range(99999) %}{% for b in range(99999) %}x{% endfor %}{% endfor %}"
LIMIT_S = 0.5  # shorter than the default, to keep the suite quick
# How long a render may take before the test calls it a hang rather than a stop at its limit: far above any
# limit here, so that a renderer restarting on a busy machine never reaches it, while a clock that waits in
# the wrong unit (or not at all) does. The message says which mechanism stopped a render, not this.
HANG_S = 30.0
SANDBOX = "tried to get out of its sandbox .*; the file is not trustworthy$"
FILE = "tried to read a file .*; the file is not trustworthy$"
SLOW = f"took longer than {LIMIT_S:g} s to render$"
# The memory limit or the clock, whichever strikes first (RLIMIT_AS is not enforced on macOS).
HUGE = f"used more than \\d+ MB of memory$|{SLOW}"
ATTACKS = {
    "{{ ''.__class__.__mro__[1].__subclasses__() }}": SANDBOX,
    "{{ cycler.__init__.__globals__.os }}": SANDBOX,
    "{{ lipsum.__globals__['os'].popen('id').read() }}": SANDBOX,
    "{{ raise_exception.__globals__ }}": SANDBOX,
    "{{ self.__init__.__globals__ }}": SANDBOX,
    "{% if ''.__class__ %}leak{% endif %}": SANDBOX,
    "{{ '{0.__class__.__base__}'.format('') }}": SANDBOX,
    "{{ messages.append(1) }}": SANDBOX,
    "{{ messages[0].update({'role': 'system'}) }}": SANDBOX,
    "{% include '/etc/passwd' %}": FILE,
    "{% import 'os' as os %}": FILE,
    "{% from 'os' import system %}": FILE,
    "{% extends '/etc/passwd' %}": FILE,
    "{{ 'x' * 10**10 }}": "tried to build a sequence of 10000000000 items$",
    "{{ 'x' * 99999999 }}": "tried to build a sequence of 99999999 items$",
    "{{ [messages] * 10**8 }}": "tried to build a sequence of 100000000 items$",
    "{{ 10 ** (10 ** 10) }}": "tried to compute 10 \\*\\* 10000000000$",
    "{{ range(10**9)|list }}": "failed: OverflowError: Range too big",
    "{{ 'x'.center(10**10) }}": HUGE,
    "{% for i in range(2000) %}{{ 'x' * 9999 }}{% endfor %}": "produced more than 10 MB of text$",
    ENDLESS: SLOW,
    # One C call that never returns to Python: printing a list whose halves are shared, 60 deep.
    "{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}": HUGE,
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "recursed too deeply$",
    "{% for m in messages %}{{ m.content }}": "has a syntax error on line 1: Unexpected end of template",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_hostile_template_fails_as_one_line_then_rendering_still_works(attack):
    tally("untrusted chat templates", inputs=1)
    start = time.monotonic()
    with pytest.raises(SpecchatError) as caught:
        template(attack, limit_s=LIMIT_S).render(CONVERSATION)
    elapsed = time.monotonic() - start
    message = str(caught.value)
    assert message.startswith("the chat template of evil.gguf ") and "\n" not in message
    assert re.search(ATTACKS[attack], message), message  # which of sandbox, file, size or clock stopped it
    assert elapsed < HANG_S
    if SLOW in ATTACKS[attack] and "memory" not in message:
        assert elapsed >= LIMIT_S  # it really ran until the limit (a clock does not run fast)
    assert template(CHATML).render(CONVERSATION[1:2]).endswith("<|im_start|>assistant\n")


def test_the_default_limit_stops_an_endless_render():
    tally("untrusted chat templates", inputs=1)
    start = time.monotonic()
    with pytest.raises(SpecchatError, match=f"took longer than {TIME_LIMIT_S:g} s to render$"):
        template(ENDLESS).render(CONVERSATION)
    assert TIME_LIMIT_S <= time.monotonic() - start < HANG_S


RENDERING_S = 0.1  # of CPU: far above what reading and parsing one request takes (microseconds)


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used so far (Linux's /proc; its name may hold spaces, so count from the ')')."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime, in clock ticks


def kill_once_busy(proc: subprocess.Popen[bytes], killed: threading.Event, timeout: float = HANG_S) -> None:
    """Kill an idle renderer once it has burnt RENDERING_S of CPU: nothing but a request it was sent since
    can have done that, so the kill lands mid-render however late that request comes or runs."""
    idle = cpu_seconds(proc.pid)
    deadline = time.monotonic() + timeout
    while cpu_seconds(proc.pid) - idle < RENDERING_S:
        if time.monotonic() > deadline or proc.poll() is not None:
            return  # the render then ends otherwise than crashed, and the test says so
        time.sleep(0.01)  # polling for the evidence, not waiting for it to happen
    proc.kill()  # e.g. the OOM killer, or a C stack overflow
    killed.set()


def test_a_renderer_that_dies_mid_render_is_reported_and_replaced():
    assert template(CHATML).render(CONVERSATION[1:2])  # a renderer is running, and now idle
    endless = template(ENDLESS, limit_s=HANG_S)  # compiled: what is left is the render alone
    proc, killed = _RENDERER._proc, threading.Event()
    assert proc is not None
    killer = threading.Thread(target=kill_once_busy, args=(proc, killed))
    killer.start()
    try:
        with pytest.raises(SpecchatError, match="^the chat template of evil.gguf crashed the template renderer$"):
            endless.render(CONVERSATION)
    finally:
        killer.join()
    assert killed.is_set()
    assert template(CHATML).render(CONVERSATION[1:2]).endswith("<|im_start|>assistant\n")
    assert _RENDERER._proc is not proc  # replaced


def test_an_orphaned_renderer_stops_an_endless_render_by_itself():
    """If the app is killed mid-render nobody kills the renderer, so it must stop on its own."""
    tally("untrusted chat templates", inputs=1)
    proc = subprocess.Popen([sys.executable, "-c", "from specchat.llama.renderer import serve; serve()"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    request = {"template": ENDLESS, "limit_s": LIMIT_S,
               "variables": {"messages": [{"role": "user", "content": "hi"}]}}
    start = time.monotonic()  # before it can have armed its alarm
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()  # and then never read the reply nor kill it, as a dead parent would
    try:
        # Killed by its own SIGALRM (at its default action), a second past the limit: by nobody else.
        assert proc.wait(timeout=HANG_S) == -signal.SIGALRM
    finally:
        proc.kill()
        proc.wait()
    assert time.monotonic() - start >= LIMIT_S + 1.0  # not before its limit and the grace second


class WordModel:
    """A tokenizer of whole words (with their spaces) that an answer generated letter by letter does
    not match: re-tokenizing the answer's text would give other tokens than those the cache holds."""

    metadata = {"tokenizer.chat_template": CHATML}
    bos_text = eos_text = ""
    add_bos = False

    def __init__(self) -> None:
        from pathlib import Path

        self.path = Path("words.gguf")
        self.pieces: dict[int, bytes] = {}

    def _id(self, piece: str) -> int:
        token = 1000 + len(self.pieces) if piece.encode() not in self.pieces.values() else \
            next(t for t, p in self.pieces.items() if p == piece.encode())
        self.pieces[token] = piece.encode()
        return token

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return [self._id(w) for w in re.findall(r"<\|[a-z_]+\|>|\s*[^\s<]+|\s+", text)]

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token]


def test_the_prompter_keeps_the_tokens_an_answer_was_generated_as():
    """The next turn, a regenerated answer and an edited last message all start from tokens the cache
    holds (as generated), not from the answer's text tokenized anew."""
    from specchat.llama.template import ChatPrompter

    model = WordModel()
    prompter = ChatPrompter(model)
    first = [Message("user", "Spell cat")]
    prompt = prompter.tokens(first)
    letters = [model._id(c) for c in ("c", "a", "t")] + [model._id("<|im_end|>")]  # generated one by one
    prompter.remember(letters)
    second = first + [Message("assistant", "cat"), Message("user", "Again")]
    turn2 = prompter.tokens(second)
    assert prompter.continued and turn2[:len(prompt) + 4] == prompt + letters  # not the word "cat"
    prompter.remember([model._id("x")])
    assert prompter.tokens(second) == turn2 and not prompter.continued  # regenerate: the same prompt
    edited = prompter.tokens(first + [Message("assistant", "cat"), Message("user", "Once more")])
    assert edited[:len(prompt) + 4] == prompt + letters and edited != turn2


# --- reasoning models' templates (tests/templates/: the real ones, as llama.cpp vendors them) -------------

REASONING_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
THOUGHT = Message("assistant", "Paris.", thinking="France's capital is Paris.")
TURNS = [Message("user", "Capital of France?"), THOUGHT, Message("user", "And of Italy?")]


def real(name: str) -> ChatTemplate:
    return ChatTemplate((REASONING_TEMPLATES / f"{name}.jinja").read_text(), name, "<|begin▁of▁sentence|>", "")


def test_the_thinking_switch_is_the_variable_each_template_reads():
    assert real("Qwen-Qwen3-0.6B").switch == "enable_thinking"
    assert real("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B").switch == "enable_thinking"
    assert real("ibm-granite-granite-3.3-2B-Instruct").switch == "thinking"
    assert real("openai-gpt-oss-120b").switch is None  # it reads reasoning_effort, which has no "off"
    assert ChatTemplate(CHATML, "chatml").switch is None
    assert ChatTemplate(CHATML, "chatml").variables(None) == {}  # nothing to switch: nothing passed
    with pytest.raises(SpecchatError, match="no switch for thinking"):
        ChatTemplate(CHATML, "chatml").variables(False)


def test_qwen3_leaves_an_earlier_answers_thinking_out_and_switches_its_own_off():
    qwen3 = real("Qwen-Qwen3-0.6B")
    prompt = qwen3.render(TURNS)
    assert "Paris." in prompt and "France's capital" not in prompt  # as Qwen3's template wants it
    # The thinking of the answer after the last question is kept (a tool call's chain goes on).
    assert "<think>\nFrance's capital is Paris.\n</think>" in qwen3.render(TURNS[:2], add_generation_prompt=False)
    off = qwen3.render(TURNS, variables=qwen3.variables(False))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and prompt.endswith("assistant\n")


def test_gpt_oss_takes_the_thinking_field_and_the_reasoning_effort():
    gpt_oss = real("openai-gpt-oss-120b")
    prompt = gpt_oss.render(TURNS[:2], add_generation_prompt=False)
    assert "<|channel|>analysis<|message|>France's capital is Paris.<|end|>" in prompt
    assert "Reasoning: low" in gpt_oss.render(TURNS, variables={"reasoning_effort": "low"})
    assert "France's capital" not in gpt_oss.render(TURNS)  # an earlier turn's analysis is dropped
