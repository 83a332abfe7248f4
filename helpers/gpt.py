"""A small decoder-only GPT whose whole backward is written by hand (chapter 7; used by chapters 8, 9, 11).

Forward, for token ids ``idx`` (B, N) with N ≤ n_ctx::

    X0 = wte[idx] + wpe[:N]                      token + learned position embeddings   (B, N, d)
    X_l = block_l(X_{l−1})   l = 1..n_layers     pre-norm, causal (helpers.block)
    logits = LN_f(X_L) W_headᵀ                   untied output head, no bias           (B, N, V)

Backward (``gpt_backward``) is the chain: head → ln_f → every block's ``block_manual_backward`` in
reverse → embeddings.  The token-embedding backward is a scatter-add::

    grad_wte.index_add_(0, idx.flatten(), grad_X0.flatten(0, 1))

and never ``grad_wte[idx] = ...``: a token that occurs twice must receive the sum of both
gradients, and an indexed assignment keeps only one of them.

Parameters are a flat dict of tensors; its keys are exactly ``TinyGPT(config).state_dict()``'s::

    wte (V, d)   wpe (n_ctx, d)   blocks.{l}.<BLOCK_PARAM_NAMES>   ln_f.weight  ln_f.bias  head.weight (V, d)

``TinyGPT`` (``nn.TransformerEncoderLayer(norm_first=True)`` blocks with a causal mask) is the
autograd reference; ``gpt_params_from_module`` / ``load_params_into_module`` copy between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from helpers.block import BLOCK_PARAM_NAMES, block_forward, block_manual_backward, block_param_shapes
from helpers.checks import expect_int, expect_tensor
from helpers.device import randn
from helpers.functions import (
    cross_entropy_backward,
    cross_entropy_forward,
    layernorm_backward,
    layernorm_forward,
)
from helpers.numgrad import linear_backward

__all__ = [
    "GPTConfig",
    "gpt_param_shapes",
    "gpt_init",
    "gpt_forward",
    "gpt_backward",
    "gpt_loss_and_grads",
    "embedding_backward",
    "block_grad_norms",
    "TinyGPT",
    "gpt_params_from_module",
    "load_params_into_module",
    "CharTokenizer",
    "load_corpus",
    "get_batch",
    "sample",
]

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "corpus.txt"


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a TinyGPT: vocabulary, context length, width, heads, blocks, FFN width; GELU, LayerNorm eps."""

    vocab_size: int
    n_ctx: int = 32
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    activation: str = "gelu"
    eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "n_ctx", "d_model", "n_heads", "n_layers", "d_ff"):
            expect_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"GPTConfig: expected n_heads dividing d_model, got {self.n_heads} and {self.d_model}"
            )
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"GPTConfig: expected activation 'relu' or 'gelu', got {self.activation!r}")


# --------------------------------------------------------------------------- parameters


def gpt_param_shapes(config: GPTConfig) -> dict:
    """Name -> shape of every parameter, in state_dict order."""
    V, C, d = config.vocab_size, config.n_ctx, config.d_model
    block = block_param_shapes(d, config.d_ff)
    shapes = {"wte": (V, d), "wpe": (C, d)}
    for l in range(config.n_layers):
        shapes.update({f"blocks.{l}.{n}": block[n] for n in BLOCK_PARAM_NAMES})
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,), "head.weight": (V, d)})
    return shapes


def gpt_init(config: GPTConfig, seed: int = 0, dtype=torch.float32, device=None) -> dict:
    """GPT-2 init: weights and embeddings ~ N(0, 0.02²), out_proj/linear2 ~ N(0, (0.02/√(2·n_layers))²), biases 0, γ 1."""
    params = {}
    for i, (name, shape) in enumerate(gpt_param_shapes(config).items()):
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "ln_f.weight":
            t = torch.ones(shape, dtype=torch.float64)
        elif len(shape) == 1:
            t = torch.zeros(shape, dtype=torch.float64)
        else:
            # The two projections that write into the residual stream are scaled down, so the
            # stream's variance does not grow with depth (GPT-2, section 2.3).
            std = (
                0.02 / math.sqrt(2 * config.n_layers)
                if name.endswith(("out_proj.weight", "linear2.weight"))
                else 0.02
            )
            t = std * randn(*shape, seed=seed * 1000 + i, dtype=torch.float64)
        params[name] = t.to(device=device or "cpu", dtype=dtype)
    return params


def _block(params: dict, l: int) -> dict:
    """Block l's parameters under their nn.TransformerEncoderLayer names (no copies)."""
    return {n: params[f"blocks.{l}.{n}"] for n in BLOCK_PARAM_NAMES}


def _check_idx(idx, config, name="idx"):
    expect_tensor(name, idx)
    if idx.dim() != 2 or idx.dtype != torch.long:
        raise ValueError(f"{name}: expected int64 token ids (B, N), got {idx.dtype} {tuple(idx.shape)}")
    if idx.shape[1] > config.n_ctx:
        raise ValueError(f"{name}: expected at most n_ctx={config.n_ctx} positions, got {idx.shape[1]}")


# --------------------------------------------------------------------------- forward / backward


@torch.no_grad()
def gpt_forward(idx, params: dict, config: GPTConfig):
    """logits = LN_f(block_L(…block_1(wte[idx] + wpe[:N])…)) W_headᵀ; returns (logits (B, N, V), cache)."""
    _check_idx(idx, config)
    missing = [n for n in gpt_param_shapes(config) if n not in params]
    if missing:
        raise ValueError(f"params: expected every key of gpt_param_shapes(config), missing {missing[:3]}")
    N = idx.shape[1]
    X = params["wte"][idx] + params["wpe"][:N]  # (B, N, d) gather + (N, d) broadcast
    block_caches = []
    for l in range(config.n_layers):
        X, c = block_forward(
            X,
            _block(params, l),
            config.n_heads,
            norm_first=True,
            causal=True,
            activation=config.activation,
            eps=config.eps,
        )
        block_caches.append(c)
    Hf, mu, rstd = layernorm_forward(X, params["ln_f.weight"], params["ln_f.bias"], config.eps)  # (B, N, d)
    logits = Hf @ params["head.weight"].T  # (B, N, d) @ (d, V) -> (B, N, V)
    cache = {
        "idx": idx,
        "params": params,
        "config": config,
        "blocks": block_caches,
        "X_L": X,
        "mu_f": mu,
        "rstd_f": rstd,
    }
    return logits, cache


def embedding_backward(idx, grad_X0, vocab_size: int, n_ctx: int):
    """X0 = wte[idx] + wpe[:N]  ⇒  grad_wte = scatter-add of grad_X0 rows at idx,  grad_wpe[:N] = Σ_batch grad_X0."""
    B, N, d = grad_X0.shape
    grad_wte = torch.zeros(vocab_size, d, dtype=grad_X0.dtype, device=grad_X0.device)
    # index_add_ ADDS row r of the source into row idx[r]: a repeated token accumulates every use.
    grad_wte.index_add_(0, idx.flatten(), grad_X0.flatten(0, 1))  # (B·N,) ids, (B, N, d) -> (B·N, d)
    grad_wpe = torch.zeros(n_ctx, d, dtype=grad_X0.dtype, device=grad_X0.device)
    grad_wpe[:N] = grad_X0.sum(0)  # (B, N, d) -> (N, d): each position once
    return grad_wte, grad_wpe


@torch.no_grad()
def gpt_backward(grad_logits, cache: dict, stream: list | None = None) -> dict:
    """Every parameter gradient by hand: head → ln_f → blocks in reverse → embeddings (keys as params).

    If ``stream`` is a list, ∂L/∂X_l for l = 0..n_layers (the residual stream before each block and
    after the last) is appended to it, input side first.
    """
    if not isinstance(cache, dict) or "blocks" not in cache:
        raise ValueError("gpt_backward: expected the cache returned by gpt_forward")
    p, config, X_L = cache["params"], cache["config"], cache["X_L"]
    expect_tensor("grad_logits", grad_logits, shape=(*X_L.shape[:2], config.vocab_size))
    grads = {}
    mu, rstd = cache["mu_f"], cache["rstd_f"]
    Hf, _, _ = layernorm_forward(
        X_L, p["ln_f.weight"], p["ln_f.bias"], mu=mu, rstd=rstd
    )  # LN_f output, rebuilt
    grad_Hf, grads["head.weight"], _ = linear_backward(
        Hf, p["head.weight"], grad_logits, needs=(True, True, False)
    )  # (B, N, d)
    grad_X, grads["ln_f.weight"], grads["ln_f.bias"] = layernorm_backward(
        X_L, mu, rstd, p["ln_f.weight"], grad_Hf
    )
    per_stream = [grad_X]
    for l in reversed(range(config.n_layers)):
        g = block_manual_backward(grad_X, cache["blocks"][l])
        grad_X = g.pop("X")
        grads.update({f"blocks.{l}.{n}": t for n, t in g.items()})
        per_stream.append(grad_X)
    grads["wte"], grads["wpe"] = embedding_backward(cache["idx"], grad_X, config.vocab_size, config.n_ctx)
    if stream is not None:
        stream.extend(reversed(per_stream))
    return {n: grads[n] for n in gpt_param_shapes(config)}


def gpt_loss_and_grads(idx, targets, params: dict, config: GPTConfig):
    """L = mean −log softmax(logits)[target] over positions, and ∂L/∂θ for every parameter, all by hand."""
    _check_idx(targets, config, "targets")
    if targets.shape != idx.shape:
        raise ValueError(f"targets: expected shape {tuple(idx.shape)}, got {tuple(targets.shape)}")
    logits, cache = gpt_forward(idx, params, config)
    z = logits.reshape(-1, config.vocab_size)  # (B, N, V) -> (B·N, V)
    t = targets.reshape(-1)  # (B, N) -> (B·N,)
    with torch.no_grad():
        L, lse = cross_entropy_forward(z, t)
        grad_z = cross_entropy_backward(z, lse, t, torch.ones((), dtype=z.dtype, device=z.device))  # (B·N, V)
    grads = gpt_backward(grad_z.view_as(logits), cache)  # (B·N, V) -> (B, N, V)
    return L, grads


def block_grad_norms(grads: dict, n_layers: int) -> list[float]:
    """‖∂L/∂θ_block‖ per block (all its parameters together), input side first."""
    norms = []
    for l in range(n_layers):
        sq = sum(float(grads[f"blocks.{l}.{n}"].double().pow(2).sum()) for n in BLOCK_PARAM_NAMES)
        norms.append(math.sqrt(sq))
    return norms


# --------------------------------------------------------------------------- the autograd reference


class TinyGPT(nn.Module):
    """The same GPT from torch modules: nn.TransformerEncoderLayer(norm_first=True) blocks with a causal mask."""

    def __init__(self, config: GPTConfig, seed: int = 0):
        super().__init__()
        self.config = config
        d = config.d_model
        self.wte = nn.Parameter(torch.empty(config.vocab_size, d))
        self.wpe = nn.Parameter(torch.empty(config.n_ctx, d))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d,
                config.n_heads,
                config.d_ff,
                dropout=0.0,
                activation=config.activation,
                layer_norm_eps=config.eps,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(d, eps=config.eps)
        self.head = nn.Linear(d, config.vocab_size, bias=False)
        load_params_into_module(self, gpt_init(config, seed))

    def forward(self, idx):
        """logits (B, N, V) for token ids idx (B, N)."""
        _check_idx(idx, self.config)
        N = idx.shape[1]
        X = nn.functional.embedding(idx, self.wte) + self.wpe[:N]  # (B, N, d)
        mask = nn.Transformer.generate_square_subsequent_mask(
            N, device=X.device, dtype=X.dtype
        )  # (N, N) 0 / −inf
        for block in self.blocks:
            X = block(X, src_mask=mask, is_causal=True)
        return self.head(self.ln_f(X))  # (B, N, d) -> (B, N, V)


def gpt_params_from_module(model: TinyGPT) -> dict:
    """Detached copies of a TinyGPT's parameters, keyed like its state_dict (= the params dict)."""
    if not isinstance(model, TinyGPT):
        raise ValueError(f"gpt_params_from_module: expected a TinyGPT, got {type(model).__name__}")
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def load_params_into_module(model: TinyGPT, params: dict) -> TinyGPT:
    """Copy a params dict into a TinyGPT in place (keys must match its state_dict exactly); returns the model."""
    sd = model.state_dict()
    if set(sd) != set(params):
        raise ValueError(
            f"load_params_into_module: expected the keys of model.state_dict(), "
            f"differing: {sorted(set(sd) ^ set(params))[:3]}"
        )
    with torch.no_grad():
        for n, t in sd.items():
            expect_tensor(n, params[n], shape=t.shape)
            t.copy_(params[n])
    return model


# --------------------------------------------------------------------------- data and sampling


class CharTokenizer:
    """One token per distinct character of a text, ids in sorted order: encode(str) -> (n,) int64, decode(ids) -> str."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("CharTokenizer: expected a non-empty str")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        """Token ids of s, (len(s),) int64; a character not in the vocabulary raises ValueError."""
        unknown = sorted(set(s) - set(self.stoi))
        if unknown:
            raise ValueError(
                f"CharTokenizer.encode: expected characters of the vocabulary, got {unknown[:5]}"
            )
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        """The text of a sequence of ids (list or 1-D tensor)."""
        return "".join(self.chars[int(i)] for i in ids)


def load_corpus() -> str:
    """The course's small English corpus (helpers/data/corpus.txt, written for the course)."""
    return CORPUS_PATH.read_text(encoding="utf-8")


def get_batch(data: torch.Tensor, batch_size: int, n_ctx: int, seed: int = 0, device=None):
    """idx, targets (batch_size, n_ctx): random windows of data and the same windows shifted by one."""
    expect_tensor("data", data, dtype=torch.long)
    expect_int("batch_size", batch_size)
    expect_int("n_ctx", n_ctx)
    if data.dim() != 1 or data.numel() <= n_ctx:
        raise ValueError(f"data: expected 1-D ids longer than n_ctx={n_ctx}, got {tuple(data.shape)}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    start = torch.randint(0, data.numel() - n_ctx, (batch_size,), generator=g)  # (B,)
    offsets = start[:, None] + torch.arange(n_ctx)[None, :]  # (B, n_ctx)
    return data[offsets].to(device or "cpu"), data[offsets + 1].to(device or "cpu")


@torch.no_grad()
def sample(params: dict, config: GPTConfig, idx, n: int, temperature: float = 1.0, seed: int = 0):
    """Append n tokens to idx (B, N0), each drawn from softmax(logits_last / temperature) (argmax when 0)."""
    _check_idx(idx[:, -config.n_ctx :], config)
    expect_int("n", n, low=0)
    if temperature < 0:
        raise ValueError(f"temperature: expected a number ≥ 0, got {temperature!r}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(n):
        logits, _ = gpt_forward(idx[:, -config.n_ctx :], params, config)
        z = logits[:, -1, :].to("cpu", torch.float64)  # (B, V), drawn on the CPU: same on any device
        if temperature == 0:
            nxt = z.argmax(-1, keepdim=True)  # (B, 1)
        else:
            nxt = torch.multinomial(torch.softmax(z / temperature, -1), 1, generator=g)  # (B, 1)
        idx = torch.cat([idx, nxt.to(idx.device)], dim=1)  # (B, N + 1)
    return idx
