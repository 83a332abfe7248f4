# %% ex1
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    kept = {
        "x (layer_norm input)": B * d,
        "mu": B,
        "rstd": B,
        "LN output (W1 matmul input)": B * d,
    }
    if activation == "relu":
        kept["relu output = W2 matmul input"] = B * d_ff
    elif activation == "gelu":
        kept["gelu input"] = B * d_ff
        kept["gelu output (W2 matmul input)"] = B * d_ff
    else:
        raise ValueError(activation)
    return sum(kept.values()) * bytes_per_element
# %% ex2
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        blocks = [params[i : i + 4] for i in range(0, len(params), 4)]
        with torch.no_grad():
            y = x
            for theta in blocks:
                y = fn(y, *theta)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[0]
        ctx.every = inputs[1]
        ctx.save_for_backward(*inputs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        blocks = [params[i : i + 4] for i in range(0, len(params), 4)]
        L, k = len(blocks), ctx.every
        flags = ctx.needs_input_grad[2:]
        seg_inputs = {}
        y = x
        with torch.no_grad():
            for l, theta in enumerate(blocks):
                if l % k == 0:
                    seg_inputs[l] = y
                y = ctx.fn(y, *theta)
        param_grads = [None] * len(params)
        upstream = grad_y
        for start in sorted(seg_inputs, reverse=True):
            stop = min(start + k, L)
            x_needs = start > 0 or flags[0]
            inp = seg_inputs[start].detach().requires_grad_(x_needs)
            leaves = []
            for j in range(4 * start, 4 * stop):
                leaves.append(params[j].detach().requires_grad_(flags[1 + j]))
            with torch.enable_grad():
                out = inp
                for b in range(stop - start):
                    out = ctx.fn(out, *leaves[4 * b : 4 * b + 4])
            targets = [inp] if x_needs else []
            idx = [j for j in range(len(leaves)) if leaves[j].requires_grad]
            targets += [leaves[j] for j in idx]
            if not targets:
                continue
            res = torch.autograd.grad(out, targets, upstream)
            if x_needs:
                upstream, res = res[0], res[1:]
            for j, r in zip(idx, res):
                param_grads[4 * start + j] = r
        grad_x = upstream if flags[0] else None
        return None, None, grad_x, *param_grads
# %% ex3
class CheckpointRNG(torch.autograd.Function):
    """y = fn(x, *params) keeping x; backward recomputes fn with the RNG put back to
    rng_state."""

    @staticmethod
    def forward(fn, rng_state, x, *params):
        with torch.no_grad():
            y = fn(x, *params)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[0]
        ctx.rng_state = inputs[1]
        ctx.save_for_backward(*inputs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        tensors = ctx.saved_tensors
        flags = ctx.needs_input_grad[2:]
        detached = []
        for t, f in zip(tensors, flags):
            d = t.detach()
            d.requires_grad_(f)
            detached.append(d)
        cuda_devices = [i for i, _ in ctx.rng_state.cuda]
        with torch.random.fork_rng(devices=cuda_devices):
            set_rng_state(ctx.rng_state)
            with torch.enable_grad():
                out = ctx.fn(*detached)
        need = [d for d in detached if d.requires_grad]
        grads = list(torch.autograd.grad(out, need, grad_y)) if need else []
        result = [None, None]
        for d in detached:
            result.append(grads.pop(0) if d.requires_grad else None)
        return tuple(result)


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    # before apply: setup_context runs after forward, when the mask is already drawn
    state = get_rng_state([x] + list(params))
    return CheckpointRNG.apply(fn, state, x, *params)
# %% ex4
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    def segment_fn(inp, *flat):
        out = inp
        for k in range(len(flat) // 4):
            W1, b1, W2, b2 = flat[4 * k : 4 * k + 4]
            out = ffn_dropout(out, W1, b1, W2, b2)
        return out

    i = 0
    while i < len(layers):
        chunk = layers[i : i + segment]
        flat = []
        for theta in chunk:
            flat.extend(theta)
        x = checkpoint_rng(segment_fn, x, *flat)
        i += segment
    return x
# %% ex5
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    loss = loss_fn(*params)
    scaled_grads = torch.autograd.grad(scale * loss, params)
    inv = 1.0 / scale
    unscaled = [g.float() * inv for g in scaled_grads]
    finite = True
    for g in unscaled:
        if not torch.isfinite(g).all():
            finite = False
            break
    if not finite:
        return scale * 0.5, 0, False
    with torch.no_grad():
        for p, g in zip(params, unscaled):
            p.sub_(lr * g)
    tracker = tracker + 1
    if tracker >= growth_interval:
        return scale * 2.0, 0, True
    return scale, tracker, True
