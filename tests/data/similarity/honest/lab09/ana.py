# %% ex1
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    elems = B * d + 2 * B  # layer_norm: x, mu, rstd
    elems += B * d  # matmul 1 keeps LN(x)
    elems += B * d_ff  # relu output == matmul 2 input, or gelu input
    if activation == "gelu":
        elems += B * d_ff  # gelu output kept by matmul 2
    return int(elems * bytes_per_element)
# %% ex2
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        with torch.no_grad():
            for i in range(0, len(params), 4):
                x = fn(x, *params[i : i + 4])
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, every, x, *params = inputs
        ctx.fn, ctx.every = fn, every
        ctx.save_for_backward(x, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        fn, every = ctx.fn, ctx.every
        n_blocks = len(params) // 4
        starts = list(range(0, n_blocks, every))
        inputs = []
        h = x
        with torch.no_grad():
            for s in starts:
                inputs.append(h)
                for b in range(s, min(s + every, n_blocks)):
                    h = fn(h, *params[4 * b : 4 * b + 4])
        needs = ctx.needs_input_grad[2:]
        grads = [None] * len(params)
        g = grad_y
        grad_x = None
        for seg in reversed(range(len(starts))):
            s = starts[seg]
            e = min(s + every, n_blocks)
            need_in = seg > 0 or needs[0]
            with torch.enable_grad():
                h = inputs[seg].detach().requires_grad_(need_in)
                leaves = [p.detach().requires_grad_(needs[1 + i]) for i, p in enumerate(params[4 * s : 4 * e], start=4 * s)]
                out = h
                for b in range(e - s):
                    out = fn(out, *leaves[4 * b : 4 * b + 4])
                wanted = ([h] if need_in else []) + [p for p in leaves if p.requires_grad]
                got = list(torch.autograd.grad(out, wanted, g, allow_unused=True)) if wanted else []
            if need_in:
                g = got.pop(0)
            for i, p in enumerate(leaves, start=4 * s):
                if p.requires_grad:
                    grads[i] = got.pop(0)
            if seg == 0 and needs[0]:
                grad_x = g
        return (None, None, grad_x, *grads)
# %% ex3
class CheckpointRNG(torch.autograd.Function):
    """y = fn(x, *params) keeping x; backward recomputes fn with the RNG put back to
    rng_state."""

    @staticmethod
    def forward(fn, rng_state, x, *params):
        with torch.no_grad():
            return fn(x, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, rng_state, x, *params = inputs
        ctx.fn = fn
        ctx.rng_state = rng_state
        ctx.save_for_backward(x, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        leaves = [t.detach().requires_grad_(n) for t, n in zip(saved, needs)]
        with torch.random.fork_rng(devices=[i for i, _ in ctx.rng_state.cuda]):
            set_rng_state(ctx.rng_state)
            with torch.enable_grad():
                y = ctx.fn(*leaves)
        wanted = [t for t in leaves if t.requires_grad]
        got = iter(torch.autograd.grad(y, wanted, grad_y, allow_unused=True))
        return (None, None, *[next(got) if t.requires_grad else None for t in leaves])


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    rng_state = get_rng_state([x, *params])
    return CheckpointRNG.apply(fn, rng_state, x, *params)
# %% ex4
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    def run_segment(h, *flat):
        for i in range(0, len(flat), 4):
            h = ffn_dropout(h, *flat[i : i + 4])
        return h

    for start in range(0, len(layers), segment):
        flat = [t for layer in layers[start : start + segment] for t in layer]
        x = checkpoint_rng(run_segment, x, *flat)
    return x
# %% ex5
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    grads = torch.autograd.grad(scale * loss_fn(*params), params)
    grads = [g * (1.0 / scale) for g in grads]
    if not all(torch.isfinite(g).all() for g in grads):
        return scale / 2, 0, False
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(lr * g)
    tracker += 1
    if tracker == growth_interval:
        scale *= 2
        tracker = 0
    return scale, tracker, True
