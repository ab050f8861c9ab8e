"""The scripts that use the package, where they run without a GPU: traffic.py's prediction,
summarize_results.py's table and ceilings.py's choice of metrics."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

import _support
from fa_course import Problem, capi
from fa_course.bench import results

SCRIPTS = os.path.join(_support.REPO, "scripts")


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage(folder, kv_passes):
    return capi.Stage(id=folder, title="", backend="cuda", precision="fp32", max_dim=256, architecture="sm_75+",
                      min_compute_capability=75, feature_flags=0, kv_passes=kv_passes, source_hash="")


class TrafficPrediction(unittest.TestCase):
    def setUp(self):
        self.traffic = load_script("traffic")
        self.smem = 233472  # an H200's shared memory per SM

    def test_the_paper_formulas_per_head(self):
        problem = Problem.square(4, 16, 4096, 128)
        e, n, d, heads = 4, 4096, 128, 64
        rows = min(-(-(self.smem // e) // (4 * d)), d)  # Br = min(ceil(M / 4d), d)
        blocks = -(-n // rows)
        self.assertEqual(self.traffic.predicted_bytes(stage("04_online_softmax", 1.0), problem, e, self.smem),
                         heads * e * (2 * n * d + blocks * 2 * n * d))
        self.assertEqual(self.traffic.predicted_bytes(stage("03_tiled_smem", 2.0), problem, e, self.smem),
                         heads * e * (2 * n * d + blocks * 4 * n * d))
        self.assertEqual(self.traffic.predicted_bytes(stage("02_naive_gpu", 1.0), problem, e, self.smem),
                         heads * e * (4 * n * d + 4 * n * n))

    def test_the_values_of_the_measured_data_set(self):
        # plots/data/NVIDIA_H200/traffic.csv of the first part of the course, at (4, 16, 4096, 128) FP32
        problem = Problem.square(4, 16, 4096, 128)
        self.assertEqual(self.traffic.predicted_bytes(stage("02_naive_gpu", 1.0), problem, 4, self.smem), 17716740096)
        self.assertEqual(self.traffic.predicted_bytes(stage("03_tiled_smem", 2.0), problem, 4, self.smem), 19595788288)

    def test_general_shapes(self):
        problem = Problem(1, 32, 8, 16, 4096, 128)
        e, d = 2, 128
        rows = min(-(-(self.smem // e) // (4 * d)), d)
        expected = 32 * e * (2 * 16 * d + -(-16 // rows) * 2 * 4096 * d)
        self.assertEqual(self.traffic.predicted_bytes(stage("12_split_kv", 1.0), problem, e, self.smem), expected)


class Summary(unittest.TestCase):
    def test_a_legacy_file_and_a_current_one(self):
        legacy = ("stage,gpu,B,H,N,D,dtype,causal,ms_median,ms_min,tflops,gbps,peak_bytes,max_abs_err,rel_l2_err,"
                  "status,source_hash,note\n"
                  "05_float4,G,4,16,4096,128,fp32,0,14.3,14.2,38.4,1,1,1e-7,1e-7,ok,abc,\n"
                  "05_float4,G,4,16,4096,128,fp32,1,8.0,8.0,34.4,1,1,1e-7,1e-7,ok,abc,\n")
        with tempfile.TemporaryDirectory() as folder:
            old = os.path.join(folder, "old.csv")
            with open(old, "w") as handle:
                handle.write(legacy)
            new = os.path.join(folder, "new.csv")
            row = results.make_row(stage="08_mma_registers", gpu="G", dtype="fp16", status="ok", tflops=100.0,
                                   ms_median=1.0, **{"pass": "fwd"}, **Problem(1, 32, 8, 4, 4096, 128).row_fields())
            results.write_results(new, [row])
            for path, expect in ((old, ["4x16x4096x128 ", "38.40", "causal / non-causal", "0.56"]),
                                 (new, ["1x32/8x4/4096x128", "100.00"])):
                done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "summarize_results.py"), path],
                                      capture_output=True, text=True)
                self.assertEqual(done.returncode, 0, done.stderr)
                for text in expect:
                    self.assertIn(text, done.stdout)


if __name__ == "__main__":
    unittest.main()


class CeilingsChoice(unittest.TestCase):
    def setUp(self):
        self.ceilings = load_script("ceilings")

    def test_all_leaves_out_the_rows_of_executables_not_given(self):
        chosen = self.ceilings.chosen_metrics(None, set())
        self.assertIn("copy_bandwidth", chosen)
        self.assertIn("device_memory", chosen)
        self.assertNotIn("read_bandwidth", chosen)
        self.assertNotIn("fp16_mma_sync", chosen)
        self.assertIn("read_bandwidth", self.ceilings.chosen_metrics("", {"--read-ceiling"}))

    def test_only_names_some(self):
        self.assertEqual(self.ceilings.chosen_metrics("read_bandwidth", {"--read-ceiling"}), {"read_bandwidth"})
        self.assertEqual(self.ceilings.chosen_metrics(" copy_bandwidth, multiprocessors ", set()),
                         {"copy_bandwidth", "multiprocessors"})

    def test_unknown_or_unmeasurable_names_are_refused(self):
        with self.assertRaisesRegex(ValueError, "no metric read_bandwith"):
            self.ceilings.chosen_metrics("read_bandwith", {"--read-ceiling"})
        with self.assertRaisesRegex(ValueError, "read_bandwidth needs --read-ceiling"):
            self.ceilings.chosen_metrics("read_bandwidth,copy_bandwidth", {"--mma-ceiling"})

    def test_the_refusal_is_one_line_before_the_gpu_is_touched(self):
        done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "ceilings.py"), "--only", "bogus"],
                              capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(done.returncode, 2)
        self.assertEqual(done.stdout, "")
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assertIn("no metric bogus", done.stderr)

    def test_the_fp8_ceiling_is_measured_like_the_16_bit_ones(self):
        self.assertIn("fp8_tensor_matmul", self.ceilings.chosen_metrics(None, set()))
        self.assertEqual(self.ceilings.chosen_metrics("fp8_tensor_matmul", set()), {"fp8_tensor_matmul"})


class Fp8Peers(unittest.TestCase):
    """scripts/fp8_peers.py where there is no GPU: its help, and its refusals in one line."""

    def run_script(self, *arguments):
        environment = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a machine with one
        return subprocess.run([sys.executable, os.path.join(SCRIPTS, "fp8_peers.py"), *arguments],
                              capture_output=True, text=True, timeout=120, check=False, env=environment)

    def test_help_lists_what_it_measures(self):
        done = self.run_script("--help")
        self.assertEqual(done.returncode, 0, done.stderr)
        for name in ("14_fp8/quantize", "14_fp8/attention", "10_overlap", "torch_cudnn", "cudnn_fp8",
                     "nvidia-cudnn-frontend==1.32.0", "--out"):
            self.assertIn(name, done.stdout)

    def test_without_a_gpu_it_says_so_in_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "fp8.csv")
            done = self.run_script("--out", out)
            self.assertEqual(done.returncode, 2)
            self.assertEqual(done.stdout, "")
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertRegex(done.stderr, r"^fp8_peers: (PyTorch .*(needed|sees no CUDA GPU)|.*)")
            self.assertFalse(os.path.exists(out))

    def test_an_unknown_row_is_refused_before_anything_is_loaded(self):
        done = self.run_script("--out", "unused.csv", "--rows", "14_fp8,cudnn_fp16")
        self.assertEqual(done.returncode, 2)
        self.assertIn("no row cudnn_fp16", done.stderr)

    def test_the_plan(self):
        peers = load_script("fp8_peers")
        problems = peers.parse_args(["--out", "x.csv"]).problems
        self.assertEqual(len(problems), 5 * 2 + 2)
        self.assertEqual({p.dim for p in problems if p.causal}, {128})
        self.assertIn(Problem.square(4, 16, 4096, 256), problems)
        chosen = peers.parse_args(["--out", "x.csv", "--shapes", "1x2x128x64", "--causal", "both"]).problems
        self.assertEqual(chosen, [Problem.square(1, 2, 128, 64), Problem.square(1, 2, 128, 64, causal=True)])

