# %% ex1
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    # dL/dz = (softmax(z) - q) / N for kept rows, q the smoothed target
    valid = target.ne(ignore_index)
    n_valid = valid.sum()
    num_classes = logits.size(-1)
    target_dist = F.one_hot(target.clamp(min=0) * valid, num_classes).to(logits.dtype)
    target_dist = target_dist * (1.0 - label_smoothing) + label_smoothing / num_classes
    g = logits.softmax(-1) - target_dist
    g = g * valid.unsqueeze(-1)
    return g / n_valid
# %% ex2
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    grad_norms = {}
    fwd_handles, tensor_handles = [], []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __call__(self, module, inputs, output):
            tensor_handles.append(output.register_hook(self.save))

        def save(self, grad):
            grad_norms[self.name] = grad.norm().item()

    try:
        for name in layer_names(model):
            fwd_handles.append(model.get_submodule(name).register_forward_hook(Recorder(name)))
        logits = model(X)
        F.cross_entropy(logits, y).backward()
    finally:
        for h in fwd_handles + tensor_handles:
            h.remove()
    return grad_norms
# %% ex3
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    candidates = []
    for i, name in enumerate(names):
        if i == 0:
            continue
        leaves, enters = norms[names[i - 1]], norms[name]
        candidates.append((leaves / enters, i, name))
    candidates.sort()
    return candidates[0][2]
# %% ex4
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    total_sq = None
    for p in params:
        if p.grad is not None:
            s = p.grad.pow(2).sum()
            total_sq = s if total_sq is None else total_sq + s
    global_norm = total_sq.sqrt()
    if global_norm > max_norm:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(max_norm / (global_norm + 1e-6))
    return global_norm
