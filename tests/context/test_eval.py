"""Perplexity windows, passkey documents and their scorer, and the paper-shaped tables, on oracle models."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attnbench.context import passkey
from attnbench.context.perplexity import (document_starts, sliding_window_score, sliding_windows,
                                          truncated_window_score)
from attnbench.report.context import passkey_table, perplexity_table

V = 7


def _bigram():
    gen = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(V, V, generator=gen, dtype=torch.float64), -1)
    return logp, (lambda tokens: logp[tokens])  # logits at t depend on token t only


def _exact_nll(logp, tokens):
    return -sum(logp[a, b].item() for a, b in zip(tokens[:-1].tolist(), tokens[1:].tolist()))


@pytest.mark.parametrize("n, window, stride", [(50, 16, 4), (50, 16, 16), (17, 16, 3), (64, 8, 1), (16, 16, 5)])
def test_sliding_window_scores_every_token_once(n, window, stride):
    logp, model = _bigram()
    tokens = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n))
    score = sliding_window_score(model, tokens, window, stride, batch_size=3)
    assert score.n_tokens == n - 1
    assert score.nll_sum == pytest.approx(_exact_nll(logp, tokens), rel=1e-6)
    spans = sliding_windows(n, window, stride)
    assert all(b + window <= n for b, _ in spans) and spans[-1][0] + window == n


def test_sliding_window_context_is_at_least_window_minus_stride():
    for begin, first in sliding_windows(1000, 128, 32)[1:]:
        assert first - begin >= 128 - 32


def test_truncated_windows_score_each_document_prefix():
    logp, model = _bigram()
    text = torch.randint(0, V, (300,), generator=torch.Generator().manual_seed(1))
    starts = document_starts(300, 40, 5)
    assert starts[0] == 0 and starts[-1] == 260 and len(set(starts)) == 5
    docs = torch.stack([text[s:s + 40] for s in starts])
    score = truncated_window_score(model, docs, 25, batch_size=2)
    assert score.n_tokens == 5 * 24
    assert score.nll_sum == pytest.approx(sum(_exact_nll(logp, d[:25]) for d in docs), rel=1e-6)
    assert score.ppl == pytest.approx(math.exp(score.nll_sum / score.n_tokens))


def test_uniform_model_has_vocab_perplexity():
    tokens = torch.randint(0, V, (100,), generator=torch.Generator().manual_seed(2))
    score = sliding_window_score(lambda t: torch.zeros(*t.shape, V), tokens, 32, 8)
    assert score.ppl == pytest.approx(V)


def test_window_errors():
    with pytest.raises(ValueError, match="stride=0"):
        sliding_windows(100, 10, 0)
    with pytest.raises(ValueError, match="fewer than the window"):
        sliding_windows(5, 10, 2)


def test_passkey_documents():
    batch = passkey.make_batch(6, 400, seed=3, depths=[0.0, 0.5, 1.0])
    assert batch.tokens.shape == (6, 400)
    for row, start, depth in zip(batch.tokens, batch.answer_start, batch.depth):
        text = bytes(row.to(torch.uint8).tolist())
        key = text[start:start + 5]
        assert key.isdigit() and start + 5 == 400
        assert text.count(b"The key is " + key) == 2  # once in the needle, once as the answer
        assert text.index(b"The key is " + key) / 400 == pytest.approx(depth.item(), abs=0.05)
    assert batch.depth[0] < 0.25 < batch.depth[1] < 0.75 < batch.depth[2]
    with pytest.raises(ValueError, match="passkey length=50 is too short"):
        passkey.make_batch(1, 50)
    assert passkey.make_batch(1, passkey.min_length()).tokens.shape[1] == passkey.min_length()


def test_passkey_score_on_oracles():
    batch = passkey.make_batch(8, 300, seed=4)

    def oracle(tokens):  # predicts the true next token everywhere
        nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
        return torch.nn.functional.one_hot(nxt, 256).float()

    assert passkey.score(oracle, batch, batch_size=3).accuracy == 1.0

    def zeros(tokens):  # always answers the digit '0'
        return torch.nn.functional.one_hot(torch.full_like(tokens, ord("0")), 256).float()

    result = passkey.score(zeros, batch)
    want = (batch.tokens[torch.arange(8)[:, None], batch.answer_start[:, None] + torch.arange(5)] == ord("0"))
    assert result.digit_accuracy == pytest.approx(want.float().mean().item())
    assert result.accuracy == want.all(-1).float().mean().item() and result.n == 8


def test_tables_are_shaped_like_the_papers():
    rows = []
    for method, factor, steps in [("none", 1, 0), ("linear", 2, 0), ("yarn", 2, 0), ("linear", 2, 10)]:
        for eval_len in (64, 128):
            for window in ("sliding", "truncated"):
                rows.append(dict(method=method, factor=factor, finetune_steps=steps, train_len=64, eval_len=eval_len,
                                 eval=window, ppl=float(eval_len + steps + factor), accuracy=float("nan")))
            rows.append(dict(method=method, factor=factor, finetune_steps=steps, train_len=64, eval_len=eval_len,
                             eval="passkey", ppl=float("nan"), accuracy=0.5))
    df = pd.DataFrame(rows)
    table = perplexity_table(df, "sliding")
    assert list(table.columns) == ["method", "s", "extended to", "finetune_steps", "64", "128"]
    assert table["method"].tolist() == ["none (extrapolation)", "PI (linear)", "YaRN", "PI (linear)"]
    assert table.loc[3, "128"] == 128 + 10 + 2 and table.loc[1, "extended to"] == 128
    assert perplexity_table(df, "truncated").shape == table.shape
    assert (passkey_table(df)[["64", "128"]] == 0.5).all().all()
    with pytest.raises(ValueError, match="allowed: sliding, truncated"):
        perplexity_table(df, "strided")
