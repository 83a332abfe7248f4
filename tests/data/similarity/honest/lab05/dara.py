# %% ex1
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    mask = (target != ignore_index).unsqueeze(1).to(logits.dtype)
    tgt = target.masked_fill(target == ignore_index, 0)
    C = logits.shape[1]
    smooth = torch.zeros_like(logits).scatter_(1, tgt.unsqueeze(1), 1.0)
    smooth = smooth * (1 - label_smoothing) + label_smoothing / C
    soft = (logits - logits.logsumexp(1, keepdim=True)).exp()
    return mask * (soft - smooth) / mask.sum()
# %% ex2
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    store = {}
    live = []

    def hook(m, i, o, name):
        live.append(o.register_hook(lambda grad: store.update({name: grad.norm().item()})))

    try:
        for n in layer_names(model):
            h = model.get_submodule(n).register_forward_hook(functools.partial(hook, name=n))
            live.append(h)
        loss = F.cross_entropy(model(X), y)
        loss.backward()
    finally:
        for h in live:
            h.remove()
    return store
# %% ex3
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    ratio = torch.tensor([norms[a] / norms[b] for a, b in zip(names[:-1], names[1:])])
    return names[1 + int(ratio.argmin())]
# %% ex4
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    gs = [p.grad for p in params if p.grad is not None]
    if not gs:
        return torch.tensor(0.0)
    total = torch.cat([g.reshape(-1) for g in gs]).norm()
    clip = max_norm / (total + 1e-6)
    if clip < 1:
        for g in gs:
            g.mul_(clip)
    return total
