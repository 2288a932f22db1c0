"""The `specchat` command line. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from specchat.decoding.guessers import GUESSERS, REGISTRY
from specchat.errors import SpecchatError
from specchat.models.catalog import size_text
from specchat.service import choices
from specchat.service.choices import ModelChoice

if TYPE_CHECKING:  # the commands import what they run when they run: `specchat --help` loads none of it
    from specchat.decoding.engine import GenerationConfig
    from specchat.llama.template import Message
    from specchat.mcptools.toolbox import Toolbox
    from specchat.service.chat import ChatService


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _with_command(argv, commands)
        args = parser.parse_args(argv)
        return int(args.run(args) or 0)
    except SpecchatError as e:
        _progress.end()
        print(f"specchat: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _progress.end()
        print("specchat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specchat models | head`: the reader left, which is not an error
        sys.stdout = open(os.devnull, "w")
        return 0


def _with_command(argv: list[str], commands: Sequence[str]) -> list[str]:
    """`specchat [--pair NAME ...]` opens the app: with no command, or options only, the command is chat.
    A first word that is no command is a mistake, said so, rather than a chat about it."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        return ["chat", *argv]
    if argv[0] in commands or argv[0] in ("-h", "--help"):
        return argv
    close = difflib.get_close_matches(argv[0], commands, n=1)
    hint = f"did you mean `specchat {close[0]}`?" if close else f"the commands are {', '.join(commands)}"
    raise SpecchatError(f"unknown command {argv[0]!r}; {hint} (`specchat --help` says what each does)")


def _parser() -> tuple[argparse.ArgumentParser, list[str]]:
    p = argparse.ArgumentParser(prog="specchat", description="Local chat with exact speculative decoding.")
    sub = p.add_subparsers(dest="command")
    for name, summary, arguments in _COMMANDS:
        arguments(sub.add_parser(name, help=summary))
    return p, list(sub.choices)


# Each command's arguments, and what runs it.

def _chat_args(c: argparse.ArgumentParser) -> None:
    _model_args(c, guesser=False)
    _remote_args(c)
    c.set_defaults(run=_chat, file=None)


def _rewrite_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("file", type=Path)
    _model_args(r, guesser=False)
    _remote_args(r)
    r.set_defaults(run=_chat)


def _generate_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("prompt")
    g.add_argument("--system", default=None, help="a system message (default: the settings' system prompt)")
    g.add_argument("--raw", action="store_true",
                   help="continue the prompt as raw text, without a chat template (base models, drafts)")
    g.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="a reasoning model thinks first, or not, where its template has a switch (default: "
                        "the thinking setting); the thinking goes to stderr, the answer to stdout")
    g.add_argument("--tools", action="store_true",
                   help="the model may call the tools of the MCP servers in config.toml (docs/tools.md); each call is "
                        "asked for on the terminal, and printed with its result's size on stderr")
    g.add_argument("--allow-tools", action="store_true", help="with --tools: run every call without asking")
    g.add_argument("--tool-choice", default="auto", metavar="CHOICE",
                   help="with --tools, for the first answer: auto (the model decides), required (a call, made so by a "
                        "grammar), none, or a tool's name (a call to it); later answers are auto (default: auto)")
    g.add_argument("--tool-rounds", type=int, default=8, metavar="N",
                   help="with --tools: the most rounds of calls one answer may make, after which it answers without "
                        "the tools (default: 8)")
    _model_args(g)
    _sampling_args(g)
    g.set_defaults(run=_generate)


def _prompt_args(pr: argparse.ArgumentParser) -> None:
    pr.add_argument("--conversation", type=int, default=None, help="its number in the app (default: the latest)")
    pr.add_argument("--then", metavar="TEXT", default=None, help="a next message of yours, as if sent")
    pr.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                    help="with thinking switched on or off (default: the thinking setting)")
    _model_args(pr, guesser=False)
    pr.set_defaults(run=_prompt)


def _bench_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--prompts", type=Path, nargs="+", required=True, help="JSONL files of {task, prompt}")
    b.add_argument("--json", type=Path, default=None, help="write the report here")
    b.add_argument("--repeat", type=int, default=3, help="runs per prompt and guesser; medians are reported")
    _model_args(b, multi_guesser=True)
    _sampling_args(b, settings_fill=False)
    b.set_defaults(run=_bench)


def _measure_args(m: argparse.ArgumentParser) -> None:
    m.add_argument("--prompts", type=Path, nargs="+", required=True, help="JSONL files of {task, prompt}")
    m.add_argument("--json", type=Path, default=None, help="write the report here")
    m.add_argument("--max-tokens", type=int, default=120)
    m.add_argument("--seed", type=int, default=0)
    _model_args(m, guesser=False)
    m.set_defaults(run=_measure)


def _costs_args(co: argparse.ArgumentParser) -> None:
    co.add_argument("--remeasure", action="store_true", help="measure again and replace the cached curve")
    _model_args(co, guesser=False)
    co.set_defaults(run=_costs)


def _models_args(ls: argparse.ArgumentParser) -> None:
    ls.set_defaults(run=_models)


def _add_args(add: argparse.ArgumentParser) -> None:
    add.add_argument("source")
    add.add_argument("--name", default=None, help="its name in the catalog (default: from the file name)")
    add.add_argument("--no-fetch", action="store_true", help="record a hub model without downloading it yet")
    add.set_defaults(run=_add)


def _remove_args(rm: argparse.ArgumentParser) -> None:
    rm.add_argument("name")
    rm.add_argument("--delete-file", action="store_true", default=None, help="delete its file without asking")
    rm.add_argument("--keep-file", action="store_false", dest="delete_file", help="keep its file without asking")
    rm.set_defaults(run=_remove)


def _drafts_args(dr: argparse.ArgumentParser) -> None:
    dr.add_argument("target", help="a catalog model, a pair (its target) or a .gguf path")
    dr.set_defaults(run=_drafts)


def _pair_args(pa: argparse.ArgumentParser) -> None:
    pa.add_argument("name")
    pa.add_argument("target")
    pa.add_argument("draft", nargs="?", default=None)
    pa.add_argument("--default", action="store_true", help="make it the pair the app and commands use by default")
    pa.set_defaults(run=_pair)


def _endurance_args(e: argparse.ArgumentParser) -> None:
    e.add_argument("--minutes", type=float, default=20.0)
    e.add_argument("--workdir", type=Path, default=None, help="where its conversations go (default: a temp dir)")
    e.add_argument("--seed", type=int, default=0)
    _model_args(e, guesser=False)
    e.set_defaults(run=_endurance)


def _pull_args(pull: argparse.ArgumentParser) -> None:
    pull.add_argument("name", nargs="?", default=None)
    pull.set_defaults(run=_pull)


def _serve_args(sv: argparse.ArgumentParser) -> None:
    _model_args(sv, guesser=False)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $SPECCHAT_API_KEY); "
                                                    "needed to listen on any address other machines can reach")
    sv.add_argument("--queue", type=int, default=8, help="requests that may wait for the one running (default: 8); "
                                                         "more are answered 503")
    sv.set_defaults(run=_serve)


# The commands in the order `specchat --help` lists them: name, the line it shows, and what adds the arguments.
_COMMANDS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("chat", "open the terminal app (the default when no command is given)", _chat_args),
    ("rewrite", "open the terminal app in document rewrite mode", _rewrite_args),
    ("generate", "answer one prompt (the answer on stdout, stats on stderr)", _generate_args),
    ("prompt", "print the prompt the next answer of a stored conversation would be given "
               "(the chat template's text: what goes back to the model, thinking or not)", _prompt_args),
    ("bench", "plain vs speculative decoding on a prompt set, side by side", _bench_args),
    ("measure", "acceptance measurements of a pair (the reference's method)", _measure_args),
    ("costs", "this machine's decode cost curve for a pair (measured once, cached)", _costs_args),
    ("models", "list the catalogs' models and pairs, on disk or not, with sizes", _models_args),
    ("add", "add a model: a .gguf path, hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf", _add_args),
    ("remove", "forget a model you added (and offer to delete its file)", _remove_args),
    ("drafts", "which models on disk and in the catalogs can draft for a target, and why not", _drafts_args),
    ("pair", "record a target/draft pair (no draft: the fastest compatible one on disk)", _pair_args),
    ("endurance", "a long scripted session through the app, checking stats, memory, caches", _endurance_args),
    ("pull", "fetch a model or a pair (no name, or `default`: the default pair)", _pull_args),
    ("serve", "an OpenAI-compatible HTTP server over the engine (needs specchat[server])", _serve_args),
)


def _model_args(p: argparse.ArgumentParser, guesser: bool = True, multi_guesser: bool = False) -> None:
    p.add_argument("--pair", default=None, help="a pair from models.toml (default: its default_pair)")
    p.add_argument("--target", type=Path, default=None, help="a target GGUF file instead of a pair")
    p.add_argument("--draft", type=Path, default=None, help="a draft GGUF file with the target's tokenizer")
    p.add_argument("--ctx", type=int, default=None,
                   help="context length in tokens (default: 4096; the app: its context setting)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, kept fixed (default: every core other programs leave free)")
    p.add_argument("--gpu-layers", type=int, default=None, help="target layers on the GPU (default: all)")
    p.add_argument("--draft-gpu-layers", type=int, default=None, help="draft layers on the GPU (default: all)")
    if multi_guesser:
        p.add_argument("--guesser", nargs="+", choices=[g for g in GUESSERS if g != "none"],
                       default=["auto", "draft", "lookup"])
    elif guesser:
        p.add_argument("--guesser", choices=GUESSERS, default=None,
                       help="(default: the settings' guesser, auto) "
                            + "; ".join(f"{name}: {entry.help}" for name, entry in REGISTRY.items()))
    if guesser:
        p.add_argument("--draft-length", "--k", type=int, default=None, dest="draft_length",
                       help="the most tokens a guesser proposes per step "
                            "(default: 4 for draft, 10 for lookup; the most auto may use: 16)")


def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, metavar="URL",
                   help="chat with an OpenAI-compatible server (specchat serve, llama-server, vLLM) instead of local models")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="the server's API key (default: $SPECCHAT_API_KEY; never written to the settings)")
    p.add_argument("--model", default=None, metavar="NAME", help="the server's model (default: the first it lists)")


def _sampling_args(p: argparse.ArgumentParser, settings_fill: bool = True) -> None:
    """Sampling options; None where not given, so that the settings (or, for the measuring commands,
    the defaults) fill them."""
    where = "the settings'" if settings_fill else "the"
    p.add_argument("--temp", type=float, default=None, help=f"temperature; 0 is greedy (default: {where} value, 0)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help=f"(default: {where} value"
                   + (", 512)" if settings_fill else ", 120)"))
    p.add_argument("--seed", type=int, default=None)


def _settings():  # type: ignore[no-untyped-def]
    from specchat.service.settings import load_settings

    settings, problems = load_settings()
    for problem in problems:
        _warn(problem)
    return settings


def _given(args: argparse.Namespace) -> ModelChoice:
    """The models as the command line names them, nothing filled in."""
    if args.ctx is not None and args.ctx < 64:
        raise SpecchatError(f"--ctx must be at least 64, got {args.ctx}")
    if args.threads is not None and args.threads < 1:
        raise SpecchatError(f"--threads must be at least 1, got {args.threads}")
    return ModelChoice(args.pair, args.target, args.draft, args.ctx, args.threads, args.gpu_layers,
                       args.draft_gpu_layers)


def _choice(args: argparse.Namespace, settings: Any = None) -> ModelChoice:
    """The models the command line names, with what it leaves open taken from the settings (read here
    unless the caller has read them: each read says the settings' problems again)."""
    from specchat.service.choices import model_choice

    return model_choice(_given(args), _settings() if settings is None else settings)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """What to sample, and how much, as the options give it (None: not given), checked."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise SpecchatError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.draft_length is not None and args.draft_length < 0:
        raise SpecchatError(f"--draft-length must be >= 0, got {args.draft_length}")
    return {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "seed": args.seed, "max_tokens": args.max_tokens, "draft_length": args.draft_length}


def _generation_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The measuring commands' sampling and lengths: the options given, then fixed defaults, never the settings
    (greedy and 120 tokens, so that their figures compare)."""
    from specchat.service.choices import generation
    from specchat.service.settings import Settings

    return generation(Settings(max_tokens=120), **_sampling(args))


class _ProgressLine:
    """The command line's progress: one line on stderr that tqdm rewrites in place (with a bar when the
    total is known), closed when its step is done; `what` says the rest (counts, sizes, rate)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, what: str, done: int, total: int) -> None:
        from tqdm import tqdm

        form = "{desc}: {percentage:3.0f}% |{bar:16}|" if total > 1 else "{desc}"
        if self._bar is None:
            self._bar = tqdm(desc=what, total=total, initial=done, bar_format=form, file=sys.stderr,
                             dynamic_ncols=True, leave=True)
        else:
            self._bar.bar_format, self._bar.total, self._bar.n = form, total, done
            self._bar.set_description_str(what)  # and redraw
        if done >= total:
            self.end()

    def end(self) -> None:
        """Finish the line (done, or interrupted), so that what follows starts a line of its own."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


_progress = _ProgressLine()


def _chat(args: argparse.Namespace) -> int:
    from specchat.service.documents import read_document
    from specchat.service.settings import resolve_api_key
    from specchat.ui.app import SpecchatApp

    if args.file is not None:
        read_document(args.file)  # a missing or binary file is a one-line error, before the UI starts
    remote, key = None, resolve_api_key(args.api_key)
    if args.server is not None:
        from specchat.service.choices import RemoteChoice
        from specchat.service.remote import base_urls, require_client

        require_client()  # without the extra: one line saying how to install it, before the UI starts
        base_urls(args.server)  # a malformed URL: one line, before the UI starts
        remote = RemoteChoice(args.server, key, args.model)
    # The app fills the choice from its settings itself: they can change while it runs.
    SpecchatApp(_given(args), rewrite_file=args.file, remote=remote, api_key=key).run()
    return 0


def _generate(args: argparse.Namespace) -> int:
    from specchat.llama.template import Message
    from specchat.service.local import open_local

    settings = _settings()
    given = choices.Given(args.guesser, args.system, args.think, raw=args.raw, **_sampling(args))
    tools = _tools(args) if args.tools else None  # a missing extra or no server configured: said before loading
    # --guesser draft without a draft, or a chat with a base model: one line saying why, and nothing before it.
    service = open_local(_choice(args, settings), _progress, guesser=args.guesser, warn=_warn, chat=not args.raw,
                         think=args.think)
    # Raw text has no chat template to read a switch from (a base model has none at all).
    answering = choices.answering(settings, service.guessers, None if args.raw else service.thinking_switch, given)
    for line in answering.notices:
        _warn(line)
    config, guesser = answering.config, answering.guesser
    printer = _AnswerPrinter(guesser)
    if args.raw:
        printer.print_all(service.complete(args.prompt, config, guesser))
        return 0
    messages = ([Message("system", answering.system)] if answering.system else []) + [Message("user", args.prompt)]
    variables = service.template_variables(answering.think)
    if tools is None:
        printer.print_all(service.chat(messages, config, guesser, variables=variables))
        return 0
    with tools:
        printer.print_all(_with_tools(args, tools, service, messages, config, guesser, variables))
    return 0


def _with_tools(args: argparse.Namespace, tools: Toolbox, service: ChatService, messages: list[Message],
                config: GenerationConfig, guesser: str, variables: dict[str, Any]) -> Iterator[Any]:
    """The answers and tool calls of `generate --tools`: the MCP servers started, the model offered their tools
    for --tool-rounds rounds, each call run as --allow-tools or the terminal says."""
    from specchat.mcptools.agent import Choice, agent_loop

    for line in tools.start():
        _warn(line)
    schemas = tools.schemas()
    rounds = 0

    def answer(conversation: Sequence[Message], offered: bool) -> Iterator[Any]:
        nonlocal rounds  # the choice is the first answer's: a forced call every round would never end
        rounds += 1
        if not offered:  # the bound is reached: the answer is in words
            return service.chat(conversation, config, guesser, variables=variables)
        choice = _tool_choice(args.tool_choice) if rounds == 1 else "auto"
        return service.chat(conversation, config, guesser, variables=variables, tools=schemas, tool_choice=choice)

    return agent_loop(answer, messages, tools.call,
                      (lambda _call: Choice.ONCE) if args.allow_tools else _ask_on_terminal, args.tool_rounds)


def _warn(line: str) -> None:
    print(f"specchat: warning: {line}", file=sys.stderr)


class _AnswerPrinter:
    """One answer's events on the terminal: the answer on stdout, and on stderr its thinking, notices, tool
    calls and figures, so that stdout holds the answer alone."""

    def __init__(self, guesser: str) -> None:
        self.guesser = guesser
        self.thinking = False  # the last thing written was thinking

    def print_all(self, events: Any) -> None:
        for event in events:
            self(event)

    def __call__(self, event: Any) -> None:
        from specchat.decoding.events import Done, Step
        from specchat.mcptools.agent import RoundsSpent, ToolRan
        from specchat.service.conversation import against_plain
        from specchat.service.events import Notice

        if isinstance(event, Step) and event.thinking:
            if not self.thinking:
                print("thinking:", file=sys.stderr)
            sys.stderr.write(event.thinking)
            sys.stderr.flush()
            self.thinking = True
        if isinstance(event, Step) and event.text:
            self._end_thinking()
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Notice):
            self._end_thinking()
            print(f"specchat: {event.text}", file=sys.stderr)
        elif isinstance(event, ToolRan):
            self._end_thinking()
            result = event.result
            what = "refused" if event.refused else f"failed: {result.text}" if result.error else \
                f"{len(result.text.encode())} bytes" + (f" ({result.cut} cut)" if result.cut else "")
            print(f"specchat: tool {event.call.name}({event.call.arguments}) -> {what}", file=sys.stderr)
        elif isinstance(event, RoundsSpent):
            print(f"specchat: the answer stopped after {event.rounds} rounds of tool calls (--tool-rounds)",
                  file=sys.stderr)
        elif isinstance(event, Done):
            self._end_thinking()
            if event.text and not event.text.endswith("\n"):
                sys.stdout.write("\n")
            s = event.stats
            speedup = against_plain(event)
            speedup = f", {speedup}" if speedup else ""
            print(f"[{self.guesser}] {s.n_tokens} tokens in {s.decode_s:.2f}s: {s.tokens_per_s:.1f} tok/s "
                  f"({s.wall_tokens_per_s:.1f} as shown), "
                  f"{s.tokens_per_step:.2f} tokens/step, acceptance {s.acceptance:.2f} "
                  f"({s.accepted}/{s.drafted}){speedup}, guessing {1000 * s.draft_s / max(1, s.steps):.2f} ms a step, "
                  f"prompt {s.n_prompt} tokens in {s.prefill_s:.2f}s, stop: {event.reason}", file=sys.stderr)
            if event.thinking_tokens:
                print(f"[thinking] {event.thinking_tokens} of the tokens in {event.thinking_s:.2f}s: "
                      f"{event.thinking_tokens_per_s:.1f} tok/s", file=sys.stderr)

    def _end_thinking(self) -> None:
        if self.thinking:
            print("\n", file=sys.stderr)
            self.thinking = False


def _tools(args: argparse.Namespace) -> Toolbox:
    from specchat.mcptools.toolbox import configured

    if args.tool_rounds < 0:
        raise SpecchatError(f"--tool-rounds must be 0 or more, got {args.tool_rounds}")
    if not args.allow_tools and not sys.stdin.isatty():
        raise SpecchatError("--tools asks before each call, and stdin is not a terminal: add --allow-tools to run "
                            "the model's calls without asking")
    return configured()


def _tool_choice(given: str) -> str | dict[str, Any]:
    """--tool-choice as the API writes it: a tool's name is a named function."""
    return given if given in ("auto", "required", "none") else {"type": "function", "function": {"name": given}}


def _ask_on_terminal(call: Any) -> Any:
    """Asks on the terminal whether to run one call: yes, always for this tool, or no (the default)."""
    from specchat.mcptools.agent import Choice

    sys.stderr.write(f"specchat: the model calls {call.name}({call.arguments}); run it? [y]es, [a]lways for this "
                     "tool, [N]o: ")
    sys.stderr.flush()
    reply = sys.stdin.readline().strip().lower()
    return {"y": Choice.ONCE, "yes": Choice.ONCE, "a": Choice.ALWAYS, "always": Choice.ALWAYS}.get(reply, Choice.REFUSE)


def _prompt(args: argparse.Namespace) -> int:
    from specchat.llama.model import Model
    from specchat.llama.template import ChatPrompter, Message
    from specchat.service.conversation import ConversationController
    from specchat.service.loader import model_paths
    from specchat.store.conversations import Store

    settings, store = _settings(), Store()
    ids = [c.id for c in store.conversations()]
    if not ids or (args.conversation is not None and args.conversation not in ids):
        raise SpecchatError("there is no conversation to show" if not ids else
                            f"there is no conversation {args.conversation}; the app's list has {', '.join(map(str, ids[:10]))}"
                            + ("…" if len(ids) > 10 else ""))
    conversation = ConversationController(store, args.conversation or ids[0])
    choice = _choice(args, settings)
    target = Model(model_paths(choice, progress=_progress)[0], n_ctx=256, n_threads=choice.threads, n_gpu_layers=0)
    try:  # the template and the special tokens' text are all it needs of the model
        template = ChatPrompter(target).template
        # Nothing runs here: the prompt is the same whichever guesser would answer it, so none is said not to run.
        answering = choices.answering(settings, GUESSERS, template.switch, choices.Given(think=args.think))
        if answering.thinking_notice is not None:
            _warn(answering.thinking_notice)
        messages = conversation.prompt_messages(answering.system)
        messages += [Message("user", args.then)] if args.then is not None else []
        sys.stdout.write(template.render(messages, variables=template.variables(answering.think)))
    finally:
        target.close()
    return 0


def _endurance(args: argparse.Namespace) -> int:
    import tempfile

    from specchat.tools.endurance import run

    with tempfile.TemporaryDirectory(prefix="specchat-endurance-") as tmp:
        report = run(_choice(args), args.workdir or Path(tmp), args.minutes, args.seed)
    print("\n".join(report.lines()))
    return 1 if report.problems else 0


def _bench(args: argparse.Namespace) -> int:
    from specchat.tools.bench import run_bench

    return run_bench(args, _choice(args), _generation_config(args))


def _measure(args: argparse.Namespace) -> int:
    from specchat.tools.measure import run_measure

    return run_measure(args, _choice(args))


def _costs(args: argparse.Namespace) -> int:
    from specchat.tools.costs import run_costs

    return run_costs(_choice(args), args.remeasure, _progress)


def _models(args: argparse.Namespace) -> int:
    from specchat.models.catalog import load_catalog, shipped_catalog_path
    from specchat.models.fetch import models_dir, on_disk

    catalog, shipped = load_catalog(), load_catalog(shipped_catalog_path())
    print(f"models directory: {models_dir()}")
    for entry in catalog.models.values():
        path = on_disk(entry)
        origin = "shipped" if shipped.models.get(entry.name) == entry else "yours"
        size = entry.size or (path.stat().st_size if path else None)
        print(f"  {entry.name:30} {entry.quantization:7} {size_text(size):>10}  {origin:7} "
              f"{'on disk: ' + str(path) if path else 'not on disk'}")
    print("pairs:")
    for pair in catalog.pairs.values():
        mark = "*" if pair.name == catalog.default_pair else " "
        print(f" {mark}{pair.name:20} {pair.target} + {pair.draft or '(no draft: lookup)'}"
              + (f"  ({pair.note})" if pair.note else ""))
    return 0


def _add(args: argparse.Namespace) -> int:
    from specchat.models.manage import add_model

    added = add_model(args.source, args.name, fetch=not args.no_fetch, progress=_progress)
    e = added.entry
    where = f"on disk: {added.path}" if added.path else f"not fetched yet: `specchat pull {added.name}`"
    print(f"added {added.name} ({e.quantization}, {size_text(e.size)}, sha256 {(e.sha256 or '?')[:12]}…), {where}")
    print(f"find its draft: specchat drafts {added.name}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    from specchat.models.manage import remove_model

    pairs, path = remove_model(args.name)
    print(f"removed {args.name}" + (f" and its pairs {', '.join(pairs)}" if pairs else "") + " from your catalog")
    if path is None:
        return 0
    delete = args.delete_file
    if delete is None and sys.stdin.isatty():
        delete = input(f"delete its file {path} ({size_text(path.stat().st_size)})? [y/N] ").strip().lower() in ("y", "yes")
    if delete:
        path.unlink()
        print(f"deleted {path}")
    else:
        print(f"kept {path}" + ("" if args.delete_file is False else " (delete it with --delete-file)"))
    return 0


def _drafts(args: argparse.Namespace) -> int:
    from specchat.models.manage import find_drafts, target_path

    target = target_path(args.target)
    candidates = find_drafts(target)
    print(f"drafts for {args.target} ({target.name}):")
    for c in candidates:
        verdict = "compatible" if c.compatible else f"no: {c.reason}"
        print(f"  {c.label:40} {size_text(c.size):>10}  {verdict}")
    if not any(c.compatible for c in candidates):
        print("none on disk can draft for it: the app still runs it with prompt lookup and plain decoding")
    return 0


def _pair(args: argparse.Namespace) -> int:
    from specchat.models.manage import make_pair

    _, how = make_pair(args.name, args.target, args.draft, args.default)
    print(f"pair {args.name}: {args.target}; {how}" + (" (now the default)" if args.default else ""))
    print(f"use it: specchat --pair {args.name}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from specchat.server.run import serve
    except ModuleNotFoundError as e:
        if e.name not in ("fastapi", "uvicorn", "starlette", "pydantic"):
            raise
        raise SpecchatError("specchat serve needs the server extra: pip install 'specchat[server]'") from None
    serve(_choice(args), args.host, args.port, args.api_key, args.queue, _progress)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from specchat.models.catalog import load_catalog
    from specchat.models.fetch import resolve

    catalog = load_catalog()
    name = None if args.name == "default" and "default" not in catalog.models else args.name
    if name is None or name in catalog.pairs:
        pair = catalog.pair(name)
        names = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    elif name in catalog.models:
        names = [name]
    else:
        raise SpecchatError(f"no model or pair is named {name!r}; pairs: {', '.join(sorted(catalog.pairs))}; "
                            "`specchat models` lists the models (no name pulls the default pair)")
    for name in dict.fromkeys(names):
        print(resolve(catalog.model(name), progress=_progress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
