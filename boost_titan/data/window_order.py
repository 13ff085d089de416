"""Which window of a prepared source its k-th read is: shuffled and seeded, per epoch.

A source of n windows is read in epochs of n reads; read k is epoch k // n, and in epoch e
the i-th read (i = k mod n) is window `Permutation(n, key(seed, source, e))(i)`. Every
window is read once per epoch, each epoch in a new order, each source in its own, and the
order is a pure function of (seed, source index, k): any read is found without the ones
before it, so data-parallel ranks read only their windows and a resume needs no more state
than the reads done (`boost_titan.data.mix`).

The permutation is a Feistel network over the smallest even-bit domain 2^2h >= n with
cycle-walking (a value >= n is permuted again until it falls in [0, n)): a bijection of
[0, n) in O(1) memory and time per window (the domain is under 4n, so under 4 walks
expected), where a stored permutation of 1e9 windows would take 8 GB per rank and a block
shuffle keeps neighbouring windows together. The round function is the splitmix64
finalizer of the round key xor the half; `ROUNDS` rounds (Luby-Rackoff: 4 make a strong
pseudo-random permutation). The cost of any shuffle over shards: reads land anywhere in
the corpus (one random read of a window each, on SSD or the page cache a few microseconds).
"""

from __future__ import annotations

import hashlib

MASK64 = (1 << 64) - 1
ROUNDS = 4


def mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints that spreads every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def epoch_key(seed: int, source: int, epoch: int) -> int:
    """The 64-bit key of one source's one epoch."""
    digest = hashlib.blake2b(f"{seed}:{source}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Permutation:
    """A seeded bijection of [0, n) (see the module doc)."""

    def __init__(self, n: int, key: int) -> None:
        self.n = n
        self.half = max(1, ((n - 1).bit_length() + 1) // 2)
        self.mask = (1 << self.half) - 1
        self.keys = [mix64((key + r * 0x9E3779B97F4A7C15) & MASK64) for r in range(ROUNDS)]

    def _feistel(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (mix64(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, i: int) -> int:
        x = self._feistel(i)
        while x >= self.n:  # cycle-walking: the cycle through i < n returns below n
            x = self._feistel(x)
        return x


class WindowOrder:
    """The windows of one source's reads: shuffled with `seed` (None: in input order)."""

    def __init__(self, windows: int, source: int, seed: int | None) -> None:
        self.windows, self.source, self.seed = windows, source, seed
        self._epoch: tuple[int, Permutation] | None = None

    def __call__(self, k: int) -> int:
        """The window of read `k` (k >= 0)."""
        epoch, i = divmod(k, self.windows)
        if self.seed is None:
            return i
        if self._epoch is None or self._epoch[0] != epoch:
            key = epoch_key(self.seed, self.source, epoch)
            self._epoch = (epoch, Permutation(self.windows, key))
        return self._epoch[1](i)
