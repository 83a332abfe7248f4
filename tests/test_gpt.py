"""helpers.gpt: the hand-written GPT forward and backward against autograd on TinyGPT."""

import pytest
import torch
import torch.nn.functional as F

import helpers.gpt as gpt_mod
from helpers.checks import compare
from helpers.gpt import (
    CharTokenizer,
    GPTConfig,
    TinyGPT,
    block_grad_norms,
    embedding_backward,
    get_batch,
    gpt_backward,
    gpt_forward,
    gpt_init,
    gpt_loss_and_grads,
    gpt_param_shapes,
    gpt_params_from_module,
    load_corpus,
    load_params_into_module,
    sample,
)

F64 = torch.float64
TOL64 = dict(atol=1e-10, rtol=0.0)
CFG = GPTConfig(vocab_size=11, n_ctx=8, d_model=16, n_heads=2, n_layers=3, d_ff=24)


def perturbed(config, seed=0, dtype=F64):
    """gpt_init's weights plus noise, so zero biases and unit γ do not hide a wrong gradient."""
    params = gpt_init(config, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    return {n: t + 0.1 * torch.randn(t.shape, generator=g, dtype=F64).to(dtype) for n, t in params.items()}


def reference(params, config, idx, targets):
    model = load_params_into_module(TinyGPT(config).to(params["wte"].dtype), params)
    logits = model(idx)
    L = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    L.backward()
    return model, logits.detach(), L.detach()


def test_param_names_are_tinygpt_state_dict_keys():
    model = TinyGPT(CFG, seed=3)
    params = gpt_init(CFG, seed=3)
    assert list(model.state_dict()) == list(params) == list(gpt_param_shapes(CFG))
    assert all(torch.equal(model.state_dict()[n], params[n]) for n in params)
    assert "blocks.2.self_attn.in_proj_weight" in params and params["head.weight"].shape == (11, 16)
    back = gpt_params_from_module(model)
    assert all(torch.equal(back[n], params[n]) for n in params)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_forward_and_every_gradient_equal_autograd_float64(activation):
    config = GPTConfig(
        vocab_size=11, n_ctx=8, d_model=16, n_heads=2, n_layers=3, d_ff=24, activation=activation
    )
    params = perturbed(config)
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 11, (3, 8), generator=g)
    targets = torch.randint(0, 11, (3, 8), generator=g)
    model, logits_ref, L_ref = reference(params, config, idx, targets)
    logits, _ = gpt_forward(idx, params, config)
    assert compare("logits", logits, logits_ref, quiet=True, **TOL64)
    L, grads = gpt_loss_and_grads(idx, targets, params, config)
    assert compare("L", L, L_ref, quiet=True, **TOL64)
    assert list(grads) == list(params)
    for n, p in model.named_parameters():
        assert compare(n, grads[n], p.grad, quiet=True, **TOL64), n


def test_shorter_sequence_and_float32():
    params = perturbed(CFG, seed=2, dtype=torch.float32)
    idx = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    targets = idx.roll(-1, 1)
    model, logits_ref, _ = reference(params, CFG, idx, targets)
    _, grads = gpt_loss_and_grads(idx, targets, params, CFG)
    assert compare("logits", gpt_forward(idx, params, CFG)[0], logits_ref, quiet=True, atol=1e-5, rtol=1e-4)
    for n, p in model.named_parameters():
        assert compare(n, grads[n], p.grad, quiet=True, atol=1e-5, rtol=1e-4), n
    assert torch.all(grads["wpe"][5:] == 0)  # positions never used get no gradient


def test_repeated_token_embedding_gradient_accumulates():
    """Token 3 appears three times: its row of grad_wte is the SUM of three gradients."""
    idx = torch.tensor([[3, 5, 3, 3, 7]])
    grad_X0 = torch.randn(1, 5, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    wte = torch.randn(10, 4, dtype=F64, requires_grad=True)
    (ref,) = torch.autograd.grad(F.embedding(idx, wte), wte, grad_X0)
    grad_wte, grad_wpe = embedding_backward(idx, grad_X0, vocab_size=10, n_ctx=8)
    assert compare("grad_wte", grad_wte, ref, quiet=True, **TOL64)
    assert compare("row 3", grad_wte[3], grad_X0[0, 0] + grad_X0[0, 2] + grad_X0[0, 3], quiet=True, **TOL64)
    assert torch.equal(grad_wpe[:5], grad_X0[0]) and torch.all(grad_wpe[5:] == 0)
    # the trap: an indexed assignment keeps one of the three and drops the others
    trap = torch.zeros(10, 4, dtype=F64)
    trap[idx.flatten()] = grad_X0.flatten(0, 1)
    assert not compare("assignment", trap, ref, quiet=True, **TOL64)


def test_broken_embedding_backward_fails_the_model_test(monkeypatch):
    params = perturbed(CFG)
    idx = torch.tensor([[1, 2, 1, 1, 4, 2, 0, 1]])
    targets = idx.roll(-1, 1)
    model, _, _ = reference(params, CFG, idx, targets)

    def assigning(idx, grad_X0, vocab_size, n_ctx):
        grad_wte = torch.zeros(vocab_size, grad_X0.shape[-1], dtype=grad_X0.dtype)
        grad_wte[idx.flatten()] = grad_X0.flatten(0, 1)
        grad_wpe = torch.zeros(n_ctx, grad_X0.shape[-1], dtype=grad_X0.dtype)
        grad_wpe[: idx.shape[1]] = grad_X0.sum(0)
        return grad_wte, grad_wpe

    monkeypatch.setattr(gpt_mod, "embedding_backward", assigning)
    _, grads = gpt_loss_and_grads(idx, targets, params, CFG)
    assert not compare("wte", grads["wte"], model.wte.grad, quiet=True, **TOL64)
    assert compare("wpe", grads["wpe"], model.wpe.grad, quiet=True, **TOL64)


def test_causal_future_tokens_do_not_change_earlier_logits():
    params = perturbed(CFG)
    a = torch.tensor([[1, 2, 3, 4, 5, 6]])
    b = torch.tensor([[1, 2, 3, 9, 9, 9]])
    la, _ = gpt_forward(a, params, CFG)
    lb, _ = gpt_forward(b, params, CFG)
    assert torch.equal(la[:, :3], lb[:, :3]) and not torch.allclose(la[:, 3:], lb[:, 3:])


def test_stream_gradients_and_block_norms():
    params = perturbed(CFG)
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    logits, cache = gpt_forward(idx, params, CFG)
    grad_logits = torch.randn(logits.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    stream = []
    grads = gpt_backward(grad_logits, cache, stream)
    assert len(stream) == CFG.n_layers + 1 and stream[0].shape == (2, 8, 16)
    # input side first: X_0 = wte[idx] + wpe[:N], so ∂L/∂wpe is stream[0] summed over the batch
    torch.testing.assert_close(stream[0].sum(0), grads["wpe"][:8], atol=1e-12, rtol=0)
    # output side last: ∂L/∂X_L through ln_f and the head, by autograd
    X_L = cache["X_L"].clone().requires_grad_(True)
    Hf = F.layer_norm(X_L, (16,), params["ln_f.weight"], params["ln_f.bias"])
    (Hf @ params["head.weight"].T).backward(grad_logits)  # (B, N, d) @ (d, V) -> (B, N, V)
    torch.testing.assert_close(stream[-1], X_L.grad, atol=1e-12, rtol=0)
    norms = block_grad_norms(grads, CFG.n_layers)
    assert len(norms) == 3 and all(v > 0 for v in norms)


def test_tokenizer_corpus_batches():
    text = load_corpus()
    assert 2000 < len(text) < 100_000
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids.dtype == torch.long
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("€")
    idx, targets = get_batch(ids, 4, 16, seed=0)
    assert idx.shape == targets.shape == (4, 16) and torch.equal(idx[:, 1:], targets[:, :-1])
    assert torch.equal(get_batch(ids, 4, 16, seed=0)[0], idx)


def test_sample_is_reproducible_and_greedy_is_argmax():
    params = perturbed(CFG)
    start = torch.tensor([[1, 2]])
    s1 = sample(params, CFG, start, 10, temperature=1.0, seed=4)
    assert s1.shape == (1, 12) and torch.equal(s1[:, :2], start)
    assert torch.equal(s1, sample(params, CFG, start, 10, temperature=1.0, seed=4))
    greedy = sample(params, CFG, start, 1, temperature=0.0)
    logits, _ = gpt_forward(start, params, CFG)
    assert greedy[0, -1] == logits[0, -1].argmax()


def test_bad_input_raises_one_line_value_error():
    with pytest.raises(ValueError, match="n_heads dividing"):
        GPTConfig(vocab_size=5, d_model=10, n_heads=3)
    params = gpt_init(CFG)
    with pytest.raises(ValueError, match="n_ctx"):
        gpt_forward(torch.zeros(1, 9, dtype=torch.long), params, CFG)
    with pytest.raises(ValueError, match="int64"):
        gpt_forward(torch.zeros(1, 4), params, CFG)
    with pytest.raises(ValueError, match=r"n_layers: expected an int ≥ 1, got 0"):
        GPTConfig(vocab_size=5, n_layers=0)
    with pytest.raises(ValueError, match=r"d_ff: expected an int ≥ 1, got True"):
        GPTConfig(vocab_size=5, d_ff=True)
    with pytest.raises(ValueError, match=r"n: expected an int ≥ 0"):
        sample(params, CFG, torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match=r"batch_size: expected an int ≥ 1"):
        get_batch(torch.arange(100), 0, 8)
