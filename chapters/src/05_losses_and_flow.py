# %% [markdown]
# # 5. Losses and the flow of gradients
#
# Backward starts at the loss function: the first gradient of every backward pass
# is $\partial L/\partial z$ for the logits $z$, and the loss decides how large it is,
# whether it can be NaN, and what every layer below receives. This chapter follows that gradient from the loss down through a deep
# network and builds the tools to watch it.
#
# **Learning goals.** After this chapter you can
#
# * derive that cross-entropy's gradient with respect to the logits is
#   $\operatorname{softmax}(z) - \text{onehot}(y)$, and why MSE on logits gives gradients
#   that grow with the logits;
# * write down what label smoothing and `ignore_index` do to that gradient;
# * explain when softmax really overflows (naive `exp`) and when it does not (`F.softmax`),
#   find the first NaN gradient with `torch.autograd.detect_anomaly`, and avoid "fixes" that
#   silently kill gradients;
# * clip gradients by global norm by hand, and place clipping between `backward()` and `step()`;
# * measure vanishing and exploding gradients layer by layer, and see what residual
#   connections, LayerNorm and the initialisation change; count dead ReLU units;
# * write a gradient-flow recorder that works (seed 000's reports nothing).
#
# Seed 000 (sections 3.3, 4.3, 5.3, 5.4; the seed articles are introduced in chapter 1)
# gets several of these wrong. Each mistake is reproduced in a collapsible aside, *What the
# source articles got wrong*, next to the section it concerns; the main text does not need
# them.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import math
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.show import fmt, fmt_sci, show

dev = get_device()
no_tf32()

# %% [markdown]
# ## 5.1 Cross-entropy: the gradient is softmax − one-hot
#
# For one example of the [cross-entropy](../pages/glossary.md#term-cross-entropy) loss, with logits $z \in \mathbb{R}^C$ and class $y$,
#
# $$L = -\log \operatorname{softmax}(z)_y = -z_y + \log \sum_j e^{z_j}.$$
#
# Differentiate term by term: $\partial(-z_y)/\partial z_i = -[i = y]$, and
# $\partial \log\sum_j e^{z_j} / \partial z_i = e^{z_i} / \sum_j e^{z_j} = p_i$. So
#
# $$\begin{aligned}
# \frac{\partial L}{\partial z_i} &= p_i - [i = y], \\
# \nabla_z L &= \operatorname{softmax}(z) - \text{onehot}(y).
# \end{aligned}$$
#
# With `reduction="mean"` over a batch of $B$ examples every row is divided by $B$.
# Every row of the gradient sums to 0 (the probabilities sum to 1, the one-hot too), and
# each entry lies in $(-1, 1)$: the target's $p_y - 1$ in $(-1, 0]$, every other $p_i$ in $[0, 1)$.
# The loss can never hand back a gradient larger than $\sqrt 2$ per example, whatever the logits.
# The target's entry is never positive (in the cell below it is the one negative entry of
# each row, e.g. −0.2144 in row 0, i.e. $(p_y - 1)/B$); it is what pulls the correct logit up.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (3.3) says softmax compresses the gradient's *magnitude* ("梯度幅值") into
# $[0, 1]$. About magnitude it is right: $|p_i - [i = y]| \le 1$. What the phrase hides is the
# sign of the entry that matters most: the target's entry $p_y - 1$ is never positive, and it
# is what pulls the correct logit up.
#
# </details>

# %%
B, C = 4, 5
z = randn(B, C, seed=0, device=dev, requires_grad=True)
y = torch.tensor([1, 0, 3, 3], device=dev)
L = F.cross_entropy(z, y)
L.backward()

p = torch.softmax(z.detach(), dim=-1)  # (B, C)
onehot = F.one_hot(y, C).to(z.dtype)  # (B, C)
grad_z = (p - onehot) / B  # (B, C)
show("grad_z (softmax - onehot) / B", grad_z)
compare("grad_z vs autograd", grad_z, z.grad)
show("row sums", grad_z.sum(dim=-1))

# %% [markdown]
# The comparison uses the float32 default (atol 1e-5, rtol 1e-4): ours and autograd compute
# the same softmax in a different order, so they agree to round-off, not bit for bit. The
# row sums print as 0 to four decimals.
#
# ## 5.2 MSE on logits: a gradient that grows with the logits
#
# Seed 000 (3.3) compares this with mean-squared error on the logits,
# $L = \sum_i (z_i - \text{onehot}_i)^2$, whose gradient is $2(z - \text{onehot})$: it is
# proportional to the logits themselves. Scale one example's logits $z = s\,z_0$ and
# measure both gradients' norms.

# %%
z0 = randn(10, seed=1, device=dev)
target = torch.tensor(3, device=dev)
print("largest logit of z0: class", int(z0.argmax()), "| target class:", int(target))
scales = [0.5, 1, 2, 4, 8, 16, 32, 64]
ce_norms, mse_norms = [], []
for s in scales:
    zs = (s * z0).requires_grad_(True)
    (grad_ce,) = torch.autograd.grad(F.cross_entropy(zs[None], target[None]), zs)
    (grad_mse,) = torch.autograd.grad(
        F.mse_loss(zs, F.one_hot(target, 10).to(zs.dtype), reduction="sum"), zs
    )
    ce_norms.append(grad_ce.norm().item())
    mse_norms.append(grad_mse.norm().item())
    print(
        f"s = {fmt(s, 1):>5}   ‖∂CE/∂z‖ = {fmt(ce_norms[-1], 3)}"
        f"   ‖∂MSE/∂z‖ = {fmt(mse_norms[-1], 3)}"
    )

zs = (8 * z0).requires_grad_(True)
(grad_mse,) = torch.autograd.grad(
    F.mse_loss(zs, F.one_hot(target, 10).to(zs.dtype), reduction="sum"), zs
)
ok = compare(
    "2(z - onehot) vs autograd", 2 * (zs.detach() - F.one_hot(target, 10)), grad_mse
)

# %% mystnb={"image": {"alt": "Log-log plot of the gradient norm at the logits per example against the logit scale s, for cross-entropy (softmax minus one-hot) and for MSE on the logits."}}
from helpers.plot_flow import plot_ce_vs_mse

fig = plot_ce_vs_mse(scales, ce_norms, mse_norms)
plt.show()

# %% [markdown]
# From $s = 0.5$ to $s = 64$ the MSE gradient grows from 2.546 to 284.743, roughly doubling
# with every doubling of $s$, while the cross-entropy gradient stays between 0.788 and 1.313:
# the target class (3) is not the largest logit of $z_0$, so as $s$ grows softmax moves its
# mass onto the wrong class and the norm creeps towards $\sqrt 2$, the most it can ever be. Cross-entropy
# hands back a bounded error signal; MSE on logits hands back one as large as the logits.
#
# ## 5.3 Label smoothing changes the target, so it changes the gradient
#
# `F.cross_entropy(..., label_smoothing=eps)` ($\varepsilon$ = `eps`) trains against the target
# $q = (1-\varepsilon)\,\text{onehot} + \varepsilon / C$ instead of the one-hot, so
#
# $$\nabla_z L = \operatorname{softmax}(z) - q.$$

# %%
eps = 0.1
z = randn(B, C, seed=0, device=dev, requires_grad=True)
F.cross_entropy(z, y, label_smoothing=eps).backward()
q = (1 - eps) * F.one_hot(y, C).to(z.dtype) + eps / C  # (B, C)
grad_z = (torch.softmax(z.detach(), dim=-1) - q) / B  # (B, C)
ok = compare("softmax - q vs autograd (smoothing 0.1)", grad_z, z.grad)

# %% [markdown]
# What changes is the end point. With a one-hot target the gradient only vanishes when
# $p_y \to 1$, i.e. when the correct logit is infinitely far ahead: the loss keeps pushing
# logits apart forever. With smoothing, $\operatorname{softmax}(z) = q$ is reachable: the
# gradient is zero at the finite gap $z_y - z_{j} = \log\frac{1-\varepsilon+\varepsilon/C}{\varepsilon/C}$,
# and beyond it the gradient pushes the correct logit back *down*.


# %%
def grad_at_gap(gap, eps):
    """∂L/∂z for one example: logit `gap` for the correct class 0, 0 for the rest."""
    zg = torch.zeros(C, device=dev)
    zg[0] = gap
    zg.requires_grad_(True)
    (g,) = torch.autograd.grad(
        F.cross_entropy(
            zg[None], torch.zeros(1, dtype=torch.long, device=dev), label_smoothing=eps
        ),
        zg,
    )
    return g


gap_star = math.log((1 - eps + eps / C) / (eps / C))
show("zero-gradient gap log((1-ε+ε/C)/(ε/C))", gap_star)
for gap in (2.0, gap_star, 10.0):
    print(
        f"gap {fmt(gap, 4):>7}:"
        f"  one-hot ∂L/∂z_y = {fmt(grad_at_gap(gap, 0.0)[0], 4):>7}"
        f"   smoothed ∂L/∂z_y = {fmt(grad_at_gap(gap, eps)[0], 4):>7}"
    )
_ = compare(
    "smoothed ∂L/∂z at gap* vs 0 (every class)",
    grad_at_gap(gap_star, eps),
    torch.zeros(C, device=dev),
)

# %% [markdown]
# With $\varepsilon = 0.1$ and $C = 5$ the smoothed gradient is 0 at a gap of 3.8286 — on every class, since
# there softmax equals $q$ — within the float32 default tolerance (atol 1e-5: the softmax is
# computed in float32 and the gap itself is rounded to float32, each worth about 1e-7), and it is
# positive (+0.0798) on the correct logit at a gap of 10: gradient descent then *lowers* the
# correct logit, while plain cross-entropy still says −0.0002 (keep going). Smoothing moves
# the target, and with it the point where the gradient vanishes.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 calls smoothing "spreading the gradient evenly over all classes"; what it does is
# move the target, and with it the point where the gradient vanishes (the cell above).
#
# Seed 000 (5.3) also warns that with `label_smoothing=0.5` "the target probability is spread
# thin and log(0.5/N) can trigger numerical instability". But the loss is
# $-\sum_c q_c \log p_c$: it takes the log of the **model's** probabilities $p$ (by
# log-sum-exp), never of the target $q$, which only multiplies. The hidden cell after this
# aside checks it on a very confident model (click to show it). The loss is 30.0000 — large,
# because this model puts almost no probability where $q$ asks for 0.1, but finite — and it
# equals $-\sum q \log p$ within the float32 default tolerance. The gradient is
# $\operatorname{softmax}(z) - q$, every entry in $(-1, 1)$ as always. The seed's
# $\log(0.5/N)$ never enters the loss or its gradient (it would appear only in the constant
# $\sum q \log q$ of the KL form), and it is a harmless −2.3026 anyway. What a large
# $\varepsilon$ does is set a poor target ($q_y = 0.6$ here), not a numerical trap.
#
# </details>

# %% tags=["hide-cell"]
# (1, C)
z_ls = torch.tensor([[30.0, 0.0, -30.0, -60.0, -90.0]], device=dev, requires_grad=True)
t_ls = torch.tensor([0], device=dev)
L_ls = F.cross_entropy(z_ls, t_ls, label_smoothing=0.5)
L_ls.backward()
q_ls = 0.5 * F.one_hot(t_ls, C).to(z_ls.dtype) + 0.5 / C  # (1, C): the smoothed target
logp_ls = F.log_softmax(z_ls.detach(), dim=-1)  # (1, C): the model's log p
show("q", q_ls)
show("log p", logp_ls)
show("loss, label_smoothing=0.5", L_ls)
compare("loss = −Σ q log p", L_ls, -(q_ls * logp_ls).sum())
show("∂L/∂z = softmax − q", z_ls.grad)
show("log(0.5 / C), the seed's worry", math.log(0.5 / C))

# %% [markdown]
# ## 5.4 `ignore_index`: padding rows get exactly zero gradient
#
# For sequences padded to a common length, the padded positions carry the label
# `ignore_index` (−100 by default). They are dropped from the sum **and** from the count:
# the mean divides by the number of non-ignored rows, not by the batch size.

# %%
z = randn(6, C, seed=2, device=dev, requires_grad=True)
y_pad = torch.tensor([2, -100, 0, 4, -100, -100], device=dev)
L = F.cross_entropy(z, y_pad, ignore_index=-100)
L.backward()

keep = y_pad != -100
n_keep = int(keep.sum().item())
per_row = F.cross_entropy(z.detach()[keep], y_pad[keep], reduction="none")  # (n_keep,)
print("rows kept:", n_keep, "of", len(y_pad))
compare("loss = sum over kept rows / n_keep", L, per_row.sum() / n_keep)
show(
    "sum over kept rows / batch size (not what torch does)", per_row.sum() / len(y_pad)
)
show("loss", L)
compare(
    "grad of padding rows == 0",
    z.grad[~keep],
    torch.zeros_like(z.grad[~keep]),
    exact=True,
)
# (n_keep, C)
grad_kept = (torch.softmax(z.detach()[keep], -1) - F.one_hot(y_pad[keep], C)) / n_keep
ok = compare("kept rows: grad = (softmax - onehot) / n_keep", grad_kept, z.grad[keep])

# %% [markdown]
# Three of six rows are kept, so each kept row's gradient is divided by 3, not 6; the
# padding rows' gradients are exactly zero (the `exact` comparison).
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (5.3) recommends `ignore_index` "because it has numerical protection inside": it
# has none to offer, it removes rows; the numerical protection is the log-sum-exp of the
# next section.
#
# </details>
#
# ## 5.5 Numerical safety: when softmax really overflows
#
# A **naive** [softmax](../pages/glossary.md#term-30), `exp(z) / exp(z).sum()`, overflows once a logit exceeds
# $\log(\text{float max})$; `F.softmax` subtracts the row maximum first,
# $\operatorname{softmax}(z) = \operatorname{softmax}(z - \max z)$, so the largest exponent
# is $e^0 = 1$ and nothing overflows.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (5.3) says "when `x.max() > 88`, `exp(x)` overflows to inf and softmax returns
# NaN". Half true: only the naive softmax does (the cells below); `F.softmax`,
# `F.log_softmax` and `F.cross_entropy` subtract the maximum and never overflow.
#
# </details>

# %%
show("log(float32 max)", math.log(torch.finfo(torch.float32).max))
show("log(float16 max)", math.log(torch.finfo(torch.float16).max))


def softmax_naive(z):
    """exp(z) / Σ exp(z): overflows once a logit exceeds log(float max)."""
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


big32 = torch.tensor([100.0, 90.0, 80.0], device=dev)
show("naive softmax, float32, z = [100, 90, 80]", softmax_naive(big32))
show("F.softmax,     float32, z = [100, 90, 80]", F.softmax(big32, dim=-1))
big16 = torch.tensor([12.0, 10.0, 0.0], device=dev, dtype=torch.float16)
show("naive softmax, float16, z = [12, 10, 0]", softmax_naive(big16), 3)
show("F.softmax,     float16, z = [12, 10, 0]", F.softmax(big16, dim=-1), 3)

# %% [markdown]
# In float32 the naive form breaks above 88.7228; in float16 already above 11.0899, so
# logits of 12 — entirely ordinary — turn into `inf / inf = nan`. The log-softmax has the
# same cure, the **log-sum-exp** form:
#
# $$\log \operatorname{softmax}(z)_i = z_i - m - \log\sum_j e^{z_j - m}, \qquad m = \max_j z_j .$$
#
# It also avoids the opposite failure: `log(softmax(z))` takes the log of a probability
# that has already underflowed to 0.


# %%
def log_softmax_lse(z):
    """z - m - log Σ exp(z - m), m = max z: every exponent is ≤ 0, nothing overflows."""
    m = z.max(dim=-1, keepdim=True).values
    return z - m - torch.log(torch.exp(z - m).sum(dim=-1, keepdim=True))


z = torch.tensor([100.0, 0.0, -200.0], device=dev)
show("log(naive softmax)", torch.log(softmax_naive(z)))
show("log(F.softmax)    ", torch.log(F.softmax(z, dim=-1)))
show("log-sum-exp form  ", log_softmax_lse(z))
compare("log-sum-exp vs F.log_softmax", log_softmax_lse(z), F.log_softmax(z, dim=-1))
show("log-sum-exp form, float16, z = [12, 10, 0]", log_softmax_lse(big16), 3)
tiny32 = torch.finfo(torch.float32).tiny
print(
    f"e^-100 = {fmt_sci(math.exp(-100))}; smallest normal float32 = {fmt_sci(tiny32)}"
)

# %% [markdown]
# `log(F.softmax(z))` no longer gives NaN but still gives `-inf` for the −200 logit
# ($e^{-300}$ underflows), and the gradient of `log` at 0 is infinite; the log-sum-exp form
# returns −300. Look also at the middle entry: `−99.9831` where the answer is exactly −100.
# $e^{-100}$ (printed) is below the smallest *normal* float32 (printed), so it is stored as a
# subnormal with only a few significant bits, and its log is already wrong in the second
# decimal. That is why `F.cross_entropy` takes **logits** and applies
# `log_softmax` + NLL fused: never feed it probabilities, never compose `log(softmax(...))`.
#
# ### Clamping the logits kills their gradients
#
# A tempting "fix" for overflow is `logits = torch.clamp(logits, -50, 50)`.
# `F.cross_entropy` needs no protection, and clamp's derivative is 0 outside the range: any
# logit that is clamped receives **no gradient at all**.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (5.3) recommends exactly this clamp "to prevent exp overflow". The cell below
# shows what it costs.
#
# </details>

# %%
z = torch.tensor([60.0, 55.0, 0.0], device=dev, requires_grad=True)
y1 = torch.tensor([1], device=dev)
L_raw = F.cross_entropy(z[None], y1)
(grad_raw,) = torch.autograd.grad(L_raw, z)
z_c = torch.clamp(z, -50, 50)  # (3,)
L_clamp = F.cross_entropy(z_c[None], y1)
grad_at_z_c, grad_clamp = torch.autograd.grad(L_clamp, (z_c, z))
show("loss without clamp", L_raw)
show("grad without clamp", grad_raw)
show("loss with clamp(-50, 50)", L_clamp)
show("grad arriving at clamp's output", grad_at_z_c)
show("grad with clamp(-50, 50), at z", grad_clamp)

# %% [markdown]
# The true loss is 5.0067 and the gradient lowers the wrong logit (+0.9933) and raises the
# right one (−0.9933). After clamping both logits read 50: the loss becomes 0.6931 (log 2),
# and the loss still asks to lower the wrong logit and raise the right one (+0.5000 and −0.5000
# at clamp's output). But both logits were clamped, clamp's derivative is 0 for both, and `z`
# receives `[0, 0, 0]`: neither logit can ever move again. Nothing warns you. If logits grow
# that large, the model or learning rate is the problem; the stable loss is already
# in `F.cross_entropy`.
#
# ## 5.6 Where NaN gradients come from, and how to find the first one
#
# A NaN gradient usually comes from one of a few places: `inf / inf` or `inf - inf` after
# an overflow (naive softmax above); `log(0)` (its derivative $1/0$); `sqrt` or `pow(x, 0.5)`
# at 0 (infinite derivative); and `0 · inf = nan` inside a backward. The sneakiest is a
# `torch.where` whose *unused* branch is NaN: the forward value is fine, the backward
# multiplies the branch's NaN gradient by 0 and gets NaN.

# %%
x = torch.tensor([4.0, -1.0, 0.25], device=dev, requires_grad=True)
L = torch.where(x > 0, x.sqrt(), 0.0).sum()  # sqrt(-1) = nan, but where() drops it
show("loss (finite)", L)
L.backward()
show("x.grad", x.grad)

# %% [markdown]
# The loss is 2.5000, the gradient of the middle entry is NaN, and one NaN in any gradient
# turns every weight it touches into NaN at the next `optimizer.step()`. To find which
# backward operation produced it, run the step under `torch.autograd.detect_anomaly()`:
# every backward node checks its outputs and raises at the first NaN, and the warning it
# emits carries the traceback of the *forward* line that created that node. (The full
# traceback depends on the machine, so we print only the first lines.)

# %%
x.grad = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        with torch.autograd.detect_anomaly():
            L = torch.where(x > 0, x.sqrt(), 0.0).sum()
            L.backward()
    except RuntimeError as err:
        print("RuntimeError:", str(err).splitlines()[0])
for w in caught:
    line = str(w.message).splitlines()[0]
    if line.startswith("Error detected"):
        print("warning:", line.split(". ")[0])

# %% [markdown]
# `SqrtBackward0` is the culprit. The fix is to keep the bad values out of the unused branch
# too (the "double where"), so no NaN is ever created:

# %%
x.grad = None
# a harmless value where the branch is unused
x_safe = torch.where(x > 0, x, torch.ones_like(x))
L = torch.where(x > 0, x_safe.sqrt(), 0.0).sum()
L.backward()
show("x.grad (double where)", x.grad)

# %% [markdown]
# `detect_anomaly` slows everything down; switch it on only to hunt a NaN, for the one step
# that produces it.
#
# ### Dropout in eval mode: identity, gradient 1
#
# In eval mode dropout *is* the identity, so its gradient is exactly 1; in train mode it is
# the mask divided by $1 - p$.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (5.4) says Dropout in eval mode "outputs the input but its gradient is 0", and
# suggests this as a cause of tiny gradients. The cell below shows the gradient is 1.
#
# </details>

# %%
drop = nn.Dropout(p=0.5)
x = torch.ones(1000, device=dev, requires_grad=True)
drop.eval()
drop(x).sum().backward()
compare("eval: output == input", drop(x), x, exact=True)
show("eval: distinct values of x.grad", torch.unique(x.grad))
x.grad = None
drop.train()
torch.manual_seed(0)
drop(x).sum().backward()
show("train: distinct values of x.grad (mask / (1 - p))", torch.unique(x.grad))

# %% [markdown]
# ## 5.7 Gradient clipping by global norm
#
# [Gradient clipping](../pages/glossary.md#term-gradient-clipping) caps the size of an update.
# This section borrows three tools that section 5.8 introduces properly:
# `helpers.gradflow.deep_mlp` (a deep MLP of chosen depth, width and activation),
# `fixed_batch` (the same random batch everywhere) and `init_scale=2.0` (weights twice the
# usual $\mathcal N(0, 1/\text{fan\_in})$ size, which makes the gradients large enough to
# need clipping).
#
# Clipping treats all gradients as one long vector $g$. If its length
# $\lVert g\rVert = \sqrt{\sum_p \lVert g_p\rVert^2}$ exceeds `max_norm`, every gradient is
# multiplied by $\texttt{max\_norm} / (\lVert g\rVert + 10^{-6})$: the direction of the
# update is kept, only its length shrinks. Written out:


# %%
def clip_by_hand(params, max_norm):
    """g ← g · min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the global L2 norm; returns ‖g‖."""
    grads = [p.grad for p in params]
    # (P,) -> ()
    total = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads])
    )
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total


from helpers.gradflow import clip_grad_norm, deep_mlp, fixed_batch, global_grad_norm


def model_with_grads():
    """A small deep MLP with init scale 2 (large gradients) after one backward."""
    model = deep_mlp(depth=6, width=16, activation="gelu", init_scale=2.0, device=dev)
    X, y = fixed_batch(batch=32, width=16, device=dev)
    F.cross_entropy(model(X), y).backward()
    return model


m_hand, m_helper, m_torch = model_with_grads(), model_with_grads(), model_with_grads()
max_norm = 1.0
total_hand = clip_by_hand(list(m_hand.parameters()), max_norm)
total_helper = clip_grad_norm(m_helper.parameters(), max_norm)
total_torch = torch.nn.utils.clip_grad_norm_(m_torch.parameters(), max_norm)
show("‖g‖ before clipping", total_torch, 2)
flat = lambda m: torch.cat([p.grad.flatten() for p in m.parameters()])
compare("by hand vs clip_grad_norm_", flat(m_hand), flat(m_torch))
compare("gradflow.clip_grad_norm vs clip_grad_norm_", flat(m_helper), flat(m_torch))
show("‖g‖ after clipping", global_grad_norm(m_torch.parameters()), 4)
_ = compare(
    "‖g‖ after clipping vs max_norm",
    global_grad_norm(m_torch.parameters()),
    torch.tensor(max_norm),
)

# %% [markdown]
# The gradients of this badly initialised network have global norm 38.47; after clipping
# the norm is 1.0000 = `max_norm`, within the float32 default tolerance (atol 1e-5): it falls
# short of 1 by the 1e-6 in the denominator divided by $\lVert g\rVert$, plus the round-off of a float32 norm,
# both far smaller. Our three versions agree within the same tolerance (the per-parameter norms may be summed in a
# different order on a GPU). `helpers.gradflow.clip_grad_norm` is the tested copy.
#
# **Where it sits.** Clipping edits `.grad`, so it must come after `backward()` has filled
# the gradients and before `step()` consumes them:

# %%
model = deep_mlp(depth=6, width=16, activation="gelu", init_scale=2.0, device=dev)
X, y = fixed_batch(batch=32, width=16, device=dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

opt.zero_grad(set_to_none=True)
loss = F.cross_entropy(model(X), y)
loss.backward()  # fills .grad
norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # rescales .grad
opt.step()  # uses the clipped .grad
show("loss before the step", loss, 4)
show(
    "‖g‖ before clipping (log this: it is the best early warning of a blow-up)", norm, 2
)
show("loss after the step", F.cross_entropy(model(X), y), 4)

# %% [markdown]
# Clipping before `backward()` clips nothing (the gradients do not exist yet, or are last
# step's); clipping after `step()` clips a gradient that has already been applied. With
# mixed precision and a `GradScaler`, unscale first (`scaler.unscale_(opt)`), then clip.
#
# ## 5.8 Vanishing and exploding gradients, layer by layer
#
# Backward multiplies the gradient by every layer's Jacobian on its way down:
# $\partial L/\partial h_{i} = (\partial h_{i+1}/\partial h_i)^\top \partial L/\partial h_{i+1}$.
# If those Jacobians shrink vectors (sigmoid's slope is at most 1/4) the gradient vanishes
# geometrically with depth (a [vanishing gradient](../pages/glossary.md#term-vanishing-gradient)); if they stretch them (weights too
# large) it explodes (an [exploding gradient](../pages/glossary.md#term-exploding-gradient)).
#
# `helpers.gradflow.deep_mlp` builds a stack of blocks
# $h \mapsto \text{act}(W\,\text{LN}(h) + b)$ ([LayerNorm](../pages/glossary.md#term-layer-normalization)
# optional), with a [residual](../pages/glossary.md#term-residual-connection) $h + \cdots$ optional, and
# weights drawn as $\texttt{init\_scale} \cdot \mathcal N(0, 1/\text{fan\_in})$ from fixed
# seeds. `layer_grad_norms` runs one cross-entropy backward on a fixed batch (64 examples,
# width 32) and returns $\lVert\partial L/\partial W\rVert$ for every block, input side
# first. Norms span twenty orders of magnitude, so we
# print them in scientific notation with two significant digits.

# %%
from helpers.gradflow import layer_grad_norms

X, y = fixed_batch(batch=64, width=32, device=dev)
inits = (1.0, 2.0)
archs = ((False, False), (True, False), (False, True), (True, True))
arch_name = {
    (False, False): "plain",
    (True, False): "residual",
    (False, True): "LayerNorm",
    (True, True): "residual+LN",
}
acts = ("sigmoid", "relu", "gelu")
norms = {}
print(f"init {'architecture':>12} {'activation':>10}  {'layer 1':>8} {'layer 20':>8}")
for init in inits:
    for res, ln in archs:
        for act in acts:
            name = arch_name[(res, ln)]
            model = deep_mlp(20, 32, act, res, ln, init, device=dev)
            n = layer_grad_norms(model, X, y)
            norms[(init, name, act)] = n
            first, last = fmt_sci(n[0]), fmt_sci(n[-1])
            print(f"{fmt(init, 1):>4} {name:>12} {act:>10}  {first:>8} {last:>8}")

# %% mystnb={"image": {"alt": "A grid of panels, one architecture per row and the two initialisation scales side by side: each layer's gradient norm, first layer to last, for each activation."}}
from helpers.plot_flow import plot_flow_grid

# One architecture per row, the two inits side by side: two panels a row stay
# readable on a phone.
by_arch = {(name, init, act): n for (init, name, act), n in norms.items()}
fig = plot_flow_grid(
    by_arch,
    rows=[arch_name[a] for a in archs],
    cols=inits,
    labels=acts,
    col_title=lambda c: f"init {c:g}",
)
plt.show()

# %% [markdown]
# Read the grid architecture by architecture (x: layer, 1 = next to the input; y:
# $\lVert\partial L/\partial W\rVert$, log scale):
#
# * **Plain sigmoid vanishes.** At init 1 the first layer's gradient is 1.4e-13 against
#   1.1e-01 at the last: each layer multiplies by $\sigma' \le 1/4$, and 20 layers of that leave
#   nothing for the input side. Doubling the weights (init 2) only moves it to 8.5e-09.
# * **Plain ReLU and GELU depend on the scale.** At init 1 the signal shrinks in the forward
#   pass (ReLU zeroes half of it), and every gradient is small (ReLU: 8.6e-04 at layer 1,
#   GELU: 9.3e-07). At init 2 both explode: 1.2e+03 (ReLU), 1.4e+03 (GELU). Swapping
#   ReLU for GELU does not help: at init 1, GELU's layer-1 gradient (9.3e-07) is about a
#   thousand times *smaller* than ReLU's (8.6e-04). What cures this stack is the scale of
#   the weights or a normalisation (next rows).
# * **Residual connections alone** give the gradient a path that skips every block
#   ($\partial h_{i+1}/\partial h_i = I + \cdots$), which cures sigmoid's vanishing (2.7e-01 at
#   layer 1) — but without normalisation the activations add up layer after layer and
#   ReLU/GELU gradients explode even at init 1 (6.1e+02 and 6.4e+02 at layer 1; 8.8e+05 and
#   9.0e+05 at init 2).
# * **LayerNorm** rescales every block's input, so neither init can blow the forward pass up;
#   **residual + LayerNorm** (the transformer recipe) keeps every activation and both inits
#   within about one order of magnitude from layer 1 to layer 20 (ReLU at init 1: 2.9e+00 to
#   9.9e-01).
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (4.3) prescribes, for a vanishing gradient, replacing `nn.ReLU()` by `nn.GELU()`
# ("its derivative is non-zero in the negative region"), or adding a LayerNorm. The table
# contradicts the first remedy: at init 1, GELU's layer-1 gradient (9.3e-07) is about a
# thousand times *smaller* than ReLU's (8.6e-04). A small negative slope (chapter 4: never
# below −0.1289) does not restore a signal that the forward pass has already shrunk; what
# cures this stack is the scale of the weights or the seed's second remedy, a
# normalisation.
#
# </details>
#
# The critical scale for ReLU is He's $\sqrt 2$: it exactly compensates for ReLU zeroing half
# the signal, so a plain ReLU stack neither vanishes nor explodes:

# %%
n_he = layer_grad_norms(
    deep_mlp(20, 32, "relu", init_scale=math.sqrt(2), device=dev), X, y
)
print("plain relu, init √2: layer 1", fmt_sci(n_he[0]), " layer 20", fmt_sci(n_he[-1]))

# %% [markdown]
# ### Dead ReLU units
#
# A ReLU unit whose pre-activation is $\le 0$ on every example of a batch outputs 0 on all of
# them, and $\mathrm{ReLU}' = 0$ there (a [dead ReLU](../pages/glossary.md#term-dead-ReLU)): on that batch no gradient passes through it, so **its own
# incoming weights and bias** get exactly zero gradient. That makes it *dead on this batch*,
# not dead for good: on other inputs it may fire, and a unit in layer 2 or deeper can come
# back when the layers below it learn and change its input (we will watch it happen). Only a
# first-layer unit, whose input is the data itself, stays dead under plain gradient descent
# once it is dead on the whole training set. `helpers.gradflow.dead_relu_units` counts the
# units that are 0 on every row of a batch, per ReLU, with a forward hook.

# %%
from helpers.gradflow import dead_relu_units


def n_dead(model):
    """Total dead ReLU units over the batch, and total units."""
    counts = dead_relu_units(model, X)
    return sum(d for d, _ in counts.values()), sum(n for _, n in counts.values())


dead_plain = dead_relu_units(deep_mlp(20, 32, "relu", device=dev), X)
print("plain relu, init 1, dead units per layer:")
print(" ", [d for d, _ in dead_plain.values()])
print(
    "plain relu, init 1: dead / units =", *n_dead(deep_mlp(20, 32, "relu", device=dev))
)
print(
    "relu + LayerNorm, init 1: dead / units =",
    *n_dead(deep_mlp(20, 32, "relu", layernorm=True, device=dev)),
)

# %% [markdown]
# At init 1, 114 of the 640 units of the plain ReLU stack are already dead on this batch,
# more in deeper layers, and none with LayerNorm (it re-centres every block's input).
#
# A classic way to kill units is one step with too large a learning rate: a big update pushes
# the biases and weights of some units so far that their pre-activation is negative on
# every example of the batch. Take a 6-layer ReLU MLP at He initialisation and make one SGD step:

# %%
for lr in (0.1, 1.0, 3.0):
    model = deep_mlp(6, 32, "relu", init_scale=math.sqrt(2), device=dev)
    before = n_dead(model)[0]
    F.cross_entropy(model(X), y).backward()
    with torch.no_grad():
        for prm in model.parameters():
            prm -= lr * prm.grad
    dead, units = n_dead(model)
    print(f"lr {fmt(lr, 1)}: dead units {before} -> {dead} of {units}")

model.zero_grad(set_to_none=True)
F.cross_entropy(model(X), y).backward()
dead_now = dead_relu_units(model, X)
rows_zero = sum(
    int((model.blocks[i].linear.weight.grad.abs().sum(dim=1) == 0).sum().item())
    for i in range(6)
)
print(
    "after lr 3.0: dead units",
    sum(d for d, _ in dead_now.values()),
    "| weight rows with exactly zero gradient",
    rows_zero,
)

# %% [markdown]
# One step at learning rate 3.0 takes the dead count from 8 to 54 of 192 units, and every
# dead unit's weight row now gets exactly zero gradient (54 rows): those rows cannot move.
# Their *inputs* can. Keep training the same network, 100 plain SGD steps at learning rate 0.1
# on the same batch, and follow each layer's dead units:


# %%
def dead_units_per_layer(model):
    """Per block, the set of units that output 0 on every row of X."""
    sets, h = [], X
    with torch.no_grad():
        for block in model.blocks:
            h = block(h)  # (B, 32)
            sets.append(set((h == 0).all(dim=0).nonzero().flatten().tolist()))
    return sets


dead_before = dead_units_per_layer(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(100):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
dead_after = dead_units_per_layer(model)
print("layer                      ", list(range(1, 7)))
print("dead after the lr 3.0 step ", [len(b) for b in dead_before])
print(
    "  ... alive again          ", [len(b - a) for b, a in zip(dead_before, dead_after)]
)
print(
    "  ... still dead           ", [len(b & a) for b, a in zip(dead_before, dead_after)]
)
print(
    "newly dead                 ", [len(a - b) for b, a in zip(dead_before, dead_after)]
)
print("loss", fmt(losses[0], 2), "->", fmt(losses[-1], 2))

# %% [markdown]
# Of the 54 dead units, 18 are alive again after 100 steps — all in layers 3 to 6, whose
# inputs the layers below kept changing — while 12 others died along the way. None was in
# layer 1 here; a layer-1 unit dead on the whole training set would have no way back. So
# "dead" is a statement about a unit, a batch and a moment: count dead units during training
# (a rising count is a warning), but do not read one count as permanent loss.
#
# ## 5.9 A gradient-flow diagnostic that works
#
# A gradient-flow diagnostic records, for every module and by its name, the norm of the
# gradient that flows past the module's output and the norms of its parameters' gradients,
# so that a layer that receives nothing stands out. A diagnostic must itself be tested: we
# try it on a small MLP with a known dead layer, its middle linear layer set to $W = b = 0$.

# %%
torch.manual_seed(0)
mlp = nn.Sequential(
    nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
).to(dev)
with torch.no_grad():
    mlp[2].weight.zero_()  # a known dead layer: W = b = 0
    mlp[2].bias.zero_()

# %% [markdown]
# `helpers.gradflow.GradFlowRecorder` keys every record by the module's name (each hook is
# created *for a name*) and records during the real backward instead of re-differentiating:
# a forward hook attaches a tensor hook to each module's output, which sees
# $\lVert\partial L/\partial\,\text{output}\rVert$ as the gradient flows past, and a
# post-accumulate-grad hook on every parameter records $\lVert\partial L/\partial\theta\rVert$.

# %%
from helpers.gradflow import GradFlowRecorder

with GradFlowRecorder(mlp) as rec:
    F.cross_entropy(mlp(X), y).backward()
print(f"{'module':>6} {'‖∂L/∂out‖':>10}   {'param':>8} {'‖∂L/∂θ‖':>8}")
for name in rec.names:
    params = [k for k, _ in mlp.named_parameters() if k.startswith(name + ".")] or [""]
    for k in params:
        pn = fmt_sci(rec.param_grad_norms[k]) if k else ""
        print(f"{name:>6} {fmt_sci(rec.output_grad_norms[name]):>10}   {k:>8} {pn:>8}")

# %% [markdown]
# Now the dead layer is visible, by name: the ReLU after it (`3`) and the head (`4`) still
# receive gradient, but $\mathrm{ReLU}'(0) = 0$ stops it, so layers `2`, `1` and `0` get
# exactly 0 — and so does the head's weight `4.weight`, whose input is all zeros; only its
# bias learns. The recorder's output-gradient norms are the same numbers
# `torch.autograd.grad` gives for each module's output:

# %%
outs = {}
hooks = [
    mlp[i].register_forward_hook(lambda m, inp, out, i=i: outs.__setitem__(str(i), out))
    for i in (0, 2, 4)
]
loss = F.cross_entropy(mlp(X), y)
for h in hooks:
    h.remove()
for name in ("0", "2", "4"):
    (g,) = torch.autograd.grad(loss, outs[name], retain_graph=True)
    compare(
        f"recorder vs autograd.grad, module {name}",
        torch.tensor(rec.output_grad_norms[name]),
        g.norm().cpu(),
    )

# %% [markdown]
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (4.3) offers a `debug_gradient_flow`. The first hidden cell below (click to show
# it) runs it, logic unchanged, on the MLP above, and it reports an empty dict.
# `activations` is keyed by module objects, `name in activations` tests a string against
# them, so it is never true and the loop records nothing — and had it run, the bare `except`
# would have reported any error as a gradient of 0.0, i.e. as "vanishing". A diagnostic that
# cannot fail is worse than none.
#
# On the seed's own example it does not even get that far. The seed builds
# `DebugTransformerEncoderLayer()` with its default `d_model=512` and feeds it a 128-wide
# `x`, which the attention rejects; its layer returns a tuple `(output, attn_weights)`, so
# `criterion(model(x), target)` gets a tuple; and `CrossEntropyLoss` reads `(1, 20, 128)`
# logits as `(N, C, d1)`, 20 classes, and wants `(1, 128)` targets, not `(1, 20)` (flatten
# to `(20, 128)` and `(20,)`, or permute to `(B, C, N)`). The hook it puts on
# `self_attn.out_proj` never fires either, because `nn.MultiheadAttention` uses
# `out_proj.weight` directly without calling the module. The second hidden cell checks this
# on a small attention layer: only the attention module's own hook fires, not
# `out_proj`'s; the output is a tuple; the loss raises. So the seed's printed
# `linear1: 0.0032` (its sign of a "vanishing" FFN) cannot come from its code: run as
# written it raises before printing anything, and once those errors are repaired it prints
# nothing (its `grads` dict is empty, so the loop over it never runs).
#
# </details>


# %% tags=["hide-cell"]
def seed_debug_gradient_flow(model, input_tensor, target, criterion):
    """Seed 000, 4.3 (verbatim logic): hooks store outputs keyed by MODULE ..."""
    activations = {}

    def hook_fn(module, input, output):
        activations[module] = output

    hooks = []
    for name, layer in model.named_modules():  # noqa: B007  (the seed's code, as it is)
        if isinstance(layer, (nn.Linear, nn.MultiheadAttention)):
            hooks.append(layer.register_forward_hook(hook_fn))
    loss = criterion(model(input_tensor), target)
    grads = {}
    for name, layer in model.named_modules():
        if name in activations:  # ... but look them up by NAME
            try:
                grad = torch.autograd.grad(loss, activations[layer], retain_graph=True)[
                    0
                ]
                grads[name] = grad.norm().item()
            except:  # noqa: E722  (and hide every error as 0.0)
                grads[name] = 0.0
    for hook in hooks:
        hook.remove()
    return grads


print(
    "seed's helper reports:", seed_debug_gradient_flow(mlp, X, y, nn.CrossEntropyLoss())
)

# %% tags=["hide-cell"]
mha = nn.MultiheadAttention(16, 2, batch_first=True).to(dev)
fired = []
for name, layer in mha.named_modules():
    if isinstance(layer, (nn.Linear, nn.MultiheadAttention)):
        layer.register_forward_hook(
            lambda m, inp, out, name=name or "(the attention)": fired.append(name)
        )
tokens = randn(1, 20, 16, seed=5, device=dev)  # (B, N, d)
result = mha(tokens, tokens, tokens)
print(
    "hooked:",
    [
        name or "(the attention)"
        for name, layer in mha.named_modules()
        if isinstance(layer, (nn.Linear, nn.MultiheadAttention))
    ],
    "| fired:",
    fired,
)
print("nn.MultiheadAttention returns a", type(result).__name__, "of", len(result))
try:
    nn.CrossEntropyLoss()(result[0], torch.zeros(1, 20, dtype=torch.long, device=dev))
except RuntimeError as err:
    print("CrossEntropyLoss((1, 20, 16), (1, 20)) -> RuntimeError:")
    print(" ", str(err).splitlines()[0])

# %% [markdown]
# ## 5.10 Try it: the gradient-flow panel
#
# A live panel rebuilds the deep MLP for the depth, activation, residual, LayerNorm and
# initialisation you choose and redraws its per-layer $\lVert\partial L/\partial W\rVert$.
# It needs a running kernel, so it is only in the notebook: open this chapter in Colab (or
# Jupyter) to use it. The animation below works on this page too: its slider steps through
# all twelve depth-20 settings at init 1.

# %% tags=["nbval-ignore-output", "remove-cell"]
# The live panel (in Jupyter and Colab only; the website leaves this cell out).
from helpers.widgets_flow import flow_panel

flow_panel()

# %% tags=["nbval-ignore-output"]
from IPython.display import HTML

from helpers.widgets_flow import flow_animation

# The depth-20, init-1 curves were computed in 5.8: reuse them as the frames.
done = {
    (act, res, ln, 1.0): norms[(1.0, arch_name[(res, ln)], act)]
    for res, ln in archs
    for act in acts
}
HTML(flow_animation(depth=20, precomputed=done).to_jshtml(default_mode="once"))

# %% [markdown]
# ## Summary
#
# * Cross-entropy's gradient with respect to the logits is
#   $\operatorname{softmax}(z) - \text{onehot}(y)$ (divided by the batch size for a mean):
#   bounded by $\sqrt 2$ per example. MSE on logits gives $2(z - \text{onehot}(y))$, which
#   grows with the logits.
# * Label smoothing replaces the one-hot by
#   $q = (1 - \varepsilon)\,\text{onehot}(y) + \varepsilon/C$: the gradient becomes
#   $\operatorname{softmax}(z) - q$ and vanishes at a finite logit gap. `ignore_index` rows get exactly zero
#   gradient and are left out of the mean's denominator.
# * Naive `exp(z) / exp(z).sum()` overflows above 88.7228 in float32 and 11.0899 in float16;
#   `F.softmax`, `F.log_softmax` and `F.cross_entropy` use the max-subtracted / log-sum-exp
#   form and do not. Find the first NaN gradient with `torch.autograd.detect_anomaly()`.
# * Clip by global norm after `backward()` and before `step()`; `clip_grad_norm_` returns the
#   norm before clipping — log it.
# * Per-layer gradient norms show vanishing (sigmoid stacks) and exploding (large init,
#   residual without normalisation); residual + LayerNorm keeps them within an order of
#   magnitude. A ReLU unit dead on a batch gets no gradient for its own weights and bias; a
#   unit in layer 2 or deeper can still revive as the layers below change its input (18 of 54
#   did in 100 SGD steps).
# * A gradient-flow recorder keys its records by module name, records during the real
#   backward, and is tested on a model with a known dead layer.
#
# ## Common mistakes
#
# * Composing `torch.log(torch.softmax(z))`, or passing probabilities to `F.cross_entropy`:
#   use logits and the fused, log-sum-exp loss.
# * "Fixing" overflow with `clamp(logits, -50, 50)`: clamped logits get zero gradient and the
#   loss is wrong (seed 000, 5.3).
# * Believing `F.softmax` returns NaN for logits above 88: only a hand-written naive softmax
#   does (seed 000, 5.3).
# * Believing Dropout in eval mode has gradient 0: it is the identity, gradient 1 (seed 000, 5.4).
# * A `torch.where` with a NaN/inf in the unused branch: finite loss, NaN gradient.
# * Clipping before `backward()` or after `step()`; forgetting `scaler.unscale_` under AMP.
# * Diagnostic hooks keyed by one thing and looked up by another, with a bare `except` that
#   turns every failure into "gradient 0.0" (seed 000, 4.3).
# * Forgetting that padding rows change the mean's denominator when computing a loss by hand.
#
# **Lab:** [Lab 5 — losses and the flow of gradients](../labs/lab05_losses_and_flow.ipynb).
