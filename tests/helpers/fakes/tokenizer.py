"""llguidance tokenizers for the scripted models, so that grammars run on them as on a real vocabulary: the
letters model's tokens ('a', 'b', … one byte each), or the text model's bytes and special tokens."""

from __future__ import annotations

import llguidance

from fakes.model import SPECIALS


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: each token's bytes (a special token's marked with 0xff, as
    llguidance's own llama.cpp reader marks them), the end token, and a tokenizer (specials parsed)."""

    def __init__(self, tokens: list[bytes], specials: dict[bytes, int], eos: int) -> None:
        self.tokens, self.special_token_ids = tokens, sorted(specials.values())
        self.eos_token_id, self.bos_token_id = eos, None
        self._specials, self._bytes = specials, {t: i for i, t in enumerate(tokens) if i not in specials.values()}

    def __call__(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        out, i = [], 0
        while i < len(data):
            special = next(((name, t) for name, t in self._specials.items() if data.startswith(name, i)), None)
            if special is not None:
                out.append(special[1])
                i += len(special[0])
            else:
                out.append(self._bytes[data[i:i + 1]])
                i += 1
        return out


def letters(n_vocab: int = 6) -> llguidance.LLTokenizer:
    """The letters model's vocabulary ('a' for token 0), and one token more that it never emits: the
    grammar's end, which llguidance needs (and a wider vocabulary than the model's)."""
    tokens = [bytes([97 + i]) for i in range(n_vocab)] + [b"\xff<end>"]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokens, {b"<end>": n_vocab}, n_vocab)))


def text(extra: tuple[str, ...] = ()) -> llguidance.LLTokenizer:
    """The text model's: 256 bytes, then the chat format's special tokens (the last ends a turn), then `extra`
    special tokens (Qwen's `<tool_call>`, say), which the scripted model does not have."""
    names = [*SPECIALS, *extra]
    specials = {name.encode(): 256 + i for i, name in enumerate(names)}
    tokens = [bytes([i]) for i in range(256)] + [b"\xff" + name.encode() for name in names]
    eos = 256 + SPECIALS.index("<|im_end|>")
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokens, specials, eos)))
