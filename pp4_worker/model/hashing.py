"""Counter-based hashing shared by synthetic weights, synthetic states and Gumbel noise.

Every random number the worker uses is a pure function of integer counters, so it
does not depend on how a tensor is split over ranks, on launch geometry, on graph
replay or on the device's random generator state.

The mixer is a 32-bit "lowbias32"-style finaliser (xorshift, multiply, xorshift,
multiply, xorshift).  Values are 32-bit but held in int64: both multipliers are
below 2**31, so ``x * C`` stays below 2**63 and no signed overflow ever happens,
and right shifts of non-negative values are logical shifts.  The same code works
on Python ints (host-side keys) and on int64 tensors (device-side elements).
"""
from __future__ import annotations

import zlib

MASK32 = 0xFFFFFFFF
MUL_A = 0x7FEB352D
MUL_B = 0x1B873593

# Domain separators: the same counters in different uses must give unrelated streams.
DOMAIN_WEIGHTS = 0x243F6A88
DOMAIN_STATES = 0x85A308D3
DOMAIN_GUMBEL_VOCAB = 0x13198A2E
DOMAIN_GUMBEL_ROW = 0x03707344
DOMAIN_SECOND = 0x9E3779B9


def first_shift(x):
    """The mixer's first step.  It distributes over xor -- first_shift(a ^ b) ==
    first_shift(a) ^ first_shift(b) -- so it can be applied to two halves of a key
    separately (and precomputed for the static half)."""
    return x ^ (x >> 16)


def mix32_after_first_shift(x):
    x = (x * MUL_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL_B) & MASK32
    x = x ^ (x >> 16)
    return x


def mix32(x):
    """Bijective 32-bit mixer on a Python int or an int64 tensor holding [0, 2**32)."""
    return mix32_after_first_shift(first_shift(x))


def split64(value: int) -> tuple[int, int]:
    value &= (1 << 64) - 1
    return value & MASK32, value >> 32


def stream_keys(seed: int, stream_id: int, domain: int) -> tuple[int, int]:
    """Two 32-bit keys for one (seed, stream) pair; host-side Python ints."""
    lo, hi = split64(seed)
    k = mix32(mix32(lo ^ domain) ^ hi)
    k1 = mix32(k ^ (stream_id & MASK32))
    k2 = mix32(k1 ^ DOMAIN_SECOND)
    return k1, k2


def name_id(name: str) -> int:
    """Stable 32-bit id of a logical tensor name (crc32: identical on every platform)."""
    return zlib.crc32(name.encode("utf-8")) & MASK32


def hash_elements(index, k1: int, k2: int):
    """Two keyed mixing rounds of element indices (int64 tensor, each < 2**32)."""
    return mix32(mix32(index ^ k1) ^ k2)


def unit_interval_open(h, torch):
    """Map 32-bit hashes to float32 (0, 1) exactly: the top 23 bits plus one half-step.

    23 bits so that ``s + 0.5`` is exact in float32's 24-bit significand.
    """
    s = (h >> 9).to(torch.float32)
    return (s + 0.5) * (2.0**-23)


def symmetric_unit(h, torch):
    """Map 32-bit hashes to float32 [-1, 1) exactly (24 bits)."""
    s = (h >> 8).to(torch.float32)
    return s * (2.0**-23) - 1.0


def tensor_bytes(t) -> bytes:
    """Raw little-endian bytes of a tensor (copied to a contiguous CPU tensor first).

    Used for digests; avoids numpy, which the torch environments here may lack.
    """
    import ctypes

    c = t.detach().to("cpu").contiguous()
    return ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()) if c.numel() else b""
