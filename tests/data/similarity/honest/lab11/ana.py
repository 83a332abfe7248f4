# %% ex1
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    if weight_decay != 0:
        g = g + weight_decay * theta
    if momentum > 0:
        if buf is None:
            buf = g.clone()
        else:
            buf = momentum * buf + (1 - dampening) * g
        d = g + momentum * buf if nesterov else buf
    else:
        d = g
    return theta - lr * d, buf
# %% ex2
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    beta1, beta2 = betas
    if weight_decay:
        g = g + weight_decay * theta
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_max = torch.maximum(v_max, v)
    bc1 = 1 - beta1**t
    bc2 = 1 - beta2**t
    denom = v_max.sqrt() / math.sqrt(bc2) + eps
    theta = theta - (lr / bc1) * m / denom
    return theta, m, v, v_max
# %% ex3
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    theta = theta * (1 - lr * weight_decay)
    return adam_step(theta, g, m, v, v_max, t, lr, betas, eps, weight_decay=0.0)
# %% ex4
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    s = step - warmup
    length = period
    while s >= length:
        s -= length
        length *= mult
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * s / length))
# %% ex5
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    B = X.shape[0]
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        total = 0.0
        for xb, yb in zip(X.split(micro), Y.split(micro)):
            loss = F.mse_loss(model(xb), yb) * (xb.shape[0] / B)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(total)
    return losses
