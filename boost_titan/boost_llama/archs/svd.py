"""SVD-style low-rank projections: ``y = B(A x)``, nothing between the factors."""

from .base import Architecture

ARCH = Architecture("svd", "low-rank pairs B(A x), no activation")
