"""The export format of `boost_llama`: a folder with `model.safetensors` (the model's
state dict: our FQNs, their saved dtype) and `config.json` (everything `ModelShape` needs
to rebuild the model). `python -m boost_titan.export` writes it; `state_dict_adapter`
loads it into the trainer. Importable without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boost_titan.config.errors import ConfigError

from .shapes import ModelShape

if TYPE_CHECKING:
    import torch

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FORMAT_VERSION = 1
MODEL_NAME = "boost_llama"


# ---- config.json ---------------------------------------------------------------------
def config_of(args: ModelShape, dtype: torch.dtype) -> dict[str, Any]:
    """The `config.json` of a model: everything ModelShape needs to rebuild it."""
    config: dict[str, Any] = {"model": MODEL_NAME, "format_version": FORMAT_VERSION}
    config["arch"] = args.arch
    if args.arch == "lax":
        config["lax_base"] = args.lax_base
    config.update(
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.kv_heads,
        ffn_dim=args.ffn_dim,
    )
    if args.low_rank:
        config["rank"] = args.effective_rank
    config.update(
        vocab_size=args.vocab_size,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_seq_len=args.max_seq_len,
        dtype=str(dtype).removeprefix("torch."),
    )
    return config


def args_of(config: dict[str, Any], source: str = CONFIG) -> ModelShape:
    """ModelShape from a `config.json` dict; ConfigError if it is not one of ours."""
    if config.get("model") != MODEL_NAME:
        raise ConfigError(
            f"{source} is not a {MODEL_NAME} export; export with python -m boost_titan.export"
        )
    for name in (
        "dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "ffn_dim",
        "rank",
        "vocab_size",
        "max_seq_len",
        "norm_eps",
        "rope_theta",
    ):
        value = config.get(name, 1)
        kind = float if name in ("norm_eps", "rope_theta") else int
        if isinstance(value, bool) or not isinstance(value, (int, kind)) or value <= 0:
            raise ConfigError(f"{source} has {name} {value!r}, not a positive number; export again")
    try:
        args = ModelShape(
            arch=config["arch"],
            lax_base=config.get("lax_base", "cola"),
            dim=config["dim"],
            n_layers=config["n_layers"],
            n_heads=config["n_heads"],
            n_kv_heads=config["n_kv_heads"],
            ffn_dim=config["ffn_dim"],
            rank=config.get("rank", 0),
            vocab_size=config["vocab_size"],
            norm_eps=config["norm_eps"],
            rope_theta=config["rope_theta"],
            max_seq_len=config["max_seq_len"],
        )
    except KeyError as e:
        raise ConfigError(f"{source} lacks {e.args[0]!r}; export the checkpoint again") from None
    args.validate()
    return args


def model_shapes(args: ModelShape) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the model's state dict (built on the meta device, no memory)."""
    import torch

    from .model import BoostTransformer

    with torch.device("meta"):
        model = BoostTransformer(args)
    return {key: tuple(t.shape) for key, t in model.state_dict().items()}


def first_shape_mismatch(
    expected: dict[str, tuple[int, ...]], stored: dict[str, tuple[int, ...]]
) -> str | None:
    """The first key (sorted) missing from one side or with another shape; None if equal."""
    return next(
        (k for k in sorted(expected.keys() | stored.keys()) if expected.get(k) != stored.get(k)),
        None,
    )
