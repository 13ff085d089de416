"""Print the flavor table: shapes and parameter counts, full-rank vs low-rank.

python -m boost_titan.boost_llama
"""

from .shapes import FLAVORS, flavor_shape, param_count


def main() -> None:
    print(
        "| flavor | layers | heads | d | d_ff | r | full-rank params | CoLA/SVD params | ratio "
        "| LaX params |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in FLAVORS:
        vocab = FLAVORS[name].vocab_size or 4096  # debug: the default tokenizer's vocab
        full = param_count(flavor_shape(name, arch="fullrank", vocab_size=vocab))
        low = flavor_shape(name, arch="cola", vocab_size=vocab)
        lax = param_count(flavor_shape(name, arch="lax", vocab_size=vocab))
        print(
            f"| {name} | {low.n_layers} | {low.n_heads} | {low.dim} | {low.ffn_dim} "
            f"| {low.effective_rank} | {full / 1e6:,.1f}M | {param_count(low) / 1e6:,.1f}M "
            f"| {param_count(low) / full:.2f} | {lax / 1e6:,.1f}M |"
        )


if __name__ == "__main__":
    main()
