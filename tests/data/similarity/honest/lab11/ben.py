# %% ex1
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    grad = g.add(theta, alpha=weight_decay) if weight_decay else g
    if momentum == 0:
        return theta.sub(grad, alpha=lr), None
    if buf is None:
        new_buf = torch.clone(grad).detach()
    else:
        new_buf = buf.mul(momentum).add(grad, alpha=1 - dampening)
    if nesterov:
        direction = grad.add(new_buf, alpha=momentum)
    else:
        direction = new_buf
    return theta.sub(direction, alpha=lr), new_buf
# %% ex2
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    b1, b2 = betas
    if weight_decay != 0:
        g = g.add(theta, alpha=weight_decay)
    m = m.mul(b1).add(g, alpha=1 - b1)
    v = v.mul(b2).addcmul(g, g, value=1 - b2)
    v_max = torch.max(v_max, v)
    step_size = lr / (1 - b1**t)
    denom = (v_max.sqrt() / (1 - b2**t) ** 0.5).add(eps)
    theta = theta.addcdiv(m, denom, value=-step_size)
    return theta, m, v, v_max
# %% ex3
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    decayed = theta.mul(1 - lr * weight_decay)
    new_theta, m, v, v_max = adam_step(decayed, g, m, v, v_max, t, lr, betas=betas, eps=eps, weight_decay=0.0)
    return new_theta, m, v, v_max
# %% ex4
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    if warmup > 0 and step < warmup:
        return float(lr_max * (step + 1) / warmup)
    t = step - warmup
    if mult == 1:
        cycle_len = period
        t_cur = t % period
    else:
        n = int(math.log(t / period * (mult - 1) + 1, mult))
        start = period * (mult**n - 1) // (mult - 1)
        if start > t:  # round-off in the log
            n -= 1
            start = period * (mult**n - 1) // (mult - 1)
        cycle_len = period * mult**n
        if t - start >= cycle_len:
            start += cycle_len
            cycle_len *= mult
        t_cur = t - start
    return float(lr_min + (lr_max - lr_min) * (1 + math.cos(math.pi * t_cur / cycle_len)) / 2)
# %% ex5
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    history = []
    n_rows = len(X)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for x_mb, y_mb in zip(torch.split(X, micro), torch.split(Y, micro)):
            weight = len(x_mb) / n_rows
            mb_loss = F.mse_loss(model(x_mb), y_mb)
            (weight * mb_loss).backward()
            step_loss += weight * mb_loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
        opt.step()
        history.append(float(step_loss))
    return history
