"""Self-check scaffolding for the labs whose answers are autograd.Functions (chapter 4; labs 4, 8, 9).

``helpers.labcheck`` compares one function with a reference; these put its pieces together for
a learner's ``torch.autograd.Function``:

* ``applied(fn)`` - ``fn``, but a forward that returns ``None`` (an unfinished ``...``) reads
  as "not implemented yet" instead of failing somewhere later;
* ``count_saved(fn, inputs)`` - how many distinct tensors ``fn``'s graph saves for backward
  (chapter 3's ``SavedTensors``);
* ``check_function(name, fn, reference, inputs, grad_out, outputs, saves=None)`` - one line:
  the output and every input gradient against autograd on ``reference``, then (``saves=(n,
  what)``) the number of tensors saved, then ``gradcheck`` in float64.
"""

from __future__ import annotations

from helpers.labcheck import CheckResult, autograd_grads, check_gradcheck, evaluate
from helpers.memory import SavedTensors

__all__ = ["applied", "count_saved", "check_function"]


def applied(fn):
    """fn, but an unfinished answer (one that returns None) raises NotImplementedError: 'not implemented yet'."""

    def run(*args):
        out = fn(*args)
        if out is None:
            raise NotImplementedError
        return out

    return run


def count_saved(fn, inputs) -> int:
    """How many distinct tensors fn's graph saves for backward, on fresh leaf copies of inputs."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    with SavedTensors() as saved:
        applied(fn)(*leaves)
    return saved.count


def check_function(
    name: str,
    fn,
    reference,
    inputs,
    grad_out,
    outputs,
    saves=None,
    quiet: bool = False,
    factors=None,
    terms=None,
    mistakes=None,
    regions=None,
) -> CheckResult:
    """Print (unless quiet) and return one line: fn(inputs) and its input gradients vs reference's
    (autograd, upstream gradient grad_out), then the tensors fn saves (saves = (n, what)), then gradcheck.

    ``factors``, ``terms``, ``mistakes`` and ``regions`` go to ``labcheck.evaluate``, which names a
    constant ratio, a missing term, a known wrong answer or the region where the answer is wrong."""

    def both(f):
        return lambda *xs: (f(*xs), *autograd_grads(f, xs, grad_out))

    result = evaluate(
        both(applied(fn)),
        both(reference),
        args=inputs,
        outputs=outputs,
        name=name,
        against="autograd",
        factors=factors,
        terms=terms,
        mistakes=mistakes,
        regions=regions,
    )
    if result and saves is not None:
        what = "tensors saved for backward"
        n_saved = evaluate(
            lambda: count_saved(fn, inputs),
            saves[0],
            outputs=(what,),
            counts=(what,),
            name=f"{name} (saves only {saves[1]})",
        )
        if n_saved:
            result.line += f"; saves only {saves[1]}"
        else:
            result = n_saved
    if result:
        gc = check_gradcheck(applied(fn), inputs, name=name, quiet=True)
        if gc:
            result.line += "; gradcheck passes"
        else:
            result = gc
    if not quiet:
        print(result.line)
    return result
