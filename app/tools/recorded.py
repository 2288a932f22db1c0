"""Recorded answers and the cost curves they are replayed on: what `bench/corpus record` writes and every
replay of it reads.

`bench/corpus record` has the target answer each prompt of a corpus plainly (greedy, and sampled) and keeps,
per answer position, what the draft model would have guessed there and how sure each model was. Every
guess's fate can then be read off the text: a copy or a greedy draft is kept while it equals the answer, and
at T > 0 a copied token is kept exactly when it equals the token sampled there (the exact rule keeps a
point-mass guess x with probability p(x), and the residual never gives x: "kept" and "sampled x" are one
event). So a guesser can be replayed over a recorded answer step by step (`specchat.tools.replay`).

Each prompt falls in one of two folds by a hash of its text: priors are fitted on "fit" and every figure
that judges them is quoted on "held-out".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specchat.decoding.policy import CostCurve
from specchat.errors import SpecchatError

FOLDS = ("fit", "held-out")


def fold(prompt: str) -> str:
    """The prompt's fold, fixed by its text: the same on every machine and in every run."""
    return FOLDS[hashlib.sha256(prompt.encode("utf-8")).digest()[0] % 2]


@dataclass(frozen=True)
class Answer:
    """One recorded answer: the prompt's tokens, the target's answer, and per answer position the draft's
    greedy guess and its probability (empty where no draft was recorded) and the target's probability of its
    most likely token there, at T = 1 (its confidence; empty where not recorded)."""

    task: str
    fold: str
    temperature: float
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    draft_guess: tuple[int, ...] = ()
    draft_p: tuple[float, ...] = ()
    target_p: tuple[float, ...] = ()

    @property
    def seq(self) -> list[int]:
        return [*self.prompt, *self.answer]

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "fold": self.fold, "temperature": self.temperature,
                           "prompt": self.prompt, "answer": self.answer, "draft_guess": self.draft_guess,
                           "draft_p": [round(p, 4) for p in self.draft_p],
                           "target_p": [round(p, 4) for p in self.target_p]})


def load_answers(path: Path) -> list[Answer]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecchatError(f"cannot read recorded answers {path}: {e.strerror} (record them with bench/corpus record)")
    answers = []
    for n, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            answers.append(Answer(d["task"], d["fold"], float(d["temperature"]), tuple(d["prompt"]),
                                  tuple(d["answer"]), tuple(d.get("draft_guess", ())), tuple(d.get("draft_p", ())),
                                  tuple(d.get("target_p", ()))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SpecchatError(f"{path}:{n}: not a recorded answer ({e}); record again with bench/corpus record")
    return answers


def by(answers: Sequence[Answer], task: str | None = None, fold_: str | None = None,
       temperature: float | None = None) -> list[Answer]:
    return [a for a in answers if (task is None or a.task == task) and (fold_ is None or a.fold == fold_)
            and (temperature is None or a.temperature == temperature)]


def load_curves(path: Path) -> dict[str, tuple[CostCurve, str]]:
    """Named cost curves users have, with their sources: {name: {"verify_ratio": [...], "draft_ratio": r,
    "source": s}}, each as a curve whose one position costs 1 (only ratios decide)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SpecchatError(f"cannot read cost curves {path}: {e}")
    return {name: (CostCurve(list(map(float, c["verify_ratio"])), float(c["draft_ratio"])), str(c["source"]))
            for name, c in data.items()}
