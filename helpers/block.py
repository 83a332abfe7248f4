"""One Transformer encoder block, forward and every gradient by hand (chapter 7).

The block is ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)``, in either placement::

    post-norm (norm_first=False, the 2017 paper)     pre-norm (norm_first=True, GPT)
        Z1 = X + SA(X)                                   X1 = X + SA(LN1(X))
        X1 = LN1(Z1)                                     Y  = X1 + FF(LN2(X1))
        Z2 = X1 + FF(X1)
        Y  = LN2(Z2)

with ``SA`` multi-head self-attention (``nn.MultiheadAttention``'s packed weights) and
``FF(h) = act(h W1ᵀ + b1) W2ᵀ + b2``.  ``block_manual_backward`` walks it back with the plain
backward functions of chapters 2, 4 and 6 (``linear_backward``, ``layernorm_backward``,
the ReLU/GELU backward, ``attention_backward``); a residual ``y = x + f(x)`` copies the
incoming gradient to both the skip path and the branch, and adds what comes back
(``residual_backward``).  No autograd anywhere: forward and backward run under ``torch.no_grad()``.

What the cache keeps (``block_saved_table``), chosen to be no more than autograd keeps:

* LayerNorm: its input and two floats per row (μ, 1/σ); the normalised output is recomputed;
* attention: the packed ``QKV`` (B, N, 3d), the merged head outputs ``A`` (B, N, d) and the row
  log-sum-exp (B, H, N) instead of the (B, H, N, N) matrix P, which backward rebuilds as
  ``exp(S − lse)`` (what PyTorch's CPU attention kernel also does);
* FFN: one (B, N, d_ff) tensor: the ReLU output (it also says where the input was > 0), or the
  GELU input (its output is recomputed).

Parameters are a dict keyed like ``nn.TransformerEncoderLayer.named_parameters()``
(``BLOCK_PARAM_NAMES``), so ``grads[name]`` lines up with ``layer.get_parameter(name).grad``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from helpers.attention import attention_backward, causal_mask, merge_heads, split_heads
from helpers.checks import expect_int, expect_tensor
from helpers.device import randn
from helpers.functions import gelu_backward, layernorm_backward, layernorm_forward
from helpers.numgrad import linear_backward

__all__ = [
    "BLOCK_PARAM_NAMES",
    "ACTIVATIONS",
    "block_param_shapes",
    "block_params",
    "params_from_layer",
    "layer_from_params",
    "load_params_into_layer",
    "block_forward",
    "block_manual_backward",
    "residual_backward",
    "block_cache_bytes",
    "block_saved_bytes_formula",
    "block_saved_table",
]

# nn.TransformerEncoderLayer.named_parameters(), in its order.
BLOCK_PARAM_NAMES = (
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
    "norm1.weight",
    "norm1.bias",
    "norm2.weight",
    "norm2.bias",
)
ACTIVATIONS = ("relu", "gelu")


# --------------------------------------------------------------------------- parameters


def block_param_shapes(d: int, d_ff: int) -> dict:
    """Name -> shape of every block parameter (BLOCK_PARAM_NAMES order): packed W_in (3d, d), W1 (d_ff, d), ..."""
    expect_int("d", d)
    expect_int("d_ff", d_ff)
    return {
        "self_attn.in_proj_weight": (3 * d, d),
        "self_attn.in_proj_bias": (3 * d,),
        "self_attn.out_proj.weight": (d, d),
        "self_attn.out_proj.bias": (d,),
        "linear1.weight": (d_ff, d),
        "linear1.bias": (d_ff,),
        "linear2.weight": (d, d_ff),
        "linear2.bias": (d,),
        "norm1.weight": (d,),
        "norm1.bias": (d,),
        "norm2.weight": (d,),
        "norm2.bias": (d,),
    }


def block_params(d: int, d_ff: int, seed: int = 0, dtype=torch.float32, device=None) -> dict:
    """Random block weights: W ~ N(0, 1/fan_in), biases ~ 0.1·N(0, 1), γ ~ 1 + 0.1·N(0, 1), β ~ 0.1·N(0, 1)."""
    params = {}
    for i, (name, shape) in enumerate(block_param_shapes(d, d_ff).items()):
        t = randn(*shape, seed=seed + i, dtype=torch.float64)
        if len(shape) == 2:
            t = t / math.sqrt(shape[1])  # keeps activations O(1) through the block
        elif name.endswith("norm1.weight") or name.endswith("norm2.weight"):
            t = 1.0 + 0.1 * t  # γ near 1, but not exactly (tests see γ)
        else:
            t = 0.1 * t
        params[name] = t.to(device=device or "cpu", dtype=dtype)
    return params


def params_from_layer(layer: nn.TransformerEncoderLayer) -> dict:
    """Detached copies of an nn.TransformerEncoderLayer's weights, keyed by BLOCK_PARAM_NAMES."""
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise ValueError(
            f"params_from_layer: expected an nn.TransformerEncoderLayer, got {type(layer).__name__}"
        )
    named = dict(layer.named_parameters())
    missing = [n for n in BLOCK_PARAM_NAMES if n not in named]
    if missing:
        raise ValueError(f"params_from_layer: expected biases everywhere, missing {missing}")
    return {n: named[n].detach().clone() for n in BLOCK_PARAM_NAMES}


def load_params_into_layer(layer: nn.TransformerEncoderLayer, params: dict) -> nn.TransformerEncoderLayer:
    """Copy params (BLOCK_PARAM_NAMES) into layer's parameters in place; returns the layer."""
    named = dict(layer.named_parameters())
    with torch.no_grad():
        for n in BLOCK_PARAM_NAMES:
            expect_tensor(n, params[n], shape=named[n].shape)
            named[n].copy_(params[n])
    return layer


def layer_from_params(
    params: dict, H: int, norm_first: bool, activation: str = "relu", eps: float = 1e-5
) -> nn.TransformerEncoderLayer:
    """The nn.TransformerEncoderLayer(batch_first=True, dropout=0) holding copies of params (autograd's reference)."""
    _check_params(params)
    W1 = params["linear1.weight"]
    d_ff, d = W1.shape
    layer = nn.TransformerEncoderLayer(
        d,
        H,
        d_ff,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=norm_first,
        device=W1.device,
        dtype=W1.dtype,
    )
    return load_params_into_layer(layer, params)


def _check_params(params) -> None:
    if not isinstance(params, dict):
        raise ValueError(f"params: expected a dict keyed by BLOCK_PARAM_NAMES, got {type(params).__name__}")
    missing = [n for n in BLOCK_PARAM_NAMES if n not in params]
    if missing:
        raise ValueError(f"params: expected keys BLOCK_PARAM_NAMES, missing {missing}")


# --------------------------------------------------------------------------- small pieces


def residual_backward(grad_y: torch.Tensor, grad_x_through_branch: torch.Tensor) -> torch.Tensor:
    """y = x + f(x)  ⇒  grad_x = grad_y (the skip path, copied as is) + grad_y·∂f/∂x (the branch)."""
    return grad_y + grad_x_through_branch


def _lin(x, W, b):
    """y = x Wᵀ + b as one addmm over the rows."""
    y = torch.addmm(b, x.reshape(-1, x.shape[-1]), W.T)  # (B·N, in) @ (in, out) -> (B·N, out)
    return y.view(*x.shape[:-1], W.shape[0])  # (B·N, out) -> (B, N, out)


def _scores(Q, K, scale, causal):
    """S = Q Kᵀ·scale with −inf above the diagonal when causal; (B, H, N, N)."""
    S = (Q @ K.transpose(-2, -1)).mul_(scale)  # (B, H, N, dh) @ (B, H, dh, N) -> (B, H, N, N)
    if causal:
        S.masked_fill_(~causal_mask(S.shape[-2], S.shape[-1], device=S.device), float("-inf"))
    return S


def _attn_forward(h, p, H, causal):
    """QKV = h W_inᵀ + b_in, O = softmax(Q Kᵀ/√dh) V per head, A = merge(O), out = A W_oᵀ + b_o; returns (out, QKV, A, lse)."""
    d = h.shape[-1]
    QKV = _lin(h, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"])  # (B, N, d) -> (B, N, 3d)
    Q, K, V = (split_heads(t, H) for t in QKV.chunk(3, dim=-1))  # 3 × (B, H, N, dh), views
    S = _scores(Q, K, 1.0 / math.sqrt(d // H), causal)  # (B, H, N, N)
    lse = torch.logsumexp(S, dim=-1, keepdim=True)  # (B, H, N, 1)
    P = S.sub_(lse).exp_()  # (B, H, N, N), in S's memory
    A = merge_heads(P @ V)  # (B, H, N, N) @ (B, H, N, dh) -> (B, H, N, dh) -> (B, N, d)
    out = _lin(A, p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"])  # (B, N, d) -> (B, N, d)
    return out, QKV, A, lse


def _ffn_forward(h, p, activation):
    """FF(h) = act(h W1ᵀ + b1) W2ᵀ + b2; returns (FF(h), the tensor backward keeps: ReLU output or GELU input)."""
    U = _lin(h, p["linear1.weight"], p["linear1.bias"])  # (B, N, d) -> (B, N, d_ff)
    if activation == "relu":
        a = U.clamp_(min=0)  # in place: the ReLU output replaces U, and is what we keep
        kept = a
    else:
        a, kept = F.gelu(U), U
    return _lin(a, p["linear2.weight"], p["linear2.bias"]), kept  # (B, N, d_ff) -> (B, N, d)


# --------------------------------------------------------------------------- forward


@torch.no_grad()
def block_forward(
    X,
    params: dict,
    H: int,
    norm_first: bool,
    causal: bool = False,
    activation: str = "relu",
    eps: float = 1e-5,
    residual: bool = True,
):
    """Y = LN2(X1 + FF(X1)), X1 = LN1(X + SA(X)) (post-norm) or Y = X1 + FF(LN2(X1)), X1 = X + SA(LN1(X)) (pre-norm).

    Returns ``(Y, cache)``; ``cache`` is what ``block_manual_backward`` needs and nothing else.
    ``residual=False`` drops both skip connections (only for the deep-stack experiment).
    """
    expect_tensor("X", X, floating=True)
    if X.dim() != 3:
        raise ValueError(f"X: expected a floating tensor (B, N, d), got {X.dtype} {tuple(X.shape)}")
    _check_params(params)
    d = X.shape[-1]
    expect_int("H", H)
    if d % H:
        raise ValueError(f"H: expected a divisor of d={d}, got {H}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"block_forward: expected activation in {ACTIVATIONS}, got {activation!r}")
    expect_tensor("self_attn.in_proj_weight", params["self_attn.in_proj_weight"], shape=(3 * d, d))
    p = params
    saved = {}
    if norm_first:
        h1, saved["mu1"], saved["rstd1"] = layernorm_forward(X, p["norm1.weight"], p["norm1.bias"], eps)
        sa, saved["QKV"], saved["A"], saved["lse"] = _attn_forward(h1, p, H, causal)
        X1 = X + sa if residual else sa  # (B, N, d)
        h2, saved["mu2"], saved["rstd2"] = layernorm_forward(X1, p["norm2.weight"], p["norm2.bias"], eps)
        ff, saved["act"] = _ffn_forward(h2, p, activation)
        Y = X1 + ff if residual else ff
        saved["X1"] = X1  # LN2's input
    else:
        sa, saved["QKV"], saved["A"], saved["lse"] = _attn_forward(X, p, H, causal)
        Z1 = X + sa if residual else sa
        X1, saved["mu1"], saved["rstd1"] = layernorm_forward(Z1, p["norm1.weight"], p["norm1.bias"], eps)
        ff, saved["act"] = _ffn_forward(X1, p, activation)
        Z2 = X1 + ff if residual else ff
        Y, saved["mu2"], saved["rstd2"] = layernorm_forward(Z2, p["norm2.weight"], p["norm2.bias"], eps)
        saved["Z1"], saved["Z2"] = Z1, Z2  # LN1's and LN2's inputs
    cache = {
        "X": X,
        "params": params,
        "H": H,
        "norm_first": bool(norm_first),
        "causal": bool(causal),
        "activation": activation,
        "residual": bool(residual),
        "saved": saved,
    }
    return Y, cache


# --------------------------------------------------------------------------- backward


def _attn_backward(grad_out, h, saved, p, H, causal):
    """out_proj, then chapter 6's attention_backward on P = exp(S − lse) rebuilt, then in_proj: grads of h and the weights."""
    QKV, A, lse = saved["QKV"], saved["A"], saved["lse"]
    B, N, d3 = QKV.shape
    d, dh = d3 // 3, d3 // (3 * H)
    scale = 1.0 / math.sqrt(dh)
    # One copy to (3, B, H, N, dh) so the five head-wise matmuls below read contiguous Q, K, V.
    Q, K, V = rearrange(QKV, "b n (t h e) -> t b h n e", t=3, h=H).contiguous().unbind(0)  # 3 × (B, H, N, dh)
    P = _scores(Q, K, scale, causal).sub_(lse).exp_()  # (B, H, N, N); masked: exp(−inf) = 0
    grad_A, grad_W_out, grad_b_out = linear_backward(A, p["self_attn.out_proj.weight"], grad_out)  # (B, N, d)
    grad_O = split_heads(grad_A, H).contiguous()  # (B, N, d) -> (B, H, N, dh)
    grad_Q, grad_K, grad_V = attention_backward(Q, K, V, P, grad_O, scale)  # 3 × (B, H, N, dh)
    # Write the three straight into the packed (B, N, 3, H, dh) layout: one copy, no merge + cat.
    grad_QKV = torch.empty(B, N, 3, H, dh, dtype=QKV.dtype, device=QKV.device)
    for i, g in enumerate((grad_Q, grad_K, grad_V)):
        grad_QKV[:, :, i].copy_(g.transpose(1, 2))  # (B, H, N, dh) -> (B, N, H, dh)
    grad_h, grad_W_in, grad_b_in = linear_backward(
        h, p["self_attn.in_proj_weight"], grad_QKV.view(B, N, 3 * d)
    )  # (B, N, 3d) -> (B, N, d)
    return grad_h, {
        "self_attn.in_proj_weight": grad_W_in,
        "self_attn.in_proj_bias": grad_b_in,
        "self_attn.out_proj.weight": grad_W_out,
        "self_attn.out_proj.bias": grad_b_out,
    }


def _ffn_backward(grad_out, h, kept, p, activation):
    """FF = act(h W1ᵀ + b1) W2ᵀ + b2 backward: linear2, the activation, linear1 (chapter 4's pieces)."""
    a = kept if activation == "relu" else F.gelu(kept)  # (B, N, d_ff)
    grad_a, grad_W2, grad_b2 = linear_backward(a, p["linear2.weight"], grad_out)  # (B, N, d_ff)
    if activation == "relu":
        # relu_backward(a, grad_a) = grad_a·[a > 0], done in place: grad_a is ours, and a float·bool
        # product would first convert the (B, N, d_ff) mask to floats.
        grad_U = grad_a.masked_fill_(a <= 0, 0.0)
    else:
        grad_U = gelu_backward(kept, grad_a)
    grad_h, grad_W1, grad_b1 = linear_backward(h, p["linear1.weight"], grad_U)  # (B, N, d)
    return grad_h, {
        "linear1.weight": grad_W1,
        "linear1.bias": grad_b1,
        "linear2.weight": grad_W2,
        "linear2.bias": grad_b2,
    }


@torch.no_grad()
def block_manual_backward(grad_Y, cache: dict) -> dict:
    """Every gradient of block_forward, by hand: {"X": ∂L/∂X, name: ∂L/∂θ for name in BLOCK_PARAM_NAMES}.

    Pre-norm:  grad_X1 = grad_Y + LN2ᵀ(FFᵀ(grad_Y)),  grad_X = grad_X1 + LN1ᵀ(SAᵀ(grad_X1)).
    Post-norm: grad_Z2 = LN2ᵀ(grad_Y), grad_X1 = grad_Z2 + FFᵀ(grad_Z2), grad_Z1 = LN1ᵀ(grad_X1),
               grad_X = grad_Z1 + SAᵀ(grad_Z1).   (Aᵀ(g) = the vector–Jacobian product of A with g.)
    """
    if not isinstance(cache, dict) or "saved" not in cache:
        raise ValueError("block_manual_backward: expected the cache returned by block_forward")
    X, p, s = cache["X"], cache["params"], cache["saved"]
    expect_tensor("grad_Y", grad_Y, shape=X.shape)
    H, causal, act = cache["H"], cache["causal"], cache["activation"]
    skip = residual_backward if cache["residual"] else (lambda grad_y, grad_branch: grad_branch)
    grads = {}

    def ln_backward(name, x, grad_y):
        mu, rstd = s["mu" + name[-1]], s["rstd" + name[-1]]
        grad_x, grads[f"{name}.weight"], grads[f"{name}.bias"] = layernorm_backward(
            x, mu, rstd, p[f"{name}.weight"], grad_y
        )
        return grad_x

    def ln_recomputed(name, x):
        # The cache keeps x, μ and 1/σ, not LayerNorm's output: rebuild it from them.
        i = name[-1]
        return layernorm_forward(
            x, p[f"{name}.weight"], p[f"{name}.bias"], mu=s["mu" + i], rstd=s["rstd" + i]
        )[0]

    if cache["norm_first"]:
        X1 = s["X1"]
        h2 = ln_recomputed("norm2", X1)
        grad_h2, g_ff = _ffn_backward(grad_Y, h2, s["act"], p, act)
        grad_X1 = skip(grad_Y, ln_backward("norm2", X1, grad_h2))
        h1 = ln_recomputed("norm1", X)
        grad_h1, g_sa = _attn_backward(grad_X1, h1, s, p, H, causal)
        grad_X = skip(grad_X1, ln_backward("norm1", X, grad_h1))
    else:
        Z1, Z2 = s["Z1"], s["Z2"]
        grad_Z2 = ln_backward("norm2", Z2, grad_Y)
        X1 = ln_recomputed("norm1", Z1)
        grad_X1_ff, g_ff = _ffn_backward(grad_Z2, X1, s["act"], p, act)
        grad_X1 = skip(grad_Z2, grad_X1_ff)
        grad_Z1 = ln_backward("norm1", Z1, grad_X1)
        grad_X_sa, g_sa = _attn_backward(grad_Z1, X, s, p, H, causal)
        grad_X = skip(grad_Z1, grad_X_sa)
    grads.update(g_sa)
    grads.update(g_ff)
    return {"X": grad_X, **{n: grads[n] for n in BLOCK_PARAM_NAMES}}


# --------------------------------------------------------------------------- memory


def block_cache_bytes(cache: dict) -> int:
    """Bytes of the activations a block_forward cache keeps (each storage once; X and the parameters not counted)."""
    if not isinstance(cache, dict) or "saved" not in cache:
        raise ValueError("block_cache_bytes: expected the cache returned by block_forward")
    storages = {}
    for t in cache["saved"].values():
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()  # a view keeps its whole storage alive
    return sum(storages.values())


def block_saved_bytes_formula(B: int, N: int, d: int, H: int, d_ff: int, bytes: int, norm_first: bool) -> int:
    """Manual cache: B·N·(5d + d_ff + H + 4)·bytes (pre-norm) or B·N·(6d + d_ff + H + 4)·bytes (post-norm)."""
    for name, v in (("B", B), ("N", N), ("d", d), ("H", H), ("d_ff", d_ff), ("bytes", bytes)):
        expect_int(name, v)
    # QKV 3d + A d + one LayerNorm input d (pre-norm: X1; post-norm: Z1 and Z2, 2d) + FFN d_ff
    # + lse H + μ and 1/σ of two LayerNorms 4.
    per_token = (5 * d if norm_first else 6 * d) + d_ff + H + 4
    return B * N * per_token * bytes


def block_saved_table(norm_first: bool, activation: str = "relu") -> list[tuple[str, str, str, str]]:
    """Rows (sub-layer, what PyTorch's autograd saves on CPU, what our cache keeps, elements per token kept)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"block_saved_table: expected activation in {ACTIVATIONS}, got {activation!r}")
    ln1_in, ln2_in = ("X (input)", "X1") if norm_first else ("Z1 = X + SA(X)", "Z2 = X1 + FF(X1)")
    ln1_row = (
        "norm1",
        f"{ln1_in}, μ, 1/σ",
        f"{ln1_in}, μ, 1/σ",
        "2 (X is the input)" if norm_first else "d + 2",
    )
    ln2_row = ("norm2", f"{ln2_in}, μ, 1/σ", f"{ln2_in}, μ, 1/σ", "d + 2")
    act_auto = "ReLU output" if activation == "relu" else "GELU input and output"
    act_ours = "ReLU output (= linear2 input)" if activation == "relu" else "GELU input (output recomputed)"
    rows = [
        (
            "in_proj",
            "its input (a copy), QKV",
            "QKV (input: LN1 recomputed)" if norm_first else "QKV (input is X)",
            "3d",
        ),
        ("attention", "O, log-sum-exp (SDPA kernel)", "log-sum-exp (P rebuilt in backward)", "H"),
        ("out_proj", "A = merged O (shares O)", "A = merged O", "d"),
        (
            "linear1",
            "its input (LN2 output)" if norm_first else "its input X1",
            "nothing new (recomputed)",
            "0",
        ),
        ("activation", act_auto, act_ours, "d_ff"),
        (
            "linear2",
            "its input (shares the ReLU output)" if activation == "relu" else "its input (GELU output)",
            "nothing new",
            "0",
        ),
    ]
    order = (
        [ln1_row, *rows[:3], ln2_row, *rows[3:]] if norm_first else [*rows[:3], ln1_row, *rows[3:], ln2_row]
    )
    return order
