"""A thin wrapper over llama.cpp's low-level API: one model, one context, one sequence.

The context's cache is the model's `Session` (`specchat.llama.session`), with a rewind that works on
every kind of memory llama.cpp has; `memory` says which kind this model's is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Iterator

import llama_cpp
from llama_cpp import _internals, _logger

from specchat.errors import SpecchatError
from specchat.llama.mtp import ASSISTANTS
from specchat.llama.session import Memory, Session

GGUF_MAGIC = b"GGUF"
_OFFLOAD_ALL_LAYERS = 999  # Metal and CUDA builds offload everything; CPU builds ignore it.
# Snapshots of a recurrent state that llama.cpp keeps for stepping back (where the architecture allows
# it): a verification of up to this many guesses is taken back with no copy. Each costs one more copy
# of the recurrent state in memory, so a few; longer rewinds use checkpoints.
ROLLBACK_SNAPSHOTS = 4
TREE_BRANCHES = 4  # the most leaves a tree of guesses may have: llama.cpp sequences per context


def _extra_buffers() -> bool:
    """Whether llama.cpp may keep weights in its extra CPU layouts (AMX tiles, repacked blocks).

    They speed up batched evaluation, but the AMX path of the llama.cpp that llama-cpp-python
    0.3.36 vendors crashes the process (SIGSEGV in ggml_backend_amx_mul_mat) on every batch of two
    or more tokens, seen on Xeon VMs that advertise AMX and grant it. So they stay off where the CPU
    has AMX; SPECCHAT_EXTRA_BUFFERS=1 (or 0) decides otherwise."""
    chosen = os.environ.get("SPECCHAT_EXTRA_BUFFERS", "")
    if chosen in ("0", "1"):
        return chosen == "1"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return not any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:  # not Linux: no AMX to trip over
        return True


_backend_ready = False
_GGML_LOG_LEVEL_ERROR = 4  # ggml.h of the vendored llama.cpp (llama-cpp-python's _logger comment is stale)
# llama.cpp's own log is for debugging llama.cpp. llama-cpp-python's logger maps the vendored levels
# one off (its WARN is ggml's INFO), so it printed llama.cpp's warnings over a one-line error: it gets
# the lines only when asked for.
_FORWARD_LOG = os.environ.get("SPECCHAT_LLAMA_LOG") == "1"
_logger.set_verbose(_FORWARD_LOG)
_load_log = threading.local()  # .lines, .level: what llama.cpp logs while this thread loads a model
# The size of each cache llama.cpp allocates for a context, as it reports it (no API says).
_CACHE_SIZE = re.compile(r"llama_(?:kv_cache|memory_recurrent): size = +([\d.]+) MiB")


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp says why a model failed to load only in its log (the API just returns NULL), so
    # the loading thread keeps its error lines (and, while it makes a context, what it allocates).
    lines = getattr(_load_log, "lines", None)
    if lines is not None and level >= _load_log.level:
        lines.append(text.decode("utf-8", "replace").strip())
    if _FORWARD_LOG:
        _logger.llama_log_callback(level, text, user_data)


llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))


def check_gguf(path: Path) -> None:
    """Fail with one clear line before llama.cpp sees a file that cannot be a model."""
    if not path.exists():
        raise SpecchatError(f"model file not found: {path} (run `specchat pull NAME` or give an existing path)")
    if path.is_dir():
        raise SpecchatError(f"model path is a directory, not a .gguf file: {path} (give the .gguf file in it)")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SpecchatError(f"cannot read model file {path}: {e.strerror} (check its permissions)") from None
    if not magic:
        raise SpecchatError(f"model file is empty: {path} (an interrupted copy or download? fetch it again)")
    if magic != GGUF_MAGIC:
        raise SpecchatError(f"not a GGUF model file: {path} (expected a .gguf file from llama.cpp's converter)")


@contextlib.contextmanager
def _llama_errors(level: int = _GGML_LOG_LEVEL_ERROR) -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread inside the block, from `level` up (ggml's: 2 is INFO)."""
    lines: list[str] = []
    _load_log.lines, _load_log.level = lines, level
    try:
        yield lines
    finally:
        _load_log.lines = None


def _load_error(path: Path, log: list[str]) -> SpecchatError:
    """One line saying why llama.cpp refused the model file, from the error lines it logged."""
    # The loader's verdict is "…: error loading model: REASON"; when REASON is only "failed to load
    # model from PATH", the GGUF reader's line before it has the cause ("failed to read key-value pairs").
    verdict = next((line.split("error loading model: ", 1)[1] for line in log if "error loading model: " in line), "")
    reason = verdict if verdict and "failed to load model from" not in verdict else (log[0] if log else "")
    reason = re.sub(r"^\w+: ", "", reason) or "no reason logged"
    arch = re.fullmatch(r"unknown model architecture: '(.*)'", reason)
    if arch:
        return SpecchatError(f"llama.cpp could not load {path}: its model architecture {arch[1]!r} is unknown to "
                             f"this llama.cpp (llama-cpp-python {llama_cpp.__version__}); use a model of a supported "
                             "architecture, or upgrade llama-cpp-python")
    return SpecchatError(f"llama.cpp could not load {path}: {reason}; the file is truncated or damaged, fetch it "
                         "again (`specchat pull NAME`) or copy it anew")


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process, before the first model is read."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


class Model:
    """A GGUF model loaded in llama.cpp with one context for a single sequence."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, n_gpu_layers: int | None = None, swa_full: bool = True,
                 tree_branches: int | None = None) -> None:
        self.path = Path(path)
        check_gguf(self.path)
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = _OFFLOAD_ALL_LAYERS if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
        mparams.use_extra_bufts = _extra_buffers()
        mparams.load_mtp = True  # a model's own MTP (NextN) layers, for the mtp guesser; none: nothing
        with _llama_errors() as log:
            try:
                self._model = _internals.LlamaModel(path_model=str(self.path), params=mparams, verbose=False)
            except ValueError:
                raise _load_error(self.path, log) from None
        arch = self._model.metadata().get("general.architecture", "")
        if arch in ASSISTANTS:
            self._model.close()
            raise SpecchatError(f"{self.path.name} is a {arch} file: the MTP layers of another model, not a model of "
                                "its own; give it as --draft to the model it was made for")
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        n_batch = min(n_batch, n_ctx)  # llama.cpp asserts a batch never exceeds the context
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        # A sliding-window model's cache of full size (llama.cpp's default, said here so that it stays so):
        # positions can then be dropped from the end at any depth, as in any attention cache. The smaller
        # one reuses the cells that fell out of the window, and a rewind past them would read garbage.
        cparams.swa_full = swa_full  # False only to measure what the full size costs (`specchat costs`)
        model = self._model.model
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        if self.recurrent:
            cparams.n_rs_seq = ROLLBACK_SNAPSHOTS  # llama.cpp grants none where the architecture cannot
        else:
            # A tree of guesses is verified as several sequences over one cache (`Session.decode_tree`):
            # unified, so that they share the context's cells rather than each getting a slice of them.
            # By default only where verifying more positions is nearly free (offloaded to a GPU): on a CPU
            # trees do not pay, and such a context gains nothing there (bench/tree_context: 0.96x to
            # 1.03x plain and lookup speed on this project's 2-core CPU, within noise).
            if tree_branches is None:
                offload = mparams.n_gpu_layers > 0 and llama_cpp.llama_supports_gpu_offload()
                tree_branches = TREE_BRANCHES if offload else 1
            if tree_branches > 1:
                cparams.n_seq_max, cparams.kv_unified = tree_branches, True
        with _llama_errors(level=2) as log:
            try:
                self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=False)
            except ValueError:
                raise SpecchatError(f"llama.cpp could not create a {n_ctx}-token context for {self.path} "
                                    "(out of memory? try a smaller --ctx)") from None
        # What the context's caches take in memory (attention, sliding window, recurrent state).
        self.cache_mib = sum(float(m[1]) for line in log if (m := _CACHE_SIZE.search(line)))
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
        self._piece_buf = ctypes.create_string_buffer(256)
        self.session = Session(self)

    # --- tokenizer -------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos, special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (possibly part of a UTF-8 character); control tokens
        such as <|im_end|> are empty unless `special`."""
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        if n < 0:  # llama.cpp says how many bytes the piece needs: a longer buffer for this one
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

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

    def close(self) -> None:
        self.session.close()
        self._ctx.close()
        self._model.close()
