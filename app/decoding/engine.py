"""The decode loop: guess, verify once, keep the accepted path, take back the rest.

`Engine.generate` yields a stream of frozen events that the UI, the CLI and the
benchmark all consume. The engine never imports the UI.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from specchat.decoding.events import Done, Event, Prefill, Source, Stats, Step, Token
from specchat.decoding.guessers import Guesser, NoGuesser, Proposal
from specchat.decoding.sampling import SamplingConfig
from specchat.decoding.textstream import TextStream
from specchat.decoding.verify import Tree, verify_logits
from specchat.errors import ContextFull, SpecchatError

if TYPE_CHECKING:  # the engine drives a loaded Model; importing it must not load llama.cpp
    from specchat.decoding.constraint import Constraint, Matcher  # (nor llguidance, unless one is given)
    from specchat.llama.model import Model


@dataclass(frozen=True)
class GenerationConfig:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 512
    draft_length: int | None = None  # the most tokens a guesser may propose; None: its default
    stop: tuple[str, ...] = ()
    # A grammar the answer must follow (`decoding.constraint`, `decoding.toolgrammar`): the target's rule
    # samples from its distribution masked to what the grammar allows. None: unconstrained.
    constraint: Constraint | None = None


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
        """The answer to `prompt` as events: a Prefill, a Step per target step, and a Done, sooner where
        `cancel` is set, the context fills or the answer ends."""
        k_max = self._draft_length(prompt, config)
        sampling = config.sampling
        rng = np.random.default_rng(sampling.seed)
        text = TextStream(config.stop)
        matcher, stats = self._begin(prompt, config)
        yield Prefill(len(prompt), stats.cached, stats.prefill_s)

        t_decode = last_end = time.perf_counter()
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
            r = self._step(context, k, sampling, rng, matcher)
            new = [*r.kept, r.token]
            if matcher is not None:  # the answer so far, as the cache holds it; an end token ends it
                matcher.consume(new[:next((i for i, t in enumerate(new) if self.target.is_eog(t)), len(new))])
            step = self._release(r, new, text, generated, last_end)
            context.extend(new)
            answer.append(step.text)
            last_end += step.span_s  # the next step's span starts where this one's ended
            self.guesser.observe(step.drafted, step.accepted, step.span_s)
            stats = stats.add_step(step)
            yield step
            if step.ended or text.stopped:
                reason = "eog" if step.ended else "stop"
                break
        answer.append(text.flush())
        yield Done(reason, "".join(answer), tuple(generated), replace(stats, wall_s=time.perf_counter() - t_decode))

    def _draft_length(self, prompt: Sequence[int], config: GenerationConfig) -> int:
        """The most tokens a step may guess, once the prompt is known to fit the context and the guesses with
        the pending token llama.cpp's batch."""
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                              "shorten it or raise --ctx")
        k_max = self.guesser.default_draft_length if config.draft_length is None else config.draft_length
        if k_max + 1 > self.target.n_batch:  # the guesses and the pending token are verified in one batch
            raise SpecchatError(f"the draft length {k_max} does not fit llama.cpp's batch of {self.target.n_batch} "
                                f"tokens; use at most {self.target.n_batch - 1}")
        return k_max

    def _begin(self, prompt: Sequence[int], config: GenerationConfig) -> tuple[Matcher | None, Stats]:
        """The prompt into the cache, the guesser told of it, and the answer's grammar started: its matcher
        (None: no grammar) and the figures the steps add to."""
        t0 = time.perf_counter()
        # The last prompt token stays pending: the first step evaluates it with the guesses.
        cached = self.target.session.prefill(prompt)
        self.guesser.prepare(prompt)
        # One matcher per generation, following the answer's committed tokens: a generation cancelled between
        # steps leaves nothing behind in it, and the next starts from the grammar's start.
        matcher = config.constraint.start() if config.constraint is not None else None
        # Drafters that sample under the grammar make guesses that hold; set for every generation, so that none
        # drafts under an earlier one's. (Guessers without it draft as they would: the rule stays exact.)
        constrain = getattr(self.guesser, "constrain", None)
        if constrain is not None:
            constrain(None if matcher is None else matcher.after)
        return matcher, Stats(n_prompt=len(prompt), cached=cached, prefill_s=time.perf_counter() - t0)

    def _release(self, r: Round, new: list[int], text: TextStream, generated: list[int], since: float) -> Step:
        """The step event of a round's tokens (`new`: the kept guesses, then the target's token), released token
        by token as plain decoding would: a stop string or an end-of-generation token inside the accepted run
        ends it there, and what follows is neither shown nor counted. Each token produced is added to
        `generated`; the step's span runs from `since` to now."""
        last = Source.PLAIN if not r.proposal.tokens else Source.BONUS if r.bonus else Source.CORRECTION
        sources = [Source.DRAFT] * len(r.kept) + [last]
        tokens, released = [], []
        ended = False
        for tok, src in zip(new, sources):
            generated.append(tok)
            if self.target.is_eog(tok):
                ended = True
                break
            tokens.append(Token(tok, text.decode(self.target.piece(tok)), src))
            released.append(text.push(tokens[-1].text))
            if text.stopped:
                break
        return Step(tuple(tokens), "".join(released), drafted=len(r.proposal.tokens), accepted=len(r.kept),
                    draft_s=r.draft_s, verify_s=r.verify_s, guesser=r.proposal.guesser, rollback_s=r.rollback_s,
                    sync_s=r.proposal.sync_s, ended=ended, span_s=time.perf_counter() - since)

    def _step(self, context: list[int], k: int, sampling: SamplingConfig, rng: np.random.Generator,
              matcher: Matcher | None = None) -> Round:
        """One target step, as the algorithm reads: the guesser proposes up to k tokens (a chain is a tree
        of one branch); the target scores the pending token and every guess in one batch; the rule keeps a
        path of the guesses and adds one token of its own; the cache keeps exactly the context plus the
        kept guesses, the rest taken back (how, the session decides). Where the cache cannot drop
        positions by itself, a way back is kept before the batch goes in."""
        session = self.target.session
        t_draft = time.perf_counter()
        proposal = self.guesser.propose(context, k, sampling, rng)
        if matcher is not None:
            proposal = fitted(proposal, matcher)
        tree = proposal.tree or Tree.chain(proposal.tokens, proposal.probs)  # a chain is a one-branch tree
        t_verify = time.perf_counter()
        if tree.tokens:
            session.checkpoint(reach=len(tree.tokens))
        t_checked = time.perf_counter()
        path, token = self._verify(context[-1], tree, sampling, rng, matcher)
        t_verified = time.perf_counter()
        session.keep(path)  # the pending token and the path taken; every other guess goes
        t_end = time.perf_counter()
        kept = [tree.tokens[i] for i in path]
        bonus = not tree.children(path[-1]) if path else not tree.tokens  # every guess on the path held
        return Round(proposal, kept, token, bonus, draft_s=t_verify - t_draft, verify_s=t_end - t_verify,
                     rollback_s=(t_checked - t_verify) + (t_end - t_verified))

    def _verify(self, pending: int, tree: Tree, sampling: SamplingConfig, rng: np.random.Generator,
                matcher: Matcher | None = None) -> tuple[tuple[int, ...], int]:
        """The target scores the pending token and every guess in one batch; the rule keeps a path. Under a
        constraint every row is the target's masked to what the grammar allows after that row's path, before
        the rule reads it: the rule is then exact for the constrained target."""
        logits = self.target.session.decode_guesses(pending, tree.tokens, tree.parents)  # (nodes + 1, V)
        v = verify_logits(tree, logits, sampling, rng, None if matcher is None else matcher.masks(tree))
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


def fitted(proposal: Proposal, matcher: Matcher) -> Proposal:
    """A proposal without the deterministic guesses the grammar refuses: a copied chain cut at its first refused
    token, a tree's copied nodes that are refused dropped with what follows them. The target gives such a guess
    probability 0, so the rule would reject it with certainty and draw from the target as if it had not been
    made: leaving it out changes nothing but the positions verified. A *sampled* guess stays (cutting it
    would change which draws the rule sees, and with them the residual it samples from: not exact); the
    masked target rejects it."""
    if proposal.tree is not None:
        tree = proposal.tree
        keep: list[int] = []
        index: dict[int, int] = {-1: -1}
        for i, (token, parent, q) in enumerate(zip(tree.tokens, tree.parents, tree.drafts)):
            if parent not in index:
                continue
            if q is None:
                path = [tree.tokens[n] for n in tree.path(i)]
                if matcher.valid_prefix(path) < len(path):
                    continue
            index[i] = len(keep)
            keep.append(i)
        if len(keep) == len(tree.tokens):
            return proposal
        pruned = Tree(tuple(tree.tokens[i] for i in keep), tuple(index[tree.parents[i]] for i in keep),
                      tuple(tree.drafts[i] for i in keep))
        return replace(proposal, tokens=list(pruned.tokens), tree=pruned)
    if proposal.probs is not None or not proposal.tokens:
        return proposal
    n = matcher.valid_prefix(proposal.tokens)
    return proposal if n == len(proposal.tokens) else replace(proposal, tokens=proposal.tokens[:n])
