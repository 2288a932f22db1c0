"""The engine's events, what the engine knows of an answer: a Prefill when the prompt is in, a Step per
target step (its tokens, where each came from, and what the guess cost and gained), and a Done with the
answer and its figures. Frozen: a consumer cannot change what another sees. The conversation service
passes each Step and Done on as its own, with what it learns beside (`specchat.service.events`): that is
the one stream the UI, the CLI, the server and the benchmarks consume.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import astuple, dataclass
from typing import Iterable, Union

# The guessers that spend time on every token they draft (a copy from the context costs nothing a token).
DRAFTERS = ("draft", "mtp")


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
    # The step's last token was the end of generation: decoded like any other (plain decoding pays a step
    # for it too), but not shown, so not among `tokens`.
    ended: bool = False
    # Wall seconds from the previous step's end (or the prefill's) to this one's: the guess, the check and
    # everything between steps (the engine's own work, whoever reads the events), so that the steps' spans
    # add up to `Stats.wall_s`, the time behind the tok/s a user sees. 0: not measured (a step made up).
    span_s: float = 0.0

    @property
    def drafted_token_s(self) -> float | None:
        """What each token a drafting model (DRAFTERS) drafted took it, its catching up with earlier steps left
        out; None where none drafted."""
        return (self.draft_s - self.sync_s) / self.drafted if self.drafted and self.guesser in DRAFTERS else None


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
    ended: int = 0  # generations that ended on an end-of-generation token, which n_tokens leaves out

    @property
    def produced(self) -> int:
        """Every token the target produced, the end-of-generation token included: what plain decoding would
        spend a step on each of, and what the tokens per step count."""
        return self.n_tokens + self.ended

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
        """Every token a step produced: a plain step makes one, the one that ends the answer included."""
        return self.produced / self.steps if self.steps else 0.0

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
                     self.draft_s + step.draft_s, self.verify_s + step.verify_s, self.wall_s,
                     self.ended + step.ended)

    def speedup(self, plain_s: float) -> float | None:
        """Against plain decoding, where one plain step costs plain_s (None: not known): the seconds plain
        decoding would have spent on every token produced, over the seconds these steps took. Every step
        costs at least a plain step, so it can never be more than the tokens per step: a larger ratio is
        noise, and is cut there."""
        if not plain_s or not self.decode_s or not self.produced:
            return None
        return min(self.produced * plain_s / self.decode_s, max(1.0, self.tokens_per_step))


@dataclass(frozen=True)
class Done:
    reason: str  # "eog", "max_tokens", "stop", "cancelled", "context_full"; "tool_calls": it ended after calls
    text: str  # the whole answer
    token_ids: tuple[int, ...]  # every generated token, the end-of-generation token included
    stats: Stats


Event = Union[Prefill, Step, Done]
