# %% ex1
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    R, C = logits.shape
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    q = torch.full_like(logits, label_smoothing / C)
    q[torch.arange(R), safe] += 1.0 - label_smoothing
    p = torch.softmax(logits, dim=1)
    grad = (p - q) * keep[:, None]
    return grad / keep.sum()
# %% ex2
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    norms = {}
    handles = []

    def make_hook(name):
        def fwd_hook(module, inputs, output):
            def grad_hook(grad):
                norms[name] = grad.norm().item()

            handles.append(output.register_hook(grad_hook))

        return fwd_hook

    try:
        for name in layer_names(model):
            handles.append(model.get_submodule(name).register_forward_hook(make_hook(name)))
        L = F.cross_entropy(model(X), y)
        L.backward()
    finally:
        for h in handles:
            h.remove()
    return norms
# %% ex3
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    best, best_ratio = None, float("inf")
    for i in range(1, len(names)):
        ratio = norms[names[i - 1]] / norms[names[i]]
        if ratio < best_ratio:
            best, best_ratio = names[i], ratio
    return best
# %% ex4
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g.detach() ** 2).sum() for g in grads))
    if total > max_norm:
        factor = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(factor)
    return total
