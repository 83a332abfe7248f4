# %% ex1
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    eps = label_smoothing
    C = logits.size(1)
    grad = torch.zeros_like(logits)
    rows = (target != ignore_index).nonzero().flatten()
    for r in rows:
        q = torch.full((C,), eps / C, dtype=logits.dtype, device=logits.device)
        q[target[r]] += 1 - eps
        grad[r] = logits[r].softmax(0) - q
    return grad / max(len(rows), 1)
# %% ex2
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    out_norms = {}
    registered = []
    try:
        for name, module in model.named_modules():
            if name not in layer_names(model):
                continue

            def on_forward(mod, args, output, name=name):
                def on_grad(g):
                    out_norms[name] = g.norm().item()

                registered.append(output.register_hook(on_grad))

            registered.append(module.register_forward_hook(on_forward))
        F.cross_entropy(model(X), y).backward()
    finally:
        while registered:
            registered.pop().remove()
    return out_norms
# %% ex3
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    worst = names[1]
    for prev, cur in zip(names, names[1:]):
        if norms[prev] / norms[cur] < norms[names[names.index(worst) - 1]] / norms[worst]:
            worst = cur
    return worst
# %% ex4
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    sq = torch.tensor(0.0, dtype=torch.float64)
    with_grad = []
    for p in params:
        if p.grad is None:
            continue
        with_grad.append(p)
        sq = sq + p.grad.double().pow(2).sum().cpu()
    norm = sq.sqrt()
    if norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for p in with_grad:
            p.grad *= coef.to(p.grad.dtype).to(p.grad.device)
    return norm.to(with_grad[0].grad.dtype) if with_grad else norm
