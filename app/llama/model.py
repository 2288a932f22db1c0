"""A thin wrapper over llama.cpp's low-level API: one model, one context, one sequence.

`Session.tokens` mirrors the KV cache exactly: every decode and rewind updates both or
neither, so an interrupted generation can never leave them out of step, and the next
generation simply reuses the longest common prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Iterator, Literal, Sequence

import llama_cpp
import numpy as np
from llama_cpp import _internals, _logger

from specchat.errors import ContextFull, SpecchatError

GGUF_MAGIC = b"GGUF"
_OFFLOAD_ALL_LAYERS = 999  # Metal and CUDA builds offload everything; CPU builds ignore it.



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
_logger.set_verbose(False)  # llama.cpp's load and context logs are for its own debugging
_GGML_LOG_LEVEL_ERROR = 4  # ggml.h of the vendored llama.cpp (llama-cpp-python's _logger comment is stale)
_load_log = threading.local()  # .lines: llama.cpp's error lines while this thread loads a model


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp says why a model failed to load only in its log (the API just returns NULL), so
    # the loading thread keeps its error lines; all lines still go to llama-cpp-python's logger.
    lines = getattr(_load_log, "lines", None)
    if lines is not None and level == _GGML_LOG_LEVEL_ERROR:
        lines.append(text.decode("utf-8", "replace").strip())
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
def _llama_errors() -> Iterator[list[str]]:
    """The error lines llama.cpp logs on this thread inside the block."""
    _load_log.lines = lines = []
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
                 n_batch: int = 512, n_gpu_layers: int | None = None) -> None:
        self.path = Path(path)
        check_gguf(self.path)
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = _OFFLOAD_ALL_LAYERS if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
        mparams.use_extra_bufts = _extra_buffers()
        with _llama_errors() as log:
            try:
                self._model = _internals.LlamaModel(path_model=str(self.path), params=mparams, verbose=False)
            except ValueError:
                raise _load_error(self.path, log) from None
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        n_batch = min(n_batch, n_ctx)  # llama.cpp asserts a batch never exceeds the context
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        try:
            self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        except ValueError:
            raise SpecchatError(f"llama.cpp could not create a {n_ctx}-token context for {self.path} "
                                "(out of memory? try a smaller --ctx)") from None
        self.vocab = self._model.vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx.ctx)
        self.n_batch = n_batch
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


class Session:
    """The KV cache of a model's context, with the list of tokens it holds."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tokens: list[int] = []
        self._ctx = model._ctx.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(model.n_batch, 0, 1)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None

    def common_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return n

    def prefill(self, tokens: Sequence[int]) -> int:
        """Make the cache hold exactly tokens[:-1], reusing the longest prefix it already holds;
        the last token stays pending, for the step that asks for its logits. Returns how many
        tokens were reused."""
        cached = min(self.common_prefix(tokens), len(tokens) - 1)
        self.rewind(cached)
        if len(tokens) - 1 > cached:
            self.decode(tokens[cached:-1], "none")
        return cached

    def rewind(self, n: int) -> None:
        """Drop every cached position from n on. Checked: llama.cpp may refuse a partial removal
        (recurrent models), and then the whole cache is cleared so that it never lies."""
        if n >= len(self.tokens):
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1):
            llama_cpp.llama_memory_clear(self._memory, True)
            self.tokens.clear()
            raise SpecchatError(f"llama.cpp could not rewind the KV cache of {self.model.name} to {n} tokens")
        del self.tokens[n:]

    def decode(self, tokens: Sequence[int], logits: Literal["last", "all", "none"] = "last") -> np.ndarray:
        """Append tokens to the cache; return logits (rows, n_vocab) only where asked.

        The returned array is a view of llama.cpp's buffer, valid until the next decode.
        """
        if not tokens:
            raise ValueError("decode needs at least one token")
        start = len(self.tokens)
        if start + len(tokens) > self.model.n_ctx:
            raise ContextFull(f"the conversation needs {start + len(tokens)} tokens but the context holds "
                              f"{self.model.n_ctx} (start a new conversation or raise --ctx)")
        n_batch = self.model.n_batch
        if logits == "all" and len(tokens) > n_batch:
            raise ValueError("logits for every position need the tokens to fit in one batch")
        # Record first, then decode: if anything interrupts us, rewinding to `start` is always right.
        self.tokens.extend(tokens)
        try:
            for lo in range(0, len(tokens), n_batch):
                chunk = tokens[lo:lo + n_batch]
                last_chunk = lo + n_batch >= len(tokens)
                self._fill(chunk, start + lo, logits, last_chunk)
                rc = llama_cpp.llama_decode(self._ctx, self._batch)
                if rc != 0:
                    raise SpecchatError(f"llama.cpp decode failed with code {rc} on {self.model.name}")
        except BaseException:
            self._drop_after(start)
            raise
        if logits == "none":
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        return self.last_logits(len(tokens) if logits == "all" else 1)

    def last_logits(self, rows: int) -> np.ndarray:
        """The logits rows of the latest decode, as a view of llama.cpp's buffer (no copy)."""
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.model.n_vocab))

    def _fill(self, chunk: Sequence[int], pos0: int, logits: str, last_chunk: bool) -> None:
        b = self._batch
        b.n_tokens = len(chunk)
        want_all = logits == "all"
        for i, tok in enumerate(chunk):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = want_all
        if last_chunk and logits == "last":
            b.logits[len(chunk) - 1] = True

    def _drop_after(self, n: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1)
        del self.tokens[n:]
