# %% ex1
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    n_classes = logits.shape[-1]
    kept = (target != ignore_index)
    N = kept.sum().item()
    t = target.clone()
    t[~kept] = 0
    onehot = F.one_hot(t, n_classes).to(logits.dtype)
    q = (1 - label_smoothing) * onehot + label_smoothing / n_classes
    probs = F.softmax(logits, dim=-1)
    grad = (probs - q) / N
    grad[~kept] = 0.0
    return grad
# %% ex2
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    result = {}
    hooks = []

    def forward_hook(module, inp, out, name=None):
        out.register_hook(lambda g, name=name: result.__setitem__(name, g.norm().item()))

    modules = dict(model.named_modules())
    for name in layer_names(model):
        hooks.append(
            modules[name].register_forward_hook(lambda m, i, o, name=name: forward_hook(m, i, o, name))
        )
    try:
        loss = F.cross_entropy(model(X), y)
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return result
# %% ex3
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    ratios = {names[i]: norms[names[i - 1]] / norms[names[i]] for i in range(1, len(names))}
    return min(ratios, key=ratios.get)
# %% ex4
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    params = [p for p in params if p.grad is not None]
    norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
    total_norm = torch.linalg.vector_norm(norms)
    if total_norm.item() > max_norm:
        scale = max_norm / (total_norm + 1e-6)
        with torch.no_grad():
            for p in params:
                p.grad.mul_(scale)
    return total_norm
