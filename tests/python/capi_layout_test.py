#!/usr/bin/python3
"""The package's ctypes declarations (ampscope/_capi.py) against the C header as the C compiler
reads it: every struct's size and every field's offset and size (capi_layout, built from
capi_layout.c), every constant, the header's ABI version, and the library's.

Run by ctest with: --header PATH/c_api.h"""

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import unittest

import ampscope._capi as capi

HEADER = None


class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tool = os.path.join(os.environ["AMPSCOPE_TEST_TOOLS"], "capi_layout")
        cls.c = json.loads(subprocess.run([tool], check=True, capture_output=True,
                                          text=True).stdout)

    def test_every_struct_has_the_c_layout(self):
        self.assertEqual(sorted(self.c["structs"]), sorted(capi.STRUCTS))
        for name, struct in capi.STRUCTS.items():
            with self.subTest(struct=name):
                c = self.c["structs"][name]
                self.assertEqual(ctypes.sizeof(struct), c["sizeof"])
                py = {f: [getattr(struct, f).offset, getattr(struct, f).size]
                      for f, _ in struct._fields_}
                self.assertEqual(py, c["fields"])

    def test_every_constant_has_the_c_value(self):
        for name, value in self.c["constants"].items():
            with self.subTest(constant=name):
                self.assertEqual(getattr(capi, name), value)

    def test_abi_versions_agree(self):
        with open(HEADER, encoding="utf-8") as f:
            m = re.search(r"#define AMPSCOPE_AGENT_ABI_VERSION (\d+)u?", f.read())
        self.assertIsNotNone(m)
        self.assertEqual(int(m.group(1)), capi.ABI_VERSION)
        self.assertEqual(capi.library().ampscope_agent_abi_version(), capi.ABI_VERSION)

    def test_a_missing_library_is_a_clear_error(self):
        env = dict(os.environ, AMPSCOPE_AGENT_LIBRARY="/nonexistent/libampscope_agent.so")
        r = subprocess.run([sys.executable, "-c", "import ampscope._capi as c; c.library()"],
                           env=env, capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LibraryError", r.stderr)
        self.assertIn("/nonexistent/libampscope_agent.so", r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--header", required=True)
    args, rest = parser.parse_known_args()
    HEADER = args.header
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
