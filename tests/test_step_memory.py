"""Memory of training steps by category, from a real torch.profiler profile of a tiny model
trained here (an embedding, a transformer layer and an output layer, Adam, two steps on CPU)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from labkit.errors import LabkitError  # noqa: E402
from labkit.measured.plots import plot_memory_categories  # noqa: E402
from labkit.measured.step_memory import category_columns, profile_training_steps, step_summary  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    vocab, hidden = 128, 64
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, hidden),
                                torch.nn.TransformerEncoderLayer(hidden, 4, 2 * hidden, batch_first=True),
                                torch.nn.Linear(hidden, vocab))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (4, 32))

    def loss():
        return torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), tokens.reshape(-1))

    n_params = sum(p.numel() * p.element_size() for p in model.parameters())
    return profile_training_steps(loss, opt, steps=2), n_params


def test_categories_are_there_and_the_optimizer_state_appears_in_the_first_step(tiny):
    df, n_params = tiny
    cols = category_columns(df)
    for c in ("parameter", "optimizer_state", "activation", "gradient"):
        assert f"{c}_mb" in cols and df[f"{c}_mb"].max() > 0, (c, cols)
    s = step_summary(df)
    assert [tuple(r) for r in s[["step", "phase"]].to_numpy()] == [
        (1, "forward"), (1, "backward"), (1, "optimizer"), (2, "forward"), (2, "backward"),
        (2, "optimizer")]
    before = df[(df["step"] == 1) & (df["phase"].isin(["forward", "backward"]))]
    assert before["optimizer_state_mb"].max() == 0  # no Adam state before its first step
    after = df[df["step"] == 2]
    # Adam keeps two moments per parameter: as many bytes as the parameters, twice, all step 2.
    assert after["optimizer_state_mb"].min() == pytest.approx(2 * n_params / 1e6, rel=0.01)
    assert df["parameter_mb"].max() == pytest.approx(n_params / 1e6, rel=0.3)
    # Activations peak in forward/backward; the optimizer step holds (almost) none.
    peak = df.loc[df["activation_mb"].idxmax()]
    assert peak["phase"] in ("forward", "backward")
    opt2 = df[(df["step"] == 2) & (df["phase"] == "optimizer")]
    assert opt2["activation_mb"].max() < 0.1 * df["activation_mb"].max()
    # Gradients exist from backward on, and are freed by zero_grad(set_to_none=True).
    assert before[before["phase"] == "forward"]["gradient_mb"].max() == 0
    assert df[(df["step"] == 1) & (df["phase"] == "backward")]["gradient_mb"].max() > 0


def test_the_stacked_plot_shows_each_category(tiny):
    df, _ = tiny
    ax = plot_memory_categories(df)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"parameter", "optimizer state", "activation", "gradient"} <= set(labels)
    assert ax.get_ylabel() == "tensor memory (MB)" and ax.get_xlabel() == "time (ms)"


def test_bad_input_is_named():
    with pytest.raises(LabkitError, match="torch.optim.Optimizer.*got object"):
        profile_training_steps(lambda: None, object())
    with pytest.raises(LabkitError, match="steps=0"):
        profile_training_steps(lambda: None, torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                                             lr=0.1), steps=0)
