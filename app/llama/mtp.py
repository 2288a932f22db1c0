"""A target's own multi-token-prediction (MTP, NextN) layers, as a draft that costs one layer a token.

Models such as Qwen3.5/3.6, DeepSeek and GLM ship a layer trained to predict the token after next
from the model's last hidden state; Gemma 4 ships the same as a separate "assistant" GGUF. llama.cpp
runs it in a second context of type MTP over the same weights (or the assistant's), as llama-server's
draft-mtp and llama-cpp-python's MTPDraftProvider do:

- the target's context hands out its hidden state h for every token it decodes
  (`llama_set_embeddings_nextn`);
- the head's own attention cache holds one row per position p of the target's: (token x_p, h_{p-1}).
  So the head follows the target's session (`Follower`): every target decode is decoded into it too,
  and every rewind of the target rewinds it. An assistant that reads the target's cache directly (the
  memory is shared) needs neither;
- to draft, the head takes (the pending token, h of the position before it), gives logits for the
  next token, and its own hidden state stands in for the target's for the step after.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext as ext

from specchat.errors import SpecchatError
from specchat.llama.cores import FITTER
from specchat.llama.loading import extra_buffers, open_gguf

if TYPE_CHECKING:
    from specchat.llama.model import Model


# What an assistant reads of its target's cache must have the shape it expects: llama.cpp checks
# none of it, and a mismatch reads the wrong cells rather than failing (llama-kv-cache.cpp's views).
_SHARED_SHAPE = ("attention.key_length", "attention.key_length_swa", "attention.head_count_kv",
                 "attention.sliding_window")
_TARGET_OF = {"gemma4-assistant": "gemma4"}
ASSISTANTS = frozenset(_TARGET_OF)  # architectures of MTP layers made for another model (Gemma 4's drafters)


def _assistant_mismatch(target: dict[str, str], assistant: dict[str, str]) -> str | None:
    """Why an assistant file cannot draft for this target, or None."""
    arch, target_arch = assistant.get("general.architecture", ""), target.get("general.architecture", "")
    if arch in _TARGET_OF and target_arch != _TARGET_OF[arch]:
        return f"it drafts for {_TARGET_OF[arch]} models and the target is {target_arch or 'of no known kind'}"
    for key in _SHARED_SHAPE:
        ours, theirs = target.get(f"{target_arch}.{key}"), assistant.get(f"{arch}.{key}")
        if ours != theirs:
            return f"its {key} is {theirs} and the target's {ours}"
    return None


class MtpHead:
    """The MTP layers of `target` (or of an assistant file made for it), kept in step with its cache."""

    def __init__(self, target: Model, assistant: Path | None = None) -> None:
        self.target, self._assistant = target, None
        what = f"{assistant.name}" if assistant is not None else f"the MTP layers of {target.path.name}"
        model = target._model.model if assistant is None else self._load_assistant(assistant, what)
        self._check_fits(model, what)
        self._ctx = self._new_context(model, what)
        # The assistant reads the target's cache itself: nothing to follow, every draft step at one position.
        self.shared = bool(ext.llama_get_ctx_other(self._ctx))
        ext.llama_set_embeddings_nextn(target._ctx.ctx, True, False)  # h for every token the target decodes
        ext.llama_set_embeddings_nextn(self._ctx, True, True)  # the head's h for its logits rows only
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(target.n_batch, self.n_embd, 1)
        # llama_batch_init gives an embeddings batch no token array; the head's rows need both.
        self._tokens = (llama_cpp.llama_token * target.n_batch)()
        self._batch.token = ctypes.cast(self._tokens, ctypes.POINTER(llama_cpp.llama_token))
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(target.n_batch, self.n_embd))
        # The target's h at every position it holds: a rewind makes an earlier one the next input.
        self._h = np.zeros((target.n_ctx, self.n_embd), dtype=np.float32)
        self.n = 0  # positions the head's cache follows
        self._drafted = 0
        target.session.followers.append(self)
        self.rewound(len(target.session.tokens))
        self.n_threads = self.threads = target.n_threads
        if target.fitted:  # the head's threads follow the free cores as the target's do
            FITTER.contexts.add(self)

    def _load_assistant(self, assistant: Path, what: str) -> llama_cpp.llama_model_p:
        """An assistant file's layers (Gemma 4's drafters), refused unless made for this target's shape."""
        params = llama_cpp.llama_model_default_params()
        params.load_mtp, params.use_extra_bufts = True, extra_buffers()
        self._assistant = open_gguf(assistant, params)
        mismatch = _assistant_mismatch(self.target.metadata, self._assistant.metadata())
        if mismatch:
            self.close()
            raise SpecchatError(f"{what} was not made for {self.target.path.name}: {mismatch}")
        return self._assistant.model

    def _check_fits(self, model: llama_cpp.llama_model_p, what: str) -> None:
        """Fail with one line unless `model` has MTP layers that read the target's hidden state and vocabulary;
        sets the hidden size."""
        target = self.target
        if llama_cpp.llama_model_n_layer_nextn(model) < 1:
            self.close()  # an assistant's weights, loaded for nothing
            raise SpecchatError(f"{what}: no MTP (NextN) layers to draft with")
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model) or llama_cpp.llama_model_n_embd(model))
        target_embd = int(llama_cpp.llama_model_n_embd_out(target._model.model) or
                          llama_cpp.llama_model_n_embd(target._model.model))
        if self.n_embd != target_embd or llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)) \
                != target.n_vocab:
            self.close()
            raise SpecchatError(f"{what} was not made for {target.path.name}: its hidden size or vocabulary differs")

    def _new_context(self, model: llama_cpp.llama_model_p, what: str) -> llama_cpp.llama_context_p:
        """llama.cpp's MTP context over `model`, beside the target's and of its size, batch and threads."""
        target = self.target
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = target.n_ctx, target.n_batch, target.n_batch
        p.n_threads = p.n_threads_batch = target.n_threads
        p.ctx_type, p.n_rs_seq, p.no_perf, p.swa_full = llama_cpp.LLAMA_CONTEXT_TYPE_MTP, 0, True, True
        p.ctx_other = target._ctx.ctx
        ctx = llama_cpp.llama_init_from_model(model, p)
        if not ctx:
            self.close()
            raise SpecchatError(f"llama.cpp could not make an MTP context from {what}; the target runs without it")
        return ctx

    def use_threads(self, n: int) -> None:
        if n != self.threads:
            llama_cpp.llama_set_n_threads(self._ctx, n, n)
            self.threads = n

    # --- following the target ------------------------------------------------------------------

    def decoded(self, tokens: Sequence[int], pos: int) -> None:
        n = len(tokens)
        rows = np.ctypeslib.as_array(ext.llama_get_embeddings_nextn(self.target._ctx.ctx), shape=(n, self.n_embd))
        self._h[pos:pos + n] = rows
        if not self.shared:
            self._decode(tokens, pos, logits=False)
        self.n = pos + n

    def rewound(self, n: int) -> None:
        if not self.shared:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1)
        self.n = min(self.n, n)

    # --- drafting -------------------------------------------------------------------------------

    def begin(self) -> None:
        """Draft from where the target's cache ends (its pending token comes first)."""
        if self.n != len(self.target.session.tokens):
            raise SpecchatError("the MTP head fell out of step with its target")
        self._drafted = 0
        self._h_next = self._h[self.n - 1] if self.n else np.zeros(self.n_embd, dtype=np.float32)

    def step(self, token: int) -> np.ndarray:
        """The head's logits for the token after `token` (the pending token, then each drafted one)."""
        pos = self.n if self.shared else self.n + self._drafted
        self._embd[0] = self._h_next
        self._decode([token], pos, logits=True)
        self._drafted += 1
        self._h_next = np.ctypeslib.as_array(ext.llama_get_embeddings_nextn_ith(self._ctx, 0),
                                             shape=(self.n_embd,)).copy()
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, 0), shape=(self.target.n_vocab,))

    def end(self) -> None:
        """Drop the draft's rows: the head holds again exactly what the target holds."""
        if not self.shared and self._drafted:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, self.n, -1)
        self._drafted = 0

    def _decode(self, tokens: Sequence[int], pos: int, logits: bool) -> None:
        b = self._batch
        b.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos + i, 1, logits and i == len(tokens) - 1
            b.seq_id[i][0] = 0
        if not logits:  # the catch-up row at p pairs x_p with h_{p-1}
            self._embd[0] = self._h[pos - 1] if pos else 0.0
            if len(tokens) > 1:
                self._embd[1:len(tokens)] = self._h[pos:pos + len(tokens) - 1]
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise SpecchatError(f"llama.cpp decode failed with code {rc} in the MTP head of {self.target.name}")

    def close(self) -> None:
        FITTER.contexts.discard(self)
        if self in getattr(self.target.session, "followers", []):
            self.target.session.followers.remove(self)
            ext.llama_set_embeddings_nextn(self.target._ctx.ctx, False, False)
        if getattr(self, "_batch", None) is not None:
            self._batch.token = ctypes.POINTER(llama_cpp.llama_token)()  # ours, not llama.cpp's to free
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._assistant is not None:
            self._assistant.close()
            self._assistant = None
