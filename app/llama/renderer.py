"""The sandboxed renderer of chat templates: the parent's client (`render`) and the process (`serve`).

A GGUF's chat template is untrusted input: a Jinja program written by whoever published the
file. It runs in jinja2's immutable sandbox (no Python internals, no mutation, no file reads)
inside a separate renderer process that is killed when a render outlives TIME_LIMIT_S and that
cannot allocate more than MEMORY_LIMIT bytes.

Why a process and not a tracer (sys.settrace with a deadline) in this one: a tracer only runs
between Python lines, and a template can start single C calls that never return to Python,
e.g. printing a list nested 60 deep whose halves are shared (`{% set ns.a = [ns.a, ns.a] %}` in a
loop, then `{{ ns.a }}`) runs list.__repr__ for 2**60 items. Only killing a process stops that,
and only a per-process memory limit stops `'x'.center(10**10)` or `s.replace('', s)`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import select
import signal
import subprocess
import sys
import threading
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from specchat.errors import SpecchatError

TIME_LIMIT_S = 1.0  # real templates render in milliseconds
MAX_OUTPUT = 10_000_000  # characters; far more than any context window holds
MEMORY_LIMIT = 1 << 30  # bytes of address space for the renderer process


class _Renderer:
    """The parent's end of the renderer process: started on first use, killed and restarted after a
    render that ran out of time or crashed it. One request at a time (threads share it)."""


    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def run(self, request: dict[str, Any], limit_s: float) -> dict[str, Any]:
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                with contextlib.suppress(BrokenPipeError):  # a dead renderer shows as no reply below
                    proc.stdin.write(json.dumps(request).encode() + b"\n")
                    proc.stdin.flush()
                # The clock starts once the request is sent: startup and transfer are not the template's doing.
                answered = select.select([proc.stdout], [], [], limit_s)[0]
                line = proc.stdout.readline() if answered else b""
                if line.endswith(b"\n"):  # else it died, perhaps mid-reply (e.g. a C stack overflow)
                    return json.loads(line)
            except BaseException:  # e.g. Ctrl-C mid-render: its late reply would answer the next request
                self._kill()
                raise
            self._kill()
            return {"error": f"took longer than {limit_s:g} s to render" if not answered
                    else "crashed the template renderer"}

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            # The installed package, run as a module: -P keeps the current directory off its sys.path.
            # A session of its own: Ctrl-C goes to the app only.
            self._proc = subprocess.Popen([sys.executable, "-P", "-m", __name__], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            assert self._proc.stdout is not None
            if self._proc.stdout.readline() != b"ready\n":
                self._kill()
                raise SpecchatError(f"the chat template renderer ({sys.executable}) did not start; "
                                    "is jinja2 installed in this environment?")
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


_RENDERER = _Renderer()
atexit.register(_RENDERER._kill)  # it would exit when its stdin closes, unless busy with an endless template


def render(request: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """One request to the renderer process (see `serve`): {"text": ...} or {"error": ...}."""
    return _RENDERER.run(request, limit_s)


# --- the renderer process -------------------------------------------------------------------------


class _Rejected(Exception):
    """raise_exception(): the template refuses this conversation (e.g. roles that do not alternate)."""


class _TooBig(Exception):
    """An operation whose result would be a memory bomb, refused before it allocates."""


class _IgnoreGeneration(Extension):
    """HuggingFace's `{% generation %}` tag (marks assistant text for training) renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise _Rejected(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Transformers' (and llama-cpp-python's) tojson: no HTML escaping, unlike jinja's own.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """What llama-cpp-python's Jinja2ChatFormatter offers templates, in jinja's immutable sandbox.

    BaseLoader finds no template, so include/import/extends cannot read files. Reaching for an
    unsafe attribute (`__class__`, `append` on an immutable list) raises at once. `*` and `**` are
    checked before they run: they turn a short template into gigabytes (the memory limit would stop
    them too, but this names the cause and works where RLIMIT_AS is not enforced, e.g. macOS).
    jinja's sandbox already caps range() at MAX_RANGE items.
    """

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        super().__init__(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                         extensions=[_IgnoreGeneration, loopcontrols])
        self.filters["tojson"] = _tojson
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_OUTPUT:
                raise _TooBig(f"tried to build a sequence of {len(seq) * n} items")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * abs(left).bit_length() > 100_000:
            raise _TooBig(f"tried to compute {left} ** {right}")
        return super().call_binop(context, operator, left, right)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # jinja returns an Undefined that prints as "" and fails only when used further: fail now instead,
        # so that `{{ f.__globals__ }}` is reported rather than silently rendered as nothing.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _failure(e: BaseException) -> str:
    """What went wrong, as the end of a one-line sentence that starts with 'the chat template of X'."""
    detail = " ".join(str(e).split())[:200]
    if isinstance(e, jinja2.TemplateNotFound):
        return f"tried to read a file ({detail}); the file is not trustworthy"
    if isinstance(e, SecurityError):
        return f"tried to get out of its sandbox ({detail}); the file is not trustworthy"
    if isinstance(e, jinja2.TemplateSyntaxError):
        return f"has a syntax error on line {e.lineno}: {detail}"
    if isinstance(e, _Rejected):
        return f"rejected this conversation: {detail}"
    if isinstance(e, _TooBig):
        return detail
    if isinstance(e, RecursionError):
        return "recursed too deeply"
    if isinstance(e, MemoryError):
        return f"used more than {MEMORY_LIMIT >> 20} MB of memory"
    return f"failed: {type(e).__name__}: {detail}"


def serve() -> None:
    """The renderer process: one JSON request a line in, one JSON reply a line out, until stdin closes.

    A request is {"template": source, "variables": {...} or null to only compile, "limit_s": s}; a
    reply is {"text": ...} (with "reads", the variables the template reads, for a compile) or
    {"error": ...}. Replies are ASCII JSON, so any text survives the pipe.

    The parent kills a render that outlives its limit, but if the parent itself dies (SIGKILL)
    mid-render, nobody would: so each request also arms SIGALRM at its default action, which the
    kernel carries out even inside a C call that never returns, one second after the limit."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # Where RLIMIT_AS is missing or not enforced (Windows, macOS) the clock and the `*` check still hold.
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    sandbox = _Sandbox()
    compiled = lru_cache(maxsize=4)(sandbox.from_string)  # the same template every turn
    stdout.write(b"ready\n")
    stdout.flush()
    deadman = getattr(signal, "setitimer", None)  # POSIX only, like the select() in the parent
    if deadman:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    for line in stdin:
        request = json.loads(line)
        if deadman:
            deadman(signal.ITIMER_REAL, float(request.get("limit_s", TIME_LIMIT_S)) + 1.0)
        try:
            template = compiled(request["template"])
            if request["variables"] is None:  # compile only, and say which variables the template reads
                reply = {"text": "", "reads": sorted(meta.find_undeclared_variables(sandbox.parse(request["template"])))}
            else:
                text = template.render(**request["variables"])
                reply = {"text": text} if len(text) <= MAX_OUTPUT else \
                    {"error": f"produced more than {MAX_OUTPUT // 1_000_000} MB of text"}
        except Exception as e:  # MemoryError and RecursionError included: the template's fault, reported
            reply = {"error": _failure(e)}
        if deadman:
            deadman(signal.ITIMER_REAL, 0)
        stdout.write(json.dumps(reply).encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    serve()
