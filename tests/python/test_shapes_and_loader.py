"""Problems and presets, which library loads (explicitly named, or the installed one: never a build
folder found by searching) and its errors, and the package without PyTorch."""

import ctypes
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import _support
from fa_course import Problem, capi
from fa_course.bench import shapes
from fa_course.bench.shapes import parse_problem, parse_shapes


class Problems(unittest.TestCase):
    def test_square_and_general_specs(self):
        self.assertEqual(parse_problem("4x16x4096x128"), Problem.square(4, 16, 4096, 128))
        self.assertEqual(parse_problem("1x32x8x4x65536x128"), Problem(1, 32, 8, 4, 65536, 128))
        for spec in ("4x16x4096x128", "1x32x8x4x65536x128"):
            self.assertEqual(parse_problem(spec).spec(), spec)
        for bad in ("4x16x4096", "0x1x1x1", "1x3x2x4x4x8", "axbxcxd"):
            with self.assertRaises(ValueError):
                parse_problem(bad)

    def test_presets(self):
        self.assertEqual(len(parse_shapes("seed001")), 6)
        for name in ("seed001", "seed001-d64", "sweep-head-dims", "seed004", "sweep-d64", "sweep-d128", "small",
                     "gqa", "mqa", "decode"):
            self.assertIn(name, shapes.PRESETS)
            for problem in shapes.PRESETS[name]:
                self.assertEqual(problem.validate(), "", (name, problem))
        self.assertEqual({(p.dim, p.batch * p.q_seq) for p in shapes.PRESETS["sweep-head-dims"]},
                         {(d, 16384) for d in (64, 96, 192, 256)})
        self.assertEqual(shapes.PRESETS["gqa"][0], Problem(4, 32, 8, 4096, 4096, 128))
        self.assertEqual(shapes.PRESETS["mqa"][0].kv_heads, 1)
        decode = shapes.PRESETS["decode"]
        self.assertEqual({p.q_seq for p in decode}, {1, 4, 16})
        self.assertEqual({p.kv_seq for p in decode}, {4096, 65536})
        self.assertTrue(all((p.q_heads, p.kv_heads, p.dim) == (32, 8, 128) for p in decode))
        self.assertEqual(parse_shapes(["small", "1x1x8x8, 2x2x2x2"])[-2:],
                         [Problem.square(1, 1, 8, 8), Problem.square(2, 2, 2, 2)])
        with self.assertRaises(ValueError):
            parse_shapes("nonsense")

    def test_derived_sizes_and_rows(self):
        problem = Problem(2, 8, 2, 3, 100, 64, causal=True)
        self.assertEqual(problem.group_size, 4)
        self.assertEqual([problem.kv_head_of(h) for h in range(8)], [0, 0, 0, 0, 1, 1, 1, 1])
        self.assertEqual(problem.q_shape, (2, 8, 3, 64))
        self.assertEqual(problem.kv_shape, (2, 2, 100, 64))
        self.assertEqual(problem.row_fields(), {"B": 2, "Hq": 8, "Hkv": 2, "Nq": 3, "Nk": 100, "D": 64, "causal": 1})
        self.assertEqual(Problem.from_row(problem.row_fields()), problem)
        self.assertEqual(problem.describe(), "B=2 Hq=8 Hkv=2 Nq=3 Nk=100 D=64 causal")
        self.assertEqual(Problem.of((1, 2, 3, 4), causal=True), Problem.square(1, 2, 3, 4, True))

    def test_c_struct_of_a_problem(self):
        c_problem = capi.FaProblem.of(Problem(2, 8, 2, 3, 100, 64, causal=True))
        self.assertEqual(c_problem.size, ctypes.sizeof(capi.FaProblem))
        self.assertEqual((c_problem.q_heads, c_problem.kv_heads, c_problem.kv_seq, c_problem.causal), (8, 2, 100, 1))


class Loader(unittest.TestCase):
    def test_a_missing_explicit_path_says_where_it_looked(self):
        with self.assertRaises(capi.LibraryNotFoundError) as caught:
            capi.find_library("/nonexistent/libfa_capi.so")
        self.assertIn("/nonexistent/libfa_capi.so", str(caught.exception))

    def test_a_missing_environment_path(self):
        with mock.patch.dict(os.environ, {"FA_CAPI_LIB": "/nonexistent/lib.so"}):
            with self.assertRaises(capi.LibraryNotFoundError) as caught:
                capi.find_library()
        self.assertIn("FA_CAPI_LIB", str(caught.exception))

    def test_without_a_name_the_installed_library_and_never_a_build_folder(self):
        """A build folder beside the package or in the working directory is not looked at: only the
        library installed inside the package, and the message says how to name another."""
        with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, {}, clear=False), \
                mock.patch.object(capi, "INSTALLED_LIBRARY", os.path.join(folder, "fa_course", "libfa_capi.so")), \
                mock.patch("os.getcwd", return_value=folder):
            os.environ.pop("FA_CAPI_LIB", None)
            os.makedirs(os.path.join(folder, "build", "lib"))
            open(os.path.join(folder, "build", "lib", "libfa_capi.so"), "w").close()
            with self.assertRaises(capi.LibraryNotFoundError) as caught:
                capi.find_library()
            message = str(caught.exception)
            self.assertIn(os.path.join(folder, "fa_course", "libfa_capi.so"), message)
            self.assertIn("FA_CAPI_LIB", message)
            self.assertIn("pip install", message)
            os.makedirs(os.path.join(folder, "fa_course"))
            open(os.path.join(folder, "fa_course", "libfa_capi.so"), "w").close()
            self.assertEqual(capi.find_library(), os.path.join(folder, "fa_course", "libfa_capi.so"))
            self.assertEqual(capi.find_library(os.path.join(folder, "build", "lib")),
                             os.path.join(folder, "build", "lib", "libfa_capi.so"))

    def test_a_file_that_is_not_the_library(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as handle:
            with self.assertRaises(capi.LibraryNotFoundError):
                capi.Library(handle.name)

    def test_require_lib_turns_a_missing_library_into_a_failure(self):
        class Probe(unittest.TestCase):
            def runTest(self):
                _support.library_or_skip(self)

        for require, expect in (("1", "failures"), ("", "skipped")):
            with mock.patch.dict(os.environ, {"FA_CAPI_LIB": "/nonexistent/lib.so", "FA_REQUIRE_LIB": require}):
                result = unittest.TestResult()
                Probe().run(result)
            self.assertEqual(len(getattr(result, expect)), 1, (require, expect))

    def test_addresses(self):
        import array

        buffer = array.array("f", [1.0, 2.0])
        self.assertEqual(capi._address(buffer), buffer.buffer_info()[0])
        self.assertIsNone(capi._address(None))
        self.assertIsNone(capi._address(0))
        self.assertEqual(capi._address(1234), 1234)
        value = ctypes.c_float(1.0)
        self.assertEqual(capi._address(value), ctypes.addressof(value))
        with self.assertRaises(TypeError):
            capi._address("not a pointer")


class WithoutTorch(unittest.TestCase):
    def test_the_package_imports_without_torch_and_says_what_is_missing(self):
        """Importing fa_course (and torch_runner) must not import torch; asking for it raises
        TorchUnavailable with a message when torch is missing."""
        code = ("import sys; sys.modules['torch'] = None\n"
                "import fa_course, fa_course.bench.torch_runner as r\n"
                "try:\n    r.load_sdpa()\nexcept r.TorchUnavailable as e:\n    print('unavailable:', e)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(_support.REPO, "python")))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("unavailable: PyTorch is needed", done.stdout)

    def test_compare_torch_without_torch_exits_2(self):
        script = os.path.join(_support.REPO, "scripts", "compare_torch.py")
        code = f"import sys, runpy; sys.modules['torch'] = None; sys.argv = ['compare_torch.py', '--stages', " \
               f"'none', '--lib', sys.argv[1]]; runpy.run_path({script!r}, run_name='__main__')"
        try:
            library = capi.find_library()
        except capi.LibraryNotFoundError:
            library = None
        if library is None:
            done = subprocess.run([sys.executable, script, "--lib", "/nonexistent.so"], capture_output=True, text=True)
            self.assertEqual(done.returncode, 2)
            self.assertIn("no C ABI library", done.stderr)
            return
        done = subprocess.run([sys.executable, "-c", code, library], capture_output=True, text=True)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("PyTorch is needed", done.stderr)


if __name__ == "__main__":
    unittest.main()
