"""The decode loop: guess, verify once, keep the accepted path, take back the rest.

`Engine.generate` yields a stream of frozen events that the UI, the CLI and the
benchmark all consume. The engine never imports the UI.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from dataclasses import astuple, dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence, Union

import numpy as np

from specchat.decoding.guessers import Guesser, NoGuesser, Proposal
from specchat.decoding.sampling import SamplingConfig, logits_to_probs
from specchat.decoding.textstream import TextStream
from specchat.decoding.verify import Tree, verify_tree, verify_tree_greedy
from specchat.errors import ContextFull, SpecchatError

if TYPE_CHECKING:  # the engine drives a loaded Model; importing it must not load llama.cpp
    from specchat.llama.model import Model


class Source(enum.Enum):
    """Where an emitted token came from."""

    PLAIN = "plain"  # a step that drafted nothing
    DRAFT = "draft"  # a drafted token the target accepted
    CORRECTION = "correction"  # the target's own token after a rejection
    BONUS = "bonus"  # the target's extra token after every draft was accepted


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the characters this token completed (may be "" mid UTF-8 sequence)
    source: Source


@dataclass(frozen=True)
class Prefill:
    """The prompt was evaluated; `cached` of its tokens were reused from the previous turn."""

    n_prompt: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class Step:
    """One target step: the tokens it emitted and what the guess cost and gained."""

    tokens: tuple[Token, ...]
    text: str  # text released to the user (held back near a possible stop string)
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float  # the target's side of the step: verifying, and taking back what it rejected
    guesser: str = "none"  # the guesser behind this step's guess: "none", "lookup", "draft" or "mtp"
    rollback_s: float = 0.0  # of verify_s: saving the state beforehand and rewinding after (0 on most models)
    sync_s: float = 0.0  # of draft_s: the draft's cache catching up with what earlier steps committed


@dataclass(frozen=True)
class Stats:
    n_prompt: int = 0
    cached: int = 0
    prefill_s: float = 0.0
    n_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # steps that ended on a rejected guess
    draft_s: float = 0.0
    verify_s: float = 0.0
    # Wall-clock from the end of the prefill to the last step, set on Done: unlike decode_s it
    # includes the time the consumer (the app drawing, the CLI printing) held each step.
    wall_s: float = 0.0

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def wall_tokens_per_s(self) -> float:
        """Tokens per second as the user sees them arrive."""
        return self.n_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.n_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        """The fraction of drafted tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-position acceptance: a guess is judged only up to the first rejection, so this,
        not `acceptance`, is the alpha of the (1 - alpha^(k+1)) / (1 - alpha) formula."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    def plus(self, other: "Stats") -> "Stats":
        """Both together: the figures of two generations (or two parts of one rewrite) as one."""
        return Stats(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @staticmethod
    def total(stats: Iterable["Stats"]) -> "Stats":
        """All of them together, as one."""
        return functools.reduce(Stats.plus, stats, Stats())

    def add_step(self, step: Step) -> "Stats":
        return Stats(self.n_prompt, self.cached, self.prefill_s, self.n_tokens + len(step.tokens), self.steps + 1,
                     self.drafted + step.drafted, self.accepted + step.accepted,
                     self.rejections + (step.accepted < step.drafted),
                     self.draft_s + step.draft_s, self.verify_s + step.verify_s, self.wall_s)


ENGINE_FIGURES = "engine"  # Done.figures when the stats are the engine's own count of its steps
BUSY_SLOWDOWN = 1.5  # steps this much slower than the machine's curve: something else was running


@dataclass(frozen=True)
class Done:
    reason: str  # "eog", "max_tokens", "stop", "cancelled", "context_full"
    text: str  # the whole answer
    token_ids: tuple[int, ...]  # every generated token, the end-of-generation token included
    stats: Stats
    figures: str = ENGINE_FIGURES  # where `stats` come from (a server reports its own, or only a stream)
    # One plain step's seconds under the same conditions (0: not known), and how much slower than usual
    # the steps ran (the conversation service fills both in: the engine does not know the machine).
    plain_s: float = 0.0
    slowdown: float = 1.0

    @property
    def speedup(self) -> float | None:
        """Against plain decoding under the same conditions. Every step costs at least a plain step, so
        it can never be more than the tokens per step: a larger ratio is noise, and is cut there."""
        if not self.plain_s or not self.stats.tokens_per_s:
            return None
        return min(self.stats.tokens_per_s * self.plain_s, max(1.0, self.stats.tokens_per_step))

    @property
    def busy(self) -> bool:
        """The machine was busy during the answer: its figures say more about the machine than the answer."""
        return self.slowdown > BUSY_SLOWDOWN

Event = Union[Prefill, Step, Done]


@dataclass(frozen=True)
class GenerationConfig:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 512
    draft_length: int | None = None  # the most tokens a guesser may propose; None: its default
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Round:
    """What one target step made of a proposal: the guesses kept, the target's own token after them (a
    correction, or the bonus when every guess held), and the seconds it took."""

    proposal: Proposal
    kept: list[int]
    token: int
    bonus: bool
    draft_s: float  # proposing
    verify_s: float  # the target's side: verifying, and taking back what it rejected
    rollback_s: float  # of verify_s: saving the state beforehand and rewinding after


class Engine:
    """A target model and a guesser. Batch 1; not thread-safe: one generation at a time."""

    def __init__(self, target: Model, guesser: Guesser | None = None) -> None:
        self.target = target
        self.guesser: Guesser = guesser or NoGuesser()

    def generate(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig(),
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                              "shorten it or raise --ctx")
        sampling = config.sampling
        rng = np.random.default_rng(sampling.seed)
        k_max = self.guesser.default_draft_length if config.draft_length is None else config.draft_length
        if k_max + 1 > self.target.n_batch:  # the guesses and the pending token are verified in one batch
            raise SpecchatError(f"the draft length {k_max} does not fit llama.cpp's batch of {self.target.n_batch} "
                                f"tokens; use at most {self.target.n_batch - 1}")
        session = self.target.session
        text = TextStream(config.stop)

        t0 = time.perf_counter()
        # The last prompt token stays pending: the first step evaluates it with the guesses.
        cached = session.prefill(prompt)
        self.guesser.prepare(prompt)
        stats = Stats(n_prompt=len(prompt), cached=cached, prefill_s=time.perf_counter() - t0)
        yield Prefill(len(prompt), cached, stats.prefill_s)

        t_decode = time.perf_counter()
        context = list(prompt)
        generated: list[int] = []
        answer: list[str] = []
        reason = "max_tokens"
        while len(generated) < config.max_tokens:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            room = self.target.n_ctx - len(context)
            if room <= 0:
                reason = "context_full"
                break
            k = max(0, min(k_max, config.max_tokens - len(generated) - 1, room - 1))
            r = self._step(context, k, sampling, rng)
            new = [*r.kept, r.token]
            last = Source.PLAIN if not r.proposal.tokens else Source.BONUS if r.bonus else Source.CORRECTION
            sources = [Source.DRAFT] * len(r.kept) + [last]
            tokens, released = [], []
            # Token by token, as plain decoding would: a stop string or an end-of-generation token
            # inside the accepted run ends it there, and what follows is neither shown nor counted.
            for tok, src in zip(new, sources):
                generated.append(tok)
                if self.target.is_eog(tok):
                    reason = "eog"
                    break
                tokens.append(Token(tok, text.decode(self.target.piece(tok)), src))
                released.append(text.push(tokens[-1].text))
                if text.stopped:
                    reason = "stop"
                    break
            context.extend(new)
            answer.append("".join(released))
            step = Step(tuple(tokens), answer[-1], drafted=len(r.proposal.tokens), accepted=len(r.kept),
                        draft_s=r.draft_s, verify_s=r.verify_s, guesser=r.proposal.guesser, rollback_s=r.rollback_s,
                        sync_s=r.proposal.sync_s)
            self.guesser.observe(step.drafted, step.accepted, step.draft_s)
            stats = stats.add_step(step)
            yield step
            if reason in ("eog", "stop"):
                break
        answer.append(text.flush())
        yield Done(reason, "".join(answer), tuple(generated), replace(stats, wall_s=time.perf_counter() - t_decode))

    def _step(self, context: list[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Round:
        """One target step, as the algorithm reads: the guesser proposes up to k tokens (a chain is a tree
        of one branch); the target scores the pending token and every guess in one batch; the rule keeps a
        path of the guesses and adds one token of its own; the cache keeps exactly the context plus the
        kept guesses, the rest taken back (how, the session decides). Where the cache cannot drop
        positions by itself, a way back is kept before the batch goes in."""
        session = self.target.session
        t_draft = time.perf_counter()
        proposal = self.guesser.propose(context, k, sampling, rng)
        tree = proposal.tree or Tree.chain(proposal.tokens, proposal.probs)  # a chain is a one-branch tree
        t_verify = time.perf_counter()
        if tree.tokens:
            session.checkpoint(reach=len(tree.tokens))
        t_checked = time.perf_counter()
        path, token = self._verify(context[-1], tree, sampling, rng)
        t_verified = time.perf_counter()
        session.keep(path)  # the pending token and the path taken; every other guess goes
        t_end = time.perf_counter()
        kept = [tree.tokens[i] for i in path]
        bonus = not tree.children(path[-1]) if path else not tree.tokens  # every guess on the path held
        return Round(proposal, kept, token, bonus, draft_s=t_verify - t_draft, verify_s=t_end - t_verify,
                     rollback_s=(t_checked - t_verify) + (t_end - t_verified))

    def _verify(self, pending: int, tree: Tree, sampling: SamplingConfig,
                rng: np.random.Generator) -> tuple[tuple[int, ...], int]:
        """The target scores the pending token and every guess in one batch; the rule keeps a path."""
        logits = self.target.session.decode_guesses(pending, tree.tokens, tree.parents)  # (nodes + 1, V)
        v = verify_tree_greedy(tree, logits.argmax(-1)) if sampling.greedy else \
            verify_tree(tree, logits_to_probs(logits, sampling), rng)
        return v.path, v.token


def final(events: Iterable[Event]) -> Done:
    """Run a generation to the end and return its summary (for callers that don't stream)."""
    done = None
    for event in events:
        if isinstance(event, Done):
            done = event
    if done is None:
        raise RuntimeError("the generation ended without a Done event")
    return done
