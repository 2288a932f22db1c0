"""The one place where what the command line says and what the settings say are merged.

The rule, for every front end (the app, `generate`, `serve` and the measuring commands): an option
given on the command line wins; what it leaves open comes from the settings; what neither says is the
default. So a pair, a context size or a thread count chosen in the app's Settings holds for
`specchat generate` and `specchat serve` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.sampling import SamplingConfig
from specchat.service.settings import Settings


@dataclass(frozen=True)
class ModelChoice:
    """This machine's models: a pair of the catalog, or files."""

    pair: str | None = None
    target: Path | None = None
    draft: Path | None = None
    n_ctx: int | None = None  # None: the loader's DEFAULT_CONTEXT
    threads: int | None = None  # None: every core other programs leave free (llama/cores.py)
    gpu_layers: int | None = None  # layers offloaded to the GPU (Metal, CUDA builds); None: all
    draft_gpu_layers: int | None = None
    fetch: bool = True
    offline: bool = False  # never fetch (HF_HUB_OFFLINE in the environment does the same)


@dataclass(frozen=True)
class RemoteChoice:
    """Another machine's server; the key is never written to the settings file; model None: its first."""

    url: str
    api_key: str | None = None
    model: str | None = None


def model_choice(given: ModelChoice, settings: Settings) -> ModelChoice:
    """The models to load: the command line's choice, its gaps filled from the settings."""
    choice = given
    if settings.pair and given.target is None and given.pair is None:
        choice = replace(choice, pair=settings.pair)
    # The offline setting adds to HF_HUB_OFFLINE and to the command line's; it never turns either off.
    return replace(choice, offline=given.offline or settings.offline, n_ctx=given.n_ctx or settings.context,
                   threads=given.threads or settings.threads or None,
                   gpu_layers=settings.gpu_layers if given.gpu_layers is None else given.gpu_layers,
                   draft_gpu_layers=settings.draft_gpu_layers if given.draft_gpu_layers is None
                   else given.draft_gpu_layers)


def where_to_chat(given: ModelChoice, server: RemoteChoice | None, settings: Settings,
                  api_key: str | None = None) -> ModelChoice | RemoteChoice:
    """This machine's models, or a server: `--server` wins over the server setting. The API key comes
    from the command line or the environment, never from the settings file."""
    if server is not None:
        return server
    if settings.server:
        return RemoteChoice(settings.server, api_key)
    return model_choice(given, settings)


def same_models(a: ModelChoice | RemoteChoice, b: ModelChoice | RemoteChoice) -> bool:
    """Whether two choices load the same thing, so that a change of settings between them needs no reload
    (going offline changes how models are found, not which)."""
    if isinstance(a, ModelChoice) and isinstance(b, ModelChoice):
        return replace(a, offline=False) == replace(b, offline=False)
    return a == b


def generation(settings: Settings, temperature: float | None = None, top_k: int | None = None,
               top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
               max_tokens: int | None = None, draft_length: int | None = None) -> GenerationConfig:
    """Sampling and lengths: each value given wins over the setting (None: not given)."""

    def pick(value, setting):  # type: ignore[no-untyped-def]
        return setting if value is None else value

    sampling = SamplingConfig(pick(temperature, settings.temperature), pick(top_k, settings.top_k),
                              pick(top_p, settings.top_p), pick(min_p, settings.min_p),
                              pick(seed, None if settings.seed < 0 else settings.seed))
    return GenerationConfig(sampling, pick(max_tokens, settings.max_tokens),
                            pick(draft_length, settings.draft_length or None))


@dataclass(frozen=True)
class Given:
    """What one request names itself (the command line's options); None: not named, the settings say. The app
    names nothing: its answers run as the settings say."""

    guesser: str | None = None
    system: str | None = None  # an empty one too: no system prompt
    think: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    draft_length: int | None = None
    raw: bool = False  # text completed as it stands: no chat template, so no system prompt and no thinking


@dataclass(frozen=True)
class Answering:
    """What an answer runs with, and the lines a front end shows about it (each None when all is as chosen)."""

    config: GenerationConfig
    guesser: str
    system: str  # "": none
    think: bool | None  # on, off, or as the model does unasked (None)
    guesser_notice: str | None = None  # the settings' guesser cannot run on these models: auto runs
    thinking_notice: str | None = None  # the thinking setting is left aside: the template has no switch

    @property
    def notices(self) -> list[str]:
        return [line for line in (self.guesser_notice, self.thinking_notice) if line is not None]


def answering(settings: Settings, can_run: Sequence[str], switch: str | None, given: Given = Given()) -> Answering:
    """What an answer runs with, by one rule in every front end: what the request names wins, the settings fill
    the rest. `can_run` is the guessers the models can run; `switch` the chat template's variable for thinking
    (None: it reads none). The app shows the guesser's line when the models load and the thinking line once."""
    config = generation(settings, given.temperature, given.top_k, given.top_p, given.min_p, given.seed,
                        given.max_tokens, given.draft_length)
    guesser, guesser_notice = _guesser(given.guesser, settings, can_run)
    if given.raw:
        return Answering(config, guesser, "", None, guesser_notice)
    think, thinking_notice = _thinking(given.think, settings, switch)
    system = settings.system_prompt if given.system is None else given.system
    return Answering(config, guesser, system, think, guesser_notice, thinking_notice)


def _guesser(given: str | None, settings: Settings, can_run: Sequence[str]) -> tuple[str, str | None]:
    """The guesser that answers, and a line to show when it is not the one chosen. A guesser given for this
    request (the command line's, a server request's) runs, or is refused before anything else (`open_local`,
    `ChatService.require`). The settings' guesser runs where it can; elsewhere auto does and the line says so,
    and the setting stays the user's (another pair may run it)."""
    if given is not None or settings.guesser in can_run:
        return given or settings.guesser, None
    return "auto", (f"the {settings.guesser} guesser cannot run on these models; using auto (your setting stays: "
                    "choose another in Settings)")


THINKING = {"default": None, "on": True, "off": False}  # the thinking setting's values, as a switch


def _thinking(given: bool | None, settings: Settings, switch: str | None) -> tuple[bool | None, str | None]:
    """Thinking on (True), off (False) or as the model does unasked (None), by the guesser's rule: asked
    for in this request (`--think`, a server request's `chat_template_kwargs`), it is passed to the template
    or refused (`ChatService.template_variables`); from the settings, it holds where the model's template
    has a switch, and elsewhere gives way to the model's default with a line."""
    if given is not None:
        return given, None
    wanted = THINKING[settings.thinking]
    if wanted is not None and switch is None:
        return None, (f"this model's chat template has no switch for thinking; the thinking setting "
                      f"({settings.thinking}) is left aside for it")
    return wanted, None
