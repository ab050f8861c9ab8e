"""The built C ABI library through fa_course.capi: stage facts, errors, and the CPU stage's forward
pass on host buffers (array.array: no NumPy or PyTorch needed) against a float64 reference written
here in plain Python, over square, grouped, multi-query, Nq != Nk, causal and LSE problems.

Skipped, saying so, when no library is built; failed instead with FA_REQUIRE_LIB=1 (ctest)."""

import array
import ctypes
import math
import random
import unittest
import zlib

import _support
from fa_course import FaError, Problem, capi

CPU_STAGE = "01_cpu"


def random_buffer(count, rng, scale=1.0):
    return array.array("f", [rng.uniform(-scale, scale) for _ in range(count)])


def reference(problem, q, k, v):
    """O and LSE in float64: query head h reads key/value head h // (Hq / Hkv); with causal, query i
    sees keys 0 .. i + Nk - Nq; a row that sees no key has O = 0 and LSE = -inf."""
    b_, hq, hkv, nq, nk, d = (problem.batch, problem.q_heads, problem.kv_heads, problem.q_seq, problem.kv_seq,
                              problem.dim)
    scale = 1.0 / math.sqrt(d)
    out = [0.0] * (b_ * hq * nq * d)
    lse = [0.0] * (b_ * hq * nq)
    for b in range(b_):
        for h in range(hq):
            kv = h // (hq // hkv)
            for i in range(nq):
                q_row = ((b * hq + h) * nq + i) * d
                end = nk if not problem.causal else max(0, min(nk, i + 1 + nk - nq))
                scores = []
                for j in range(end):
                    k_row = ((b * hkv + kv) * nk + j) * d
                    scores.append(scale * sum(float(q[q_row + t]) * float(k[k_row + t]) for t in range(d)))
                row = (b * hq + h) * nq + i
                if not scores:
                    lse[row] = -math.inf
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                lse[row] = top + math.log(total)
                for t in range(d):
                    out[q_row + t] = sum(w * float(v[((b * hkv + kv) * nk + j) * d + t])
                                         for j, w in enumerate(weights)) / total
    return out, lse


# Problems the tests run, each with the features it needs beyond the square forward pass.
PROBLEMS = [
    ("square", Problem.square(2, 3, 17, 8)),
    ("square causal", Problem.square(1, 2, 33, 5, causal=True)),
    ("grouped", Problem(2, 4, 2, 9, 9, 8)),
    ("multi-query causal", Problem(1, 4, 1, 12, 12, 16, causal=True)),
    ("decode Nq < Nk", Problem(1, 4, 2, 1, 70, 8)),
    ("Nq < Nk causal", Problem(1, 2, 1, 5, 40, 4, causal=True)),
    ("Nq > Nk causal: rows that see no key", Problem(1, 2, 2, 10, 4, 4, causal=True)),
    ("Nq > Nk", Problem(1, 3, 3, 19, 6, 3)),
]


def needed_features(problem, lse):
    return {name for name, needed in (("causal", problem.causal), ("grouped", problem.grouped),
                                      ("rectangular", problem.rectangular), ("lse", lse)) if needed}


class LibraryTestCase(unittest.TestCase):
    def setUp(self):
        self.library = _support.library_or_skip(self)


class Facts(LibraryTestCase):
    def test_the_library_reports_its_version_and_stages(self):
        self.assertIn(self.library.abi_version, (1, 2, 3, 4))
        ids = [s.id for s in self.library.stages()]
        self.assertIn(CPU_STAGE, ids)
        self.assertEqual(ids, sorted(ids), "stages in course order")
        self.assertEqual(len(ids), len(set(ids)))

    def test_every_stage_describes_itself(self):
        for stage in self.library.stages():
            with self.subTest(stage=stage.id):
                self.assertIn(stage.backend, ("cpu", "cuda"))
                self.assertIn(stage.precision, ("fp32", "fp16", "bf16"))
                self.assertGreaterEqual(stage.max_dim, 128)
                self.assertTrue(stage.title)
                self.assertTrue(stage.features <= set(capi.FEATURES))
                if stage.backend == "cpu":
                    self.assertEqual(stage.architecture, "cpu")
                    self.assertEqual(stage.min_compute_capability, 0)
                else:
                    self.assertRegex(stage.architecture, r"^sm_\d+a?\+?$")
                if self.library.abi_version >= 2:
                    self.assertIsNotNone(stage.kv_passes)
                    self.assertGreaterEqual(stage.kv_passes, 1.0)

    def test_kv_passes_of_the_traffic_model(self):
        if self.library.abi_version < 2:
            self.skipTest("a version 1 library has no fa_stage_kv_passes")
        passes = {s.folder: s.kv_passes for s in self.library.stages()}
        # stage 03 reads K three times and V once per query tile: 2 K+V passes; FlashAttention 1
        if "03_tiled_smem" in passes:
            self.assertEqual(passes["03_tiled_smem"], 2.0)
        for folder, value in passes.items():
            if folder >= "04":
                self.assertEqual(value, 1.0, folder)

    def test_selection_by_number_folder_and_id(self):
        self.assertEqual([s.id for s in self.library.select("1")], [CPU_STAGE])
        self.assertEqual([s.id for s in self.library.select("01_cpu")], [CPU_STAGE])
        with self.assertRaises(FaError) as caught:
            self.library.select("99")
        self.assertEqual(caught.exception.status, capi.FA_UNKNOWN_STAGE)

    def test_tolerance(self):
        self.assertGreater(self.library.tolerance("fp32", 1.0), 0)
        self.assertGreater(self.library.tolerance("fp16", 1.0), self.library.tolerance("fp32", 1.0))
        with self.assertRaises(ValueError):
            self.library.tolerance("fp8", 1.0)


class Errors(LibraryTestCase):
    def buffers(self, problem):
        rng = random.Random(1)
        q = random_buffer(problem.batch * problem.q_heads * problem.q_seq * problem.dim, rng)
        kv = problem.batch * problem.kv_heads * problem.kv_seq * problem.dim
        return q, random_buffer(kv, rng), random_buffer(kv, rng), array.array("f", bytes(4 * len(q)))

    def test_an_unknown_stage(self):
        problem = Problem.square(1, 1, 4, 4)
        with self.assertRaises(FaError) as caught:
            self.library.forward("99_nothing", problem, *self.buffers(problem))
        self.assertEqual(caught.exception.status, capi.FA_UNKNOWN_STAGE)
        self.assertIn("99_nothing", str(caught.exception))
        with self.assertRaises(FaError):
            self.library.workspace_bytes("99_nothing", problem)

    def test_a_head_dim_past_the_maximum_is_refused_with_a_reason(self):
        stage = self.library.stage(CPU_STAGE)
        problem = Problem.square(1, 1, 4, stage.max_dim + 1)
        with self.assertRaises(FaError) as caught:
            self.library.forward(CPU_STAGE, problem, *self.buffers(problem))
        self.assertTrue(caught.exception.refused)
        self.assertTrue(caught.exception.message)
        self.assertTrue(self.library.unsupported_reason(CPU_STAGE, problem))

    def test_a_null_pointer_is_an_invalid_argument(self):
        problem = Problem.square(1, 1, 4, 4)
        q, k, v, o = self.buffers(problem)
        with self.assertRaises(FaError) as caught:
            self.library.forward(CPU_STAGE, problem, q, None, v, o)
        self.assertEqual(caught.exception.status, capi.FA_INVALID_ARGUMENT)

    def test_a_deterministic_backward_needs_abi_version_4(self):
        """Refused before the library is called, whichever way the struct was filled (Library.backward,
        or the op's call_backward on a filled copy of its own)."""
        older = capi.Library(self.library.path)
        older.abi_version = 3
        problem = Problem.square(1, 1, 4, 4)
        q, k, v, o = self.buffers(problem)
        with self.assertRaises(FaError) as caught:
            older.backward("11_backward/fp32", problem, q, k, v, o, o, o, o, o, o, deterministic=True)
        self.assertEqual(caught.exception.status, capi.FA_UNSUPPORTED)
        self.assertIn("deterministic", caught.exception.message)
        args = capi.FaBackwardArgs(ctypes.sizeof(capi.FaBackwardArgs), ctypes.pointer(capi.FaProblem.of(problem)))
        args.deterministic = 1
        with self.assertRaises(FaError) as caught:
            older.call_backward(b"11_backward/fp32", args)
        self.assertIn("version 4", caught.exception.message)

    def test_a_gpu_stage_on_host_memory_says_what_is_wrong(self):
        """Host buffers to a GPU stage: without a GPU the library says plainly that there is none (as
        the command line does), never the runtime's "driver version is insufficient"; with one, it
        refuses the host memory."""
        # An FP32 stage where the build has one; a build of a few stages (FA_ONLY_STAGES) may have
        # only 16-bit ones, which take the same pointers (they read fewer bytes of them).
        cuda_stages = sorted((s for s in self.library.stages() if s.is_cuda), key=lambda s: s.precision != "fp32")
        if not cuda_stages:
            self.skipTest("this build has no GPU stage (FA_ONLY_STAGES named CPU stages only)")
        stage = cuda_stages[0]
        problem = Problem.square(1, 1, 4, 4)
        with self.assertRaises(FaError) as caught:
            self.library.forward(stage.id, problem, *self.buffers(problem))
        error = caught.exception
        self.assertNotIn("driver version is insufficient", error.message)
        if error.status == capi.FA_CUDA_ERROR:
            self.assertRegex(error.message, "no NVIDIA driver|no CUDA GPU|supports CUDA up to")
        else:
            self.assertEqual(error.status, capi.FA_INVALID_ARGUMENT, error.message)

    def test_heads_that_do_not_group(self):
        if self.library.abi_version < 2:
            self.skipTest("a version 1 library takes square problems only")
        problem = Problem(1, 3, 2, 4, 4, 4)
        with self.assertRaises(FaError) as caught:
            self.library.forward(CPU_STAGE, problem, *self.buffers(problem))
        self.assertTrue(caught.exception.refused)


class CpuForward(LibraryTestCase):
    """01_cpu through the C ABI against the plain-Python float64 reference."""

    def run_problem(self, name, problem, with_lse):
        library = self.library
        stage = library.stage(CPU_STAGE)
        rng = random.Random(zlib.crc32(name.encode()))
        q = random_buffer(problem.batch * problem.q_heads * problem.q_seq * problem.dim, rng, 2.0)
        kv_count = problem.batch * problem.kv_heads * problem.kv_seq * problem.dim
        k, v = random_buffer(kv_count, rng, 2.0), random_buffer(kv_count, rng)
        out = array.array("f", [math.nan]) * len(q)  # poisoned: an element never written fails
        lse = array.array("f", [math.nan]) * (problem.batch * problem.q_heads * problem.q_seq) if with_lse else None
        missing = needed_features(problem, with_lse) - stage.features
        if library.abi_version < 2 and (not problem.is_square or with_lse):
            missing.add("ABI version 2")
        if missing:
            with self.assertRaises(FaError, msg=f"{name}: the stage lacks {missing} and must refuse") as caught:
                library.forward(CPU_STAGE, problem, q, k, v, out, lse=lse)
            self.assertTrue(caught.exception.refused, str(caught.exception))
            self.assertTrue(caught.exception.message)
            return
        workspace = library.workspace_bytes(CPU_STAGE, problem)
        buffer = array.array("b", bytes(workspace)) if workspace else None
        library.forward(CPU_STAGE, problem, q, k, v, out, lse=lse, workspace=buffer)
        expected_out, expected_lse = reference(problem, q, k, v)
        tolerance = library.tolerance(stage.precision, max(abs(x) for x in v))
        for index, (got, want) in enumerate(zip(out, expected_out)):
            self.assertTrue(math.isfinite(got), f"{name}: O[{index}] = {got}")
            self.assertLessEqual(abs(got - want), tolerance, f"{name}: O[{index}] {got} vs {want}")
        if with_lse:
            for index, (got, want) in enumerate(zip(lse, expected_lse)):
                if math.isinf(want):
                    self.assertEqual(got, want, f"{name}: LSE[{index}] of a row that sees no key")
                else:
                    self.assertLessEqual(abs(got - want), 1e-5 * max(1.0, abs(want)), f"{name}: LSE[{index}]")

    def test_problems(self):
        for name, problem in PROBLEMS:
            with self.subTest(problem=name):
                self.run_problem(name, problem, with_lse=False)

    def test_problems_with_lse(self):
        for name, problem in PROBLEMS:
            with self.subTest(problem=name):
                self.run_problem(name + " lse", problem, with_lse=True)

    def test_the_reference_stage_takes_general_shapes(self):
        """DESIGN.md: the reference takes grouped, Nq != Nk and causal problems and writes the LSE."""
        if self.library.abi_version < 2:
            self.skipTest("a version 1 library takes square problems only")
        self.assertTrue({"causal", "grouped", "rectangular", "lse"} <= self.library.stage(CPU_STAGE).features)

    def test_version_1_call_still_works(self):
        problem = Problem.square(1, 2, 11, 6, causal=True)
        rng = random.Random(5)
        count = 2 * 11 * 6
        q, k, v = (random_buffer(count, rng) for _ in range(3))
        out = array.array("f", [math.nan]) * count
        status = self.library.handle.fa_forward(CPU_STAGE.encode(), 1, 2, 11, 6, 1, q.buffer_info()[0],
                                                k.buffer_info()[0], v.buffer_info()[0], out.buffer_info()[0], None, None)
        self.assertEqual(status, capi.FA_OK, self.library.last_error())
        expected, _ = reference(problem, q, k, v)
        self.assertLessEqual(max(abs(a - b) for a, b in zip(out, expected)), 1e-5)


if __name__ == "__main__":
    unittest.main()
