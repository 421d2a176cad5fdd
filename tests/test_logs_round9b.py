"""Round nine's second part, each rule on real lines of the held-out sets 4w, 4x and 4y (the sources
named at each test; the whole logs are in tests/fixtures/logs/heldout4w/ to 4y/)."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_lines

HELD = Path(__file__).parent / "fixtures" / "logs"


def _lines(folder: str, stem: str) -> list[bytes]:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path.read_bytes().split(b"\n")


def _layout(lines: list[bytes]) -> dict:
    return parse_lines(lines).layout


def test_sizes_stated_by_short_names_make_the_world():
    """``Setting DP = 4, TP = 4, CP = 1, PP = 1`` (alexk101/sc24-dl-tutorial, err_log.txt at 3904415) and
    ezpz's ``TP: 4, PP: 3, CP: 1, DP: 2`` (saforem2/ezpz, docs/launch.md at 74fd786)."""
    lay = _layout([ln for ln in _lines("heldout4w", "perlmutter_dp4_tp4_sixteen_rank_watchdog_timeouts_glued"
                                                       "_lines_srun_exit_134_step_cancelled_sc24tutorial")
                   if b"Setting DP" in ln])
    assert (lay["world_size"], lay["dp"], lay["tp"], lay["pp"]) == (16, 4, 4, 1)
    lay = _layout([ln for ln in _lines("heldout4x", "ezpzlaunch") if b"TP: 4" in ln])
    assert (lay["world_size"], lay["dp"], lay["tp"], lay["pp"]) == (24, 2, 4, 3)


def test_a_loggers_rank_coordinates_are_no_sizes():
    """nanotron's ``[INFO|DP=0|PP=0|TP=0]`` prefix (real/nanotron_2025_pp_iterations_nanotron390)."""
    lines = (HELD / "real" / "nanotron_2025_pp_iterations_nanotron390.txt").read_bytes().split(b"\n")
    assert _layout(lines[:3])["world_size"] is None


def test_torchs_store_based_barrier_states_the_world():
    """``Rank 0: Completed store-based barrier for key:store_based_barrier_key:1 with 32 nodes.``
    (argonne-lcf/dl_scaling, cosmoflow_pytorch wandb output.log at bed24a0)."""
    assert _layout(_lines("heldout4w", "dlscaling"))["world_size"] == 32


def test_a_timer_after_its_step_line_is_that_steps():
    """Megatron-DeepSpeed resumed at step 136004: DeepSpeed's ``step=136005`` then its timer's
    ``global_step=5`` (argonne-lcf/Megatron-DeepSpeed, ALCF/notes/cooldown.md at 6c20809)."""
    its = parse_lines(_lines("heldout4x", "alcfmds_cooldown")).iterations
    assert its["iteration"].tolist() == list(range(136004, 136012))


def test_torchtunes_peak_memory_is_a_memory_row():
    """``peak_memory_active:23.435...`` on torchtune's step lines (https://github.com/meta-pytorch/torchtune/pull/2605)."""
    assert len(parse_lines(_lines("heldout4y", "torchtune2605")).memory) == 2


def test_determineds_trial_log_prefix_names_the_rank():
    """``[2023-09-21T00:40:07.708118Z] 63e6f494 [rank=0] || ...`` (https://github.com/determined-ai/determined/issues/7939)."""
    f = parse_lines(_lines("heldout4x", "determined7939")).failures
    assert f[["kind", "rank"]].values.tolist() == [["python_exception", 0]]


def test_a_jax_stacks_log_is_a_log():
    """levanter's lines behind host addresses (https://github.com/marin-community/levanter/issues/584):
    no step, no failure, but a log of a trainer labkit knows."""
    assert "trainer" in parse_lines(_lines("heldout4y", "levanter584")).tools
