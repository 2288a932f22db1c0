"""Tokenizers: a GGUF file's vocabulary read without its weights, and whether two of them match.

A draft must speak its target's tokenizer: its guesses are token ids, and the target judges
them as its own. Reading only the vocabulary (llama.cpp's `vocab_only`) takes a fraction of a
second even for a 7B model, so a whole disk of models can be checked while the user waits.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Protocol

import llama_cpp

from specchat.errors import SpecchatError
from specchat.llama.loading import open_gguf, token_piece

# Vocabularies may differ by a few extra entries (padding, added special tokens) at the end:
# the catalog's Qwen2.5 7B has 152,064 tokens and its 0.5B draft 151,936. Beyond this, they are
# different tokenizers.
MAX_VOCAB_DIFFERENCE = 128


class Tokenizer(Protocol):
    """What a compatibility check reads: a loaded Model or a VocabFile."""

    path: Path
    n_vocab: int

    def token_text(self, token: int) -> str: ...

    def is_control(self, token: int) -> bool: ...


class VocabFile:
    """A GGUF file's tokenizer and metadata, without its weights."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = open_gguf(self.path, params)
        self._vocab = self._model.vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.metadata: dict[str, Any] = self._model.metadata()
        self._piece_buf = ctypes.create_string_buffer(256)

    @property
    def quantization(self) -> str:
        """The weights' type as llama.cpp names it (Q4_K_M, Q8_0...), from the file's metadata."""
        ftype = self.metadata.get("general.file_type")
        names = {value: key.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
                 for key, value in vars(llama_cpp).items() if key.startswith("LLAMA_FTYPE_") and isinstance(value, int)}
        return names.get(int(ftype), "?") if ftype is not None and str(ftype).isdigit() else "?"

    @property
    def mtp_layers(self) -> int:
        """The file's own MTP (NextN) layers: a draft it carries inside (0: none)."""
        arch = self.metadata.get("general.architecture", "")
        return int(self.metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", "replace")

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token))

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for, as a loaded Model's `piece` gives them (auto reads them to resume a copy)."""
        return token_piece(self._vocab, token, self._piece_buf)

    def close(self) -> None:
        self._model.close()

    def __enter__(self) -> "VocabFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def incompatibility(target: Tokenizer, draft: Tokenizer) -> str | None:
    """Why `draft` cannot draft for `target`, or None if it can."""
    for token in range(min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            special = " (a special token: the models come from different families, with different chat formats)" \
                if target.is_control(token) or draft.is_control(token) else ""
            return f"token {token} is {a!r} in the target but {b!r} in the draft{special}"
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_DIFFERENCE:
        return f"the draft has {draft.n_vocab} tokens and the target {target.n_vocab}"
    return None


def check_compatible(target: Tokenizer, draft: Tokenizer) -> None:
    """Raise a one-line error if `draft` cannot draft for `target`."""
    why = incompatibility(target, draft)
    if why is not None:
        raise SpecchatError(f"draft {draft.path.name} is incompatible with target {target.path.name}: {why}; "
                            "pick a draft of the same model family (`specchat drafts TARGET` lists them)")
