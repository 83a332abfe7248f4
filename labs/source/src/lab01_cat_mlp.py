# %% [markdown]
# # Lab 1 · The cat MLP, backward by hand
#
# The chapter showed every gradient of the cat MLP; here **you** write them. This lab goes
# with [Chapter 1](../chapters/01_cat_mlp.ipynb).
#
# **Learning goals.** After this lab you can
# * compute a small network's forward pass and keep what backward needs;
# * write the gradient of the MSE loss, of a linear layer and of ReLU by hand, with the shapes right;
# * say why a dead ReLU unit's weights get a zero gradient;
# * vectorise the whole backward pass over a batch.
#
# **How a lab works.** Each exercise states its goal and its points (11 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It runs your function on one case of each promise the exercise makes
# (the cat's own sizes, other sizes, a dead unit, float32, …) and compares it with reference
# outputs recorded from the course's solution. It answers in one line:
#
# * `✓` your function matches in every kind of case;
# * `✗` the kinds of case where it fails, named in words first ("fails when there are several
#   outputs — works when …"), then what is off in the first one: a known mistake it matches,
#   the shape or dtype expected, a factor such as 1/B, or an argument it changed;
# * `·` not implemented yet.
#
# Your instructor grades the notebook you hand in with *hidden* tests: the same kinds of case,
# with other values. A `✓` means every kind passes here; the hidden tests try each kind again.
# To hand it in: run all cells, then *File → Download → .ipynb*.
#
# **By hand** means derived: a graded backward may not call autograd, and an estimate by finite
# differences (the forward run again for each input entry) does not count either. One kind of
# case of each backward is large, and there the self-check and the hidden tests count the tensor
# entries your code writes, forward and backward: at most 10 × what the course's backward
# writes, room enough for any derived backward on rows and matrices (loops over rows or samples and float64 copies included; a loop over every single entry may not fit).
# Values read out of tensors into Python or NumPy there (`.item()`, `float()`, `.tolist()`,
# `.numpy()`, printing) count too, at most 8 (a count or a norm, not a tensor), and comparisons
# read out (`if h[i] > 0`) at most two per entry: work done outside tensors cannot be measured. A
# backward over any of these limits scores 0 for its exercise, as one that calls autograd does;
# so does one that calls a backward pass of the course's `helpers`, unless the lab's own code uses it for you and the exercise does not name it.
#
# **The seed's numbers** (chapter 1, the cat): $x = (1, 2, -1, 0.5)$,
# $W_1 = \begin{pmatrix} 0.1 & 0.2 & -0.1 & 0.05 \\ 0.3 & -0.1 & 0.2 & 0.1 \end{pmatrix}$,
# $b_1 = (0.1, -0.1)$, $W_2 = (0.5, -0.4)$ (shape (1, 2)), $b_2 = 0.2$, $y = 1$
# (`helpers.cat_mlp.cat_params()` gives them as tensors). With them, $h = (0.725, -0.15)$,
# $a = (0.725, 0)$, $\hat y = 0.5625$, $L = 0.19140625$ and $\partial L/\partial \hat y =
# -0.875$: numbers to check your pencil work against.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch

from helpers import cat_mlp  # noqa: F401 - the seed's numbers: cat_mlp.cat_params()
from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · The forward pass (1 point)
#
# **Goal:** compute and keep every value that backward will need.
#
# **You derive:** the four formulas as tensor operations for any sizes: which product turns
# `W1` (n_h, n_in) and `x` (n_in,) into `h` (n_h,), and how the squared error becomes a
# 0-dim `L`.
#
# **You are given:** the formulas below, the seed's numbers (`cat_mlp.cat_params()`) and the
# values they give ($h$, $a$, $\hat y$, $L$ in the introduction). The course's own
# `cat_mlp.forward` is what you write here: calling it scores 0 for this exercise, as calling
# `cat_mlp.backward` does in the exercises after it.
#
# Write `forward_pass` for the seed's network, $h = W_1 x + b_1$, $a = \mathrm{relu}(h)$,
# $\hat y = W_2 a + b_2$, $L = \sum (\hat y - y)^2$ (a sum over the outputs). The cat has `x`
# (4,), `W1` (2, 4), `W2` (1, 2); write it for **any sizes**: `x` (n_in,), `W1` (n_h, n_in),
# `b1` (n_h,), `W2` (k, n_h), `b2` and `y_true` (k,), with units that are active ($h > 0$) or
# dead ($h < 0$), in float32 or float64 (keep the dtype you are given). Return the dict
# `{"h", "a", "y_hat", "L"}` with `h`, `a` of shape (n_h,), `y_hat` of shape (k,) and `L` a
# **0-dimensional tensor** (shape `()`, not `(1,)`).
#
# <details><summary>Hint 1 of 3 · the idea: shapes first</summary>
#
# Write the shape of every line before the code. A matrix (n_h, n_in) times a vector (n_in,)
# gives a vector (n_h,); a bias of that shape adds entry by entry. Keep each intermediate in
# its own name: backward needs `h` (for the ReLU's mask) and `a` (for the second layer's
# weight gradient). Operations on the given tensors keep their dtype; a value you build
# yourself (a Python float, a new `torch.tensor`) may not.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the loss as a 0-dim tensor</summary>
#
# $L$ adds one squared difference per output: subtract the target entry by entry, square entry
# by entry, then add up every entry. A sum over all entries with no `dim` returns shape `()`;
# indexing `[0]` or a sum with `keepdim=True` does not, and a mean divides by k.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the seed's numbers, then other sizes</summary>
#
# Run it on `cat_mlp.cat_params()` and compare with the introduction: $h = (0.725, -0.15)$,
# $a = (0.725, 0)$, $\hat y = 0.5625$, $L = 0.19140625$ (float64, to 12 decimals), and
# `out["L"].shape == torch.Size([])`. Then, in a scratch cell you delete before handing in,
# try k = 2 outputs and n_h = 3 units on random float64 tensors: compare `h` with
# `torch.nn.functional.linear(x, W1, b1)`, check that `a` is 0 exactly where `h <= 0`, and
# repeat with float32 inputs: every output should be float32.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (n_h, n_in) @ (n_in,) -> (n_h,)
    h = W1 @ x + b1  # SOLUTION
    # (n_h,)
    a = torch.relu(h)  # SOLUTION
    # (k, n_h) @ (n_h,) -> (k,)
    y_hat = W2 @ a + b2  # SOLUTION
    # ()
    L = ((y_hat - y_true) ** 2).sum()  # SOLUTION
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex1", forward_pass)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · Where backward starts: $\partial L/\partial \hat y$ (1 point)
#
# **Goal:** differentiate the loss itself, the first link of the chain.
#
# **You derive:** $\partial L/\partial \hat y$ entry by entry, as a tensor of the shape of
# `y_hat`: (1,), (n,) or (B, k).
#
# **You are given:** the loss $L$ below and `y_true` of the shape of `y_hat`; for the cat,
# $\hat y = 0.5625$ and $y = 1$.
#
# Write `grad_loss(y_hat, y_true)`, the gradient of $L = \sum(\hat y - y)^2$ (the sum over
# every entry) with respect to $\hat y$: a tensor of the **shape** and dtype of `y_hat`,
# whether `y_hat` has one entry (shape (1,), the cat's), several (shape (n,)) or is 2-D
# (B, k), a batch of outputs. Derive it on paper first: one entry, one power rule.
#
# <details><summary>Hint 1 of 3 · the idea: one term per entry</summary>
#
# $L$ is a sum of separate terms, one per entry of $\hat y$, and $\hat y_i$ appears in one term
# only. So $\partial L/\partial \hat y_i$ is the derivative of that one term; the others give
# 0. The result has one entry per entry of $\hat y$: no sum, no mean, the same shape whether
# `y_hat` is 1-D or 2-D.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the power rule, then the inside</summary>
#
# Differentiate the term $(\hat y_i - y_i)^2$: the power rule brings down a factor, and the
# chain rule multiplies by the derivative of the inside, $\hat y_i - y_i$, with respect to
# $\hat y_i$, which is $+1$. Mind both the factor and the sign.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the cat, then several entries</summary>
#
# For the cat ($\hat y = 0.5625$, $y = 1$) it is −0.875. A missing factor, or
# $y - \hat y$ instead of $\hat y - y$, each give another number. A mean instead of the sum
# does not show here: with one output the mean *is* the sum. It shows as soon as $\hat y$ has
# several entries, which is why the self-check also tries several: in a scratch cell (delete
# it before handing in), take a float64 `y_hat` of shape (2, 3), move one entry by
# $\pm 10^{-6}$, and compare $(L_+ - L_-)/(2 \cdot 10^{-6})$ with that entry of yours. To
# check yours against:
#
# $$\frac{\partial L}{\partial \hat y} = 2(\hat y - y).$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # the shape of y_hat
    grad_y_hat = 2 * (y_hat - y_true)  # SOLUTION
    return grad_y_hat


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex2", grad_loss)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · The second layer's gradients (2 points)
#
# **Goal:** one linear layer, three gradients: the weights, the bias, and the input that
# passes the signal further back.
#
# **You derive:** `grad_W2` (k, n), `grad_b2` (k,) and `grad_a` (n,), each from one entry of
# $\hat y$.
#
# **You are given:** `grad_y_hat` (exercise 2's result) and the forward's `a` and `W2`; `b2`
# itself is not needed.
#
# $\hat y = W_2 a + b_2$. The cat has `W2` (1, 2) and `a` (2,); write it for any `W2` (k, n)
# and `a` (n,): a longer `a`, several outputs ($k > 1$), a square `W2` ($k = n$), in float32 or
# float64. Given `grad_y_hat` $= \partial L/\partial \hat y$ (shape (k,)), return
# `(grad_W2, grad_b2, grad_a)` with the shapes of `W2` (k, n), `b2` (k,) and `a` (n,), in the
# dtype of the inputs. Leave the arguments unchanged.
#
# <details><summary>Hint 1 of 3 · the idea: one entry, then the chain rule</summary>
#
# Derive each from one entry, $\hat y_i = \sum_j (W_2)_{ij} a_j + (b_2)_i$. The chain rule
# says: $\partial L/\partial \theta$ is the sum over $i$ of $\partial L/\partial \hat y_i$
# times $\partial \hat y_i/\partial \theta$. Which entries of $\hat y$ does $(W_2)_{ij}$ touch?
# Which does $a_j$ touch (all of them: add up what each sends back)? Each gradient has the shape
# of its tensor.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the weight's entry</summary>
#
# $(W_2)_{ij}$ touches $\hat y_i$ only, with slope $a_j$. So $\partial L/\partial (W_2)_{ij}$
# is one product, no sum: an entry of `grad_y_hat` times an entry of `a`. One product for every
# pair $(i, j)$ is an outer product of two vectors; which one comes first so that the shape is
# (k, n)? The bias and `a` follow the same way.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the cat, then a square W2</summary>
#
# The cat's $\partial L/\partial \hat y = -0.875$ and $a = (0.725, 0)$ give
# `grad_W2` $= [[-0.634375, 0]]$, `grad_b2` $= [-0.875]$ and `grad_a` $= [-0.4375, 0.35]$.
# A square `W2` is where a transpose you forgot still has the right shape but not the right
# numbers: in a scratch cell (delete it before handing in), take float64 `W2` (3, 3), `b2`
# (3,) and `a` (3,) with `requires_grad=True`, compute `(grad_y_hat * (W2 @ a + b2)).sum()`, call
# `.backward()` and compare `W2.grad`, `b2.grad`, `a.grad` with yours. To check yours against:
#
# $$\frac{\partial L}{\partial W_2} = \frac{\partial L}{\partial \hat y}\, a^\top,
# \qquad \frac{\partial L}{\partial b_2} = \frac{\partial L}{\partial \hat y},
# \qquad \frac{\partial L}{\partial a} = W_2^\top \frac{\partial L}{\partial \hat y}.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (k, n), the shape of W2
    grad_W2 = torch.outer(grad_y_hat, a)  # SOLUTION
    # (k,)
    grad_b2 = grad_y_hat.clone()  # SOLUTION
    # -> (n,), the shape of a
    grad_a = W2.T @ grad_y_hat  # SOLUTION
    return grad_W2, grad_b2, grad_a


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex3", layer2_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Through the ReLU (2 points)
#
# **Goal:** a nonlinearity's backward is a gate: the gradient passes where the unit was
# active and is cut where it was not.
#
# **You derive:** $\partial L/\partial h$ for $a = \mathrm{relu}(h)$, entry by entry, for `h` of
# any shape.
#
# **You are given:** `grad_a` $= \partial L/\partial a$ and the pre-activation `h` the forward
# kept.
#
# Write `relu_backward(grad_a, h)` $= \partial L/\partial h$ for $a = \mathrm{relu}(h)$, for `h`
# of any shape (1-D like the cat's, or 2-D and more) and `grad_a` of the same shape, returning a
# tensor of that shape in the dtype of `grad_a` (float32 or float64). Use PyTorch's convention
# at $h = 0$: the derivative there is 0, at `0.0` and at `-0.0` alike. Return a new tensor (when
# every unit is active too: the checks look at the memory you return) and leave `grad_a` as it
# is: a backward never writes into the gradient it receives (the caller may still need it).
#
# <details><summary>Hint 1 of 3 · the idea: entry by entry</summary>
#
# ReLU acts on each entry alone: $a_i$ depends on $h_i$ and on nothing else. So there is no
# sum and no matrix in its backward: each entry of `grad_a` is multiplied by the slope of ReLU
# at the matching entry of `h`. Look at that slope first, on both sides of 0 and at 0.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the mask</summary>
#
# The slope is 1 where $h_i > 0$ and 0 where $h_i \le 0$, with 0 at exactly 0 (the
# convention). A strict comparison with 0 is false for `0.0` and for `-0.0` alike and true
# for `1e-300`; a tolerance such as `h > 1e-6`, or a division by `h`, breaks one of those
# cases. Turn the 0/1 mask into `grad_a`'s dtype and multiply: that makes a new tensor. Setting
# entries of `grad_a` to 0 in place writes into the caller's tensor.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the edge values, against autograd</summary>
#
# In a scratch cell (delete it before handing in), take a float64 `h` (2, 3) holding
# `1.5, 0.0, -0.0, -2.0, 1e-300, -1e-300` with `requires_grad=True` and a random `grad_a`,
# run `torch.relu(h).backward(grad_a)` and compare `h.grad` with yours (PyTorch's slope at 0 is
# 0 too). Keep `grad_a.clone()` before your call and check with `torch.equal` that `grad_a` did
# not change, and, with every `h > 0`, that what you return is not `grad_a` itself
# (`data_ptr()` differs). To check yours against:
#
# $$\frac{\partial L}{\partial h} = \frac{\partial L}{\partial a} \odot \mathbb{1}[h > 0].$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> the shape of h
    grad_h = grad_a * (h > 0).to(grad_a.dtype)  # SOLUTION
    return grad_h


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex4", relu_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex5

# %% [markdown]
# ## Exercise 5 · The first layer's gradients (2 points)
#
# **Goal:** the same layer as in exercise 3, now with the input `x` fixed; then see why a unit
# whose $\partial L/\partial h$ is 0 gives its whole row of `W1` a zero gradient.
#
# **You derive:** `grad_W1` (n_h, n_in) and `grad_b1` (n_h,) from one entry of $h$; no
# gradient for `x`, which is data.
#
# **You are given:** `grad_h` (exercise 4's result) and the input `x`; exercise 3's way of
# deriving a linear layer's gradients.
#
# $h = W_1 x + b_1$. The cat has `W1` (2, 4) and `x` (4,); write it for any `x` (n_in,) and
# `grad_h` (n_h,): another length of `x`, more units, $n_h = n_{in}$, a unit whose
# $\partial L/\partial h$ is 0, in float32 or float64. Given `grad_h`, return
# `(grad_W1, grad_b1)` with the shapes of `W1` (n_h, n_in) and `b1` (n_h,), in the dtype of
# the inputs, derived as in exercise 3 from one entry of $h$.
#
# <details><summary>Hint 1 of 3 · the idea: exercise 3's weight, once more</summary>
#
# Write one entry, $h_i = \sum_j (W_1)_{ij} x_j + (b_1)_i$, and ask which entries of $h$ the
# weight $(W_1)_{ij}$ and the bias $(b_1)_i$ touch. It is the same question as for `W2` in
# exercise 3, with `grad_h` in the place of `grad_y_hat` and `x` in the place of `a`.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: one row of the gradient</summary>
#
# $(W_1)_{ij}$ touches $h_i$ only, with slope $x_j$. So the whole row $i$ of `grad_W1` is
# $\partial L/\partial h_i$ times the vector $x$: zero when $\partial L/\partial h_i = 0$, the
# dead unit. Stack all rows at once with one product whose shape is (n_h, n_in).
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the cat, then a square W1</summary>
#
# The cat's `grad_h` $= (-0.4375, 0)$ and $x = (1, 2, -1, 0.5)$ give `grad_W1` with rows
# $(-0.4375, -0.875, 0.4375, -0.21875)$ and $(0, 0, 0, 0)$, and `grad_b1` $= (-0.4375, 0)$.
# With $n_h = n_{in}$ a product in the wrong order has the right shape and the transposed
# numbers: in a scratch cell (delete it before handing in), take float64 `W1` (3, 3) and `b1`
# (3,) with `requires_grad=True`, call `(grad_h * (W1 @ x + b1)).sum().backward()` and compare
# `W1.grad`, `b1.grad` with yours. To check yours against:
#
# $$\frac{\partial L}{\partial W_1} = \frac{\partial L}{\partial h}\, x^\top, \qquad
# \frac{\partial L}{\partial b_1} = \frac{\partial L}{\partial h}.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (n_h, n_in), the shape of W1
    grad_W1 = torch.outer(grad_h, x)  # SOLUTION
    # (n_h,)
    grad_b1 = grad_h.clone()  # SOLUTION
    return grad_W1, grad_b1


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex5", layer1_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex6

# %% [markdown]
# ## Exercise 6 · The whole backward pass, for a batch (3 points)
#
# **Goal:** vectorise: one matrix product per gradient instead of a loop over samples, and
# see that a batch's weight gradient is the **sum** of the per-sample ones.
#
# **You derive:** the batched forward and the four parameter gradients, each as one matrix
# product or one sum over the batch, with every shape right in `nn.Linear`'s layout.
#
# **You are given:** the forward formulas below and the one-sample steps of exercises 2–5
# (the loss's gradient, the linear layer, the ReLU's mask).
#
# Now the rows of `X` (B, n_in) are B samples and the layers use `nn.Linear`'s layout:
# $H = X W_1^\top + b_1$ (B, n_h), $A = \mathrm{relu}(H)$, $\hat Y = A W_2^\top + b_2$ (B, k),
# $L = \sum_{b}\sum_{o}(\hat Y_{bo} - Y_{bo})^2$ (a sum, not a mean). The cat's sizes are
# n_in = 4, n_h = 2, k = 1; write it for any B ≥ 1 (one sample or several), any n_in, n_h and
# k (several outputs: `W2` (k, n_h), `Y` (B, k)), in float32 or float64, with relu'(0) = 0
# where a pre-activation is exactly 0. Write `cat_backward_batch` returning the dict
# `{"W1", "b1", "W2", "b2"}` of $\partial L/\partial(\text{parameter})$, each with its
# parameter's shape and dtype. Write the forward pass inside it too (no autograd).
#
# <details><summary>Hint 1 of 4 · the idea: the same five steps, a row per sample</summary>
#
# Walk the chain of exercises 2–5 in the same order: $\hat Y$, then `W2` and `b2`, then $A$,
# then $H$ through the mask, then `W1` and `b1`. Each sample is a row, and each gradient of an
# activation has that activation's shape: (B, k), (B, n_h), (B, n_h). A parameter is shared by
# all B samples, so its gradient is the sum over $b$ of the per-sample gradients.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: a weight gradient as a sum over the batch</summary>
#
# Sample $b$ alone gives `W2` the outer product of row $b$ of $\partial L/\partial \hat Y$
# (k,) and row $b$ of $A$ (n_h,). The sum of these B outer products is one matrix product
# that sums over the batch index: arrange (B, k) and (B, n_h) so that B is the inner
# dimension and the result is (k, n_h). A bias gets the plain sum over the batch dimension,
# not the mean.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: back into A in this layout</summary>
#
# Here $\hat Y_{bo} = \sum_j A_{bj} (W_2)_{oj} + (b_2)_o$: the weight is stored
# (out, in) and used transposed. Going back to $A$ sums over the outputs $o$; work out from
# the shapes, (B, k) and (k, n_h) to (B, n_h), whether `W2` needs a transpose here. Then the
# mask is the one of exercise 4, from $H$, and `W1` is like `W2` one layer down.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: B = 1, then a batch</summary>
#
# With one sample, `X = x[None]` and `Y = y[None]` from `cat_mlp.cat_params()`, you must get
# the cat's numbers: `W2` $[[-0.634375, 0]]$, `b2` $[-0.875]$, `W1` rows
# $(-0.4375, -0.875, 0.4375, -0.21875)$ and zeros, `b1` $(-0.4375, 0)$. Then, in a scratch cell
# you delete before handing in, take B = 3, k = 2 float64, and compare with the sum over rows
# of your exercise 3–5 functions, or with `.grad` after `L.backward()` on parameters with
# `requires_grad=True`. Set a row of `X` to zeros and an entry of `b1` to 0 for a
# pre-activation exactly 0: that unit's gradient from that sample must be 0. To check yours
# against, with $G = 2(\hat Y - Y)$ and $G_H = G W_2 \odot \mathbb{1}[H > 0]$:
#
# $$\frac{\partial L}{\partial W_2} = G^\top A,\quad
# \frac{\partial L}{\partial b_2} = \textstyle\sum_b G_{b,:},\quad
# \frac{\partial L}{\partial W_1} = G_H^\top X,\quad
# \frac{\partial L}{\partial b_1} = \textstyle\sum_b (G_H)_{b,:}.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    # BEGIN SOLUTION
    H = X @ W1.T + b1  # (B, n_in) @ (n_in, n_h) -> (B, n_h)
    A = torch.relu(H)  # (B, n_h)
    Y_hat = A @ W2.T + b2  # (B, n_h) @ (n_h, k) -> (B, k)
    grad_Y_hat = 2 * (Y_hat - Y)  # (B, k)
    grad_W2 = grad_Y_hat.T @ A  # (k, B) @ (B, n_h) -> (k, n_h)
    grad_b2 = grad_Y_hat.sum(0)  # (k,)
    grad_A = grad_Y_hat @ W2  # (B, k) @ (k, n_h) -> (B, n_h)
    grad_H = grad_A * (H > 0).to(H.dtype)  # (B, n_h)
    grad_W1 = grad_H.T @ X  # (n_h, B) @ (B, n_in) -> (n_h, n_in)
    grad_b1 = grad_H.sum(0)  # (n_h,)
    return {"W1": grad_W1, "b1": grad_b1, "W2": grad_W2, "b2": grad_b2}
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 6** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab01", "ex6", cat_backward_batch)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `forward_pass`, `grad_loss`,
# `layer2_backward`, `relu_backward`, `layer1_backward` and `cat_backward_batch`.
