# %% ex1
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    grad = g if weight_decay == 0 else g + theta * weight_decay
    if momentum == 0.0:
        step_dir = grad
    else:
        first_step = buf is None
        buf = grad.detach().clone() if first_step else buf * momentum + grad * (1 - dampening)
        step_dir = grad + buf * momentum if nesterov else buf
    new_theta = theta - step_dir * lr
    return new_theta, buf
# %% ex2
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    beta_1, beta_2 = betas
    grad = g + weight_decay * theta if weight_decay else g
    m_new = m + (1 - beta_1) * (grad - m)  # = b1 m + (1-b1) g
    v_new = beta_2 * v + (1 - beta_2) * grad.square()
    vmax_new = torch.maximum(v_max, v_new)
    corr1 = 1 - beta_1**t
    corr2 = math.sqrt(1 - beta_2**t)
    update = (m_new / corr1) / (vmax_new.sqrt() / corr2 + eps)
    return theta - lr * update, m_new, v_new, vmax_new
# %% ex3
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    beta_1, beta_2 = betas
    theta = theta - lr * weight_decay * theta
    m = beta_1 * m + (1 - beta_1) * g
    v = beta_2 * v + (1 - beta_2) * g * g
    v_max = torch.maximum(v_max, v)
    step = lr / (1 - beta_1**t)
    theta = theta - step * m / (v_max.sqrt() / math.sqrt(1 - beta_2**t) + eps)
    return theta, m, v, v_max
# %% ex4
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    k = step - warmup
    T_i = period
    i = 0
    while k >= T_i:
        k -= T_i
        i += 1
        T_i = period * mult**i
    return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + math.cos(math.pi * k / T_i))
# %% ex5
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    batches = list(zip(X.split(micro), Y.split(micro)))
    B = X.size(0)
    record = []
    for _ in range(steps):
        opt.zero_grad()
        parts = []
        for xb, yb in batches:
            share = xb.size(0) / B
            part = share * F.mse_loss(model(xb), yb)
            part.backward()
            parts.append(part.detach())
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm)
        opt.step()
        record.append(torch.stack(parts).sum().item())
    return record
