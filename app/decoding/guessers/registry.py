"""The registry: every guesser by name, what each needs of the models, and how it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Sequence

from specchat.decoding.guessers.auto import AutoGuesser
from specchat.decoding.guessers.base import Guesser, NoGuesser
from specchat.decoding.guessers.copying import HistoryGuesser, LookupGuesser
from specchat.decoding.guessers.drafting import DraftGuesser, MtpGuesser
from specchat.decoding.policy import CostCurve
from specchat.errors import SpecchatError

if TYPE_CHECKING:
    from specchat.decoding.history import HistoryIndex
    from specchat.llama.model import Model
    from specchat.llama.mtp import MtpHead


@dataclass(frozen=True)
class Inputs:
    """What guessers are built from, assembled by the service: the loaded models, what they can do, this
    machine's live cost curve (None where nothing built from these weighs costs) and the user's past
    conversations. Fixed inputs: building a guesser measures nothing and reaches nothing above `decoding`."""

    target: Model
    draft: Model | None = None
    mtp: MtpHead | None = None  # the target's own MTP layers (or its assistant's), if it has them
    capabilities: frozenset[str] = frozenset({"rewind"})  # what guessers may need that is there (see NEEDS)
    curve: CostCurve | None = None  # one object, kept current from real steps by the service
    history: HistoryIndex | None = None  # the user's past conversations in the target's tokens
    warnings: tuple[str, ...] = ()  # why something the user asked for was left out (a draft that failed)


# What a guesser may need, in the words that say so when a pair lacks it.
NEEDS = {"rewind": "a cache that can take back a rejected guess, which this model's cannot (see its warning)",
         "draft": "a draft model: pass --draft PATH or use a --pair that has one",
         "mtp": "MTP layers: a model that has them (Qwen3.5/3.6, DeepSeek, GLM), or a Gemma 4 target with its "
                "gemma4-assistant file as --draft",
         "history": "the app's conversations to copy from (`generate` and `serve` have none)"}


@dataclass(frozen=True)
class Entry:
    help: str
    build: Callable[[Inputs], Guesser]  # a new guesser, with state of its own, over the inputs
    needs: frozenset[str] = frozenset()
    # "draft": drafts token by token at the curve's cost per token of its name; auto weighs every such entry
    # the pair can run. "": auto does not use it as a drafter (it copies for itself, or it is auto).
    kind: str = ""
    costs: bool = False  # it weighs this machine's costs: the service measures the curve before building it


def _auto(inputs: Inputs) -> Guesser:
    if "rewind" not in inputs.capabilities:  # every guess would cost the whole conversation again
        return NoGuesser()
    if inputs.curve is None:
        raise SpecchatError("auto needs this machine's cost curve, and none was given (build it with the inputs "
                            "of a service, which measures the curve first)")
    drafters = {name: entry.build(inputs) for name, entry in REGISTRY.items()
                if entry.kind == "draft" and entry.needs <= inputs.capabilities}
    return AutoGuesser(inputs.curve, drafters, piece=inputs.target.piece,  # type: ignore[arg-type]
                       history=inputs.history, tree_branches=inputs.target.tree_branches)


# Every guesser by name, in the order the app cycles through them. A new guesser is its class and one
# line here: the command line, the settings, Ctrl+G, the server and the loader all read this.
REGISTRY: dict[str, Entry] = {
    "auto": Entry("picks a copy (lookup, history, or several as a tree), the draft or MTP, or nothing at each step, "
                  "by this machine's costs", _auto, costs=True),
    "none": Entry("plain decoding", lambda inputs: NoGuesser()),
    "lookup": Entry("copies from earlier text (prompt lookup)", lambda inputs: LookupGuesser(), frozenset({"rewind"})),
    "draft": Entry("the draft model guesses", lambda inputs: DraftGuesser(inputs.draft),
                   frozenset({"rewind", "draft"}), "draft"),
    "mtp": Entry("the target's own MTP layers guess", lambda inputs: MtpGuesser(inputs.mtp),
                 frozenset({"rewind", "mtp"}), "draft"),
    "history": Entry("copies what your past conversations said next", lambda inputs: HistoryGuesser(inputs.history),
                     frozenset({"rewind", "history"})),
}
GUESSERS = tuple(REGISTRY)


def available(capabilities: Collection[str]) -> list[str]:
    """The guessers that can run on what a pair (or a server) has, in the registry's order."""
    return [name for name, entry in REGISTRY.items() if entry.needs <= set(capabilities)]


def unavailable(name: str, capabilities: Collection[str], warnings: Sequence[str] = ()) -> str | None:
    """Why the guesser `name` cannot run here (one line, with what to do), or None if it can. `warnings`
    say why something it needs was left out, when it was."""
    entry = REGISTRY.get(name)
    if entry is None:
        return f"unknown guesser {name!r}; choose one of {', '.join(GUESSERS)}"
    lacking = sorted(entry.needs - set(capabilities))
    if not lacking:
        return None
    if warnings:
        return f"the {name} guesser cannot run: {'; '.join(warnings)} (choose another guesser)"
    return f"the {name} guesser needs " + "; and ".join(NEEDS[need] for need in lacking)


def build(name: str, inputs: Inputs) -> Guesser:
    """A new guesser of this name over the inputs, or a one-line error saying why it cannot run."""
    why = unavailable(name, inputs.capabilities, inputs.warnings)
    if why is not None:
        raise SpecchatError(why)
    return REGISTRY[name].build(inputs)
