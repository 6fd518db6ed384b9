#!/usr/bin/python3
"""FP8 tensors as PyTorch stores them (torch.float8_e4m3fn / float8_e5m2: one byte per element):
ampscope.compute_stats through the C ABI against the values decoded from the OCP FP8
definitions written out here, every byte pattern; and ampscope.torch measuring an FP8 tensor
where the installed torch has float8 dtypes (torch 1.13 has none: that part skips)."""

import ctypes
import math
import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402,F401
import ampscope  # noqa: E402
import ampscope._capi as capi  # noqa: E402


def e4m3(b):
    """OCP FP8 E4M3 ("fn"): bias 7, no Inf, NaN only at S.1111.111."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m / 8.0, -6)
    return sign * math.ldexp(1.0 + m / 8.0, e - 7)


def e5m2(b):
    """OCP FP8 E5M2: IEEE-like, bias 15, Inf at S.11111.00, NaN above it."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 2) & 0x1F, b & 0x3
    if e == 0x1F:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m / 4.0, -14)
    return sign * math.ldexp(1.0 + m / 4.0, e - 15)


DECODERS = {capi.FORMAT_E4M3: e4m3, capi.FORMAT_E5M2: e5m2}


class Fp8StorageTest(unittest.TestCase):
    def test_every_pattern_through_the_c_abi(self):
        # Each pattern b appears 1 + b % 3 times, so counts that mix patterns up disagree.
        data = bytes(b for b in range(256) for _ in range(1 + b % 3))
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        for fmt, decode in DECODERS.items():
            with self.subTest(format=capi.FORMAT_NAMES[fmt]):
                values = [decode(b) for b in data]
                target = (capi.FORMAT_FP16, -4)
                s = ampscope.compute_stats(ctypes.addressof(buf), len(data), fmt, [target])
                finite = [v for v in values if math.isfinite(v)]
                nonzero = [abs(v) for v in finite if v != 0.0]
                self.assertEqual(s.numel, len(data))
                self.assertEqual(s.nan, sum(1 for v in values if math.isnan(v)))
                self.assertEqual(s.pos_inf, sum(1 for v in values if v == math.inf))
                self.assertEqual(s.neg_inf, sum(1 for v in values if v == -math.inf))
                self.assertEqual(s.zeros, sum(1 for v in finite if v == 0.0))
                self.assertEqual(s.max_abs, max(nonzero))
                self.assertEqual(s.min_abs_nonzero, min(nonzero))
                self.assertEqual(s.sum, math.fsum(finite))
                hist = {}
                for v in nonzero:
                    e = math.frexp(v)[1] - 1
                    hist[e] = hist.get(e, 0) + 1
                lo, counts = s.histogram()
                self.assertEqual({lo + i: c for i, c in enumerate(counts) if c}, hist)
                # x * 2^-4 in FP16: no FP8 value overflows it; those below 2^-25 * 2^4 underflow.
                (_, overflow, underflow, _) = s.targets()[0]
                self.assertEqual(overflow, 0)
                self.assertEqual(underflow,
                                 sum(1 for v in nonzero if math.ldexp(v, -4) <= 2.0 ** -25))

    @unittest.skipUnless(hasattr(torch, "float8_e4m3fn"), "this torch has no float8 dtypes")
    def test_a_torch_float8_tensor_is_measured_as_stored(self):
        x = torch.tensor([0.0, 1.0, -448.0, 0.001953125, float("nan")]).to(torch.float8_e4m3fn)
        s = ampscope.compute_stats(x.data_ptr(), x.numel(), capi.FORMAT_E4M3)
        self.assertEqual((s.numel, s.zeros, s.nan, s.max_abs, s.min_abs_nonzero),
                         (5, 1, 1, 448.0, 2.0 ** -9))

    def test_fp4_is_not_a_storage_format(self):
        buf = (ctypes.c_uint8 * 4)()
        with self.assertRaisesRegex(ValueError, "dtype"):
            ampscope.compute_stats(ctypes.addressof(buf), 4, capi.FORMAT_E2M1)


if __name__ == "__main__":
    unittest.main()
