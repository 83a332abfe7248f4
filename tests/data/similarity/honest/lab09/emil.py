# %% ex1
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    saved = []
    saved.append(("x", B * d))
    saved.append(("mu", B * 1))
    saved.append(("rstd", B * 1))
    saved.append(("ln_out", B * d))
    if activation == "relu":
        saved.append(("act_out", B * d_ff))  # relu and matmul share it
    else:
        saved.append(("U", B * d_ff))
        saved.append(("act_out", B * d_ff))
    unique = dict(saved)
    return sum(unique.values()) * bytes_per_element
# %% ex2
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        with torch.no_grad():
            for layer in range(len(params) // 4):
                x = fn(x, *params[layer * 4 : layer * 4 + 4])
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, every, x, *params = inputs
        ctx.fn = fn
        ctx.every = every
        ctx.save_for_backward(x, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        req = list(ctx.needs_input_grad[2:])
        n_layers = len(params) // 4

        def run(h, first, last, ps):
            for layer in range(first, last):
                h = ctx.fn(h, *ps[4 * (layer - first) : 4 * (layer - first) + 4])
            return h

        starts = list(range(0, n_layers, ctx.every))
        with torch.no_grad():
            saved_inputs = [x]
            for a, b in zip(starts, starts[1:]):
                saved_inputs.append(run(saved_inputs[-1], a, b, params[4 * a : 4 * b]))
        grads = [None] * len(params)
        g_out = grad_y
        for seg in reversed(range(len(starts))):
            a = starts[seg]
            b = min(a + ctx.every, n_layers)
            x_req = req[0] if seg == 0 else True
            h0 = saved_inputs[seg].detach().requires_grad_(x_req)
            ps = [params[i].detach().requires_grad_(req[1 + i]) for i in range(4 * a, 4 * b)]
            with torch.enable_grad():
                y = run(h0, a, b, ps)
                sources = [t for t in [h0, *ps] if t.requires_grad]
                if not sources:
                    continue
                gs = list(torch.autograd.grad(y, sources, g_out))
            if h0.requires_grad:
                g_out = gs.pop(0)
            for i, p in enumerate(ps):
                if p.requires_grad:
                    grads[4 * a + i] = gs.pop(0)
        gx = g_out if req[0] else None
        return (None, None, gx) + tuple(grads)
# %% ex3
class CheckpointRNG(torch.autograd.Function):
    """y = fn(x, *params) keeping x; backward recomputes fn with the RNG put back to
    rng_state."""

    @staticmethod
    def forward(fn, rng_state, x, *params):
        with torch.no_grad():
            result = fn(x, *params)
        return result

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[0]
        ctx.rng_state = inputs[1]
        ctx.save_for_backward(inputs[2], *inputs[3:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        needs = ctx.needs_input_grad[2:]
        fresh = [t.detach().requires_grad_(r) for t, r in zip(ctx.saved_tensors, needs)]
        gpu_ids = [dev for dev, _ in ctx.rng_state.cuda]
        with torch.random.fork_rng(devices=gpu_ids):
            set_rng_state(ctx.rng_state)
            with torch.enable_grad():
                recomputed = ctx.fn(*fresh)
        targets = [t for t in fresh if t.requires_grad]
        computed = list(torch.autograd.grad(recomputed, targets, grad_y)) if targets else []
        out = []
        for t in fresh:
            out.append(computed.pop(0) if t.requires_grad else None)
        return (None, None, *out)


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    snapshot = get_rng_state([x] + [p for p in params])
    y = CheckpointRNG.apply(fn, snapshot, x, *params)
    return y
# %% ex4
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    def make_segment(n_blocks):
        def seg_fn(h, *flat):
            for b in range(n_blocks):
                h = ffn_dropout(h, flat[4 * b], flat[4 * b + 1], flat[4 * b + 2], flat[4 * b + 3])
            return h

        return seg_fn

    h = x
    n = len(layers)
    s = 0
    while s < n:
        block_params = layers[s : min(s + segment, n)]
        flat = tuple(t for bp in block_params for t in bp)
        h = checkpoint_rng(make_segment(len(block_params)), h, *flat)
        s += segment
    return h
# %% ex5
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    scaled_loss = loss_fn(*params) * scale
    raw = torch.autograd.grad(scaled_loss, params)
    unscaled = []
    for g in raw:
        unscaled.append(g.to(torch.float32) * (1.0 / scale))
    bad = False
    for g in unscaled:
        bad = bad or not bool(torch.isfinite(g).all())
    if bad:
        # overflow: skip the step and back off
        return scale / 2.0, 0, False
    with torch.no_grad():
        for p, g in zip(params, unscaled):
            p.sub_(lr * g)
    tracker += 1
    if tracker >= growth_interval:
        scale = scale * 2.0
        tracker = 0
    return scale, tracker, True
