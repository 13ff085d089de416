"""Bottleneck-aware TP on a Hugging Face Llama: convert, shard, train, save, reload.

    torchrun --nproc_per_node=2 -m boost_titan.examples.hf_llama     # CPU (gloo) or GPUs

A tiny `LlamaForCausalLM` is built from a config (nothing is downloaded; a pretrained
checkpoint works the same: ``LlamaForCausalLM.from_pretrained(folder,
tie_word_embeddings=False)``). `to_low_rank` turns q, k, v, o, gate, up and down into CoLA
pairs (SiLU between down and up) initialised from each weight's truncated SVD;
`hf_layout` reads the layout from the model and its config; `apply_plan` shards it with
BTP and (``verify=True``) compares one step with an unsharded copy. A few AdamW steps use
HF's own loss (``labels=``), which reads gathered logits: the plan is built with
``loss_parallel=False``. `save_hf` writes a Hugging Face folder once (rank 0), and rank 0
reloads it on one process (`load_hf`: from_pretrained plus the pairs) and compares its
logits with the sharded model's. Exits non-zero if they differ.
"""

from __future__ import annotations

import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from boost_titan.config.cli import require_package
from boost_titan.examples import HF_EXTRA, start_process_group
from boost_titan.parallelize import (
    apply_plan,
    btp_plan,
    hf_layout,
    load_hf,
    save_hf,
    to_low_rank,
)
from boost_titan.processes.teardown import run_to_end

RANK, STEPS, TOLERANCE = 16, 5, 1e-5


def tiny_llama():
    """A 4-layer Llama with GQA (8 heads, 4 kv heads of 16), random weights, untied head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def main(steps: int = STEPS, folder: str | None = None) -> dict:
    """Convert, shard, train `steps` steps, save to `folder` (default: a new temporary
    folder) and reload on rank 0; returns the losses and the reloaded logits' error."""
    require_package("transformers", HF_EXTRA)
    device, rank, world = start_process_group()
    torch.manual_seed(0)  # the same weights on every rank
    model = tiny_llama().to(device)
    to_low_rank(model, RANK, layout=hf_layout(model), init="svd", activation="silu")
    apply_plan(
        model,
        init_device_mesh(device, (world,)),
        btp_plan(hf_layout(model), loss_parallel=False),
        verify=True,
    )
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (8, 33), generator=generator).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        batch = data[2 * (step % 4) : 2 * (step % 4) + 2]
        loss = model(batch, labels=batch).loss  # HF shifts the labels itself
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    with torch.no_grad():
        sharded = model(data[:2]).logits.cpu()
    if folder is None:
        folder = tempfile.mkdtemp(prefix="hf_llama_") if rank == 0 else ""
    save_hf(model, folder)
    error = [0.0]
    if rank == 0:
        with torch.no_grad():
            reloaded = load_hf(folder)(data[:2].cpu()).logits
        error[0] = ((reloaded - sharded).abs().max() / sharded.abs().max()).item()
        print(f"TP={world}: verify passed; loss " + " ".join(f"{x:.3f}" for x in losses))
        print(f"saved to {folder}; reloaded on one process: logits max rel err {error[0]:.1e}")
    dist.broadcast_object_list(error, src=0)
    return {"losses": losses, "reload_error": error[0], "folder": folder}


if __name__ == "__main__":
    # the ranks meet, the process group ends, the process exits 0 (1 if the reload differs)
    run_to_end(lambda: int(main()["reload_error"] > TOLERANCE))
