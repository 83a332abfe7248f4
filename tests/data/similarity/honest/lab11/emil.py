# %% ex1
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    # 1. L2 penalty joins the gradient
    if weight_decay:
        g = torch.add(g, theta, alpha=weight_decay)
    # 2. momentum buffer
    if momentum <= 0:
        return torch.add(theta, g, alpha=-lr), buf
    if buf is None:
        buf = g.clone()  # first step: no dampening
    else:
        buf = torch.add(buf * momentum, g, alpha=1.0 - dampening)
    step = torch.add(g, buf, alpha=momentum) if nesterov else buf
    # 3. update
    return torch.add(theta, step, alpha=-lr), buf
# %% ex2
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    b1, b2 = betas
    g = torch.add(g, theta, alpha=weight_decay)
    m = torch.lerp(m, g, 1 - b1)
    v = b2 * v + (1 - b2) * torch.square(g)
    v_max = torch.maximum(v_max, v)
    c1 = 1.0 - b1**t
    c2 = 1.0 - b2**t
    theta = theta - lr * (m / c1) / (torch.sqrt(v_max) / math.sqrt(c2) + eps)
    return theta, m, v, v_max
# %% ex3
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    # decoupled: shrink first, and the decay never reaches m, v, v_max
    theta_decayed = torch.mul(theta, 1.0 - lr * weight_decay)
    theta_new, m_new, v_new, vmax_new = adam_step(theta_decayed, g, m, v, v_max, t, lr, betas, eps, 0.0)
    return theta_new, m_new, v_new, vmax_new
# %% ex4
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    if step < warmup:
        return float(lr_max) * (step + 1) / warmup
    since = step - warmup
    bounds = [0]
    length = period
    while bounds[-1] + length <= since:
        bounds.append(bounds[-1] + length)
        length = length * mult
    into = since - bounds[-1]
    angle = math.pi * into / length
    return float(lr_min + (lr_max - lr_min) * (math.cos(angle) + 1) / 2)
# %% ex5
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    total_rows = X.shape[0]
    X_chunks = X.split(micro)
    Y_chunks = Y.split(micro)
    losses = []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        loss_sum = torch.zeros(())
        for xc, yc in zip(X_chunks, Y_chunks):
            frac = xc.shape[0] / total_rows
            chunk_loss = frac * torch.nn.functional.mse_loss(model(xc), yc)
            chunk_loss.backward()
            loss_sum = loss_sum + chunk_loss.detach().cpu()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(loss_sum.item())
    return losses
