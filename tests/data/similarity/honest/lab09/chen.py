# %% ex1
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    ln = B * d + B + B            # input + mean + 1/sigma per row
    mm1 = B * d                   # normalised x
    if activation == "relu":
        act = B * d_ff            # relu's output, shared with the second matmul
        mm2 = 0
    else:
        act = B * d_ff            # gelu's input
        mm2 = B * d_ff            # gelu's output
    return (ln + mm1 + act + mm2) * bytes_per_element
# %% ex2
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        h = x.detach()
        with torch.no_grad():
            for l in range(len(params) // 4):
                h = fn(h, *params[4 * l : 4 * (l + 1)])
        return h

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, every, x = inputs[:3]
        ctx.fn = fn
        ctx.every = every
        ctx.save_for_backward(x, *inputs[3:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        saved = ctx.saved_tensors
        x, params = saved[0], saved[1:]
        fn, k = ctx.fn, ctx.every
        L = len(params) // 4
        need = ctx.needs_input_grad[2:]
        # pass 1: no graph, remember each segment's input
        seg_in = []
        with torch.no_grad():
            h = x
            for l in range(L):
                if l % k == 0:
                    seg_in.append(h)
                h = fn(h, *params[4 * l : 4 * l + 4])
        out_grads = [None] * (len(params) + 1)
        g = grad_y
        for s in range(len(seg_in) - 1, -1, -1):
            lo, hi = s * k, min(s * k + k, L)
            xin = seg_in[s].detach()
            if s > 0 or need[0]:
                xin.requires_grad_(True)
            ps = []
            for j in range(4 * lo, 4 * hi):
                ps.append(params[j].detach().requires_grad_(bool(need[j + 1])))
            with torch.enable_grad():
                y = xin
                for b in range(hi - lo):
                    y = fn(y, *ps[4 * b : 4 * b + 4])
            wrt = [xin] + ps
            mask = [t.requires_grad for t in wrt]
            res = torch.autograd.grad(y, [t for t in wrt if t.requires_grad], g)
            res = iter(res)
            full = [next(res) if m else None for m in mask]
            g = full[0]
            for j, gp in enumerate(full[1:]):
                out_grads[1 + 4 * lo + j] = gp
        out_grads[0] = g if need[0] else None
        return (None, None, *out_grads)
# %% ex3
class CheckpointRNG(torch.autograd.Function):
    """y = fn(x, *params) keeping x; backward recomputes fn with the RNG put back to
    rng_state."""

    @staticmethod
    def forward(fn, rng_state, x, *params):
        with torch.no_grad():
            out = fn(x, *params)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, state = inputs[0], inputs[1]
        ctx.fn, ctx.rng_state = fn, state
        ctx.save_for_backward(*inputs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        ins = [t.detach().requires_grad_(n) for t, n in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        devs = [idx for idx, _ in ctx.rng_state.cuda]
        with torch.random.fork_rng(devices=devs), torch.enable_grad():
            set_rng_state(ctx.rng_state)
            y = ctx.fn(*ins)
        req = [t for t in ins if t.requires_grad]
        g = torch.autograd.grad(y, req, grad_y) if req else ()
        it = iter(g)
        return (None, None) + tuple(next(it) if t.requires_grad else None for t in ins)


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    return CheckpointRNG.apply(fn, get_rng_state([x, *params]), x, *params)
# %% ex4
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    def many_blocks(h, *ps):
        blocks = [ps[i : i + 4] for i in range(0, len(ps), 4)]
        for W1, b1, W2, b2 in blocks:
            h = ffn_dropout(h, W1, b1, W2, b2)
        return h

    segments = [layers[i : i + segment] for i in range(0, len(layers), segment)]
    for seg in segments:
        x = checkpoint_rng(many_blocks, x, *itertools.chain.from_iterable(seg))
    return x
# %% ex5
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    gs = torch.autograd.grad(loss_fn(*params) * scale, params)
    gs = [g / scale for g in gs]
    overflow = any(bool((~torch.isfinite(g)).any()) for g in gs)
    if overflow:
        scale = scale / 2
        tracker = 0
        return scale, tracker, False
    with torch.no_grad():
        for p, g in zip(params, gs):
            p -= lr * g
    tracker += 1
    if tracker == growth_interval:
        scale, tracker = scale * 2, 0
    return scale, tracker, True
