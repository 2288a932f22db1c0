"""A scripted model and its cache, in the shape the engine, the service and the loader use, with no
weights: the logits after a context are a fixed random function of its last tokens, and a token is one
byte of text (or a special token), so chat text goes in and out as it does with a real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from specchat.decoding.verify import Tree
from specchat.llama.session import Memory, is_chain, reusable

# A chat format in the shape of ChatML: what a real instruct model's template renders.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|im_start|>", "<|im_end|>")


class ScriptedSession:
    """A cache that holds tokens; what it decodes is scored by the model's script. Rewinding drops
    positions (an attention cache) unless the model keeps a state that can neither be cut nor saved."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model, self.tokens = model, []
        self.memory = model.memory
        self.decoded = 0  # positions evaluated in all, prompt included: what reusing the cache saves

    def reusable(self, tokens: Sequence[int]) -> int:
        return reusable(self.tokens, tokens)

    def prefill(self, tokens: Sequence[int]) -> int:
        cached = self.reusable(tokens)
        self.rewind(cached)
        self.decoded += len(tokens) - 1 - len(self.tokens)
        self.tokens.extend(tokens[len(self.tokens):-1])
        return cached

    def rewind(self, n: int) -> None:
        del self.tokens[n:]

    def checkpoint(self, lasting: bool = False, reach: int | None = None) -> None:
        pass

    def can_take_back(self) -> bool:
        return self.memory is not Memory.RESTART

    def clear(self) -> None:
        self.tokens = []

    def decode(self, tokens: Sequence[int], logits: str = "last") -> np.ndarray:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.decoded += len(tokens)
        rows = np.stack([self.model.logits(self.tokens[:start + i + 1]) for i in range(len(tokens))])
        return rows if logits == "all" else rows[-1:]

    def decode_guesses(self, pending: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        self._guessed = len(self.tokens) if is_chain(parents) else None
        if self._guessed is not None:
            return self.decode([pending, *tokens], "all")
        return self.decode_tree(pending, tokens, parents)

    def keep(self, path: Sequence[int]) -> None:
        if self._guessed is None:
            self.keep_path(path)
        else:
            self.rewind(self._guessed + 1 + len(path))

    def decode_tree(self, pending: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        self.tokens.append(pending)
        self._tree = (list(tokens), list(parents))
        tree = Tree(tuple(tokens), tuple(parents), (None,) * len(tokens))
        return np.stack([self.model.logits(self.tokens + [tokens[n] for n in path])
                         for path in ([], *(tree.path(i) for i in range(len(tokens))))])

    def keep_path(self, path: Sequence[int]) -> None:
        self.tokens.extend(self._tree[0][n] for n in path)


class ScriptedModel:
    """`vocab` tokens: with `text`, the 256 bytes then the chat format's special tokens (the last is the end
    of a turn); without, letters from 'a'. The logits after a context are a random table of its last
    `order` tokens, drawn from `seed`, `sharpness` their spread."""

    n_batch, tree_branches, n_threads, n_nextn = 64, 4, 1, 0
    add_bos, bos_text, eos_text = False, "", "<|im_end|>"

    def __init__(self, seed: int = 0, sharpness: float = 1.0, vocab: int = 6, order: int = 2, n_ctx: int = 256,
                 text: bool = False, name: str = "scripted", memory: Memory = Memory.TRIM,
                 path: Path | None = None) -> None:
        self.text, self.shown = text, set[int]()
        self.n_vocab = 256 + len(SPECIALS) if text else vocab
        self.order, self.n_ctx, self.name, self.memory = order, n_ctx, name, memory
        self.path = path or Path(f"{name}.gguf")
        self.table = np.random.default_rng(seed).normal(0, sharpness, (self.n_vocab,) * (order + 1))
        self.metadata = {"tokenizer.chat_template": TEMPLATE} if text else {}
        self.cache_key = f"scripted:{name}:{seed}:{sharpness}:{self.n_vocab}"
        self.session = ScriptedSession(self)
        self.closed = False

    @classmethod
    def from_file(cls, path: Path, n_ctx: int = 256, **_: object) -> ScriptedModel:
        """The model a file describes (JSON of this constructor's arguments), as the loader opens one."""
        spec = json.loads(Path(path).read_text())
        return cls(**{**spec, "memory": Memory[spec.get("memory", "TRIM")]}, n_ctx=n_ctx, path=Path(path))

    def logits(self, context: Sequence[int]) -> np.ndarray:
        last = [0] * max(0, self.order - len(context)) + list(context[-self.order:])
        return self.table[tuple(last)]

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        tokens, data = [], text.encode("utf-8")
        i = 0
        while i < len(data):
            for n, name in enumerate(SPECIALS):
                if special and data.startswith(name.encode(), i):
                    tokens.append(256 + n)
                    i += len(name)
                    break
            else:
                tokens.append(data[i])
                i += 1
        return tokens

    def piece(self, token: int, special: bool = False) -> bytes:
        if not self.text:
            return bytes([97 + token])
        if token >= 256:
            return SPECIALS[token - 256].encode() if special or token in self.shown else b""
        return bytes([token])

    def show(self, markers: Iterable[str]) -> None:  # as Model.show
        for marker in markers:
            tokens = self.tokenize(marker, add_bos=False) if marker else []
            if len(tokens) == 1 and self.is_control(tokens[0]):
                self.shown.add(tokens[0])

    def token_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("latin-1")

    def is_control(self, token: int) -> bool:
        return self.text and token >= 256

    def is_eog(self, token: int) -> bool:
        return self.text and token == self.n_vocab - 1

    def close(self) -> None:
        self.closed = True


class _AnsweringSession(ScriptedSession):
    def prefill(self, tokens: Sequence[int]) -> int:
        self.model.prompt_len = len(tokens)  # type: ignore[attr-defined]
        return super().prefill(tokens)


class AnsweringModel(ScriptedModel):
    """A text model that answers every prompt with `answer`, byte for byte, then ends the turn: for tests of what
    a front end makes of chosen text (a tool call, a malformed one) through the real service and engine.
    `template` is the chat template its GGUF would carry, any template (the answer starts where the prompt the
    engine prefilled ends). Every guess but the answer's own next byte is rejected, as a real model would."""

    def __init__(self, answer: str = "Hello.", template: str = TEMPLATE, n_ctx: int = 4096,
                 name: str = "answering") -> None:
        super().__init__(text=True, order=1, n_ctx=n_ctx, name=name)
        self.answer = answer
        self.metadata = {"tokenizer.chat_template": template}
        self.session = _AnsweringSession(self)
        self.prompt_len = 0  # the last prompt's length: where the answer starts

    def logits(self, context: Sequence[int]) -> np.ndarray:
        # The answer's next byte, far above every other token: greedy or sampled, the same answer.
        wanted, done = self.answer.encode(), len(context) - self.prompt_len
        token = wanted[done] if 0 <= done < len(wanted) else self.n_vocab - 1  # then the end of the turn
        row = np.full(self.n_vocab, -50.0)
        row[token] = 50.0
        return row
