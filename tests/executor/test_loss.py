"""The chunked output projection + cross-entropy: same loss and gradients as the plain loss on full
logits, for any slice count, in fp32 and bf16, eager and under torch.compile(fullgraph=True); the
built-in models and `train_step` use it, user models that return logits keep the plain loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from executor.runtime.loss import chunked_linear_cross_entropy
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model, computes_own_loss
from executor.runtime.parallelize import Parallelized
from executor.runtime.step import train_step
from tests.executor.test_runtime_units import GPT2_SMALL, SMALL, model_config

TOKENS = (2, 23)  # 46 tokens: no chunk count below divides it evenly
HIDDEN, VOCAB = 16, 101


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(*TOKENS, HIDDEN, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.3).to(dtype).requires_grad_()
    targets = torch.randint(0, VOCAB, TOKENS, generator=g)
    return hidden, weight, targets


def plain_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What train_step computed before: fp32 cross-entropy on the full logits."""
    return F.cross_entropy((hidden @ weight.t()).flatten(0, 1).float(), targets.flatten())


def loss_and_grads(fn, hidden, weight, targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets)
    # A non-unit upstream gradient: backward must scale the stored gradients.
    (2.5 * loss).backward()
    return loss.detach(), hidden.grad, weight.grad


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunks", [1, 3, 4])
def test_chunked_loss_matches_plain_loss(dtype: torch.dtype, chunks: int) -> None:
    hidden, weight, targets = inputs(dtype)
    ref = loss_and_grads(plain_loss, hidden, weight, targets)
    got = loss_and_grads(
        lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunks=chunks), hidden, weight, targets
    )
    assert got[0].dtype == torch.float32
    assert got[1].dtype == dtype and got[2].dtype == dtype
    # fp32: the same sums in another order; bf16: the plain path rounds the logit gradient to bf16
    # once, here each slice's weight-gradient share is rounded before the fp32 sum.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[0], ref[0], rtol=tol, atol=tol)
    assert rel_err(got[1], ref[1]) < tol
    assert rel_err(got[2], ref[2]) < tol


def test_more_chunks_than_tokens_and_bad_arguments() -> None:
    hidden, weight, targets = inputs(torch.float32)
    ref = plain_loss(hidden, weight, targets)
    torch.testing.assert_close(chunked_linear_cross_entropy(hidden, weight, targets, chunks=64), ref)
    with pytest.raises(ValueError, match=">= 1"):
        chunked_linear_cross_entropy(hidden, weight, targets, chunks=0)
    with pytest.raises(TypeError, match="bfloat16"):
        chunked_linear_cross_entropy(hidden, weight.bfloat16(), targets, chunks=2)


def test_chunked_loss_compiles_as_one_graph() -> None:
    # aot_eager: dynamo + AOTAutograd, what fullgraph and the autograd.Function need, without the
    # ~30 s of inductor code generation on CPU (the compiled parity case runs it under inductor).
    torch._dynamo.reset()
    hidden, weight, targets = inputs(torch.float32)
    compiled = torch.compile(
        lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunks=3), backend="aot_eager", fullgraph=True
    )
    ref = loss_and_grads(plain_loss, hidden, weight, targets)
    got = loss_and_grads(compiled, hidden, weight, targets)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims", [SMALL, GPT2_SMALL], ids=["llama", "gpt2-tied"])
def test_models_return_the_chunked_loss_given_targets(dims: dict) -> None:
    cfg = model_config(dims)
    model = build_model(cfg, seq_len=32)
    materialize(model, device=torch.device("cpu"), seed=3)
    head = "lm_head.weight" if cfg.architecture == "gpt2" else "output.weight"
    assert head in model.state_dict()
    assert computes_own_loss(model)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    inputs_, targets = tokens[:, :-1], tokens[:, 1:]

    def grads_of(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss = F.cross_entropy(model(inputs_).flatten(0, 1).float(), targets.flatten())
    ref = grads_of(ref_loss)
    loss = model(inputs_, targets, loss_chunks=3)
    assert loss.shape == ()
    torch.testing.assert_close(loss, ref_loss)
    for name, grad in grads_of(loss).items():
        # Tied: the head's and the embedding's gradient land on the one shared weight.
        torch.testing.assert_close(grad, ref[name], rtol=1e-4, atol=1e-6, msg=name)


class LogitsOnly(nn.Module):
    """A user model: returns logits, knows nothing of targets."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(tokens)


def test_train_step_chunks_built_in_models_and_falls_back_for_logit_models() -> None:
    cfg = model_config(SMALL)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    results = {}
    for kind in ("built_in", "user"):
        model = build_model(cfg, seq_len=32)
        materialize(model, device=torch.device("cpu"), seed=3)
        module = model if kind == "built_in" else LogitsOnly(model)
        assert computes_own_loss(module) == (kind == "built_in")
        par = Parallelized(
            module=module,
            forward=module,
            engine="fsdp2",
            compiled=False,
            compile_settings=None,
            checkpointed_blocks=0,
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
        )
        optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
        grads: dict[str, torch.Tensor] = {}

        def capture(module: nn.Module = module, grads: dict = grads) -> None:
            grads.update({n.removeprefix("inner."): p.grad.clone() for n, p in module.named_parameters()})

        result = train_step(
            par,
            optimizer,
            [tokens],
            grad_accum_steps=1,
            max_grad_norm=0.0,
            loss_chunks=3,
            before_update=capture,
        )
        results[kind] = (result.loss_sum, grads)
    torch.testing.assert_close(results["built_in"][0], results["user"][0])
    for name, grad in results["built_in"][1].items():
        torch.testing.assert_close(grad, results["user"][1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_second_backward_through_the_same_loss_is_scaled_once_not_twice() -> None:
    # Backward scales the stored gradients in place (no head-sized copy); a retained second
    # backward (a zero-bubble pipeline schedule's weight-gradient pass) must still get its own
    # scale's gradients, not the first pass's scale times its own.
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    targets = torch.randint(0, 11, (6,))
    loss = chunked_linear_cross_entropy(hidden, weight, targets, chunks=2)
    (loss * 0.5).backward(retain_graph=True)
    once = [hidden.grad.clone(), weight.grad.clone()]
    loss.backward()
    torch.testing.assert_close(hidden.grad, 3 * once[0])
    torch.testing.assert_close(weight.grad, 3 * once[1])


def test_without_autograd_the_loss_alone_is_computed_and_is_the_same() -> None:
    # Evaluation runs under no_grad: the same loss, bit for bit, with no gradient buffers.
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 24, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (2, 24), generator=g)
    for chunks in (1, 5):
        trained = chunked_linear_cross_entropy(hidden, weight, targets, chunks=chunks)
        with torch.no_grad():
            evaluated = chunked_linear_cross_entropy(hidden, weight, targets, chunks=chunks)
        assert torch.equal(trained.detach(), evaluated) and evaluated.grad_fn is None
