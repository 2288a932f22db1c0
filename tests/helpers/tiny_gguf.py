"""Tiny random-weight GGUF models of the architectures no registry ships small, written at test time.

Hybrid models (Qwen3.5: gated-delta-net layers between attention layers, plus a NextN/MTP head) and
recurrent ones (Mamba-2) keep a state that llama.cpp cannot cut back to an earlier position, which
plain transformers never show. The engine's tests need such models and none small enough can be
fetched here, so this module writes them with llama.cpp's own `gguf` package: a few layers of tiny
dimensions and seeded random weights, so the same arguments always give the same bytes.

The tokenizer is either SmolLM2-135M-Instruct's, copied whole (real text and its chat template work,
so `specchat generate --target OUT.gguf` does), or, with `vocab`, a few single characters (so an
exact chi-square test over the first generated tokens needs only a few dozen cells).

Gemma 4 comes as a pair: `gemma4` is the target (sliding-window layers beside a full-attention one,
exposing its post-norm hidden state as llama.cpp's nextn output), `gemma4-assistant` its separate
MTP drafter, which reads the target's token table, hidden states and KV cache. A pair matches when
both are written with the same tokenizer (the same `vocab`, or `--for TARGET`, which copies the
target's); `write_gemma4_pair` writes one. The assistant is no model on its own: llama.cpp opens it
only as an MTP context (ctx_type LLAMA_CONTEXT_TYPE_MTP) whose ctx_other is a context of the target,
and every draft row sits at the target's next position, since the assistant's cache is the target's.

    python tests/helpers/tiny_gguf.py ARCH OUT.gguf [--vocab N] [--seed S] [--tokenizer-from PATH] [--chat-template JINJA]
    python tests/helpers/tiny_gguf.py gemma4-assistant OUT.gguf --for TARGET.gguf [--seed S]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import gguf
import numpy as np

ARCHS = ("qwen35", "mamba2", "llama", "gemma4", "gemma4-assistant")

# The small vocabulary: three specials, then characters, most common first. RWKV's tokenizer
# matches the longest entry and maps anything else to <unk>, where SPM and BPE would need byte
# tokens for every possible byte (llama-vocab.cpp, llm_tokenizer_rwkv_session::tokenize). The
# newline comes first because llama.cpp refuses an RWKV vocabulary without one.
UNK, BOS, EOS = 0, 1, 2
_SPECIALS = ["<unk>", "<s>", "</s>"]
# RWKV entries are escaped: "\\n" is the newline (llama-vocab.cpp, llama_unescape_rwkv_token).
_CHARS = ["\\n", " "] + list("etaoinshrdlucmfwygpbvkxjqz.,!?0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ'-:;()")
MAX_SMALL_VOCAB = len(_SPECIALS) + len(_CHARS)
# A minimal template, so chat code that renders messages works on small-vocabulary files too.
_SMALL_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"

N_EMBD = 64
N_FF = 128
N_CTX_TRAIN = 8192
RMS_EPS = 1e-6
# Logit spread in units of sqrt(2 ln V), about the z-score of the largest of V normal draws. At 1 the
# top token takes roughly half the mass of a 48-token vocabulary and the top five about 90%, and the
# 49,152-token models land near SmolLM2's own first-token entropy (3.8 against 3.9 nats).
LOGIT_SPREAD = 1.0
# The tied table is both the input and the output head: the residual stream carries the last token's
# own row, and at unit scale that row would win every next-token choice (the model would only
# repeat). Small rows leave the stream to the layers; the first layer's norm rescales them anyway.
EMBD_STD = 0.05
# SmolLM2's tokenizer alone takes 1.9 MB of metadata, and its 49,152-token table in f16 would take
# 6.3 MB more; Q4_0 takes 1.8 MB. Small vocabularies keep f16.
_F16_TABLE_MAX = 1 << 20


def default_tokenizer_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF, through specchat's catalog: fetched once, then found on disk."""
    from specchat.models.catalog import load_catalog
    from specchat.models.fetch import resolve

    return resolve(load_catalog().model("smollm2-135m-instruct"))


def _finish(writer: gguf.GGUFWriter, out: Path) -> Path:
    """Write beside the target and rename, so a reader never sees half a file."""
    tmp = out.with_name(out.name + ".part")
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def write(arch: str, out: Path, vocab: int | None = None, seed: int = 0, tokenizer_from: Path | None = None,
          cycle: float | None = None, chat_template: str | None = None, spread: float | None = None) -> Path:
    """Write a tiny `arch` model to `out` and return its path.

    vocab: None copies SmolLM2's tokenizer (from `tokenizer_from`, else the catalog's file);
    a number gives that many tokens of the small character vocabulary instead. The weights depend
    only on `seed` and the arguments, so a test may regenerate a file rather than ship it.
    cycle: a constructed model instead of a random one (qwen35 and llama, small vocabularies): its
    next token follows the last one round a fixed cycle (`successor`), with that token's logit
    `cycle` above the others', and qwen35's MTP head predicts the token after next from the
    pending token and the trunk's hidden state (see `_cycle_head`).
    spread: a cycle model whose other tokens are not all tied at 0: each falls `spread` further behind
    for every step it lies past the successor round the cycle (`cycle_logits`), in the target and its
    MTP head alike, so top-k keeps exactly k tokens.
    chat_template: the file carries this template instead of its tokenizer's (a reasoning model's, from
    tests/templates/, where no such model can be fetched).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    if cycle is not None and (arch not in _CYCLE_ARCHS or vocab is None or vocab > CYCLE_MAX_VOCAB):
        raise ValueError(f"a cycle model is {' or '.join(_CYCLE_ARCHS)} with --vocab at most {CYCLE_MAX_VOCAB}")
    if spread is not None and (cycle is None or spread <= 0):
        raise ValueError("spread goes with cycle, and is positive")
    out = Path(out)
    writer = gguf.GGUFWriter(None, arch)  # path given at write time, to a temporary name
    writer.add_name(f"tiny-{arch}")
    if vocab is None:
        n_vocab = _copy_tokenizer(writer, Path(tokenizer_from) if tokenizer_from else default_tokenizer_path(),
                                  keep_template=chat_template is None)
    else:
        n_vocab = _small_tokenizer(writer, vocab, template=chat_template is None)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    # The assistant draws from its own stream, so a pair written with one seed has unrelated weights.
    rng = np.random.default_rng([seed, _SEED_STREAM[arch]] if arch in _SEED_STREAM else seed)
    weights = _Weights(writer, rng, n_vocab, cycle, spread)
    _BUILDERS[arch](writer, weights)
    return _finish(writer, out)


def write_gemma4_pair(target: Path, assistant: Path, vocab: int | None = None, seed: int = 0,
                      tokenizer_from: Path | None = None) -> tuple[Path, Path]:
    """Write a tiny Gemma 4 target and its assistant drafter, which pair: the same tokenizer, and
    the assistant's embedding_length_out, head sizes and layer kinds those of the target."""
    return (write("gemma4", target, vocab=vocab, seed=seed, tokenizer_from=tokenizer_from),
            write("gemma4-assistant", assistant, vocab=vocab, seed=seed, tokenizer_from=tokenizer_from))


def check_gemma4_target(target: Path) -> None:
    """Raise unless `target` is a gemma4 file whose hidden size, head sizes, window and layer kinds
    are those this module writes, the ones its assistant is made for."""
    fields = {name: value for name, value, _, _ in _gguf_fields(Path(target).resolve())}
    want = {
        "general.architecture": "gemma4",
        "gemma4.embedding_length": N_EMBD,
        "gemma4.attention.key_length": GEMMA4_HEAD_DIM,
        "gemma4.attention.key_length_swa": GEMMA4_HEAD_DIM_SWA,
        "gemma4.attention.head_count_kv": GEMMA4_KV_HEADS,
        "gemma4.attention.sliding_window": GEMMA4_SWA,
        "gemma4.attention.sliding_window_pattern": list(GEMMA4_PATTERN),
    }
    for key, value in want.items():
        got = fields.get(key)
        if got != value:
            raise ValueError(f"{target} is no tiny gemma4 target this assistant fits: {key} is {got!r}, not {value!r}")


# --- tokenizers ----------------------------------------------------------------------------


def _copy_tokenizer(writer: gguf.GGUFWriter, source: Path, keep_template: bool = True) -> int:
    """Copy every tokenizer.* key (tokens, types, merges, special ids, chat template) from `source`."""
    fields = _tokenizer_fields(source.resolve())
    for name, value, main, sub in fields:
        if keep_template or name != gguf.Keys.Tokenizer.CHAT_TEMPLATE:
            writer.add_key_value(name, value, main, sub_type=sub)
    n_vocab = next((len(value) for name, value, _, _ in fields if name == gguf.Keys.Tokenizer.LIST), 0)
    if not n_vocab:
        raise ValueError(f"{source} has no {gguf.Keys.Tokenizer.LIST} to copy")
    return n_vocab


_Field = tuple[str, Any, gguf.GGUFValueType, "gguf.GGUFValueType | None"]


def _tokenizer_fields(source: Path) -> tuple[_Field, ...]:
    """The tokenizer.* keys of a GGUF file as (name, value, type, array item type)."""
    return tuple(f for f in _gguf_fields(source) if f[0].startswith("tokenizer."))


@functools.lru_cache(maxsize=4)
def _gguf_fields(source: Path) -> tuple[_Field, ...]:
    """Every key of a GGUF file as (name, value, type, array item type).

    Cached: GGUFReader takes seconds over SmolLM2's 98,000 token and merge strings, and a test
    session writes several models with the same tokenizer."""
    reader = gguf.GGUFReader(source)
    fields = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):  # the header's own counts, not keys
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        fields.append((name, field.contents(), main, sub))
    return tuple(fields)


def _small_tokenizer(writer: gguf.GGUFWriter, n: int, template: bool = True) -> int:
    """The first `n` entries of the character vocabulary, as an RWKV-style tokenizer."""
    if not len(_SPECIALS) + 1 <= n <= MAX_SMALL_VOCAB:
        raise ValueError(f"vocab must be {len(_SPECIALS) + 1}..{MAX_SMALL_VOCAB}, got {n}")
    tokens = (_SPECIALS + _CHARS)[:n]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.NORMAL] * (n - len(_SPECIALS))
    writer.add_tokenizer_model("rwkv")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_eot_token_id(EOS)
    writer.add_add_bos_token(False)  # RWKV's tokenize never prepends one; say so, not the default
    if template:
        writer.add_chat_template(_SMALL_TEMPLATE)
    return n


# --- weights -------------------------------------------------------------------------------


@dataclass
class _Weights:
    """Seeded random tensors, added to the writer in call order (numpy shapes: ggml's reversed)."""

    writer: gguf.GGUFWriter
    rng: np.random.Generator
    n_vocab: int
    cycle: float | None = None  # a constructed cycle model's successor logit (module docstring of `write`)
    spread: float | None = None  # and its other tokens' fall along the cycle (None: all at 0)

    def matrix(self, name: str, rows: int, cols: int) -> None:
        """A (rows, cols) f16 weight for ggml's mul_mat, fan-in scaled so activations stay O(1).

        In a cycle model the layers' output projections are zero: every layer adds nothing to the
        residual stream, which reaches the head as the last token's own row, so the next token
        depends on the last one alone (the layers still run, and a recurrent one keeps its state)."""
        w = self.rng.standard_normal((rows, cols)) / math.sqrt(cols)
        if self.cycle is not None and name.endswith(_SILENT):
            w = np.zeros((rows, cols))
        self.writer.add_tensor(name, w.astype(np.float16))

    def f32(self, name: str, values: np.ndarray) -> None:
        """Norms, biases, conv kernels and decay rates: kept f32, as ggml's elementwise ops expect."""
        self.writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    def ones(self, name: str, *shape: int, value: float = 1.0) -> None:
        self.f32(name, np.full(shape, value))

    def embeddings(self, n_embd: int) -> None:
        """token_embd, also the output head (no `output` tensor: llama.cpp ties them).

        A cycle model's rows are one-hot (token j at dimension j) plus a constant dimension, and its
        `output` maps each token's row to its successor."""
        if self.cycle is not None:
            self.writer.add_tensor("token_embd.weight", _cycle_rows(self.n_vocab, n_embd).astype(np.float16))
            out = np.zeros((self.n_vocab, n_embd))
            for j in range(self.n_vocab):
                out[:, j] = cycle_logits(successor(j, self.n_vocab), self.n_vocab, self.cycle, self.spread) / _NORMED
            self.writer.add_tensor("output.weight", out.astype(np.float16))
            return
        table = (self.rng.standard_normal((self.n_vocab, n_embd)) * EMBD_STD).astype(np.float32)
        # Q4_0 packs rows in blocks of 32
        assert table.size <= _F16_TABLE_MAX or n_embd % 32 == 0, n_embd
        if table.size <= _F16_TABLE_MAX:
            self.writer.add_tensor("token_embd.weight", table.astype(np.float16))
        else:
            q4 = gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q4_0)
            self.writer.add_tensor("token_embd.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)

    def head_gain(self, n_embd: int) -> float:
        """The final norm's weight that gives logits a spread of LOGIT_SPREAD * sqrt(2 ln V).

        The normed state has unit RMS and the embedding rows entries of EMBD_STD, so a logit's
        standard deviation is gain * EMBD_STD * sqrt(n_embd). (A cycle model's `output` sets its logits.)"""
        if self.cycle is not None:
            return 1.0
        return LOGIT_SPREAD * math.sqrt(2 * math.log(self.n_vocab)) / (EMBD_STD * math.sqrt(n_embd))

    def decays(self, n: int) -> np.ndarray:
        """-exp(A_log) with A_log ~ U(0, log 16), the initialisation of Mamba-2 and Qwen3.5's delta net."""
        return -np.exp(self.rng.uniform(0.0, math.log(16.0), n))

    def dt_bias(self, n: int) -> np.ndarray:
        """Inverse softplus of time steps drawn log-uniformly in [1e-3, 1e-1], as those models initialise."""
        dt = np.exp(self.rng.uniform(math.log(1e-3), math.log(1e-1), n))
        return np.log(np.expm1(dt))


def _common(writer: gguf.GGUFWriter, n_layer: int) -> None:
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_rms_eps(RMS_EPS)


def _ffn(w: _Weights, il: int) -> None:
    w.matrix(f"blk.{il}.ffn_gate.weight", N_FF, N_EMBD)
    w.matrix(f"blk.{il}.ffn_up.weight", N_FF, N_EMBD)
    w.matrix(f"blk.{il}.ffn_down.weight", N_EMBD, N_FF)


# --- qwen35 --------------------------------------------------------------------------------

# Four trunk layers, the last one attention (full_attention_interval 4, as Qwen3.5 itself), and one
# NextN block after them: block_count counts it, nextn_predict_layers says it is the MTP head.
QWEN35_LAYERS = 4
QWEN35_HEADS, QWEN35_KV_HEADS, QWEN35_HEAD_DIM = 2, 1, 32
QWEN35_ROT = 16  # partial rotary, a quarter of Qwen3.5's head; the sections below sum to QWEN35_ROT / 2
QWEN35_SECTIONS = [3, 3, 2, 0]
QWEN35_CONV, QWEN35_STATE, QWEN35_K_HEADS, QWEN35_V_HEADS = 4, 16, 2, 4


def _qwen35(writer: gguf.GGUFWriter, w: _Weights) -> None:
    """Qwen3.5 dense: src/models/qwen35.cpp (load_arch_hparams, load_arch_tensors)."""
    n_all = QWEN35_LAYERS + 1
    _common(writer, n_all)
    writer.add_nextn_predict_layers(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(QWEN35_HEADS)
    writer.add_head_count_kv(QWEN35_KV_HEADS)
    writer.add_key_length(QWEN35_HEAD_DIM)
    writer.add_value_length(QWEN35_HEAD_DIM)
    writer.add_rope_dimension_count(QWEN35_ROT)
    writer.add_rope_dimension_sections(QWEN35_SECTIONS)  # required: get_key_or_arr(..., true)
    writer.add_rope_freq_base(1e7)
    writer.add_full_attention_interval(QWEN35_LAYERS)
    key_dim = QWEN35_STATE * QWEN35_K_HEADS
    value_dim = QWEN35_STATE * QWEN35_V_HEADS  # the graph takes head_v_dim = inner_size / v_heads
    writer.add_ssm_conv_kernel(QWEN35_CONV)
    writer.add_ssm_state_size(QWEN35_STATE)
    writer.add_ssm_group_count(QWEN35_K_HEADS)
    writer.add_ssm_time_step_rank(QWEN35_V_HEADS)
    writer.add_ssm_inner_size(value_dim)

    gain = w.head_gain(N_EMBD)
    w.embeddings(N_EMBD)
    w.ones("output_norm.weight", N_EMBD, value=gain)
    for il in range(QWEN35_LAYERS):
        w.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        w.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        if (il + 1) % QWEN35_LAYERS == 0:
            _qwen35_attention(w, il)
        else:
            conv_dim = 2 * key_dim + value_dim
            # attn_qkv and attn_gate are "not required" to the loader, but the graph multiplies by
            # them unconditionally (qwen35.cpp build_qkvz): without them the model loads, and making its
            # first context segfaults.
            w.matrix(f"blk.{il}.attn_qkv.weight", conv_dim, N_EMBD)
            w.matrix(f"blk.{il}.attn_gate.weight", value_dim, N_EMBD)
            w.f32(f"blk.{il}.ssm_conv1d.weight", w.rng.standard_normal((conv_dim, QWEN35_CONV)) / math.sqrt(QWEN35_CONV))
            w.f32(f"blk.{il}.ssm_dt.bias", w.dt_bias(QWEN35_V_HEADS))
            w.f32(f"blk.{il}.ssm_a", w.decays(QWEN35_V_HEADS))
            w.matrix(f"blk.{il}.ssm_beta.weight", QWEN35_V_HEADS, N_EMBD)
            w.matrix(f"blk.{il}.ssm_alpha.weight", QWEN35_V_HEADS, N_EMBD)
            w.ones(f"blk.{il}.ssm_norm.weight", QWEN35_STATE)
            w.matrix(f"blk.{il}.ssm_out.weight", N_EMBD, value_dim)
        _ffn(w, il)

    mtp = QWEN35_LAYERS  # the NextN block: a full-attention layer fed [enorm(embd); hnorm(h)]
    w.ones(f"blk.{mtp}.attn_norm.weight", N_EMBD)
    w.ones(f"blk.{mtp}.post_attention_norm.weight", N_EMBD)
    _qwen35_attention(w, mtp)
    w.ones(f"blk.{mtp}.nextn.enorm.weight", N_EMBD)
    w.ones(f"blk.{mtp}.nextn.hnorm.weight", N_EMBD)
    if w.cycle is not None:
        _cycle_head(w, mtp)
        return
    _ffn(w, mtp)
    w.matrix(f"blk.{mtp}.nextn.eh_proj.weight", N_EMBD, 2 * N_EMBD)
    # embed_tokens and shared_head_head are optional: without them the head reuses token_embd.
    w.ones(f"blk.{mtp}.nextn.shared_head_norm.weight", N_EMBD, value=gain)


def _qwen35_attention(w: _Weights, il: int) -> None:
    """Gated attention: attn_q yields query and gate together, hence twice the heads' width."""
    q_dim = QWEN35_HEADS * QWEN35_HEAD_DIM
    kv_dim = QWEN35_KV_HEADS * QWEN35_HEAD_DIM
    w.matrix(f"blk.{il}.attn_q.weight", 2 * q_dim, N_EMBD)
    w.matrix(f"blk.{il}.attn_k.weight", kv_dim, N_EMBD)
    w.matrix(f"blk.{il}.attn_v.weight", kv_dim, N_EMBD)
    w.matrix(f"blk.{il}.attn_output.weight", N_EMBD, q_dim)
    w.ones(f"blk.{il}.attn_q_norm.weight", QWEN35_HEAD_DIM)
    w.ones(f"blk.{il}.attn_k_norm.weight", QWEN35_HEAD_DIM)


# --- cycle models: a next token known in advance, and an MTP head that must line up to find it ---

# Dimensions of the residual stream: [0, V) the token, [V, 2V) the token the head's hidden-state input
# says comes now, [2V, 3V) the head's answer, and one constant dimension (every embedding row has it).
CYCLE_MAX_VOCAB = (N_EMBD - 1) // 3
_CYCLE_ARCHS = ("qwen35", "llama")
_SILENT = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")
_CONST = N_EMBD - 1
_NORMED = math.sqrt(N_EMBD / 2)  # each entry of an RMS-normed vector of two equal entries
# The head's FFN: unit j fires with (silu(g) * g) at g = _GATE * (x_j + x_{V+j}). Both halves agreeing
# give about four times what one alone gives; the sink unit, from the constant dimension, sits between.
_GATE, _SINK_GATE = 1.0, 1.5


def successor(token: int, n_vocab: int) -> int:
    """The cycle a cycle model follows: the ordinary tokens in order, round and round. The last token
    (the sink, `n_vocab - 1`) is left out of it, and it and the specials lead into it."""
    first, sink = len(_SPECIALS), n_vocab - 1
    return token + 1 if first <= token < sink - 1 else first


def cycle_logits(answer: int, n_vocab: int, cycle: float, spread: float | None = None) -> np.ndarray:
    """The logits of a cycle model whose next token is `answer`: `cycle` for it and 0 for the rest, or
    with `spread`, -spread * r for the token r steps past it round the cycle, and for the tokens the
    cycle never reaches from it (the specials, and the sink past an ordinary token) -spread * n_vocab,
    below them all. Distinct above those, so that top-k keeps k tokens (k up to the cycle's length), none
    of them the end of generation."""
    logits = np.zeros(n_vocab)
    if spread is not None:
        logits[:] = -spread * n_vocab
        token = answer
        for steps in range(n_vocab):
            logits[token] = -spread * steps
            token = successor(token, n_vocab)
            if token == answer or logits[token] > -spread * n_vocab:
                break
    logits[answer] = cycle
    return logits


def _cycle_rows(n_vocab: int, n_embd: int) -> np.ndarray:
    table = np.zeros((n_vocab, n_embd))
    table[np.arange(n_vocab), np.arange(n_vocab)] = 1.0
    table[:, _CONST] = 1.0
    return table


def _cycle_head(w: _Weights, il: int) -> None:
    """An MTP block (qwen35.cpp, graph_mtp) that predicts the token after next only when its two inputs
    line up, as a trained head's do.

    Its row for position p takes the pending token x_p and the trunk's hidden state h_{p-1}, which in a
    cycle model is x_{p-1}'s own row. eh_proj writes x_p at dimension x_p and successor(x_{p-1}), the
    token h says comes now, at V + it; a draft step's own hidden state carries its answer at 2V + it,
    which eh_proj also writes at V + it. The FFN's unit j fires strongly when both say j, writing
    successor(j) as the answer; when they differ, the sink unit (from the constant dimension) outgrows
    both halves and the head answers the sink, which the target never gives. So a head fed the hidden
    state of the wrong position, or the wrong token, drafts nothing the target keeps. Its attention
    output is zero: the head's own cache holds the rows a real one reads, and adds nothing
    (tests/llama/test_hybrid.py compares that cache with the one a plain decode leaves instead)."""
    v, sink = w.n_vocab, w.n_vocab - 1
    tokens = np.arange(v)
    nexts = np.array([successor(j, v) for j in tokens])
    eh = np.zeros((N_EMBD, 2 * N_EMBD))  # [enorm(token row); hnorm(h)] -> the stream
    eh[tokens, tokens] = 1.0
    eh[_CONST, _CONST] = 1.0
    eh[v + nexts, N_EMBD + tokens] = 1.0  # the trunk's h: x_{p-1}'s row, whose successor comes now
    ordinary = tokens[tokens != sink]
    eh[v + ordinary, N_EMBD + 2 * v + ordinary] = 1.0  # a draft step's h: its answer comes now
    gate = np.zeros((N_FF, N_EMBD))
    gate[tokens, tokens] = gate[tokens, v + tokens] = _GATE
    gate[v, _CONST] = _SINK_GATE
    down = np.zeros((N_EMBD, N_FF))
    down[2 * v + nexts, tokens] = 1.0
    down[2 * v + sink, v] = 1.0
    head = np.zeros((v, N_EMBD))
    head[:, 2 * v + tokens] = np.stack([cycle_logits(a, v, w.cycle, w.spread) for a in tokens], axis=1) / _NORMED
    for name, value in (("ffn_gate", gate), ("ffn_up", gate), ("ffn_down", down),
                        ("nextn.eh_proj", eh), ("nextn.shared_head_head", head)):
        w.writer.add_tensor(f"blk.{il}.{name}.weight", value.astype(np.float16))
    w.ones(f"blk.{il}.nextn.shared_head_norm.weight", N_EMBD)


# --- scripted models: one answer, whatever the prompt ------------------------------------------------

# A scripted model says its script one token at a time: token i of it (one-hot at dimension i of the
# residual stream, plus the constant dimension every row has) leads to token i + 1, SCRIPT_LEAD above the
# rest; any other token (the prompt's last) leads to the first, and the last to the end of generation.
SCRIPT_MAX = N_EMBD - 1
SCRIPT_LEAD = 20.0


def write_scripted(out: Path, script: Sequence[str], tokenizer_from: Path | None = None,
                   added: Sequence[tuple[str, gguf.TokenType]] = (), chat_template: str | None = None) -> Path:
    """Write a llama model with SmolLM2's tokenizer (from `tokenizer_from`, else the catalog's file), `added`
    tokens appended to its vocabulary, that answers every prompt with `script` and then its end-of-generation
    token: each entry is one token, named by the text it stands for (an added token's, or a vocabulary entry's
    such as " two"), and no token comes twice (the next token depends on the last alone). Real engines, chat
    templates and reasoning splits then run on tokens whose kind the test chose, such as `<think>` as a
    user-defined or control token, which no fetchable model has."""
    if not 0 < len(script) <= SCRIPT_MAX or len(set(script)) != len(script):
        raise ValueError(f"a script is 1..{SCRIPT_MAX} distinct tokens, got {list(script)!r}")
    writer = gguf.GGUFWriter(None, "llama")
    writer.add_name("tiny-scripted")
    fields = _tokenizer_fields((Path(tokenizer_from) if tokenizer_from else default_tokenizer_path()).resolve())
    values = {name: value for name, value, _, _ in fields}
    tokens = [*values[gguf.Keys.Tokenizer.LIST], *(text for text, _ in added)]
    types = [*values[gguf.Keys.Tokenizer.TOKEN_TYPE], *(int(kind) for _, kind in added)]
    for name, value, main, sub in fields:
        if name == gguf.Keys.Tokenizer.CHAT_TEMPLATE and chat_template is not None:
            continue
        if name in (gguf.Keys.Tokenizer.SCORES, gguf.Keys.Tokenizer.TOKEN_TYPE, gguf.Keys.Tokenizer.LIST):
            value = {gguf.Keys.Tokenizer.LIST: tokens, gguf.Keys.Tokenizer.TOKEN_TYPE: types,
                     gguf.Keys.Tokenizer.SCORES: [*value, *[0.0] * len(added)]}[name]
        writer.add_key_value(name, value, main, sub_type=sub)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    index = {text: i for i, text in enumerate(tokens)}
    added_texts = {text for text, _ in added}
    ids = []
    for text in script:
        entry = text if text in added_texts else _byte_level(text)
        if entry not in index:
            raise ValueError(f"{text!r} is no single token of this vocabulary")
        ids.append(index[entry])
    ids.append(int(values[gguf.Keys.Tokenizer.EOS_ID]))
    weights = _Scripted(writer, np.random.default_rng(0), len(tokens), cycle=SCRIPT_LEAD, chain=ids)
    _llama(writer, weights)
    return _finish(writer, Path(out))


@functools.lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: the character each byte is written as in the vocabulary (a space as
    "Ġ", a newline as "Ċ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def _byte_level(text: str) -> str:
    return "".join(_byte_chars()[b] for b in text.encode("utf-8"))


@dataclass
class _Scripted(_Weights):
    """A scripted model's tables (see SCRIPT_LEAD); its layers are silent, as a cycle model's are."""

    chain: Sequence[int] = ()  # the script's token ids, then the end of generation

    def embeddings(self, n_embd: int) -> None:
        table = np.zeros((self.n_vocab, n_embd), dtype=np.float32)
        table[:, _CONST] = 1.0
        out = np.zeros((self.n_vocab, n_embd), dtype=np.float32)
        out[self.chain[0], _CONST] = self.cycle / _NORMED  # from the prompt's last token: about 1.4 leads
        for i, (token, after) in enumerate(zip(self.chain, self.chain[1:])):
            table[token, i] = 1.0
            out[after, i] = 2 * self.cycle / _NORMED
        for name, values in (("token_embd.weight", table), ("output.weight", out)):
            # each block of 32 holds zeros and one other value, which Q4_0 keeps exactly
            q4 = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_0)
            self.writer.add_tensor(name, q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)


# --- mamba2 --------------------------------------------------------------------------------

MAMBA2_LAYERS = 2
MAMBA2_INNER, MAMBA2_STATE, MAMBA2_HEAD_DIM, MAMBA2_GROUPS, MAMBA2_CONV = 2 * N_EMBD, 16, 32, 1, 4


def _mamba2(writer: gguf.GGUFWriter, w: _Weights) -> None:
    """Mamba-2: src/models/mamba2.cpp; keys as conversion/mamba.py's Mamba2Model writes them."""
    n_heads = MAMBA2_INNER // MAMBA2_HEAD_DIM
    _common(writer, MAMBA2_LAYERS)
    writer.add_feed_forward_length(0)  # unused, but the converter writes them and so do we
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(MAMBA2_CONV)
    writer.add_ssm_inner_size(MAMBA2_INNER)
    writer.add_ssm_state_size(MAMBA2_STATE)
    writer.add_ssm_time_step_rank(n_heads)
    writer.add_ssm_group_count(MAMBA2_GROUPS)

    conv_dim = MAMBA2_INNER + 2 * MAMBA2_GROUPS * MAMBA2_STATE
    w.embeddings(N_EMBD)
    w.ones("output_norm.weight", N_EMBD, value=w.head_gain(N_EMBD))
    for il in range(MAMBA2_LAYERS):
        w.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        w.matrix(f"blk.{il}.ssm_in.weight", MAMBA2_INNER + conv_dim + n_heads, N_EMBD)  # z, xBC, dt
        w.f32(f"blk.{il}.ssm_conv1d.weight", w.rng.standard_normal((conv_dim, MAMBA2_CONV)) / math.sqrt(MAMBA2_CONV))
        w.f32(f"blk.{il}.ssm_conv1d.bias", np.zeros(conv_dim))
        w.f32(f"blk.{il}.ssm_dt.bias", w.dt_bias(n_heads))
        # A and D are {1, n_heads} in ggml, unsqueezed as the converter does.
        w.f32(f"blk.{il}.ssm_a", w.decays(n_heads)[:, None])
        w.ones(f"blk.{il}.ssm_d", n_heads, 1)
        w.ones(f"blk.{il}.ssm_norm.weight", MAMBA2_GROUPS, MAMBA2_INNER // MAMBA2_GROUPS)
        w.matrix(f"blk.{il}.ssm_out.weight", N_EMBD, MAMBA2_INNER)


# --- llama ---------------------------------------------------------------------------------

LLAMA_LAYERS = 2
LLAMA_HEADS, LLAMA_KV_HEADS = 2, 1


def _llama(writer: gguf.GGUFWriter, w: _Weights) -> None:
    """A plain transformer (src/models/llama.cpp): a same-tokenizer draft for the models above."""
    head_dim = N_EMBD // LLAMA_HEADS
    _common(writer, LLAMA_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(LLAMA_HEADS)
    writer.add_head_count_kv(LLAMA_KV_HEADS)
    writer.add_rope_dimension_count(head_dim)  # llama checks n_rot == head size
    writer.add_vocab_size(w.n_vocab)

    w.embeddings(N_EMBD)
    w.ones("output_norm.weight", N_EMBD, value=w.head_gain(N_EMBD))
    for il in range(LLAMA_LAYERS):
        w.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        w.matrix(f"blk.{il}.attn_q.weight", N_EMBD, N_EMBD)
        w.matrix(f"blk.{il}.attn_k.weight", LLAMA_KV_HEADS * head_dim, N_EMBD)
        w.matrix(f"blk.{il}.attn_v.weight", LLAMA_KV_HEADS * head_dim, N_EMBD)
        w.matrix(f"blk.{il}.attn_output.weight", N_EMBD, N_EMBD)
        w.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        _ffn(w, il)


# --- gemma4 and gemma4-assistant ----------------------------------------------------------

# Two layers, sliding-window then full attention: the assistant maps its sliding layers onto the
# target's last-but-one layer and its full ones onto the last (llama-model.cpp, the `share`
# callback of LLM_ARCH_GEMMA4_ASSISTANT's cache), and the target's cache asserts at least two
# layers with their own KV. As in Gemma 4, full layers have twice the head size, and rotate only a
# quarter of it ("proportional" rope, through rope_freqs); sliding layers rotate all of theirs.
GEMMA4_PATTERN = (True, False)  # per layer: sliding window?
GEMMA4_HEADS, GEMMA4_KV_HEADS = 2, 1
GEMMA4_HEAD_DIM, GEMMA4_HEAD_DIM_SWA = 32, 16
GEMMA4_SWA = 16  # tokens; small, so that a short test runs past the window
GEMMA4_ROPE_PARTIAL = 0.25
GEMMA4_ROPE_BASE, GEMMA4_ROPE_BASE_SWA = 1e6, 1e4
GEMMA4_SOFTCAP = 30.0
# The assistant is narrower than the target (the loader insists: embedding_length_out carries the
# target's width and must differ from its own); it attends with queries only, over the target's KV,
# so its head sizes and KV heads are the target's, layer kind by layer kind.
ASSISTANT_EMBD, ASSISTANT_FF, ASSISTANT_HEADS = 32, 64, 2


def _gemma4_common(writer: gguf.GGUFWriter, n_embd: int, n_ff: int, n_head: int) -> None:
    """The keys gemma4.cpp and gemma4-assistant.cpp both read (load_arch_hparams)."""
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(len(GEMMA4_PATTERN))
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(GEMMA4_KV_HEADS)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_key_length(GEMMA4_HEAD_DIM)
    writer.add_value_length(GEMMA4_HEAD_DIM)
    writer.add_key_length_swa(GEMMA4_HEAD_DIM_SWA)  # required
    writer.add_value_length_swa(GEMMA4_HEAD_DIM_SWA)  # required
    writer.add_rope_dimension_count(GEMMA4_HEAD_DIM)  # the converter's n_rot_full: all of it, see rope_freqs
    writer.add_rope_dimension_count_swa(GEMMA4_HEAD_DIM_SWA)
    writer.add_rope_freq_base(GEMMA4_ROPE_BASE)
    writer.add_rope_freq_base_swa(GEMMA4_ROPE_BASE_SWA)
    writer.add_sliding_window(GEMMA4_SWA)  # required
    writer.add_sliding_window_pattern(list(GEMMA4_PATTERN))  # required
    writer.add_shared_kv_layers(0)


def _gemma4_rope_freqs(w: _Weights) -> None:
    """Proportional rope for the full layers: factor 1 on the rotated quarter, 1e30 (no rotation)
    on the rest (conversion/gemma.py, Gemma4Model.generate_extra_tensors). One tensor, shared."""
    n_rot = int(GEMMA4_HEAD_DIM * GEMMA4_ROPE_PARTIAL / 2)
    w.f32("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (GEMMA4_HEAD_DIM // 2 - n_rot)))


def _gemma4_block(w: _Weights, il: int, n_embd: int, n_ff: int, n_head: int, kv: bool) -> None:
    """One Gemma 4 block: sandwich norms around attention and the GELU FFN, a layer scale; the
    assistant's blocks (kv=False) have no K or V of their own."""
    head_dim = GEMMA4_HEAD_DIM_SWA if GEMMA4_PATTERN[il] else GEMMA4_HEAD_DIM
    w.ones(f"blk.{il}.attn_norm.weight", n_embd)
    w.matrix(f"blk.{il}.attn_q.weight", n_head * head_dim, n_embd)
    if kv:
        w.matrix(f"blk.{il}.attn_k.weight", GEMMA4_KV_HEADS * head_dim, n_embd)
        w.matrix(f"blk.{il}.attn_v.weight", GEMMA4_KV_HEADS * head_dim, n_embd)
        w.ones(f"blk.{il}.attn_k_norm.weight", head_dim)
    w.matrix(f"blk.{il}.attn_output.weight", n_embd, n_head * head_dim)
    w.ones(f"blk.{il}.attn_q_norm.weight", head_dim)
    w.ones(f"blk.{il}.post_attention_norm.weight", n_embd)
    w.ones(f"blk.{il}.ffn_norm.weight", n_embd)
    w.matrix(f"blk.{il}.ffn_gate.weight", n_ff, n_embd)
    w.matrix(f"blk.{il}.ffn_up.weight", n_ff, n_embd)
    w.matrix(f"blk.{il}.ffn_down.weight", n_embd, n_ff)
    w.ones(f"blk.{il}.post_ffw_norm.weight", n_embd)
    w.ones(f"blk.{il}.layer_output_scale.weight", 1)  # optional in the target, required in the assistant


def _gemma4(writer: gguf.GGUFWriter, w: _Weights) -> None:
    """Gemma 4 dense: src/models/gemma4.cpp; keys as conversion/gemma.py's Gemma4Model writes them.

    No per-layer embeddings (embedding_length_per_layer_input 0, the key itself is required), no
    experts, no KV-shared layers. The graph publishes the post-output-norm state as t_h_nextn,
    which the assistant reads."""
    _gemma4_common(writer, N_EMBD, N_FF, GEMMA4_HEADS)
    writer.add_embedding_length_per_layer_input(0)
    writer.add_final_logit_softcapping(GEMMA4_SOFTCAP)

    w.embeddings(N_EMBD)
    w.ones("output_norm.weight", N_EMBD, value=w.head_gain(N_EMBD))
    _gemma4_rope_freqs(w)
    for il in range(len(GEMMA4_PATTERN)):
        _gemma4_block(w, il, N_EMBD, N_FF, GEMMA4_HEADS, kv=True)


def _gemma4_assistant(writer: gguf.GGUFWriter, w: _Weights) -> None:
    """Gemma 4's MTP drafter: src/models/gemma4-assistant.cpp; keys as conversion/gemma.py's
    Gemma4AssistantModel writes them (embedding_length_out, every block a nextn block).

    It embeds tokens with the target's table, projects [embedding; target hidden] down to its own
    width, and ends in its own (tied) head and a projection back up to the target's width: the
    hidden state it feeds itself on the next draft step."""
    _gemma4_common(writer, ASSISTANT_EMBD, ASSISTANT_FF, ASSISTANT_HEADS)
    writer.add_embedding_length_out(N_EMBD)
    writer.add_nextn_predict_layers(len(GEMMA4_PATTERN))

    w.embeddings(ASSISTANT_EMBD)  # the output head only: inputs come from the target's token_embd
    w.ones("output_norm.weight", ASSISTANT_EMBD, value=w.head_gain(ASSISTANT_EMBD))
    w.matrix("nextn.pre_projection.weight", ASSISTANT_EMBD, 2 * N_EMBD)
    w.matrix("nextn.post_projection.weight", N_EMBD, ASSISTANT_EMBD)
    _gemma4_rope_freqs(w)
    for il in range(len(GEMMA4_PATTERN)):
        _gemma4_block(w, il, ASSISTANT_EMBD, ASSISTANT_FF, ASSISTANT_HEADS, kv=False)


_BUILDERS: dict[str, Callable[[gguf.GGUFWriter, _Weights], None]] = {
    "qwen35": _qwen35,
    "mamba2": _mamba2,
    "llama": _llama,
    "gemma4": _gemma4,
    "gemma4-assistant": _gemma4_assistant,
}
# Random streams other than the plain seed's, per arch (the older archs keep theirs, and their bytes).
_SEED_STREAM = {"gemma4-assistant": 1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", choices=ARCHS)
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, help=f"a small character vocabulary of N tokens (4..{MAX_SMALL_VOCAB})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cycle", type=float, metavar="LOGIT",
                        help=f"a constructed model (qwen35 or llama, --vocab at most {CYCLE_MAX_VOCAB}) whose next token "
                             "follows a fixed cycle, LOGIT above the rest; qwen35's MTP head agrees with it")
    parser.add_argument("--spread", type=float, metavar="LOGIT",
                        help="with --cycle: the other tokens fall LOGIT further behind each step past the successor")
    parser.add_argument("--tokenizer-from", type=Path, help="GGUF to copy the tokenizer from (default: SmolLM2-135M)")
    parser.add_argument("--chat-template", type=Path, help="a Jinja file the model carries as its chat template "
                        "(e.g. tests/templates/Qwen-Qwen3-0.6B.jinja)")
    parser.add_argument("--for", dest="target", type=Path,
                        help="gemma4-assistant only: the gemma4 target it drafts for (checked; its tokenizer is copied)")
    args: Any = parser.parse_args(argv)
    tokenizer_from = args.tokenizer_from
    if args.target is not None:
        if args.arch != "gemma4-assistant":
            parser.error("--for goes with gemma4-assistant only")
        if args.vocab is not None or tokenizer_from is not None:
            parser.error("--for copies the target's tokenizer: give no --vocab or --tokenizer-from with it")
        try:
            check_gemma4_target(args.target)
        except (OSError, ValueError) as e:
            parser.error(str(e))
        tokenizer_from = args.target
    try:
        template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
        path = write(args.arch, args.out, vocab=args.vocab, seed=args.seed, tokenizer_from=tokenizer_from,
                     cycle=args.cycle, chat_template=template, spread=args.spread)
    except ValueError as e:
        parser.error(str(e))
    print(path)


if __name__ == "__main__":
    main()
