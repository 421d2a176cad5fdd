"""Step records and layouts of the logs gathered blind in the sixth round (tests/fixtures/logs/
heldout4c-4k, scored before these rules were written; their READMEs name each source). Each line is
copied from its log; the expected values were read from the line by hand."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_lines

HELDOUT = Path(__file__).parent / "fixtures" / "logs"


def _line(folder: str, prefix: str, startswith: str) -> str:
    """The first line starting with ``startswith`` of the log whose name starts with ``prefix``."""
    log = next((HELDOUT / folder).glob(prefix + "*.txt"))
    return next(t for t in log.read_text().splitlines() if t.startswith(startswith))


def test_a_value_before_its_name_may_carry_a_number_type() -> None:
    # llm.c's train_gpt2cu (heldout4f/, hectorfcardenas)
    line = ("step    1/19560 | loss 11.010252 (+nanz)| norm 15.1374 (+nanz)| lr 8.57e-07 | 4621.47 ms | "
            "29.2% bf16 MFU | 113446 tok/s")
    it = parse_lines([line]).iterations.iloc[0]
    assert (it["iteration"], it["lm_loss"], it["mfu"], it["tokens_per_sec"]) == (1, 11.010252, 29.2, 113446.0)


def test_a_batch_in_parentheses_after_the_epoch_is_a_step() -> None:
    # minimind's SFT (heldout4f/, coicozoi)
    lines = ["Epoch:[1/1](50/56608), loss: 2.4945, logits_loss: 2.4945, aux_loss: 0.0000, lr: 0.00001000, "
             "epoch_time: 116.0min",
             "Epoch:[1/1](100/56608), loss: 2.4126, logits_loss: 2.4126, aux_loss: 0.0000, lr: 0.00001000, "
             "epoch_time: 111.0min"]
    its = parse_lines(lines).iterations
    assert its["iteration"].tolist() == [50, 100]
    assert its["lm_loss"].tolist() == [2.4945, 2.4126]
    assert its["lr"].tolist() == [1e-05, 1e-05]


def test_a_quoted_name_on_a_line_that_is_no_dict() -> None:
    # PaddleDetection 0.x (heldout4e/, PaddlePaddle/Paddle issue 18576)
    line = "2019-07-09 18:08:16.698352, iter: 346094, lr: 0.001000, 'loss': 78.400635, time: 1.747"
    it = parse_lines([line]).iterations.iloc[0]
    assert (it["iteration"], it["lm_loss"], it["lr"]) == (346094, 78.400635, 0.001)


def test_a_negative_mfu_is_a_placeholder_in_every_reader() -> None:
    # nanoGPT under torchrun (heldout4j/, karpathy/nanoGPT PR 673): its own reader, not generic.py's
    lines = ["iter 0: loss 10.9766, time 26086.69ms, mfu -100.00%",
             "iter 1: loss 10.9558, time 813.91ms, mfu -100.00%"]
    its = parse_lines(lines).iterations
    assert its["mfu"].isna().all() and its["lm_loss"].tolist() == [10.9766, 10.9558]


def test_a_unit_in_brackets_after_a_time_is_its_unit() -> None:
    # verl's SFT trainer (heldout4k/, jianghoucheng): ``train/time(s):7.41`` is 7.41 s
    line = _line("heldout4k", "verl_2025_fsdp", "step:1 -")
    it = parse_lines([line]).iterations.iloc[0]
    assert it["iteration"] == 1 and abs(it["elapsed_ms"] - 7411.591291427612) < 1e-6
    assert it["lr"] == 0.0002702702702702703 * 1e-3  # ``train/lr(1e-3):`` a scale


def test_a_value_in_numpys_repr_is_its_number() -> None:
    # verl's PPO trainer (heldout4k/, jianghoucheng): ``actor/lr:np.float64(1e-06)``; step 10's line
    # also prints validation metrics, and the training-only ones (lr, grad norm) keep it a step
    line = _line("heldout4k", "verl_2025_agent", "step:10 -")
    it = parse_lines([line]).iterations.iloc[0]
    assert (it["iteration"], it["lr"], it["grad_norm"]) == (10, 1e-06, 0.6531039774417877)


def test_sizes_in_words_and_a_dist_world_size_key_state_the_layout() -> None:
    # ColossalAI's legacy launch, wrapped by rich over two lines (heldout4j/, hpcaitech/ColossalAI 3514)
    colossal = ["                             environment is initialized, data parallel size: 4, ",
                "                             pipeline parallel size: 1, tensor parallel size: 1 "]
    lay = parse_lines(colossal).layout
    assert (lay["world_size"], lay["dp"], lay["tp"], lay["pp"]) == (4, 4, 1, 1)
    # ESPnet's config print (heldout4j/, espnet/espnet issue 1940)
    assert parse_lines(["self.dist_world_size: 4"]).layout["world_size"] == 4


def _kinds_ranks(lines: list[str]) -> list[tuple[str, int | None]]:
    return [(f.kind, f.rank) for f in parse_lines(lines).failure_records]


def test_an_exception_line_with_its_module_is_an_uncaught_exception_without_its_traceback() -> None:
    # torch DDP, NCCL 2.21.5 (heldout4e/, NVIDIA/nccl issue 2076): the excerpt starts at the exception
    lines = ["torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
             "NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5",
             "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
             "prematurely."]
    assert [k for k, _ in _kinds_ranks(lines)] == ["python_exception"]


def test_frames_without_their_header_open_a_traceback_of_their_rank() -> None:
    # torch 2.x, NCCL 2.28.8 (heldout4h/, NVIDIA/nccl issue 1928): rank 3's traceback cut above its
    # frames, then rank 2's whole header
    log = next((HELDOUT / "heldout4h").glob("torch_2025_rank_prefixed_dist_backend_error*.txt"))
    lines = log.read_text().splitlines()
    assert _kinds_ranks(lines)[0] == ("python_exception", 3)
    # its frames alone: a traceback the log cuts after them (an exception, told by its last frame)
    assert _kinds_ranks(lines[:4]) == [("python_exception", 3)]


def test_a_scripts_ddp_greeting_makes_a_log() -> None:
    # an ALCF training series DDP exercise under mpiexec --label (heldout4i/, tnguyen2211)
    line = ("x3206c0s37b1n0.hsn.cm.polaris.alcf.anl.gov 0: DDP: Hi from rank 0 of 2 with local rank 0."
            "x3206c0s37b1n0")
    p = parse_lines([line])
    assert "torch" in p.tools and p.iterations.empty and p.layout["world_size"] is None


def test_every_loss_scale_line_without_a_trigger_counts_once() -> None:
    # fairseq under MLPerf's bind_launch (heldout4d/, mlcommons/training_results_v0.6, NVIDIA
    # dgx2h_n10 transformer result_1.txt): five ``| WARNING: overflow detected, setting loss scale to:
    # N`` lines, three of them beside a line the first pass reads, two not
    from labkit.logs import parse_log

    log = next((HELDOUT / "heldout4d").glob("fairseq_2019_mlperf_transformer*.txt"))
    found = {f["kind"]: f for f in parse_log(log).findings}
    assert found["fp16_overflow"]["skipped_steps"] == 5
    assert found["fp16_overflow"]["loss_scale"] == 4.0
