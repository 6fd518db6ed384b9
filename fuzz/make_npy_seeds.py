"""Writes the .npy seeds of npy_fuzz with NumPy itself: every dtype the reader takes, both byte
orders, Fortran order, a scalar, an empty array and the 2.0 and 3.0 header versions.
Usage: python3 make_npy_seeds.py CORPUS_DIR/npy_fuzz"""
import os
import sys

import numpy as np
from numpy.lib import format as npy_format


def main(out):
    os.makedirs(out, exist_ok=True)
    values = np.array([0.0, -1.5, 65504.0, 1e-8, np.inf, -np.inf, np.nan, 3.0])
    pairs = np.zeros(4, dtype=complex)
    pairs.real, pairs.imag = values[:4], values[4:]
    arrays = {
        "f4": values.astype("<f4"),
        "f2": values.astype("<f2"),
        "f8-big": values.astype(">f8"),
        "f4-big-2x4": values.astype(">f4").reshape(2, 4),
        "f4-fortran": np.asfortranarray(values.astype("<f4").reshape(2, 4)),
        "c8": pairs.astype("<c8"),
        "c16-big": pairs.astype(">c16"),
        "i1": np.arange(-4, 4, dtype="i1"),
        "i8-big": np.arange(-4, 4, dtype=">i8"),
        "u2": np.arange(8, dtype="<u2"),
        "bool": np.array([True, False, True]),
        "void2": np.zeros(3, dtype="V2"),
        "scalar": np.array(2.5, dtype="<f4"),
        "empty-0x3": np.zeros((0, 3), dtype="<f4"),
    }
    for name, a in arrays.items():
        np.save(os.path.join(out, name + ".npy"), a)
    for version in [(2, 0), (3, 0)]:
        path = os.path.join(out, "f4-v%d.npy" % version[0])
        with open(path, "wb") as f:
            npy_format.write_array(f, values.astype("<f4"), version=version)


if __name__ == "__main__":
    main(sys.argv[1])
