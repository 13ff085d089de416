"""Context parallelism in the performance and memory models and the planner, and sequence
lengths past a flavor's `max_seq_len` (`[boost] max_seq_len`). Single process."""

from __future__ import annotations

import dataclasses

import pytest

from boost_titan.boost_llama.shapes import flavor_shape
from boost_titan.config.errors import ConfigError
from boost_titan.perf import activations, block, costs, layout, layout_search, memory, timing
from boost_titan.perf.gpus import gpu_profile
from boost_titan.perf.layout import TrainingLayout
from tests.helpers import DEBUG_TOML

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

H100 = gpu_profile("h100")


def _args(strategy: str, **shape):
    args = flavor_shape("7B", arch="fullrank" if strategy == "megatron" else "cola", **shape)
    args.vocab_size = 32000
    return args


@pytest.mark.parametrize(
    "strategy, ac",
    [(s, ac) for s in ("btp", "vanilla") for ac in ("none", "full", "lowrank")]
    + [("megatron", "none"), ("megatron", "full")],  # megatron's fullrank twin has no latents
)
def test_activations_per_rank_divide_by_cp(strategy, ac):
    """Every per-token storage a block saves, and what the memory model keeps per block under
    each AC mode, fall by exactly cp; weight-sized items (grouped GEMMs' concatenated
    weights) do not, wo's input is a copy of the ring's output, and low-rank AC adds the
    ring attention's output and log-sum-exp; the weights and AdamW state are sharded over
    the cp ranks (FSDP2)."""
    args = _args(strategy)
    one = TrainingLayout(strategy, tp=4, seq_len=32768, micro_batch=2, microbatches=2, ac=ac)
    for cp in (2, 4):
        split = dataclasses.replace(one, cp=cp)
        whole, part = (activations.saved_activations(args, p) for p in (one, split))
        for item, nbytes in whole.items():
            expected = nbytes if item.endswith("concat_weights") else nbytes // cp
            assert part[item] == expected, (item, cp)
        kept_one, kept_cp = (activations.activation_bytes(args, p) for p in (one, split))
        weights = sum(v for k, v in whole.items() if k.endswith("concat_weights"))
        fixed = weights if ac == "none" else 0
        # without AC, wo's copy of the ring's head-major output; low-rank AC under CP
        # keeps the ring attention's output and fp32 log-sum-exp
        ring = {
            "none": part["attention.out_copy"],
            "full": 0,
            "lowrank": part["attention.out"] + part["attention.lse"],
        }[ac]
        assert (
            part["attention.out_copy"] == part["attention.out"]
            and "attention.out_copy" not in whole
        )
        assert (kept_cp - fixed - ring) * cp == kept_one - fixed, cp
        state_one, state_cp = (memory.stage_memory(args, p).parts for p in (one, split))
        for part in ("weights", "optimizer"):  # FSDP2 shards over dp_shard x cp
            assert state_cp[part] == state_one[part] // cp, (part, cp)


@pytest.mark.parametrize(
    "strategy, tp, n_kv_heads", [("btp", 4, 8), ("btp", 2, None), ("vanilla", 4, 8)]
)
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_bytes_are_the_unrepeated_kv_volume(strategy, tp, n_kv_heads, cp):
    """Forward: a rank receives (cp - 1)/cp of the whole micro-batch's K and V, at the
    n_kv_heads the model projects (GQA's K/V not repeated to n_heads), sharded over tp
    except by vanilla; backward: that again plus the dK/dV accumulators, fp32, passed once
    round the ring (cp passes of 1/cp each)."""
    args = _args(strategy, n_kv_heads=n_kv_heads)
    micro, seq = 2, 32768
    plan = TrainingLayout(strategy, tp=tp, cp=cp, seq_len=seq, micro_batch=micro, dtype="bf16")
    heads = args.n_kv_heads or args.n_heads
    per_rank_heads = heads if strategy == "vanilla" else heads // tp
    kv_volume = 2 * micro * seq * per_rank_heads * 128  # K and V elements, head_dim 128
    forward, backward = block.ring_bytes(args, plan)
    assert forward * cp == (cp - 1) * kv_volume * 2
    assert backward == forward + kv_volume * 4
    assert block.ring_bytes(args, dataclasses.replace(plan, cp=1)) == (0, 0)


def test_ring_hides_behind_attention_inside_a_node():
    """At 32k tokens the K/V all-gather takes less than one attention step: nothing of it is
    exposed in forward, and the hidden time is the whole gather (`costs.gather_time`)."""
    args = _args("btp")
    plan = TrainingLayout("btp", tp=4, cp=2, seq_len=32768)
    attention = block.attention_flops(args, plan)
    attn_fwd = costs.attention_time(attention, plan.dtype, H100)
    attn_bwd = costs.attention_time(attention, plan.dtype, H100, backward=True)
    (exposed, hidden), _ = timing.ring_times(args, plan, H100, attn_fwd, attn_bwd)
    gather_bytes = block.ring_bytes(args, plan)[0] // (plan.cp - 1)
    assert exposed == 0.0
    assert hidden == pytest.approx(costs.gather_time(gather_bytes, 2, H100, in_node=True))


@pytest.mark.parametrize("strategy", ["btp", "vanilla"])
def test_lowrank_ac_under_cp_replays_no_ring(strategy):
    """Low-rank AC under CP keeps the ring attention's output (as the runtime's policy
    does), so its backward replays neither the attention nor the K/V all-gather: the same
    attention and communication seconds as without AC, and no attention FLOPs recomputed;
    full AC replays both."""
    args = _args(strategy)
    base = TrainingLayout(strategy, tp=4, cp=2, seq_len=32768)
    _, none = timing.block_phases(args, base, H100)
    _, lowrank = timing.block_phases(args, dataclasses.replace(base, ac="lowrank"), H100)
    _, full = timing.block_phases(args, dataclasses.replace(base, ac="full"), H100)
    replayed_b = sum(g.flops for g in block.layer_gemms(args, base) if g.name.endswith(".B"))
    lowrank_plan = dataclasses.replace(base, ac="lowrank")
    assert block.recompute_flops(args, lowrank_plan) == replayed_b
    assert lowrank["attention"] == none["attention"] < full["attention"]
    if strategy == "btp":  # (vanilla's low-rank AC replays its own TP all-reduces)
        assert lowrank["comm"] == pytest.approx(none["comm"])
    # full AC replays the forward's communication, the ring's exposed all-gather included
    # (exposed when the CP pair spans two nodes, tp 8 x cp 2, at 8192 tokens)
    across = dataclasses.replace(base, tp=8, seq_len=8192)
    forward, none = timing.block_phases(args, across, H100)
    _, full = timing.block_phases(args, dataclasses.replace(across, ac="full"), H100)
    attention = block.attention_flops(args, across)
    attn = [costs.attention_time(attention, "bf16", H100, backward=b) for b in (False, True)]
    ring_fwd = timing.ring_times(args, across, H100, *attn)[0][0]
    assert 0 < ring_fwd < forward["comm"]
    assert full["comm"] - none["comm"] == pytest.approx(forward["comm"])


def test_ring_across_nodes_costs_the_network():
    """The same ring, once inside a node (tp 4 x cp 2) and once across (tp 8 x cp 2, which
    puts the CP pair on two nodes): with no attention to hide behind, the network's is the
    slower by the NIC's rate."""
    args = _args("btp")
    inside = TrainingLayout("btp", tp=4, cp=2, seq_len=32768)
    across = dataclasses.replace(inside, tp=8)
    in_node = timing.ring_times(args, inside, H100, 0.0, 0.0)[0][0]
    net = timing.ring_times(args, across, H100, 0.0, 0.0)[0][0]
    gather = block.ring_bytes(args, across)[0]
    assert in_node == costs.gather_time(2 * gather, 2, H100, in_node=True)
    assert net == costs.gather_time(gather, 2, H100, in_node=False) > gather / H100.net_bw


def test_attention_share_rises_and_btp_gain_falls_with_sequence_length():
    """Attention's share of a block's FLOPs grows with the sequence (quadratic against the
    linears' linear), more so under BTP whose linears are low-rank; so BTP's predicted gain
    over full rank (megatron, same TP x CP layout) shrinks from 32k to 128k tokens. Each CP
    rank's queries meet the whole sequence's keys: 1/cp of the whole attention each."""
    shares, gains = {}, []
    for seq in (4096, 32768, 131072):
        step = {}
        for strategy in ("megatron", "btp"):
            args = layout.trained_shape("7B", "cola", strategy)
            plan = TrainingLayout(strategy, tp=4, cp=2, seq_len=seq, compiled=True)
            attention = block.attention_flops(args, plan)
            whole = block.attention_flops(args, dataclasses.replace(plan, cp=1))
            assert attention * plan.cp == whole  # load balanced: 1/cp of the work each
            shares.setdefault(strategy, []).append(attention / block.layer_flops(args, plan))
            step[strategy] = timing.step_time(args, plan, H100)["step"]
        gains.append(step["megatron"] / step["btp"])
    for strategy, share in shares.items():
        assert share[0] < share[1] < share[2] and share[2] > 0.5, (strategy, share)
    assert all(b > m for b, m in zip(shares["btp"], shares["megatron"], strict=True))
    assert gains[1] > gains[2] > 1.0, gains


def test_planner_picks_cp_where_tp_and_pp_do_not_fit(monkeypatch):
    """7B at 131,072 tokens on 8 H100s given 18 GiB each: no TP x PP layout fits (the
    smallest, TP8 with full recomputation, keeps the whole sequence's loss temporaries and
    activations), CP layouts do, and every ranked layout uses CP; without CP the request
    fails in one line. At 4096 tokens the planner considers no CP (`MIN_CP_TOKENS`)."""
    req = layout_search.Request("7B", "cola", 8, "h100", 18.0, 131072, 4)
    result = layout_search.plan_layouts(req)
    assert result.ranked and all(lay.plan.cp > 1 for lay in result.ranked)
    assert all(lay.plan.pp == 1 for lay in result.ranked)
    monkeypatch.setattr(layout_search, "MIN_CP_TOKENS", 131072 + 1)
    with pytest.raises(ConfigError, match="fits no layout on 8 x 18 GiB"):
        layout_search.plan_layouts(req)
    monkeypatch.undo()
    short = layout_search.Request("7B", "cola", 8, "h100", 80.0, 4096, 32)
    assert all(lay.plan.cp == 1 for lay in layout_search.plan_layouts(short).ranked)


@pytest.fixture(scope="module")
def real_data(tmp_path_factory) -> list[str]:
    from tests.helpers.corpus import real_data_args

    return real_data_args(tmp_path_factory.mktemp("real-data"))


@pytest.mark.parametrize("seq", [32768, 131072])
def test_planned_cp_config_passes_check_and_prices_the_same(seq, real_data, tmp_path, capsys):
    """`plan --auto --flavor 7B --gpus 8 --gpu h100 --seq-len S --write-toml`: the winner
    uses CP, its TOML raises `[boost] max_seq_len` to S and sets the CP degree, `check
    --nproc 8` passes it, and `bench model --config` reads back the very plan priced."""
    from boost_titan.perf.job_plan import job_plan
    from boost_titan.plan import main
    from tests.helpers.commands import check

    path = tmp_path / "auto.toml"
    argv = ["--auto", "--flavor", "7B", "--gpus", "8", "--gpu", "h100", "--seq-len", str(seq)]
    assert main([*argv, "--write-toml", str(path)]) == 0
    capsys.readouterr()
    config = tomllib.loads(path.read_text())
    best = layout_search.plan_layouts(layout_search.Request("7B", "cola", 8, "h100", 80.0, seq, 4))
    winner = best.ranked[0].plan
    assert winner.cp > 1 and config["parallelism"]["context_parallel_degree"] == winner.cp
    assert config["boost"]["max_seq_len"] == seq
    summary = check(
        ["--nproc", "8", "--job.config_file", str(path), *real_data]
        + ["--job.dump_folder", str(tmp_path / "out")]
    )
    assert summary.startswith("config ok:") and f"cp {winner.cp}" in summary, summary
    assert job_plan(str(path), 8).plan == winner


def _debug_model(*flags: str):
    """The debug flavor's model and args as a job with `flags` builds them (CPU)."""
    import torch

    from boost_titan.boost_llama.model import BoostTransformer
    from boost_titan.boost_llama.spec import job_args
    from boost_titan.config.cli import parse_job_config

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *flags])
    args = job_args(job)
    torch.manual_seed(0)
    model = BoostTransformer(args)
    model.init_weights()
    return model, args


def test_sequences_past_the_flavors_maximum():
    """The debug flavor stops at 2048 tokens: --training.seq_len 2304 is refused in one line
    naming `--boost.max_seq_len`; with it raised the RoPE table has 2304 rows, the model runs
    2304 tokens, and on the first 1024 it computes what the flavor's own model computes with
    the same weights (causal: the longer table changes no earlier position)."""
    import torch

    from tests.helpers.distributed import randomize

    with pytest.raises(ConfigError, match="raise --boost.max_seq_len to 2304"):
        _debug_model("--training.seq_len", "2304")
    with pytest.raises(ConfigError, match="max_seq_len -1 is negative"):
        _debug_model("--boost.max_seq_len", "-1")
    long, args = _debug_model("--training.seq_len", "2304", "--boost.max_seq_len", "2304")
    short, short_args = _debug_model()
    assert (args.max_seq_len, short_args.max_seq_len) == (2304, 2048)
    assert long.rope.shape[0] == 2304 and short.rope.shape[0] == 2048
    randomize(long)
    short.load_state_dict(long.state_dict())
    tokens = torch.randint(0, args.vocab_size, (1, 2304))
    with torch.no_grad():
        out = long(tokens)
        assert out.shape == (1, 2304, args.vocab_size) and torch.isfinite(out).all()
        torch.testing.assert_close(out[:, :1024], short(tokens[:, :1024]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cp", "3"], "seq_len 4096 is not divisible by 2 x cp 3"),
        (["--cp", "0"], "cp 0 must be >= 1"),
        (["--config", "train_configs/7B_32k.toml", "--cp", "4"], "--cp is set by --config"),
    ],
)
def test_bench_model_cp_bad_input_is_one_line(argv, message, capsys):
    """`bench model --cp`: a degree that cannot split the sequence into 2 x cp chunks, or
    one the --config TOML sets, is one `error:` line."""
    from boost_titan.bench.__main__ import main

    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_bench_model_prices_cp():
    """`bench model --cp 2` at 32k tokens: the records carry cp and the ring's bytes, and
    per rank the model halves the tokens: half the forward FLOPs of attention and GEMMs."""
    from boost_titan.perf import predict

    kw = dict(flavors=["7B"], arch="cola", strategies=["btp"], tps=[4], gpus=["h100"])
    one, two = (predict.sweep(**kw, seq_len=32768, cp=cp)[0] for cp in (1, 2))
    assert (one.cp, two.cp) == (1, 2) and one.ring_bytes_per_layer_fwd == 0
    assert two.ring_bytes_per_layer_fwd == 32768 * 2 * 1024 * 2 // 2
    assert two.flops_per_layer * 2 == one.flops_per_layer


@pytest.mark.parametrize("tp", [1, 2])
def test_gqa_block_keeps_unrepeated_kv_as_measured(tp):
    """A GQA block (8 heads, 2 K/V heads) in bf16 keeps K and V un-repeated (SDPA's
    enable_gqa, as CUDA's flash attention and CPU's kernel take them): the model's bytes
    equal `measure_layer`'s on the real block, without TP and under BTP TP2."""
    import torch

    from boost_titan.bench.measure.activations import measure_layer
    from boost_titan.boost_llama import flavor_args

    shape = dataclasses.replace(layout.trained_shape("debug", "cola", "btp"), n_kv_heads=2)
    layer = measure_layer(
        flavor_args("debug", arch="cola", n_kv_heads=2), "none", seq_len=256, tp=tp
    )
    plan = TrainingLayout("btp", tp=tp, seq_len=256, dtype="bf16")
    assert layer.saved_bytes == activations.activation_bytes(shape, plan)
    assert activations.kv_repeated(shape, plan) is False
    assert torch.bfloat16.itemsize == plan.dtype_bytes
