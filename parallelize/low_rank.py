"""Turn a model's full-rank projections into low-rank down/up pairs, the shape BTP shards.

`to_low_rank(model, rank, layout=...)` replaces every nn.Linear projection the layout
names (q, k, v, o, gate, up, down of each block) with a `LowRankLinear`: ``up(act(down(x)))``
with ``act`` the identity (SVD-style) or SiLU (CoLA). ``init="svd"`` starts it from the
existing weight's truncated SVD ``W ~ U_r S_r V_r^T``, the singular values split evenly
between the factors (``up = U_r S_r^1/2``, ``down = S_r^1/2 V_r^T``; the bias goes to
``up``), so a pretrained checkpoint is where low-rank training starts: without an
activation the relative error of each weight is the tail of its singular values, and at
or above full rank the model is reproduced exactly.

``crossing=True`` makes LaX pairs: every block after the first also feeds the previous
block's latent of the same projection through ``cross`` (G, r x r) and a LayerNorm_r. A
model whose blocks call ``pair(x)`` (transformers') cannot pass that latent, so the pairs
of one projection share a `LatentRelay` that hands it from block to block within a forward.
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from .plans import ModelLayout
from .styles import PlanError

INITS = ("svd", "random")
ACTIVATIONS = (None, "silu")


class LatentRelay:
    """The latent one block's pair of a projection leaves for the next block's (LaX on a
    model that calls ``pair(x)``): blocks run in order, each pair reads then replaces it."""

    __slots__ = ("latent",)

    def __init__(self) -> None:
        self.latent: torch.Tensor | None = None


class LowRankLinear(nn.Module):
    """A projection of rank r: ``up(act(down(x)))``, two nn.Linear children.

    ``act`` is the identity (SVD-style) or SiLU (CoLA). With latent crossing (LaX) the
    latent also sees the same projection's latent ``h_prev`` from the previous block::

        h = act(LayerNorm_r(down(x) + cross(h_prev))),   y = up(h)

    `down` and `up` are children so plans address them by FQN (``...wq.down``); `act`
    (nn.SiLU, no parameter) exists only with an activation, `cross` and `latent_norm`
    only with crossing. Whatever runs between down and up is this module's own code, so
    BTP shards any pair without knowing its activation; `down_activation` lets a plan's
    norm group apply `act` once for all the pairs that read one norm.

    Args:
        in_features (int): input size.
        out_features (int): output size.
        rank (int): the latent size r.
        bias (bool): a bias on `up` (the pair's output). Default: False.
        activation (str | None): ``None`` or ``"silu"`` (CoLA) on the latent. Default: None.
        crossing (bool): LaX's latent crossing (`cross`, `latent_norm`). Default: False.
        device (torch.device | None): where the weights live. Default: None (torch's).
        dtype (torch.dtype | None): the weights' dtype. Default: None (torch's).

    Example::

        >>> import torch
        >>> from boost_titan.parallelize import LowRankLinear
        >>> pair = LowRankLinear(64, 96, 8, bias=True, activation="silu")
        >>> pair.down.weight.shape, pair.up.weight.shape, pair(torch.randn(2, 64)).shape
        (torch.Size([8, 64]), torch.Size([96, 8]), torch.Size([2, 96]))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        *,
        bias: bool = False,
        activation: str | None = None,
        crossing: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise PlanError(f"activation must be None or 'silu', got {activation!r}")
        kw = {"device": device, "dtype": dtype}
        self.down = nn.Linear(in_features, rank, bias=False, **kw)
        self.up = nn.Linear(rank, out_features, bias=bias, **kw)
        self.activation = activation
        self.act = nn.SiLU() if activation == "silu" else None
        self.cross = nn.Linear(rank, rank, bias=False, **kw) if crossing else None
        self.latent_norm = nn.LayerNorm(rank, **kw) if crossing else None
        self.relay: LatentRelay | None = None
        """Set by `to_low_rank(crossing=True)`: `forward` takes ``prev`` from it and leaves
        its latent there."""

    @property
    def out_features(self) -> int:
        return self.up.out_features

    def latent(self, z: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """The bottleneck activation h from the down-projection's output z."""
        if self.cross is not None:
            if prev is None:
                raise ValueError("a crossing projection needs the previous block's latent")
            z = self.latent_norm(z + self.cross(prev))
        return self.act(z) if self.act is not None else z

    @property
    def down_activation(self) -> nn.Module | None:
        """The activation module this pair applies straight to its down's output (none with
        crossing, whose LayerNorm comes first): a norm group may apply it once to the
        output it shares among its consumers (`groups`)."""
        return self.act if self.cross is None else None

    def project(
        self, x: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, h): the output and the latent (what the next block's crossing consumes)."""
        h = self.latent(self.down(x), prev)
        return self.up(h), h

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        if self.relay is None:
            return self.project(x, prev)[0]
        if self.cross is not None and prev is None:
            prev = self.relay.latent
        y, self.relay.latent = self.project(x, prev)
        return y

    @torch.no_grad()
    def init_weights(self) -> None:
        """CoLA's init: down, up ~ N(0, std^2), std = r^(-1/4) (d_in + d_out)^(-1/4); the
        crossing's G likewise over (r, r), its norm reset."""
        rank, d_in, d_out = self.down.out_features, self.down.in_features, self.up.out_features
        std = rank**-0.25 * (d_in + d_out) ** -0.25
        nn.init.normal_(self.down.weight, std=std)
        nn.init.normal_(self.up.weight, std=std)
        if self.cross is not None:
            nn.init.normal_(self.cross.weight, std=rank**-0.25 * (2 * rank) ** -0.25)
            self.latent_norm.reset_parameters()

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


@torch.no_grad()
def svd_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(up [out, r], down [r, in]) of the rank-r truncated SVD of `weight` [out, in], each
    holding the square root of the singular values: ``up @ down`` is the best rank-r
    approximation. Computed in float64, returned in the weight's dtype."""
    u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)
    root = s[:rank].sqrt()
    up, down = u[:, :rank] * root, root[:, None] * vh[:rank]
    return up.to(weight.dtype), down.to(weight.dtype)


def to_low_rank(
    model: nn.Module,
    rank: int,
    *,
    layout: ModelLayout,
    init: str = "svd",
    activation: str | None = None,
    crossing: bool = False,
) -> nn.Module:
    """Replace each nn.Linear projection `layout` names with a `LowRankLinear`, in place.

    A projection whose smaller side is at most `rank` keeps its full rank (min(d_in,
    d_out)). The model's ``config`` (if any) records ``low_rank = {"rank", "activation",
    "crossing"}`` so that `load_hf` rebuilds the pairs. Convert before `apply_plan`; with
    `crossing`, shard with a layout of ``crossing=("cross", "latent_norm")``; BTP's groups
    never defer a relayed latent's grad (it also feeds the next block).

    Args:
        model (nn.Module): an unsharded model, e.g. a transformers causal LM.
        rank (int): the latent size r of every pair.
        layout (ModelLayout): names the projections, e.g. ``hf_layout(model)``.
        init (str): ``"svd"``: truncated SVD of the existing weight, singular values split
            evenly; ``"random"``: nn.Linear's own initialisation. Default: ``"svd"``.
        activation (str | None): ``None`` (SVD-style pair) or ``"silu"`` (CoLA).
            Default: None.
        crossing (bool): LaX: the pairs of every block after the first take the previous
            block's latent (module docstring); ``cross`` starts at zero (``init="svd"``:
            the pretrained pairs first, then LayerNorm_r) or as `LowRankLinear.init_weights`
            (``"random"``). Default: False.

    Returns:
        nn.Module: `model`, converted.

    Raises:
        PlanError: a rank below 1, an unknown `init` or `activation`, a layout that
            entry that matches no module, or a projection that is not an unsharded
            nn.Linear (already converted, or sharded).

    Example::

        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from boost_titan.parallelize import hf_layout, to_low_rank
        >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
        ...     num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2)
        >>> model = LlamaForCausalLM(config)
        >>> ids = torch.randint(0, 64, (1, 8))
        >>> before = model(ids).logits
        >>> model = to_low_rank(model, 64, layout=hf_layout(model))  # full rank: exact
        >>> model.model.layers[0].self_attn.k_proj
        LowRankLinear(
          activation=None
          (down): Linear(in_features=64, out_features=16, bias=False)
          (up): Linear(in_features=16, out_features=16, bias=False)
        )
        >>> torch.allclose(model(ids).logits, before, atol=1e-5)
        True
    """
    if init not in INITS:
        raise PlanError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    if activation not in ACTIVATIONS:
        raise PlanError(f"activation must be None or 'silu', got {activation!r}")
    if not isinstance(rank, int) or rank < 1:
        raise PlanError(f"rank must be an integer >= 1, got {rank!r}")
    modules = dict(model.named_modules())
    for projection in layout.projections():
        pattern = f"{layout.blocks}.{projection}"
        fqns = [n for n in modules if fnmatch.fnmatchcase(n, pattern)]
        if not fqns:
            raise PlanError(
                f"{pattern!r} matches no module of {type(model).__name__}; fix the layout"
            )
        relay = LatentRelay() if crossing else None
        for block, fqn in enumerate(fqns):
            linear = modules[fqn]
            if type(linear) is not nn.Linear or _is_dtensor(linear.weight):
                raise PlanError(
                    f"{fqn} is a {type(linear).__name__}, not an unsharded nn.Linear; "
                    "to_low_rank converts full-rank projections, before apply_plan"
                )
            pair = _pair(linear, rank, init, activation, crossing and block > 0)
            pair.relay = relay
            parent, _, child = fqn.rpartition(".")
            setattr(modules[parent], child, pair)
    config = getattr(model, "config", None)
    if config is not None:
        config.low_rank = {"rank": rank, "activation": activation, "crossing": crossing}
    return model


def _pair(
    linear: nn.Linear, rank: int, init: str, activation: str | None, crossing: bool
) -> LowRankLinear:
    weight = linear.weight
    r = min(rank, *weight.shape)
    pair = LowRankLinear(
        linear.in_features,
        linear.out_features,
        r,
        bias=linear.bias is not None,
        activation=activation,
        crossing=crossing,
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        if init == "svd":
            up, down = svd_factors(weight, r)
            pair.up.weight.copy_(up)
            pair.down.weight.copy_(down)
            if linear.bias is not None:
                pair.up.bias.copy_(linear.bias)
        if crossing and init == "svd":
            pair.cross.weight.zero_()
        elif crossing and not weight.is_meta:
            nn.init.normal_(pair.cross.weight, std=r**-0.25 * (2 * r) ** -0.25)
    return pair


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)
