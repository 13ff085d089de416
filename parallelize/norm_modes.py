"""How a sharded norm group finds its RMS statistic: `online` (partial sums of squares ride
in the TP all-reduce; BOOST's online RMSNorm) or `sync` (a separate all-reduce of them).
Torch-free, so a product's option lists can name the modes without importing the library."""

RMSNORM_MODES = ("online", "sync")

__all__ = ["RMSNORM_MODES"]
