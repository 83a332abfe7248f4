"""Near-identical lab answers: pairs of submissions (or a submission and the published solutions).

The comparison is copydetect's (MOSS-style winnowing over tokenised code), not ours: each answer
is run through ``copydetect.CodeFingerprint`` (pygments tokenises it as Python and filters it:
comments and whitespace dropped, every variable, attribute and call name becomes ``V``, every
defined function name ``F``, class name ``O``, string ``S``; keywords, operators, numbers and
builtins such as ``range``/``len`` stay), and each pair goes through ``copydetect.compare_files``.

Parameters, chosen for answer cells of a few short functions rather than whole files:

* ``K = 20`` (copydetect's noise threshold = guarantee threshold): k-grams of 20 characters of
  *filtered* code, about 8-12 tokens. Renaming locals and rewording comments leaves the filtered
  code unchanged, so such a copy scores 1.0 at any k; but the filtering is so coarse
  (``torch.einsum`` and ``x.sum`` are both ``V.V``) that two different two-line softmax
  backwards that both call ``einsum`` (Jacobian vs row dot product) score 0.81 at k = 10-12,
  0.70 at k = 14-16, 0.41 at k = 18 and 0.0 at k = 20. Measured at k = 20: different
  implementations of one small function 0.0-0.2, a renamed copy 1.0, a copy with one statement
  rewritten 0.98 (each edit costs at most about k characters of the match).
* window size 1 (guarantee - noise + 1, as copydetect's defaults 25/25 also give): every k-gram
  is a fingerprint, nothing is winnowed away. Short answers have few k-grams to spare, and it
  makes the result independent of the values of Python's ``hash`` (salted per process by
  PYTHONHASHSEED; copydetect hashes k-grams with it), which winnowing would otherwise depend on
  (with a window of 4 the rows differ between hash seeds).

copydetect's two similarities of a pair are "share of A's filtered code found in B" and the
reverse; the figure here is their **mean**, symmetric and meaning "near-identical" (most of each
answer is shared). The max would also flag an answer *contained* in a larger one (a part
copied), but a short canonical answer is contained in the full published solutions whoever wrote
it, so the mean is the safer default for a flag an instructor acts on.
"""

from __future__ import annotations

import csv
import io
import itertools
from os import PathLike

import copydetect

SOLUTIONS = "(published solutions)"
K = 20  # copydetect noise threshold = guarantee threshold, in filtered characters
WIN_SIZE = 1  # guarantee - noise + 1: keep every k-gram
FIELDS = ("a", "b", "similarity", "tokens_overlap")


def _fingerprint(code: str) -> copydetect.CodeFingerprint:
    # fp= gives the text directly (no temporary files); the name is only a label, the lexer is
    # fixed to Python so no file extension is needed either.
    return copydetect.CodeFingerprint("answer.py", K, WIN_SIZE, fp=io.StringIO(code), language="python")


def similarity_pairs(
    answers: dict[str, str], solutions: str | None = None, threshold: float = 0.8, min_chars: int = 40
) -> list[dict]:
    """Pairs of submissions (and submission vs the published solutions) whose answer code is near-identical.

    answers: {submission name: the text of its answer code (already extracted, plain Python)}.
    solutions: the solutions' code as one text, compared as a pseudo-submission named
    "(published solutions)" (always in column "b" of its rows).
    Returns rows {"a": name, "b": name, "similarity": float in [0, 1], "tokens_overlap": int}
    sorted by similarity descending then names, only for pairs with similarity >= threshold.
    Between two submissions "a" is the name that sorts first.

    similarity: the mean of copydetect's two similarities of the pair (the share of a's filtered
    code matched in b and the share of b's matched in a), with k = 20 and window 1 (see the
    module docstring). tokens_overlap: copydetect's token overlap, the number of characters of
    a's filtered code (one character per identifier) covered by matches with b.
    Answers shorter than min_chars (stripped) are ignored (an empty notebook is not copying);
    so is a solutions text that short. The rows depend only on the texts and names, not on the
    order of ``answers`` or on the process (hash seed).
    """
    if solutions is not None and SOLUTIONS in answers:
        raise ValueError(f"a submission may not be named {SOLUTIONS!r}")
    names = sorted(n for n, code in answers.items() if len(code.strip()) >= min_chars)
    prints = {n: _fingerprint(answers[n]) for n in names}
    pairs = list(itertools.combinations(names, 2))
    if solutions is not None and len(solutions.strip()) >= min_chars:
        prints[SOLUTIONS] = _fingerprint(solutions)
        pairs += [(n, SOLUTIONS) for n in names]

    rows = []
    for a, b in pairs:
        overlap, (sim_a, sim_b), _ = copydetect.compare_files(prints[a], prints[b])
        similarity = min(1.0, (float(sim_a) + float(sim_b)) / 2)
        if similarity >= threshold:
            rows.append({"a": a, "b": b, "similarity": similarity, "tokens_overlap": int(overlap)})
    rows.sort(key=lambda r: (-r["similarity"], r["a"], r["b"]))
    return rows


def write_report(rows: list[dict], path: str | PathLike, *, cell) -> None:
    """CSV with columns a, b, similarity (3 decimals), tokens_overlap; a header even when empty.

    ``cell`` makes a name safe as spreadsheet text (the gradebook's own, ``labs._cell``): the
    names are student folder names, so ``=HYPERLINK(...)`` must not become a formula."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for r in rows:
            w.writerow([cell(r["a"]), cell(r["b"]), f"{r['similarity']:.3f}", int(r["tokens_overlap"])])
