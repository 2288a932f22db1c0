"""Opening GGUF files with llama.cpp: the checks before it reads one, the error lines it logs while it
loads, and the choices every load makes alike (its backends, its weight layouts). The target, its MTP
layers or assistant, and tokenizers read without weights all load through here.
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

GGUF_MAGIC = b"GGUF"


def extra_buffers() -> bool:
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


def token_piece(vocab: ctypes.c_void_p, token: int, buf: ctypes.Array[ctypes.c_char], special: bool = False) -> bytes:
    """The bytes a token stands for (possibly part of a UTF-8 character), read through `buf`, or through a longer
    buffer where llama.cpp says the piece needs one."""
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]


_backend_ready = False
_GGML_LOG_LEVEL_ERROR = 4  # ggml.h of the vendored llama.cpp (llama-cpp-python's _logger comment is stale)
# llama.cpp's own log is for debugging llama.cpp. llama-cpp-python's logger maps the vendored levels
# one off (its WARN is ggml's INFO), so it printed llama.cpp's warnings over a one-line error: it gets
# the lines only when asked for.
_FORWARD_LOG = os.environ.get("SPECCHAT_LLAMA_LOG") == "1"
_logger.set_verbose(_FORWARD_LOG)
_load_log = threading.local()  # .lines, .level: what llama.cpp logs while this thread loads a model


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
def llama_errors(level: int = _GGML_LOG_LEVEL_ERROR) -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread inside the block, from `level` up (ggml's: 2 is INFO)."""
    lines: list[str] = []
    _load_log.lines, _load_log.level = lines, level
    try:
        yield lines
    finally:
        _load_log.lines = None


def load_error(path: Path, log: list[str]) -> SpecchatError:
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


def open_gguf(path: Path, params: llama_cpp.llama_model_params) -> _internals.LlamaModel:
    """A GGUF file loaded by llama.cpp with `params`: checked before llama.cpp reads it, and a file it refuses is
    one line saying why."""
    check_gguf(path)
    ensure_backend()
    with llama_errors() as log:
        try:
            return _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
        except ValueError:
            raise load_error(path, log) from None


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process, before the first model is read."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
