"""What fa_course.ops runs, decided without PyTorch or a GPU (fa_course.selection): the forward stage
is the latest of the course that writes the LSE, runs on the GPU and takes the problem, a backward
stage's borrowed forward only as a last resort; the backward stage is the latest with a backward
pass; a named stage gets the tensors' precision; refusals carry the library's reason. Also: the
package and the scripts around the op say what is missing, instead of failing, without PyTorch.

The library tests skip, saying so, when no library is built (fail with FA_REQUIRE_LIB=1, as ctest
sets it). A case that needs a stage the build lacks (a build of some stages only) passes without
checking anything: this suite may skip nothing under ctest."""

import os
import subprocess
import sys
import unittest

import _support
from fa_course import Problem, capi
from fa_course.selection import UnsupportedProblem, choose_stage, runs_on

PROBLEM = Problem(2, 8, 2, 100, 130, 64, causal=True)


def fake_stage(stage_id, backend="cuda", architecture="sm_80+", capability=80):
    return capi.Stage(id=stage_id, title="", backend=backend, precision="fp16", max_dim=128,
                      architecture=architecture, min_compute_capability=capability,
                      feature_flags=capi.FA_FEATURE_LSE, kv_passes=1.0, source_hash="")


class RunsOn(unittest.TestCase):
    def test_architectures(self):
        anywhere_since_ampere = fake_stage("08_mma_registers")
        hopper_only = fake_stage("09_wgmma_tma", architecture="sm_90a", capability=90)
        self.assertEqual(runs_on(anywhere_since_ampere, "cuda", 80), "")
        self.assertEqual(runs_on(anywhere_since_ampere, "cuda", 120), "")
        self.assertIn("sm_80+", runs_on(anywhere_since_ampere, "cuda", 75))
        self.assertEqual(runs_on(hopper_only, "cuda", 90), "")
        self.assertIn("sm_90a", runs_on(hopper_only, "cuda", 100))  # exactly sm_90, not newer
        self.assertIn("sm_90a", runs_on(hopper_only, "cuda", 80))
        self.assertIn("CPU", runs_on(fake_stage("01_cpu", backend="cpu"), "cuda", 90))
        self.assertIn("CUDA", runs_on(anywhere_since_ampere, "cpu", 0))


class Choice(unittest.TestCase):
    def setUp(self):
        self.library = _support.library_or_skip(self)
        self.ids = [s.id for s in self.library.stages()]

    def has(self, *stage_ids):
        return all(s in self.ids for s in stage_ids)

    def choose(self, pass_, precision, capability, problem=PROBLEM, requested=None, backend="cuda"):
        return choose_stage(self.library, pass_, backend, precision, problem, capability, requested).id

    def test_the_latest_forward_stage_that_runs_here(self):
        if not self.has("08_mma_registers", "08_mma_registers/bf16"):
            return
        self.assertEqual(self.choose("fwd", "fp16", 80), "08_mma_registers")
        self.assertEqual(self.choose("fwd", "bf16", 86), "08_mma_registers/bf16")
        latest_hopper = [s for s in ("10_overlap", "09_wgmma_tma") if s in self.ids]
        expected = latest_hopper[0] if latest_hopper else "08_mma_registers"
        self.assertEqual(self.choose("fwd", "fp16", 90), expected)
        self.assertEqual(self.choose("fwd", "fp16", 100), "08_mma_registers")  # sm_90a stages run on sm_90 only

    def test_a_backward_stage_is_the_forward_stage_of_last_resort(self):
        if not self.has("08_mma_registers", "11_backward"):
            return
        self.assertEqual(self.choose("bwd", "fp16", 80), "11_backward")
        self.assertEqual(self.choose("bwd", "bf16", 90), "11_backward/bf16")
        # 08 and 11 share stage 08's kernel, so a problem 08 refuses is refused by 11 too: the
        # fallback shows only where a library has no forward stage of that precision at all
        for capability in (80, 90):
            self.assertFalse(self.library.stage(self.choose("fwd", "fp16", capability)).supports("backward"))

    def test_the_cpu_stages(self):
        if not self.has("01_cpu", "11_backward/fp32"):
            return
        self.assertEqual(self.choose("fwd", "fp32", 0, backend="cpu"), "01_cpu")
        self.assertEqual(self.choose("bwd", "fp32", 0, backend="cpu"), "11_backward/fp32")

    def test_a_named_stage_in_the_tensors_precision(self):
        if not self.has("08_mma_registers/bf16"):
            return
        self.assertEqual(self.choose("fwd", "bf16", 90, requested="08"), "08_mma_registers/bf16")
        self.assertEqual(self.choose("fwd", "bf16", 90, requested="08_mma_registers"), "08_mma_registers/bf16")
        with self.assertRaisesRegex(UnsupportedProblem, "no stage 'no_such_stage'"):
            self.choose("fwd", "fp16", 90, requested="no_such_stage")
        with self.assertRaisesRegex(UnsupportedProblem, "no cuda descriptor in fp32"):
            self.choose("fwd", "fp32", 90, requested="08")

    def test_a_named_stage_that_cannot_run_here(self):
        if not self.has("09_wgmma_tma", "07_fp16_pipelined"):
            return
        with self.assertRaisesRegex(UnsupportedProblem, "needs sm_90a; this GPU is sm_80"):
            self.choose("fwd", "fp16", 80, requested="09")
        with self.assertRaisesRegex(UnsupportedProblem, "log-sum-exp"):
            self.choose("fwd", "fp16", 90, requested="07")

    def test_refusals_carry_the_librarys_reason(self):
        if not self.has("11_backward"):
            return
        too_wide = Problem(1, 2, 2, 16, 16, self.library.stage("11_backward").max_dim + 8)
        with self.assertRaisesRegex(UnsupportedProblem, "head dim") as caught:
            self.choose("bwd", "fp16", 90, problem=too_wide)
        self.assertIn("11_backward", str(caught.exception))
        with self.assertRaisesRegex(UnsupportedProblem, "no cuda stage with a backward pass in fp32"):
            self.choose("bwd", "fp32", 90)


class WithoutTorch(unittest.TestCase):
    """The op needs PyTorch; nothing else in the package may, and the scripts say what is missing."""

    def run_python(self, code, *args):
        return subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + code, *args],
                              capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(_support.REPO, "python")))

    def test_the_package_imports_and_only_the_op_needs_torch(self):
        done = self.run_python("import fa_course, fa_course.selection, fa_course.torch_runner\n"
                               "assert 'fa_course.ops' not in sys.modules\n"
                               "try:\n    import fa_course.ops\nexcept ImportError as e:\n    print('needs torch')\n")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("needs torch", done.stdout)

    def test_the_training_example_refuses_clearly(self):
        script = os.path.join(_support.REPO, "scripts", "train_attention.py")
        done = self.run_python(f"import runpy; sys.argv = [{script!r}]; runpy.run_path({script!r}, "
                               f"run_name='__main__')")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("PyTorch is needed", done.stderr)

    def test_compare_torch_backward_pass_without_torch_exits_2(self):
        library = _support.library_or_skip(self)
        script = os.path.join(_support.REPO, "scripts", "compare_torch.py")
        done = self.run_python(f"import runpy; sys.argv = ['compare_torch.py', '--pass', 'bwd', '--stages', 'none', "
                               f"'--lib', {library.path!r}]; runpy.run_path({script!r}, run_name='__main__')")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("PyTorch is needed", done.stderr)


if __name__ == "__main__":
    unittest.main()
