"""Bottleneck-aware TP on a decoder written in plain PyTorch, knowing nothing of boost-titan.

    torchrun --nproc_per_node=2 -m boost_titan.examples.own_model     # CPU (gloo) or GPUs

The model below is ordinary code: its own names (`tok`, `blocks.N.ln1`, `attn.q_proj`,
`mlp.gate_proj`, `ln_f`, `lm_head`), `nn.RMSNorm`, grouped-query attention with RoPE, and
CoLA low-rank pairs (`down` / `up` nn.Linear children, SiLU in the pair's own forward).
What BTP needs from it is said in one `ModelLayout`; `apply_plan` checks the layout,
shards the model and (with `verify=True`) compares one step with an unsharded copy. Rank 0
prints the plan, the all-reduces per block and the loss of a few AdamW steps.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

from boost_titan.examples import start_process_group
from boost_titan.parallelize import ModelLayout, apply_plan, btp_plan, plan_table
from boost_titan.processes.teardown import run_to_end

VOCAB, DIM, HEADS, KV_HEADS, FFN, RANK, LAYERS = 256, 128, 8, 4, 352, 32, 4
HEAD_DIM = DIM // HEADS


# ---- an ordinary model --------------------------------------------------------------------
class LowRank(nn.Module):
    """CoLA: y = up(silu(down(x)))."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, RANK, bias=False)
        self.up = nn.Linear(RANK, d_out, bias=False)

    def forward(self, x):
        return self.up(F.silu(self.down(x)))


def rope(x, angles):
    """Rotate interleaved pairs of x [batch, seq, heads, head_dim]."""
    pairs = x.unflatten(-1, (-1, 2))
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = LowRank(DIM, HEADS * HEAD_DIM)
        self.k_proj = LowRank(DIM, KV_HEADS * HEAD_DIM)
        self.v_proj = LowRank(DIM, KV_HEADS * HEAD_DIM)
        self.o_proj = LowRank(HEADS * HEAD_DIM, DIM)

    def forward(self, h, angles):
        b, s, _ = h.shape
        # the head count comes from the tensor (-1): under TP each rank holds a share
        q = rope(self.q_proj(h).view(b, s, -1, HEAD_DIM), angles).transpose(1, 2)
        k = rope(self.k_proj(h).view(b, s, -1, HEAD_DIM), angles).transpose(1, 2)
        v = self.v_proj(h).view(b, s, -1, HEAD_DIM).transpose(1, 2)
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = LowRank(DIM, FFN), LowRank(DIM, FFN)
        self.down_proj = LowRank(FFN, DIM)

    def forward(self, h):
        return self.down_proj(self.gate_proj(h) * self.up_proj(h))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.RMSNorm(DIM, eps=1e-5), Attention()
        self.ln2, self.mlp = nn.RMSNorm(DIM, eps=1e-5), MLP()

    def forward(self, x, angles):
        h = self.ln1(x)
        x = x + self.attn(h, angles)
        h = self.ln2(x)
        return x + self.mlp(h)


class Decoder(nn.Module):
    def __init__(self, max_seq: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.RMSNorm(DIM, eps=1e-5)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
        self.register_buffer("angles", angles, persistent=False)

    def forward(self, tokens, positions=None):
        """`positions` [s]: each token's place in its sequence (default 0..s-1)."""
        angles = self.angles[: tokens.shape[1]] if positions is None else self.angles[positions]
        x = self.tok(tokens)
        for block in self.blocks:
            x = block(x, angles)
        return self.lm_head(self.ln_f(x))


# ---- what BTP needs to know about it ----------------------------------------------------
LAYOUT = ModelLayout(
    blocks="blocks.*",
    shared_inputs={  # each pre-norm -> every module that reads its output
        "ln1": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
        "ln2": ("mlp.gate_proj", "mlp.up_proj"),
    },
    own_inputs=("attn.o_proj", "mlp.down_proj"),
    embedding="tok",
    final_norm="ln_f",
    head="lm_head",
    head_dim=HEAD_DIM,  # checks that heads and kv heads split over the TP degree
    qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    attention_out=("attn.o_proj",),
    attention=("attn",),  # context parallelism: the modules that call SDPA
)


def all_reduces_per_block(model: nn.Module, tokens: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) all-reduces of one block: a model step minus its non-block part."""
    counts = []
    for blocks in (model.blocks, model.blocks[:1]):
        saved, model.blocks = model.blocks, blocks
        with CommDebugMode() as comm, warnings.catch_warnings():
            # CommDebugMode's module hooks warn about the token input, which needs no grad
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            logits = model(tokens)
            forward = comm.get_total_counts()
            logits.float().square().mean().backward()
            counts.append((forward, comm.get_total_counts() - forward))
        model.blocks = saved
    model.zero_grad(set_to_none=True)
    (f_all, b_all), (f_one, b_one) = counts
    return (f_all - f_one) // (LAYERS - 1), (b_all - b_one) // (LAYERS - 1)


def main(steps: int = 10) -> dict:
    device, rank, world = start_process_group()
    torch.manual_seed(0)  # the same weights on every rank
    model = Decoder().to(device)
    mesh = init_device_mesh(device, (world,))
    plan = btp_plan(LAYOUT, loss_parallel=False)  # logits gathered on every rank
    if rank == 0:
        print(plan_table(model, plan, world))
    apply_plan(model, mesh, plan, verify=True)
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (8, 65), generator=generator).to(device)
    forward, backward = all_reduces_per_block(model, data[:2, :-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        batch = data[2 * (step % 4) : 2 * (step % 4) + 2]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if rank == 0:
        print(
            f"TP={world}: verify passed; all-reduces per block: {forward} forward, "
            f"{backward} backward"
        )
        print("loss: " + " ".join(f"{x:.3f}" for x in losses))
    return {"forward": forward, "backward": backward, "losses": losses}


if __name__ == "__main__":
    run_to_end(main)  # the ranks meet, the process group ends, the process exits 0
