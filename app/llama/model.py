"""A thin wrapper over llama.cpp's low-level API: one model, one context, one sequence.

The context's cache is the model's `Session` (`specchat.llama.session`), with a rewind that works on
every kind of memory llama.cpp has; `memory` says which kind this model's is.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Iterable

import llama_cpp
from llama_cpp import _internals

from specchat.errors import SpecchatError
from specchat.llama.cores import FITTER
from specchat.llama.loading import extra_buffers, llama_errors, open_gguf, token_piece
from specchat.llama.mtp import ASSISTANTS
from specchat.llama.session import Memory, Session

_OFFLOAD_ALL_LAYERS = 999  # Metal and CUDA builds offload everything; CPU builds ignore it.
# Snapshots of a recurrent state that llama.cpp keeps for stepping back (where the architecture allows
# it): a verification of up to this many guesses is taken back with no copy. Each costs one more copy
# of the recurrent state in memory, so a few; longer rewinds use checkpoints.
ROLLBACK_SNAPSHOTS = 4
TREE_BRANCHES = 4  # the most leaves a tree of guesses may have: llama.cpp sequences per context
# The size of each cache llama.cpp allocates for a context, as it reports it (no API says).
_CACHE_SIZE = re.compile(r"llama_(?:kv_cache|memory_recurrent): size = +([\d.]+) MiB")


class Model:
    """A GGUF model loaded in llama.cpp with one context for a single sequence."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, n_gpu_layers: int | None = None, swa_full: bool = True,
                 tree_branches: int | None = None) -> None:
        self.path = Path(path)
        gpu_layers = _OFFLOAD_ALL_LAYERS if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        mparams.use_extra_bufts = extra_buffers()
        mparams.load_mtp = True  # a model's own MTP (NextN) layers, for the mtp guesser; none: nothing
        self._model = open_gguf(self.path, mparams)
        self._refuse_assistant()
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)  # the most it uses
        self.threads = self.n_threads  # what it uses now (fewer while other programs take cores: `cores`)
        self.fitted = n_threads is None  # a thread count given is kept
        model = self._model.model
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        n_batch = min(n_batch, n_ctx)  # llama.cpp asserts a batch never exceeds the context
        try:
            self._open_context(self._context_params(n_ctx, n_batch, gpu_layers, swa_full, tree_branches))
        except BaseException:
            self._model.close()  # the weights go with the context that could not be made: nothing is left held
            raise
        self._read_back(n_batch)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._shown: set[int] = set()  # control tokens whose text is shown all the same (`show`)
        self._controls: dict[str, int] | None = None  # every control token, by its text (read once, by `show`)
        self.session = Session(self)
        if self.fitted:
            FITTER.contexts.add(self)

    def _refuse_assistant(self) -> None:
        """Fail with one line where the file is another model's MTP layers, not a model of its own."""
        arch = self._model.metadata().get("general.architecture", "")
        if arch in ASSISTANTS:
            self._model.close()
            raise SpecchatError(f"{self.path.name} is a {arch} file: the MTP layers of another model, not a model of "
                                "its own; give it as --draft to the model it was made for")

    def _context_params(self, n_ctx: int, n_batch: int, gpu_layers: int, swa_full: bool,
                        tree_branches: int | None) -> llama_cpp.llama_context_params:
        """The context asked of llama.cpp: its size, batch and threads, and what the memory needs to take guesses
        back (snapshots for a recurrent state, sequences over one cache for trees)."""
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        # A sliding-window model's cache of full size (llama.cpp's default, said here so that it stays so):
        # positions can then be dropped from the end at any depth, as in any attention cache. The smaller
        # one reuses the cells that fell out of the window, and a rewind past them would read garbage.
        cparams.swa_full = swa_full  # False only to measure what the full size costs (`specchat costs`)
        if self.recurrent:
            cparams.n_rs_seq = ROLLBACK_SNAPSHOTS  # llama.cpp grants none where the architecture cannot
            return cparams
        # A tree of guesses is verified as several sequences over one cache (`Session.decode_tree`):
        # unified, so that they share the context's cells rather than each getting a slice of them.
        # By default only where verifying more positions is nearly free (offloaded to a GPU): on a CPU
        # trees do not pay, and such a context gains nothing there (bench/tree_context: 0.96x to
        # 1.03x plain and lookup speed on this project's 2-core CPU, within noise).
        if tree_branches is None:
            offload = gpu_layers > 0 and llama_cpp.llama_supports_gpu_offload()
            tree_branches = TREE_BRANCHES if offload else 1
        if tree_branches > 1:
            cparams.n_seq_max, cparams.kv_unified = tree_branches, True
        return cparams

    def _open_context(self, cparams: llama_cpp.llama_context_params) -> None:
        """The context made, and what its caches take in memory read from llama.cpp's log (no API says)."""
        with llama_errors(level=2) as log:
            try:
                self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=False)
            except ValueError:
                raise SpecchatError(f"llama.cpp could not create a {cparams.n_ctx}-token context for {self.path} "
                                    "(out of memory? try a smaller --ctx)") from None
        # every cache it allocated: attention, sliding window, recurrent state
        self.cache_mib = sum(float(m[1]) for line in log if (m := _CACHE_SIZE.search(line)))

    def _read_back(self, n_batch: int) -> None:
        """What llama.cpp made of the file and granted the context: sizes, the kind of memory, the name."""
        model = self._model.model
        self.vocab = self._model.vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx.ctx)
        self.n_batch = n_batch
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))  # sliding-window models keep a full-size cache
        self.n_nextn = int(llama_cpp.llama_model_n_layer_nextn(model))  # MTP layers, loaded with the model
        self.rollback_depth = int(llama_cpp.llama_n_rs_seq(self._ctx.ctx)) if self.recurrent else 0
        self.memory = Memory.TRIM if not self.recurrent else Memory.ROLLBACK if self.rollback_depth else \
            Memory.CHECKPOINT
        self.tree_branches = int(llama_cpp.llama_n_seq_max(self._ctx.ctx)) if not self.recurrent else 1
        self.metadata = self._model.metadata()
        self.name = self.metadata.get("general.name", self.path.stem)

    # --- tokenizer -------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos, special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (possibly part of a UTF-8 character); control tokens
        such as <|im_end|> are empty unless `special` or shown (`show`)."""
        return token_piece(self.vocab, token, self._piece_buf, special or token in self._shown)

    def show(self, markers: Iterable[str]) -> None:
        """Show the text of each marker that is one control token of this vocabulary, as llama.cpp's server
        keeps a template's "preserved tokens": a model whose `</think>` is a control token would otherwise
        stream it as nothing, and its thinking would never be told from its answer. Found by the vocabulary's
        own text, not by tokenizing the marker, which aborts the process on some tokenizers."""
        if self._controls is None:
            self._controls = {self.token_text(t): t for t in range(self.n_vocab) if self.is_control(t)}
        self._shown |= {self._controls[m] for m in markers if m in self._controls}

    def token_text(self, token: int) -> str:
        """The vocabulary entry itself, special tokens included, for messages and compatibility."""
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", "replace")

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self.vocab, token))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def bos_text(self) -> str:
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        return self.token_text(bos) if bos >= 0 else ""

    @property
    def eos_text(self) -> str:
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        return self.token_text(eos) if eos >= 0 else ""

    @property
    def cache_key(self) -> str:
        """What a measurement of this model's speed depends on: file, backend, threads."""
        backend = "gpu" if llama_cpp.llama_supports_gpu_offload() else "cpu"
        return f"{self.path.resolve()}|{self.path.stat().st_size}|{backend}|{self.n_threads}"

    @property
    def vocab_type(self) -> int:
        return int(llama_cpp.llama_vocab_type(self.vocab))

    def use_threads(self, n: int) -> None:
        """Decode with n threads from now on (llama.cpp's kernels give the same logits for any count)."""
        if n != self.threads:
            llama_cpp.llama_set_n_threads(self._ctx.ctx, n, n)
            self.threads = n

    def close(self) -> None:
        FITTER.contexts.discard(self)
        self.session.close()
        self._ctx.close()
        self._model.close()
