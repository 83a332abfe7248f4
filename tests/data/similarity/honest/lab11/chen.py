# %% ex1
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    g = g + weight_decay * theta  # L2 first
    d = g
    if momentum:
        buf = g.clone() if buf is None else momentum * buf + (1.0 - dampening) * g
        d = (g + momentum * buf) if nesterov else buf
    theta = theta - lr * d
    return theta, buf
# %% ex2
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    g = g + weight_decay * theta
    m = betas[0] * m + (1 - betas[0]) * g
    v = betas[1] * v + (1 - betas[1]) * g.pow(2)
    v_max = torch.where(v > v_max, v, v_max)
    m_hat = m / (1 - betas[0] ** t)
    # torch: sqrt(v_max) / sqrt(1 - b2^t) + eps, not sqrt(v_max / (1 - b2^t) + eps)
    denom = torch.sqrt(v_max) / math.sqrt(1 - betas[1] ** t) + eps
    return theta - lr * m_hat / denom, m, v, v_max
# %% ex3
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    shrink = 1.0 - lr * weight_decay
    out = adam_step(theta * shrink, g, m, v, v_max, t, lr, betas, eps)
    return out
# %% ex4
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    if step < warmup:
        return (step + 1) / warmup * lr_max
    cycle_start = warmup
    T = period
    while step >= cycle_start + T:
        cycle_start += T
        T = T * mult
    frac = (step - cycle_start) / T
    cos_part = (1 + math.cos(math.pi * frac)) / 2
    return float(lr_min + (lr_max - lr_min) * cos_part)
# %% ex5
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    out = []
    xs, ys = X.split(micro), Y.split(micro)
    B = sum(len(x) for x in xs)
    for _ in range(steps):
        opt.zero_grad()
        L = 0.0
        for x, y in zip(xs, ys):
            Li = F.mse_loss(model(x), y) * len(x) / B
            Li.backward()
            L += Li.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        out.append(L)
    return out
