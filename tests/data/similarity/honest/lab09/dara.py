# %% ex1
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    n_hidden_copies = 1 if activation == "relu" else 2
    total = 2 * B * d + 2 * B + n_hidden_copies * B * d_ff
    return int(total) * int(bytes_per_element)
# %% ex2
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        with torch.no_grad():
            out = x
            for theta in zip(*[iter(params)] * 4):
                out = fn(out, *theta)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn, ctx.every = inputs[0], inputs[1]
        ctx.save_for_backward(*inputs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        thetas = list(zip(*[iter(params)] * 4))
        n = len(thetas)
        k = ctx.every
        needs = ctx.needs_input_grad[2:]
        bounds = [(a, min(a + k, n)) for a in range(0, n, k)]
        checkpoints = []
        with torch.no_grad():
            cur = x
            for a, b in bounds:
                checkpoints.append(cur)
                for t in thetas[a:b]:
                    cur = ctx.fn(cur, *t)
        result = [None] * len(params)
        grad = grad_y
        for (a, b), start in reversed(list(zip(bounds, checkpoints))):
            first = a == 0
            x_leaf = start.detach().requires_grad_(not first or needs[0])
            p_leaf = [params[i].detach().requires_grad_(needs[1 + i]) for i in range(4 * a, 4 * b)]
            with torch.enable_grad():
                y = x_leaf
                for j in range(b - a):
                    y = ctx.fn(y, *p_leaf[4 * j : 4 * j + 4])
            leaves = [x_leaf, *p_leaf]
            asked = [t for t in leaves if t.requires_grad]
            if asked:
                found = dict(zip(map(id, asked), torch.autograd.grad(y, asked, grad)))
            else:
                found = {}
            grad = found.get(id(x_leaf))
            for i, t in enumerate(p_leaf):
                result[4 * a + i] = found.get(id(t))
        return (None, None, grad if needs[0] else None, *result)
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
        fn, rng_state, *tensors = inputs
        ctx.fn = fn
        ctx.rng_state = rng_state
        ctx.save_for_backward(*tensors)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        leaves = []
        for t, flag in zip(ctx.saved_tensors, ctx.needs_input_grad[2:]):
            leaves.append(t.detach().requires_grad_(flag))
        with torch.random.fork_rng(devices=[i for i, _ in ctx.rng_state.cuda]):
            set_rng_state(ctx.rng_state)  # same dropout mask as the forward
            with torch.enable_grad():
                y = ctx.fn(*leaves)
        asked = [t for t in leaves if t.requires_grad]
        found = dict(zip(map(id, asked), torch.autograd.grad(y, asked, grad_y))) if asked else {}
        return None, None, *[found.get(id(t)) for t in leaves]


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    state = get_rng_state([x, *params])
    out = CheckpointRNG.apply(fn, state, x, *params)
    return out
# %% ex4
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    def chain(inp, *flat):
        for W1, b1, W2, b2 in zip(*[iter(flat)] * 4):
            inp = ffn_dropout(inp, W1, b1, W2, b2)
        return inp

    out = x
    for first in range(0, len(layers), segment):
        params = [p for theta in layers[first : first + segment] for p in theta]
        out = checkpoint_rng(chain, out, *params)
    return out
# %% ex5
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    grads = [g * (1 / scale) for g in torch.autograd.grad(scale * loss_fn(*params), params)]
    ok = torch.stack([torch.isfinite(g).all() for g in grads]).all().item()
    if not ok:
        return scale / 2, 0, False
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(lr * g)
    tracker += 1
    grow = tracker >= growth_interval
    return (scale * 2 if grow else scale), (0 if grow else tracker), True
