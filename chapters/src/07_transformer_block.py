# %% [markdown]
# # 7. A Transformer block, every gradient by hand
#
# Chapter 6 differentiated attention. A Transformer block wraps it in three more things:
# LayerNorm, a residual connection around each sub-layer, and a two-layer feed-forward
# network (FFN). This chapter writes the backward pass of the whole block with no autograd at
# all, checks every gradient against `nn.TransformerEncoderLayer`, stacks blocks into a small
# GPT whose entire backward is hand-written, and counts what the block keeps in memory.
#
# **Learning goals.** After this chapter you can
#
# 1. recall LayerNorm's ([layer normalization](../pages/glossary.md#term-layer-normalization)) backward and name its two extra paths
#    (through the mean and through the variance);
# 2. explain why a [residual connection](../pages/glossary.md#term-residual-connection) copies the gradient to both branches, and show
#    numerically why that keeps the gradient of a deep stack alive (no
#    [vanishing gradient](../pages/glossary.md#term-vanishing-gradient));
# 3. write the FFN backward from chapter 4's pieces;
# 4. write the backward of a whole block, post-norm and pre-norm, and match autograd on
#    `nn.TransformerEncoderLayer` for every parameter and the input;
# 5. chain block backwards into a decoder-only GPT, and avoid the embedding scatter-add trap;
# 6. list what each sub-layer keeps for backward (its [saved tensors](../pages/glossary.md#term-saved-tensors)) and check a memory
#    formula against a measurement.
#
# Seed 004's "手写 GPT" (a hand-written GPT: embedding → blocks → LayerNorm → output head) is the
# target of this chapter; its remark that the residual connection "一分为二" ("splits the gradient
# in two") and sends it to both branches is section 2, where we say why "in two" must not be read
# as "in halves". Seed 000's `DebugTransformerEncoderLayer` is the
# post-norm block of section 4, without its prints.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import attention_forward
from helpers.block import (
    BLOCK_PARAM_NAMES,
    block_cache_bytes,
    block_forward,
    block_manual_backward,
    block_params,
    block_saved_bytes_formula,
    block_saved_table,
    layer_from_params,
)
from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.functions import gelu_backward, layernorm_backward, layernorm_forward
from helpers.gpt import (
    CharTokenizer,
    GPTConfig,
    TinyGPT,
    block_grad_norms,
    embedding_backward,
    get_batch,
    gpt_backward,
    gpt_forward,
    gpt_init,
    gpt_loss_and_grads,
    load_corpus,
    load_params_into_module,
    sample,
)
from helpers.memory import SavedTensors, fmt_bytes
from helpers.numgrad import linear_backward
from helpers.plot_flow import plot_layer_norms
from helpers.show import fmt_sci, show, varies

dev = get_device()
no_tf32()  # TF32 would change the last digits of fp32 matmuls on Ampere+ GPUs
F64 = torch.float64

# %% [markdown]
# ## 1. LayerNorm backward, recalled
#
# Chapter 4 derived it. For one row $x\in\mathbb R^D$: $\mu = \tfrac1D\sum_i x_i$,
# $\sigma = \sqrt{\tfrac1D\sum_i (x_i-\mu)^2 + \epsilon}$, $\hat x = (x-\mu)/\sigma$,
# $y = \gamma\circ\hat x + \beta$. With $g = \gamma\circ\partial L/\partial y$,
#
# $$\begin{gathered}
# \frac{\partial L}{\partial x} = \frac1\sigma\Big(g \;-\; \underbrace{\operatorname{mean}(g)}_{\text{through }\mu}
# \;-\; \underbrace{\hat x\,\operatorname{mean}(g\circ\hat x)}_{\text{through }\sigma}\Big), \\
# \frac{\partial L}{\partial\gamma} = \sum_{\text{rows}} \frac{\partial L}{\partial y}\circ\hat x,\qquad
# \frac{\partial L}{\partial\beta} = \sum_{\text{rows}} \frac{\partial L}{\partial y}.
# \end{gathered}$$
#
# The first term is what you would get if $\mu$ and $\sigma$ were constants. Every $x_i$ also
# moves the mean (which every output subtracts) and the variance (which every output divides
# by); the two other terms are those paths. `helpers.functions.layernorm_backward` is that
# formula; it keeps $x$, $\mu$ and $1/\sigma$, two floats per row besides the input.

# %%
x = randn(3, 6, seed=1, dtype=F64, device=dev)
gamma, beta = (
    1 + 0.1 * randn(6, seed=2, dtype=F64, device=dev),
    0.1 * randn(6, seed=3, dtype=F64, device=dev),
)
grad_y = randn(3, 6, seed=4, dtype=F64, device=dev)

y, mu, rstd = layernorm_forward(x, gamma, beta)
grad_x, grad_gamma, grad_beta = layernorm_backward(x, mu, rstd, gamma, grad_y)

xr, gr, br = (t.clone().requires_grad_() for t in (x, gamma, beta))
ref = torch.autograd.grad(F.layer_norm(xr, (6,), gr, br), (xr, gr, br), grad_y)
for name, ours, r in zip(
    ("grad_x", "grad_gamma", "grad_beta"), (grad_x, grad_gamma, grad_beta), ref
):
    compare(name, ours, r)

g = grad_y * gamma
x_hat = (x - mu) * rstd
no_mean = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))  # mean path dropped
no_var = rstd * (g - g.mean(-1, keepdim=True))  # variance path dropped
compare("without the mean path", no_mean, ref[0])
_ = compare("without the variance path", no_var, ref[0])

# %% [markdown]
# Both float64 checks use the default tolerance (atol 1e-10, rtol 1e-8): the two sides do the same
# arithmetic in a different order. Dropping either path is wrong in the first digit. A quick
# sanity check for the full formula: each row of $\partial L/\partial x$ sums to zero (shifting
# a whole row by a constant does not change $\hat x$), which the mean path is there to ensure.

# %%
show("row sums of grad_x", grad_x.sum(-1), 10)
show("row sums without the mean path", no_mean.sum(-1))

# %% [markdown]
# ## 2. The residual connection copies the gradient
#
# A residual connection computes $y = x + f(x)$. Its Jacobian is $I + J_f$, so
#
# $$\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} + J_f^\top\frac{\partial L}{\partial y}:$$
#
# the incoming gradient goes **unchanged** down the skip path, a copy goes into the branch, and
# the two are **added** where the paths split. That is all of `helpers.block.residual_backward`.
# In autograd terms, the add node's backward hands the same gradient to both of its inputs.
#
# Why it matters: in a stack $x_{l+1} = x_l + f_l(x_l)$ the gradient at the input is
# $\prod_l (I + J_{f_l})^\top$ applied to the output gradient. Expanding the product, one term
# is the identity: there is always a path on which the gradient is not multiplied by anything.
# Without the skip, only the product $\prod_l J_{f_l}^\top$ is left, and if each factor shrinks
# vectors a little, twelve of them shrink a lot.
#
# Here are 12 pre-norm causal blocks (`helpers.block`, section 4 below) with small weights, drawn
# with standard deviation $0.2/\sqrt{\text{fan-in}}$, as at the start of training. We run the
# hand-written forward and backward with and without the two skip connections per block
# (`residual=False` drops them) and print $\lVert\partial L/\partial X_l\rVert$ at the input of every block.

# %% mystnb={"image": {"alt": "The gradient norm \u2016\u2202L/\u2202X_l\u2016 at the input of each of 12 pre-norm blocks, with and without the skip connections."}}
B, N, d, H, d_ff, depth = 2, 8, 32, 4, 64, 12


def small_block(l):
    """Block l's weights: block_params with every matrix scaled by 0.2."""
    p = block_params(d, d_ff, seed=100 * l, dtype=F64, device=dev)
    return {k: 0.2 * v if v.dim() == 2 else v for k, v in p.items()}


stack = [small_block(l) for l in range(depth)]
X0 = randn(B, N, d, seed=7, dtype=F64, device=dev)
grad_out = randn(B, N, d, seed=8, dtype=F64, device=dev)  # some ∂L/∂Y at the top


def stack_input_grad_norms(residual):
    """‖∂L/∂X_l‖ at the input of each block (l = 1 first) and at the output."""
    X, caches = X0, []
    for p in stack:
        X, c = block_forward(
            X, p, H, norm_first=True, causal=True, activation="gelu", residual=residual
        )
        caches.append(c)
    g, norms = grad_out, [grad_out.norm().item()]
    for c in reversed(caches):
        g = block_manual_backward(g, c)["X"]
        norms.append(g.norm().item())
    return norms[::-1]


with_res, without_res = stack_input_grad_norms(True), stack_input_grad_norms(False)
# One row per block, so the table stays narrow.
print(f"{'input of':<10} {'with skip':>10} {'without skip':>13}")
for l, (a, b) in enumerate(zip(with_res, without_res), start=1):
    label = f"block {l}" if l <= depth else "output"
    print(f"{label:<10} {fmt_sci(a):>10} {fmt_sci(b):>13}")

fig = plot_layer_norms(
    {"with residual": with_res[:-1], "without residual": without_res[:-1]},
    title="12 pre-norm blocks: gradient at each block's input",
    ylabel="‖∂L/∂X_l‖",
)
plt.show()

# %% [markdown]
# With the skip connections the gradient reaching the first block has the same size as the one
# at the top (2.3e+01 all the way). Without them it is multiplied at each block by the
# Jacobians of two LayerNorms, the attention and the FFN with small weights, and after 12
# blocks it is 1.5e-14: the first blocks would not learn at all. This is the practical content
# of seed 004's remark that the residual "一分为二", "splits the gradient in two" and sends it to
# both branches. Read it as a fork, not a division: each branch receives the **whole**
# $\partial L/\partial y$, not half of it. The skip path is the road home precisely because it
# gets an undivided copy. Autograd's add node shows it directly:

# %%
a = randn(3, seed=1, dtype=F64, device=dev, requires_grad=True)
b = randn(3, seed=2, dtype=F64, device=dev, requires_grad=True)
g_y = randn(3, seed=3, dtype=F64, device=dev)  # some ∂L/∂y
grad_a, grad_b = torch.autograd.grad(a + b, (a, b), g_y)  # y = a + b: skip + branch
compare("skip input gets ∂L/∂y", grad_a, g_y, exact=True)
_ = compare("branch input gets ∂L/∂y (not half)", grad_b, g_y, exact=True)

# %% [markdown]
# ## 3. The FFN backward
#
# $\mathrm{FF}(h) = \operatorname{act}(h W_1^\top + b_1)\,W_2^\top + b_2$ with $W_1$ of shape
# $(d_{ff}, d)$ and $W_2$ of shape $(d, d_{ff})$. Backward is chapters 2 and 4's pieces in reverse
# order, with $U = hW_1^\top + b_1$ and $a = \operatorname{act}(U)$:
#
# | step | forward | backward |
# | --- | --- | --- |
# | 1 | $F = aW_2^\top + b_2$ | $da = dF\,W_2$, $dW_2 = dF^\top a$, $db_2 = \sum dF$ |
# | 2 | $a = \operatorname{act}(U)$ | $dU = da\circ\operatorname{act}'(U)$ |
# | 3 | $U = hW_1^\top + b_1$ | $dh = dU\,W_1$, $dW_1 = dU^\top h$, $db_1 = \sum dU$ |
#
# (sums over all $B\cdot N$ rows). For ReLU, $\operatorname{act}'(U) = [a > 0]$ can be read off
# the output, so only $a$ needs keeping; for GELU, $\operatorname{act}'$ needs $U$.

# %%
h = randn(2, 5, 8, seed=10, dtype=F64, device=dev)
W1, b1 = (
    randn(16, 8, seed=11, dtype=F64, device=dev) / 8**0.5,
    0.1 * randn(16, seed=12, dtype=F64, device=dev),
)
W2, b2 = (
    randn(8, 16, seed=13, dtype=F64, device=dev) / 4,
    0.1 * randn(8, seed=14, dtype=F64, device=dev),
)
grad_F = randn(2, 5, 8, seed=15, dtype=F64, device=dev)

U = h @ W1.T + b1  # (2, 5, 8) @ (8, 16) -> (2, 5, 16)
a = F.gelu(U)
grad_a, grad_W2, grad_b2 = linear_backward(a, W2, grad_F)  # step 1
grad_U = gelu_backward(U, grad_a)  # step 2
grad_h, grad_W1, grad_b1 = linear_backward(h, W1, grad_U)  # step 3

leaves = [t.clone().requires_grad_() for t in (h, W1, b1, W2, b2)]
hr, W1r, b1r, W2r, b2r = leaves
Fr = F.gelu(hr @ W1r.T + b1r) @ W2r.T + b2r  # (2, 5, 16) @ (16, 8) -> (2, 5, 8)
ref = torch.autograd.grad(Fr, leaves, grad_F)
for name, ours, r in zip(
    ("grad_h", "grad_W1", "grad_b1", "grad_W2", "grad_b2"),
    (grad_h, grad_W1, grad_b1, grad_W2, grad_b2),
    ref,
):
    compare(name, ours, r)

# %% [markdown]
# ## 4. One block, forward and backward
#
# `nn.TransformerEncoderLayer(batch_first=True, dropout=0)` is one of two blocks, depending on
# `norm_first`; $\mathrm{SA}$ is multi-head self-attention with `nn.MultiheadAttention`'s packed
# weights (chapter 6):
#
# | post-norm (`norm_first=False`, 2017) | pre-norm (`norm_first=True`, GPT) |
# | --- | --- |
# | $Z_1 = X + \mathrm{SA}(X)$, $\;X_1 = \mathrm{LN}_1(Z_1)$ | $X_1 = X + \mathrm{SA}(\mathrm{LN}_1(X))$ |
# | $Z_2 = X_1 + \mathrm{FF}(X_1)$, $\;Y = \mathrm{LN}_2(Z_2)$ | $Y = X_1 + \mathrm{FF}(\mathrm{LN}_2(X_1))$ |
#
# The backward walks each column upward. Writing $\mathrm{A}^\top(g)$ for "the backward of A applied
# to $g$" (its vector–Jacobian product):
#
# | post-norm | pre-norm |
# | --- | --- |
# | $dZ_2 = \mathrm{LN}_2^\top(dY)$ | $dX_1 = dY + \mathrm{LN}_2^\top(\mathrm{FF}^\top(dY))$ |
# | $dX_1 = dZ_2 + \mathrm{FF}^\top(dZ_2)$ | $dX = dX_1 + \mathrm{LN}_1^\top(\mathrm{SA}^\top(dX_1))$ |
# | $dZ_1 = \mathrm{LN}_1^\top(dX_1)$ | |
# | $dX = dZ_1 + \mathrm{SA}^\top(dZ_1)$ | |
#
# Every "$+$" is a residual (section 2). In post-norm the LayerNorms sit *on* the skip path, so
# even the skip gradient passes through $\mathrm{LN}^\top$ twice per block; in pre-norm the skip path
# from $Y$ to $X$ is untouched, the reason deep GPTs use pre-norm. $\mathrm{SA}^\top$ is chapter 6's
# backward: out-projection, `attention_backward`, in-projection.
#
# `helpers.block.block_forward` / `block_manual_backward` implement both columns with chapter 4's
# and chapter 6's plain backward functions and no autograd (both run under `torch.no_grad()`).
# Here is the pre-norm backward, the shorter one, in outline (in `helpers/block.py` the steps are
# `_ffn_backward`, `_attn_backward`, the inner `ln_backward` and `skip`, which is
# `residual_backward`):
#
# ```python
# h2 = LN2 output, recomputed from X1 and the saved μ, 1/σ
# grad_h2, g_ff = ffn_backward(grad_Y, h2, ...)                       # FFᵀ
# grad_X1 = residual_backward(grad_Y, ln_backward("norm2", X1, grad_h2))
# h1 = LN1 output, recomputed from X
# grad_h1, g_sa = attn_backward(grad_X1, h1, ...)                     # SAᵀ
# grad_X = residual_backward(grad_X1, ln_backward("norm1", X, grad_h1))
# ```
#
# Now the check: the same weights in an `nn.TransformerEncoderLayer` (dropout 0), the same input,
# the same upstream gradient $\partial L/\partial Y$; every parameter's gradient and the input's.
# Post-norm without a mask, pre-norm with the causal mask, both in float64:

# %%
B, N, d, H, d_ff = 2, 6, 16, 4, 32
params = block_params(d, d_ff, seed=0, dtype=F64, device=dev)
X = randn(B, N, d, seed=20, dtype=F64, device=dev)
grad_Y = randn(B, N, d, seed=21, dtype=F64, device=dev)


def autograd_block_grads(params, norm_first, causal, activation, X, grad_Y):
    """Y and {"X", every parameter name: gradient} from nn.TransformerEncoderLayer."""
    layer = layer_from_params(params, H, norm_first, activation)
    Xr = X.clone().requires_grad_()
    mask = (
        nn.Transformer.generate_square_subsequent_mask(
            N, device=X.device, dtype=X.dtype
        )
        if causal
        else None
    )
    Y = layer(Xr, src_mask=mask, is_causal=causal)
    weights = [layer.get_parameter(n) for n in BLOCK_PARAM_NAMES]
    return Y, dict(
        zip(("X", *BLOCK_PARAM_NAMES), torch.autograd.grad(Y, [Xr, *weights], grad_Y))
    )


for norm_first, causal in ((False, False), (True, True)):
    norm, masking = (
        ("pre" if norm_first else "post"),
        ("causal" if causal else "no mask"),
    )
    print(f"--- {norm}-norm, {masking}, relu, float64")
    Y_ref, ref = autograd_block_grads(params, norm_first, causal, "relu", X, grad_Y)
    Y, cache = block_forward(X, params, H, norm_first, causal, "relu")
    ours = block_manual_backward(grad_Y, cache)
    compare("Y", Y, Y_ref, atol=1e-10, rtol=0)
    for name in ("X", *BLOCK_PARAM_NAMES):
        compare(name, ours[name], ref[name], atol=1e-10, rtol=0)

# %% [markdown]
# All 13 gradients (the input and 12 parameter tensors) and the output agree to 1e-10 in both
# placements (the differences shown after `max|Δ|` are round-off). In float32
# the same comparison needs a looser tolerance: float32 has a relative precision of about 1.2e-7,
# a weight gradient sums $B\cdot N$ products, LayerNorm divides by $\sigma$, and PyTorch's
# attention kernel uses a blocked online softmax while we use a plain one, so the two sides
# round differently by a few hundred ulps of values up to about 10. We allow atol 5e-5 with
# rtol 1e-4, and check all four combinations of placement and activation with the causal mask,
# one line each (all 13 gradients concatenated):

# %%
params32 = block_params(d, d_ff, seed=0, device=dev)
X32, grad_Y32 = randn(B, N, d, seed=20, device=dev), randn(B, N, d, seed=21, device=dev)
for norm_first in (False, True):
    for activation in ("relu", "gelu"):
        _, ref = autograd_block_grads(
            params32, norm_first, True, activation, X32, grad_Y32
        )
        _, cache = block_forward(X32, params32, H, norm_first, True, activation)
        ours = block_manual_backward(grad_Y32, cache)
        names = ("X", *BLOCK_PARAM_NAMES)
        cat = lambda g: torch.cat([g[n].flatten() for n in names])  # noqa: E731
        compare(
            f"{'pre' if norm_first else 'post'}-norm {activation}, float32, all 13",
            cat(ours),
            cat(ref),
            atol=5e-5,
            rtol=1e-4,
        )

# %% [markdown]
# ### Seed claims about a block's parameters, checked
#
# Seed 003 says to focus on the attention part because it has the most parameters ("参数最多的注意力部分"),
# and seed 000 lists "at least 7 trainable parameter groups" as `q_proj`, `k_proj`, `v_proj`,
# `out_proj`, `norm1`, `linear1`, `linear2`, `norm2` (eight names). Count them on the seed's own
# size, `nn.TransformerEncoderLayer(512, 8, 2048)`:

# %%
layer512 = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
counts = {}
for name, p in layer512.named_parameters():
    counts[name.rsplit(".", 1)[0]] = counts.get(name.rsplit(".", 1)[0], 0) + p.numel()
for group, n in counts.items():
    print(f"{group:<24} {n:>9,d}")
attn_params = counts["self_attn"] + counts["self_attn.out_proj"]
ffn_params = counts["linear1"] + counts["linear2"]
print(
    f"attention {attn_params:,d}   FFN {ffn_params:,d}"
    f"   FFN / attention = {ffn_params / attn_params:.2f}"
)
print(
    "parameter tensors:",
    len(list(layer512.named_parameters())),
    " groups:",
    len(counts),
)

# %% [markdown]
# Two corrections. The FFN, not the attention, has most of a block's parameters: with
# $d_{ff} = 4d$ it has $8d^2$ weights against the attention's $4d^2$, twice as many (the ratio
# printed above). What makes attention the hard part of backward is not its parameter count but
# the softmax and the $N\times N$ matrices (chapters 6 and 10). And there are six groups (twelve
# tensors), not separate `q_proj`, `k_proj`, `v_proj`: `nn.MultiheadAttention` packs them into
# one `in_proj_weight` of shape $(3d, d)$ (chapter 6 splits it).
#
# Seed 000's `DebugTransformerEncoderLayer` also asks for `need_weights=True` and then reads
# `attn_weights[0, 0].sum(dim=1)` as "the first head". By default `nn.MultiheadAttention` returns
# the weights **averaged over heads**, shape $(B, N, N)$, so `[0, 0]` is already a row and
# `.sum(dim=1)` fails; per-head weights need `average_attn_weights=False`:

# %%
x512 = torch.randn(2, 10, 512, generator=torch.Generator().manual_seed(0))  # (B, N, d)
_, w_avg = layer512.self_attn(x512, x512, x512, need_weights=True)
_, w_heads = layer512.self_attn(
    x512, x512, x512, need_weights=True, average_attn_weights=False
)
print(
    "default attn_weights:",
    tuple(w_avg.shape),
    "  average_attn_weights=False:",
    tuple(w_heads.shape),
)
try:
    w_avg[0, 0].sum(dim=1)
except IndexError as err:
    print("seed's attn_weights[0, 0].sum(dim=1):", type(err).__name__)

# %% [markdown]
# ## 5. A small GPT, backward by hand from the loss to the embeddings
#
# Seed 004's hand-written GPT is: embedding → blocks → LayerNorm → head. `helpers.gpt` builds
# it from the block above, pre-norm and causal:
#
# $$\begin{gathered}
# X_0 = W_{te}[\text{idx}] + W_{pe}[0{:}N],\qquad X_l = \mathrm{block}_l(X_{l-1}), \\
# \text{logits} = \mathrm{LN}_f(X_L)\,W_{\text{head}}^\top .
# \end{gathered}$$
#
# Its backward is the chain: cross-entropy backward ($\mathrm{softmax} - \text{onehot}$, over the
# number of positions), head (`linear_backward`), $\mathrm{LN}_f$ (`layernorm_backward`), then
# `block_manual_backward` for each block from the last to the first, each one's `grad["X"]`
# being the next one's `grad_Y`, and finally the embeddings. The parameters are a flat dict whose
# keys are exactly the `state_dict` keys of `TinyGPT`, the same model made of
# `nn.TransformerEncoderLayer(norm_first=True)` blocks, our autograd reference.
#
# The data is a few kilobytes of English written for the course (`helpers/data/corpus.txt`),
# one token per character.

# %%
text = load_corpus()
tok = CharTokenizer(text)
data = tok.encode(text)
print(f"{len(text)} characters, vocabulary of {tok.vocab_size}")
print(repr(text[:60]))

config = GPTConfig(
    vocab_size=tok.vocab_size, n_ctx=16, d_model=32, n_heads=4, n_layers=4, d_ff=64
)
params = gpt_init(config, seed=0, dtype=F64, device=dev)
idx, targets = get_batch(data, batch_size=4, n_ctx=config.n_ctx, seed=1, device=dev)
print("first sequence:", repr(tok.decode(idx[0])), "->", repr(tok.decode(targets[0])))
print(
    "parameters:",
    len(params),
    "tensors,",
    sum(t.numel() for t in params.values()),
    "numbers",
)
print("some names:", *list(params)[:3], "...", *list(params)[-3:], sep="\n  ")

# %%
L, grads = gpt_loss_and_grads(idx, targets, params, config)

model = load_params_into_module(TinyGPT(config).to(dev, F64), params)
logits_ref = model(idx)
L_ref = F.cross_entropy(logits_ref.flatten(0, 1), targets.flatten())
L_ref.backward()

show("loss (ours)", L)
show("log(vocab size)", math.log(tok.vocab_size))
compare("logits", gpt_forward(idx, params, config)[0], logits_ref, atol=1e-10, rtol=0)
compare("loss", L, L_ref, atol=1e-10, rtol=0)
groups = {
    "embeddings": ["wte", "wpe"],
    **{
        f"block {l}": [f"blocks.{l}.{n}" for n in BLOCK_PARAM_NAMES]
        for l in range(config.n_layers)
    },
    "ln_f + head": ["ln_f.weight", "ln_f.bias", "head.weight"],
}
named = dict(model.named_parameters())
for group, names in groups.items():
    compare(
        f"{group} ({len(names)} tensors)",
        torch.cat([grads[n].flatten() for n in names]),
        torch.cat([named[n].grad.flatten() for n in names]),
        atol=1e-10,
        rtol=0,
    )

# %% [markdown]
# The loss at initialisation is 3.7723, close to $\log 43 = 3.7612$: with weights of standard
# deviation 0.02 the logits are nearly zero, so the model predicts every character with
# probability about 1/43. The logits, the loss and all 53 gradient tensors (grouped above, one line
# per group) agree with autograd on `TinyGPT` to 1e-10 in float64.
#
# ### The embedding trap: scatter-**add**
#
# The forward gathers rows, $X_0[b, n] = W_{te}[\text{idx}_{b,n}]$. Its backward must send each
# position's gradient back to the row it came from, and a token that occurs several times gets the
# **sum**:
#
# ```python
# grad_wte = torch.zeros_like(wte)
# grad_wte.index_add_(0, idx.flatten(), grad_X0.flatten(0, 1))     # right: accumulates
# grad_wte[idx.flatten()] = grad_X0.flatten(0, 1)                  # WRONG: one occurrence wins
# ```
#
# The indexed assignment looks right and passes any test whose tokens are all different. In text
# almost every token repeats: in the 16 characters `"the cat sat ther"`, 't' occurs four times.

# %%
s = "the cat sat there"[:16]
ids = tok.encode(s)[None].to(dev)  # (1, 16)
g0 = randn(1, len(s), config.d_model, seed=30, dtype=F64, device=dev)  # some ∂L/∂X0
grad_wte, _ = embedding_backward(ids, g0, tok.vocab_size, config.n_ctx)
assigned = torch.zeros_like(grad_wte)
assigned[ids.flatten()] = g0.flatten(0, 1)  # the trap

wte = params["wte"].clone().requires_grad_()
(ref_wte,) = torch.autograd.grad(F.embedding(ids, wte), wte, g0)
t = tok.stoi["t"]
print("'t' occurs", s.count("t"), "times")
compare("index_add_ (scatter-add)", grad_wte, ref_wte, atol=1e-10, rtol=0)
compare("assignment", assigned, ref_wte, atol=1e-10, rtol=0)
show("‖grad_wte['t']‖ scatter-add", grad_wte[t].norm())
show("‖grad_wte['t']‖ assignment ", assigned[t].norm())

# %% [markdown]
# With the assignment, the row of 't' holds one of the four gradients (which one is not even
# specified for repeated indices), and the comparison fails. `helpers.gpt.embedding_backward` uses
# `index_add_`. The position embedding has no such problem: each position occurs once per
# sequence, so its gradient is a plain sum over the batch.
#
# ### Gradient norms, block by block
#
# With the stream gradients $\partial L/\partial X_l$ returned by `gpt_backward` and the per-block
# parameter gradient norms, we can look at the flow through the stack. We make a deeper model for
# it, 8 blocks.

# %% mystnb={"image": {"alt": "Two panels for the 8-block GPT: above, each block's parameter gradient norm \u2016\u2202L/\u2202\u03b8\u2016; below, the gradient norm \u2016\u2202L/\u2202X_l\u2016 at each block's input."}}
deep = GPTConfig(
    vocab_size=tok.vocab_size, n_ctx=16, d_model=32, n_heads=4, n_layers=8, d_ff=64
)
deep_params = gpt_init(deep, seed=0, dtype=F64, device=dev)
logits, cache = gpt_forward(idx, deep_params, deep)
z = logits.flatten(0, 1)
# CE backward
grad_logits = (
    torch.softmax(z, -1) - F.one_hot(targets.flatten(), deep.vocab_size)
) / z.shape[0]
stream = []
deep_grads = gpt_backward(grad_logits.view_as(logits), cache, stream)
param_norms = block_grad_norms(deep_grads, deep.n_layers)
stream_norms = [g.norm().item() for g in stream]
print("block            " + " ".join(f"{l:>7}" for l in range(1, deep.n_layers + 1)))
print("‖∂L/∂θ_block‖    " + " ".join(f"{fmt_sci(v):>7}" for v in param_norms))
print("‖∂L/∂X_l‖ (in)   " + " ".join(f"{fmt_sci(v):>7}" for v in stream_norms[:-1]))
# Stacked, so that each panel keeps the page's width on a phone.
fig, axes = plt.subplots(2, 1, figsize=(6.4, 5.6), dpi=90)
plot_layer_norms(
    {"block parameters": param_norms}, ax=axes[0], ylabel="‖∂L/∂θ‖", title="per block"
)
plot_layer_norms(
    {"residual stream": stream_norms[:-1]},
    ax=axes[1],
    ylabel="‖∂L/∂X_l‖",
    title="at each block's input",
)
fig.tight_layout()
plt.show()

# %% [markdown]
# The stream gradient barely changes from block to block (5.0e-01 at the first block's input,
# 4.9e-01 at the others: the pre-norm skip paths carry it unchanged, plus small branch contributions), and every block's parameters get a gradient of
# the same order: nothing vanishes at depth 8. Chapter 11 trains a GPT of this kind with this
# backward. Before any training, the 4-block model we checked against `TinyGPT` above writes
# noise, a character at a time with `sample`:

# %%
out = sample(
    params, config, tok.encode("The cat")[None].to(dev), n=40, temperature=1.0, seed=0
)
print(repr(tok.decode(out[0])))

# %% [markdown]
# ## 6. What a block keeps for backward
#
# Which activations does the backward above need? Going through the block (pre-norm; post-norm in
# brackets), per token:
#
# * **LayerNorm**: its input and two floats, $\mu$ and $1/\sigma$; the normalised output is cheap
#   to recompute (chapter 4).
# * **in-projection**: its input (the $\mathrm{LN}_1$ output, recomputed; [post-norm: the block input]) and
#   nothing else; the attention needs $Q, K, V$: $3d$.
# * **attention**: $P$ would be $H\cdot N$ numbers per token. PyTorch's CPU attention kernel keeps
#   instead one log-sum-exp per row and head, $\mathrm{lse} = \log\sum_j e^{S_{ij}}$, and rebuilds
#   $P = e^{S - \mathrm{lse}}$ in backward from $Q$ and $K$ (one more $QK^\top$, chapter 10 does it
#   in tiles). We do the same: $H$ numbers per token. The rebuild is exact up to round-off:
# * **out-projection**: its input, the merged heads $A$: $d$.
# * **FFN**: $d_{ff}$: the ReLU output (which also says where the input was positive) or the GELU
#   input (its output is recomputed); `linear2`'s input is then recomputed or is the same tensor.
# * $\mathrm{LN}_2$'s input $X_1$: $d$ [post-norm: $Z_1$ and $Z_2$, $2d$].
#
# Altogether $B\,N\,(5d + d_{ff} + H + 4)$ elements for pre-norm and $B\,N\,(6d + d_{ff} + H + 4)$
# for post-norm: `block_saved_bytes_formula`. The tables compare it with what autograd keeps for
# `nn.TransformerEncoderLayer` (measured with `SavedTensors` on the CPU: the saved tensors depend
# on which attention kernel runs, which depends on the device).

# %%
# (B, H, N, d)
Qa, Ka, Va = (randn(1, 2, 5, 4, seed=s, dtype=F64, device=dev) for s in (60, 61, 62))
# (B, H, N, d) @ (B, H, d, N) -> (B, H, N, N)
Sa = Qa @ Ka.transpose(-2, -1) / math.sqrt(4)
# (B, H, N, 1): one number per row and head
lse = torch.logsumexp(Sa, dim=-1, keepdim=True)
_, P_kept = attention_forward(Qa, Ka, Va)  # chapter 6 keeps the whole P
_ = compare(
    "P = exp(S − lse) vs chapter 6's P", torch.exp(Sa - lse), P_kept, atol=1e-14, rtol=0
)

# %% [markdown]
# The rest of the list, as tables:

# %%
# Two narrow tables per block kind (ours, then autograd's) rather than one wide one.
for norm_first in (True, False):
    rows = block_saved_table(norm_first, "relu")
    print(f"--- {'pre' if norm_first else 'post'}-norm, relu")
    print(f"{'sub-layer':<11} {'our cache keeps':<36} per token")
    for row in rows:
        print(f"{row[0]:<11} {row[2]:<36} {row[3]}")
    print(f"{'sub-layer':<11} autograd keeps (nn.TransformerEncoderLayer)")
    for row in rows:
        print(f"{row[0]:<11} {row[1]}")

# %% [markdown]
# Now measured, at the benchmark's size $B=8$, $N=128$, $d=256$, $H=4$, $d_{ff}=1024$, float32,
# on the CPU. Neither count includes $X$ or the weights, which exist anyway.

# %%
B, N, d, H, d_ff = 8, 128, 256, 4, 1024
cpu_params = block_params(d, d_ff, seed=0)
Xc = randn(B, N, d, seed=40, requires_grad=True)
mask = nn.Transformer.generate_square_subsequent_mask(N)
head = ("autograd (measured)", "ours (measured)", "ours (formula)")
print(f"{'':<10} {head[0]:>20} {head[1]:>16} {head[2]:>15}")
for norm_first in (False, True):
    layer = layer_from_params(cpu_params, H, norm_first, "relu")
    with SavedTensors(exclude=[Xc, *layer.parameters()]) as saved:
        layer(Xc, src_mask=mask, is_causal=True)
    _, cache = block_forward(Xc, cpu_params, H, norm_first, causal=True)
    formula = block_saved_bytes_formula(B, N, d, H, d_ff, 4, norm_first)
    label = "pre-norm" if norm_first else "post-norm"
    print(
        f"{label:<10} {fmt_bytes(saved.total_bytes):>20} "
        f"{fmt_bytes(block_cache_bytes(cache)):>16} {fmt_bytes(formula):>15}"
    )
    compare(
        f"{'pre' if norm_first else 'post'}-norm cache = formula",
        block_cache_bytes(cache),
        formula,
        exact=True,
    )
print("P, if it were kept:", fmt_bytes(B * H * N * N * 4))

# %% [markdown]
# Our cache is exactly the formula: 10.0 MiB post-norm and 9.0 MiB pre-norm, against autograd's
# 12.0 MiB and 11.0 MiB. The difference is the LayerNorm outputs autograd keeps as inputs of the
# next linear layer (and, post-norm, a copy of the block input), which we recompute in backward
# from $\mu$ and $1/\sigma$. The ReLU output, $B\,N\,d_{ff}$ elements, is the largest item. Had we kept $P$ instead of the log-sum-exp, it would cost 2.0 MiB more per block.
#
# ## 7. How fast is the hand-written backward?
#
# `benchmarks/block_backward.py` runs both on the same block at the size above, interleaved in
# one process, and reports the median time of each and their ratio (target: the manual backward
# no slower than 1.25× autograd's) along with the saved bytes. Run it with
# `python benchmarks/block_backward.py`. The work is the same matrix products (a block's backward
# is about twice its forward's FLOPs, most of it in the four linear layers); ours adds one
# $QK^\top$ to rebuild $P$, which PyTorch's attention backward also does, and a few elementwise
# passes that PyTorch fuses (LayerNorm backward is one kernel there, about ten tensor operations
# here). A small version of the measurement, here and now:

# %%
B, N, d, H, d_ff = 4, 64, 128, 4, 512
p_small = block_params(d, d_ff, seed=0)
layer = layer_from_params(p_small, H, True, "relu")
weights = [layer.get_parameter(n) for n in BLOCK_PARAM_NAMES]
Xs, gs = randn(B, N, d, seed=50, requires_grad=True), randn(B, N, d, seed=51)
t_auto, t_man = [], []
for _ in range(6):
    Y = layer(Xs)
    t0 = time.perf_counter()
    torch.autograd.grad(Y, [Xs, *weights], gs)
    t_auto.append(time.perf_counter() - t0)
    _, cache = block_forward(Xs, p_small, H, True)
    t0 = time.perf_counter()
    block_manual_backward(gs, cache)
    t_man.append(time.perf_counter() - t0)
med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
varies(
    f"backward on the CPU: autograd {1e3 * med(t_auto):.1f} ms,"
    f" manual {1e3 * med(t_man):.1f} ms, ratio {med(t_man) / med(t_auto):.2f}x"
)

# %% [markdown]
# Both sides call the same matrix products, which dominate; what is left is our unfused elementwise
# work, so the hand-written backward stays a little slower. The benchmark script, at the full size
# on a quiet 2-core machine, measured 1.20–1.25× autograd's backward (table in
# `benchmarks/README.md`), just inside the 1.25× target. On a busy machine wall-clock ratios jump
# around (1.4–1.5× under a load average of 10); the script therefore also reports the ratio of
# CPU time used, which is steadier.
#
# ## Summary
#
# * LayerNorm's backward has three terms: the direct one, the mean path and the variance path;
#   each row of $\partial L/\partial x$ sums to zero.
# * A residual $y = x + f(x)$ sends $\partial L/\partial y$ unchanged down the skip path and adds the
#   branch's contribution: $\partial L/\partial x = \partial L/\partial y + J_f^\top\,\partial L/\partial y$.
#   Through 12 blocks with small weights the gradient kept its size with skips and fell to
#   1.5e-14 without.
# * The FFN backward is `linear2` → activation → `linear1`, chapter 4's pieces in reverse.
# * Post-norm: LN on the skip path, $dX = dZ_1 + \mathrm{SA}^\top(dZ_1)$ with $dZ_1 = \mathrm{LN}_1^\top(\cdots)$.
#   Pre-norm: the skip path from $Y$ to $X$ is untouched. Both match
#   `nn.TransformerEncoderLayer` for all 13 gradients, to 1e-10 in float64.
# * The GPT backward is the chain head → $\mathrm{LN}_f$ → blocks in reverse → embeddings, and
#   matches `TinyGPT` for every parameter; the token-embedding gradient is a scatter-**add**.
# * A block keeps $B\,N\,(5d + d_{ff} + H + 4)$ (pre-norm) or $B\,N\,(6d + d_{ff} + H + 4)$ (post-norm)
#   elements when it recomputes LN outputs and $P$, less than autograd keeps.
#
# ## Common mistakes
#
# * **Forgetting the skip term**: $dX = \mathrm{SA}^\top(\ldots)$ instead of $dX_1 + \mathrm{SA}^\top(\ldots)$.
#   Shapes agree, so only a comparison catches it (`tests/test_block.py` checks that it does).
# * **LayerNorm without its mean or variance path**, i.e. treating $\mu$ and $\sigma$ as constants.
# * **Using the wrong tensor for a recompute**: post-norm's FFN input is the $\mathrm{LN}_1$ *output* $X_1$, not
#   $Z_1$; pre-norm's attention input is $\mathrm{LN}_1(X)$, not $X$.
# * **`grad_wte[idx] = grad`** instead of `index_add_`: a repeated token keeps one gradient.
# * **Comparing with a module that has dropout on**: `nn.TransformerEncoderLayer` defaults to
#   dropout 0.1; the reference needs `dropout=0` (or `eval()`), or the gradients differ randomly.
# * **Halving the gradient at a residual**: the add node hands the *whole* $\partial L/\partial y$
#   to both inputs (seed 004's "一分为二" is a fork, not a division).
# * **Mask conventions**: `nn.TransformerEncoderLayer`'s float mask is $0/-\infty$ (True = blocked
#   for a bool mask), chapter 6's bool masks are True = attend.
#
# **Lab.** [Lab 7: one block's manual backward](../labs/lab07_transformer_block.ipynb).
