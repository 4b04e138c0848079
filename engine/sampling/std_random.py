"""The C++ standard library's std::mt19937 and generate_canonical, as libstdc++ computes them.

llama.cpp's `dist` sampler seeds a `std::mt19937` with the request's seed and draws one
`std::uniform_real_distribution<double>(0, 1)` number per token. In libstdc++ that is
`std::generate_canonical<double, 53>`: two 32-bit outputs, the first the low half,
`(a + b * 2**32) / 2**64` rounded to a double (and pulled below 1 if it rounds up to it).
Reproducing both bit for bit is what makes `--seed 42` pick the same tokens as llama.cpp.

numpy's MT19937 bit generator is the same Mersenne Twister, and `RandomState(seed)` seeds it
with the reference `init_genrand(seed)` for a 32-bit seed, which is what `std::mt19937(seed)`
does; the state is handed over to the bit generator, whose `random_raw` gives the 32-bit outputs.
"""

from __future__ import annotations

from typing import cast

import numpy as np

_TWO_64 = float(2**64)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_BELOW_ONE_F32 = np.nextafter(np.float32(1.0), np.float32(0.0))
_TWO_32_F32 = np.float32(2**32)
_AHEAD = 256


class StdMt19937:
    """`std::mt19937(seed)`: its raw 32-bit outputs and libstdc++'s canonical doubles.

    Attributes:
        seed: the 32-bit seed it was built from.
    """

    def __init__(self, seed: int):
        self.seed = int(seed) & 0xFFFFFFFF
        state = cast(tuple, np.random.RandomState(self.seed).get_state(legacy=True))
        key, pos = np.asarray(state[1], np.uint32), int(state[2])
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
        # outputs drawn ahead, consumed in order: one numpy call per 256 outputs instead of
        # one per draw (~10 µs of a sampled token); the stream is the generator's either way
        self._ahead: list[int] = []
        self._i = 0  # the next unused one in _ahead

    def _next(self, n: int) -> list[int]:
        i = self._i
        if i + n > len(self._ahead):
            self._ahead = self._ahead[i:] + self._bits.random_raw(max(n, _AHEAD)).tolist()
            i = 0
        self._i = i + n
        return self._ahead[i : i + n]

    def raw(self, n: int) -> np.ndarray:
        """The next `n` outputs of operator(), as uint32."""
        return np.array(self._next(n), np.uint32)

    def canonical(self) -> float:
        """`std::generate_canonical<double, 53>` (= `uniform_real_distribution<double>(0, 1)`)."""
        lo, hi = self._next(2)
        # the integer sum is exact; float() rounds it to nearest-even as the C++ double sum does
        x = float(lo + (hi << 32)) / _TWO_64
        return _BELOW_ONE if x >= 1.0 else x

    def canonical_float(self) -> np.float32:
        """`std::generate_canonical<float, 24>` (= `uniform_real_distribution<float>(0, 1)`):
        one output, rounded to a float, over 2**32 (llama.cpp's XTC draws these)."""
        x = np.float32(self._next(1)[0]) / _TWO_32_F32
        return _BELOW_ONE_F32 if x >= 1.0 else x
