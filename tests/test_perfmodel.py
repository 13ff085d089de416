"""Analytic performance model: hand-computed small cases, the paper's 7B payloads, the CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest

from boost_titan.bench import perfmodel as pm
from boost_titan.bench.__main__ import main
from boost_titan.bench.records import PerfRecord
from boost_titan.boost_llama.shapes import ModelShape, param_count
from boost_titan.config.errors import ConfigError

# d=8, r=2, d_ff=16, 2 heads of 4; one micro-batch of T = 3 tokens (seq 3), bf16, TP2.
TINY = ModelShape(dim=8, n_layers=2, n_heads=2, ffn_dim=16, rank=2, vocab_size=10, arch="cola")
TINY_FULL = dataclasses.replace(TINY, arch="fullrank")
BYTES_PER_ELEMENT = 3 * 2  # tokens * bf16


def plan(strategy: str, **kw) -> pm.Plan:
    return pm.Plan(strategy=strategy, **{"tp": 2, "seq_len": 3, **kw})


def args_for(strategy: str) -> ModelShape:
    return TINY_FULL if strategy == "megatron" else TINY


def sizes(collectives: list[pm.Collective]) -> list[tuple[str, int]]:
    return [(c.name, c.elements_per_token) for c in collectives]


def test_tiny_collectives_grouped_online():
    fwd, bwd = pm.layer_collectives(TINY, plan("btp"))
    assert sizes(fwd) == [("qkv.A", 7), ("o.A", 2), ("gate_up.A", 5), ("down.A", 2)]  # 3r+1, r, 2r+1, r
    assert sizes(bwd) == [("down.B", 2), ("gate_up.B", 4), ("o.B", 2), ("qkv.B", 6)]
    assert [c.bytes(3, 2) for c in fwd] == [42, 12, 30, 12]
    assert {c.kind for c in fwd + bwd} == {"all_reduce"}

    fwd, bwd = pm.layer_collectives(TINY, plan("vanilla"))
    assert [n for _, n in sizes(fwd)] == [8, 8, 8, 8, 16, 16, 8]  # q k v o gate up down at d_out
    assert sizes(bwd) == [("down.A", 16), ("gate_up.A", 8), ("o.A", 8), ("qkv.A", 8)]
    assert sum(c.bytes(3, 2) for c in fwd) == 72 * BYTES_PER_ELEMENT

    fwd, bwd = pm.layer_collectives(TINY_FULL, plan("megatron"))
    assert sizes(fwd) == [("o", 8), ("down", 8)]
    assert sizes(bwd) == [("gate_up", 8), ("qkv", 8)]


def test_tiny_collectives_sync_and_ungrouped():
    fwd, bwd = pm.layer_collectives(TINY, plan("btp", rmsnorm="sync"))
    assert [n for _, n in sizes(fwd)] == [1, 6, 2, 1, 4, 2]
    assert sorted(n for _, n in sizes(bwd)) == [1, 1, 2, 2, 4, 6]
    fwd, bwd = pm.layer_collectives(TINY, plan("btp", group_linears=False))
    assert [n for _, n in sizes(fwd)] == [3, 2, 2, 2, 3, 2, 2]  # statistic rides on q and gate
    assert [n for _, n in sizes(bwd)] == [2] * 7
    fwd, bwd = pm.layer_collectives(TINY, plan("btp", group_linears=False, rmsnorm="sync"))
    assert (len(fwd), len(bwd)) == (9, 9)
    _, bwd = pm.layer_collectives(TINY, plan("vanilla", group_linears=False))
    assert sizes(bwd) == [("down.A", 16), ("gate_up.A", 8), ("o.A", 8), ("qkv.A", 8)]  # per input
    assert pm.layer_collectives(TINY, plan("btp", tp=1)) == ([], [])


def test_tiny_step_collectives():
    fwd, bwd = pm.step_collectives(TINY, plan("btp"))
    assert [(c.kind, c.elements_per_token) for c in fwd] == [
        ("all_reduce", 1), ("all_gather", 4), ("all_reduce", 1), ("all_reduce", 1), ("all_reduce", 1)]
    assert [(c.kind, c.elements_per_token) for c in bwd] == [("reduce_scatter", 8), ("all_reduce", 1)]
    fwd, bwd = pm.step_collectives(TINY_FULL, plan("megatron"))
    assert [c.elements_per_token for c in fwd] == [1, 1, 1]
    assert sizes(bwd) == [("lm_head", 8)]


def test_tiny_flops_and_gemms():
    # low-rank GEMMs: 2T * sum r(d_in + d_out) / tp = 6 * 272 / 2; attention 4*T*seq*d/tp = 144
    assert pm.layer_flops(TINY, plan("btp")) == 816 + 144
    assert pm.layer_flops(TINY, plan("vanilla")) == 816 + 288  # attention replicated
    assert pm.layer_flops(TINY_FULL, plan("megatron")) == 6 * 640 // 2 + 144
    btp = {g.name: (g.m, g.n, g.k) for g in pm.layer_gemms(TINY, plan("btp"))}
    assert btp["qkv.A"] == (3, 6, 4) and btp["q.B"] == (3, 4, 2) and btp["down.A"] == (3, 2, 8)
    vanilla = {g.name: (g.m, g.n, g.k) for g in pm.layer_gemms(TINY, plan("vanilla"))}
    assert vanilla["qkv.A"] == (3, 3, 8) and vanilla["q.B"] == (3, 8, 1) and vanilla["down.A"] == (3, 1, 16)
    dx, dw = pm.Gemm("x", 3, 4, 2).backward()
    assert (dx.m, dx.n, dx.k, dw.m, dw.n, dw.k) == (3, 2, 4, 2, 4, 3)
    assert pm.Gemm("x", 2, 2, 2).intensity(2) == 16 / 24
    assert pm.recompute_flops(TINY, plan("btp", ac="full")) == 960
    # lowrank recomputes the B GEMMs (2T r sum(d_out) / tp) and attention
    assert pm.recompute_flops(TINY, plan("btp", ac="lowrank")) == 6 * 2 * 72 // 2 + 144


def test_tiny_memory():
    assert pm.layer_params(TINY, plan("btp")) == 136 + 8  # r(d_in+d_out)/tp + sharded norms
    assert pm.layer_params(TINY, plan("vanilla")) == 136 + 16
    assert pm.layer_params(TINY_FULL, plan("megatron")) == 320 + 16
    for strategy in pm.STRATEGIES:
        args = args_for(strategy)
        assert pm.params_per_rank(args, plan(strategy, tp=1)) == param_count(args)
    expected = {("btp", "none"): 84, ("vanilla", "none"): 126, ("megatron", "none"): 80,
                ("btp", "full"): 4, ("btp", "selective"): 44, ("btp", "lowrank"): 22}
    for (strategy, ac), elements in expected.items():
        assert pm.activation_elements_per_token(args_for(strategy), plan(strategy, ac=ac)) == elements
    mem = pm.memory_per_rank(TINY, plan("btp"))
    assert mem["activations"] == 2 * 84 * BYTES_PER_ELEMENT
    assert mem["optimizer"] == 6 * mem["params"]


def test_paper_7b_forward_payloads():
    p = pm.Plan(strategy="btp", tp=4, seq_len=4096, micro_batch=4)
    gib = {}
    for strategy in pm.STRATEGIES:
        args = pm.model_args("7B", "cola", strategy)
        fwd, _ = pm.layer_collectives(args, dataclasses.replace(p, strategy=strategy))
        gib[strategy] = sum(c.bytes(p.tokens, 2) for c in fwd) / 2**30
    assert gib["megatron"] == 0.25
    assert gib["vanilla"] == pytest.approx(1.30, abs=0.005)
    assert gib["btp"] == pytest.approx(0.22, abs=0.005)


def test_btp_keeps_gemm_intensity():
    p = pm.Plan(strategy="btp", tp=4)
    btp = pm.layer_gemms(pm.model_args("7B", "cola", "btp"), p)
    vanilla_plan = dataclasses.replace(p, strategy="vanilla")
    vanilla = pm.layer_gemms(pm.model_args("7B", "cola", "vanilla"), vanilla_plan)
    assert min(g.intensity(2) for g in btp) > min(g.intensity(2) for g in vanilla)


def test_check_rejects():
    with pytest.raises(ConfigError):
        pm.check(TINY_FULL, plan("btp"))
    with pytest.raises(ConfigError):
        pm.check(TINY, plan("btp", tp=3))
    with pytest.raises(ConfigError):
        pm.check(TINY_FULL, plan("megatron", ac="lowrank"))
    with pytest.raises(ConfigError):
        pm.check(dataclasses.replace(TINY, arch="lax"), plan("btp"))


def test_record_fields_and_speedups():
    records = pm.sweep(["1B"], "cola", list(pm.STRATEGIES), [2], ["a100", "h100"])
    fields = {f.name for f in dataclasses.fields(PerfRecord)}
    required = {
        "flavor", "arch", "strategy", "tp", "pp", "seq_len", "micro_batch", "dtype",
        "collectives_per_layer_fwd", "collectives_per_layer_bwd", "comm_bytes_per_layer_fwd",
        "comm_bytes_per_layer_bwd", "flops_per_layer", "activation_bytes_per_layer",
        "params_per_rank", "predicted_step_s", "predicted_speedup", "collectives_fwd", "collectives_bwd",
    }
    assert required <= fields
    by = {r.strategy: r for r in records}
    assert by["megatron"].arch == "fullrank" and by["btp"].arch == "cola"
    assert set(by["btp"].predicted_step_s) == {"a100", "h100"}
    assert by["btp"].predicted_speedup["megatron"] == pytest.approx(
        by["megatron"].predicted_step_s["a100"] / by["btp"].predicted_step_s["a100"])
    entry = by["btp"].collectives_fwd[0]
    assert set(entry) == {"kind", "name", "elements_per_token", "bytes"}
    assert sum(c["bytes"] for c in by["btp"].collectives_fwd) == by["btp"].comm_bytes_per_layer_fwd
    for parts, step in zip(by["btp"].time_breakdown_s.values(), by["btp"].predicted_step_s.values()):
        assert sum(parts.values()) == pytest.approx(step)


def test_validation_rows():
    rows = pm.validation_rows("a100")
    assert [(r.flavor, r.tp, r.pp) for r in rows] == list(pm.PAPER_ITERATION_S)
    assert rows[2].paper_speedup["btp_vs_vanilla"] == pytest.approx(1.64 / 0.72)
    assert set(rows[0].to_json()["predicted_speedup"]) == {"btp_vs_megatron", "btp_vs_vanilla"}


def test_cli_json(capsys):
    argv = ["model", "--flavor", "7B", "--strategy", "megatron,vanilla,btp", "--tp", "4",
            "--micro-batch", "4", "--json", "-"]
    assert main(argv) == 0
    records = json.loads(capsys.readouterr().out)
    assert isinstance(records, list) and len(records) == 3
    assert {r["strategy"] for r in records} == set(pm.STRATEGIES)
    assert records[0]["comm_bytes_per_layer_fwd"] == 2**28


def test_cli_table_validate_plot_and_errors(capsys, tmp_path):
    assert main(["model", "--flavor", "1B,7B", "--tp", "2,4", "--gpu", "a100"]) == 0
    assert "btp" in capsys.readouterr().out
    assert main(["validate"]) == 0
    assert "13B TP4xPP2" in capsys.readouterr().out
    out = tmp_path / "perf.png"
    assert main(["plot", "--out", str(out), "--flavor", "1B,7B"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["model", "--flavor", "7B", "--tp", "3"]) == 2
    assert "not divisible by tp 3" in capsys.readouterr().err


def test_cli_dtype_takes_torchtitans_spelling(capsys):
    """--dtype float32 / bfloat16 (TorchTitan's names) are fp32 / bf16; others are refused."""
    runs = {}
    for dtype in ("fp32", "float32", "bf16", "bfloat16"):
        assert main(["model", "--flavor", "1B", "--dtype", dtype, "--json", "-"]) == 0
        runs[dtype] = json.loads(capsys.readouterr().out)
    assert runs["float32"] == runs["fp32"] != runs["bf16"] == runs["bfloat16"]
    assert {r["dtype"] for r in runs["bfloat16"]} == {"bf16"}
    with pytest.raises(SystemExit):
        main(["model", "--dtype", "float16"])
    assert "'float16' is not one of bf16, fp32, bfloat16, float32" in capsys.readouterr().err
