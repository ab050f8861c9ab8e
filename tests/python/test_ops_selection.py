"""What fa_course.ops runs, decided without PyTorch or a GPU (fa_course.selection): the forward stage
is the latest of the course that writes the LSE, runs on the GPU and takes the problem, a backward
stage's borrowed forward only as a last resort; the backward stage is the latest with a backward
pass; a named stage gets the tensors' precision; refusals carry the library's reason. Also: the
package and the scripts around the op say what is missing, instead of failing, without PyTorch.

The rules are checked on the course's descriptors as a list (CourseLibrary), so every case checks on
every machine; one test compares that list with the built library's own descriptors (it skips,
saying so, when no library is built, and fails instead with FA_REQUIRE_LIB=1, as ctest sets it)."""

import ast
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


def course_stage(stage_id, precision, features=(), architecture="sm_80+", capability=80, backend="cuda",
                 max_dim=128):
    flags = 0
    for feature in features:
        flags |= capi.FEATURES[feature]
    return capi.Stage(id=stage_id, title="", backend=backend, precision=precision, max_dim=max_dim,
                      architecture=architecture, min_compute_capability=capability, feature_flags=flags,
                      kv_passes=1.0, source_hash="")


# The course's descriptors as the library lists them (stages/CMakeLists.txt: in folder order; 03 and 04
# left out, which write no LSE, like 02), with the facts choose_stage reads: backend, precision,
# architecture, the LSE and backward features and the largest head dim.
HOPPER = dict(architecture="sm_90a", capability=90, max_dim=256)
COURSE = [
    course_stage("01_cpu", "fp32", ("lse",), architecture="cpu", capability=0, backend="cpu", max_dim=256),
    course_stage("02_naive_gpu", "fp32", architecture="sm_75+", capability=75, max_dim=256),
    course_stage("05_float4", "fp32", architecture="sm_75+", capability=75, max_dim=256),
    course_stage("06_wmma", "fp16", architecture="sm_75+", capability=75, max_dim=256),
    course_stage("07_fp16_pipelined", "fp16", max_dim=256),
    course_stage("07_fp16_pipelined/bf16", "bf16", max_dim=256),
    course_stage("08_mma_registers", "fp16", ("lse",), max_dim=256),
    course_stage("08_mma_registers/bf16", "bf16", ("lse",), max_dim=256),
    course_stage("09_wgmma_tma", "fp16", ("lse",), **HOPPER),
    course_stage("09_wgmma_tma/bf16", "bf16", ("lse",), **HOPPER),
    course_stage("10_overlap", "fp16", ("lse",), **HOPPER),
    course_stage("10_overlap/bf16", "bf16", ("lse",), **HOPPER),
    course_stage("11_backward", "fp16", ("lse", "backward"), max_dim=256),
    course_stage("11_backward/bf16", "bf16", ("lse", "backward"), max_dim=256),
    course_stage("11_backward/fp32", "fp32", ("lse", "backward"), architecture="cpu", capability=0, backend="cpu",
                 max_dim=256),
]


class CourseLibrary:
    """What choose_stage asks a library, for a given list of descriptors: it refuses a head dim above a
    stage's largest, as the real library does (with its reason)."""

    path = "the course's stages"
    select = capi.Library.select  # by id, folder or number, over stages()

    def __init__(self, stage_list):
        self._stages = list(stage_list)

    def stages(self):
        return list(self._stages)

    def stage(self, stage_id):
        return next(s for s in self._stages if s.id == stage_id)

    def workspace_bytes(self, stage_id, problem, pass_="fwd", causal=None):
        stage = self.stage(stage_id)
        if problem.dim > stage.max_dim:
            raise capi.FaError(capi.FA_UNSUPPORTED, f"{stage_id}: head dim {problem.dim} is above {stage.max_dim}",
                               stage_id)
        return 0


class Choice(unittest.TestCase):
    """The rules on the course's descriptors (no library needed, so every case checks everywhere)."""

    def setUp(self):
        self.library = CourseLibrary(COURSE)

    def choose(self, pass_, precision, capability, problem=PROBLEM, requested=None, backend="cuda", library=None):
        return choose_stage(library or self.library, pass_, backend, precision, problem, capability, requested).id

    def test_the_latest_forward_stage_that_runs_here(self):
        self.assertEqual(self.choose("fwd", "fp16", 80), "08_mma_registers")
        self.assertEqual(self.choose("fwd", "bf16", 86), "08_mma_registers/bf16")
        self.assertEqual(self.choose("fwd", "fp16", 90), "10_overlap")
        self.assertEqual(self.choose("fwd", "bf16", 90), "10_overlap/bf16")
        self.assertEqual(self.choose("fwd", "fp16", 100), "08_mma_registers")  # sm_90a stages run on sm_90 only
        without_10 = CourseLibrary(s for s in COURSE if not s.id.startswith("10_"))
        self.assertEqual(self.choose("fwd", "fp16", 90, library=without_10), "09_wgmma_tma")

    def test_a_backward_stage_is_the_forward_stage_of_last_resort(self):
        self.assertEqual(self.choose("bwd", "fp16", 80), "11_backward")
        self.assertEqual(self.choose("bwd", "bf16", 90), "11_backward/bf16")
        for capability in (80, 90):
            self.assertFalse(self.library.stage(self.choose("fwd", "fp16", capability)).supports("backward"))
        only_backward = CourseLibrary(s for s in COURSE if not s.id.startswith(("08_", "09_", "10_")))
        self.assertEqual(self.choose("fwd", "fp16", 80, library=only_backward), "11_backward")

    def test_the_cpu_stages(self):
        self.assertEqual(self.choose("fwd", "fp32", 0, backend="cpu"), "01_cpu")
        self.assertEqual(self.choose("bwd", "fp32", 0, backend="cpu"), "11_backward/fp32")

    def test_a_named_stage_in_the_tensors_precision(self):
        self.assertEqual(self.choose("fwd", "bf16", 90, requested="08"), "08_mma_registers/bf16")
        self.assertEqual(self.choose("fwd", "bf16", 90, requested="08_mma_registers"), "08_mma_registers/bf16")
        with self.assertRaisesRegex(UnsupportedProblem, "no stage 'no_such_stage'"):
            self.choose("fwd", "fp16", 90, requested="no_such_stage")
        with self.assertRaisesRegex(UnsupportedProblem, "no cuda descriptor in fp32"):
            self.choose("fwd", "fp32", 90, requested="08")

    def test_a_named_stage_that_cannot_run_here(self):
        with self.assertRaisesRegex(UnsupportedProblem, "needs sm_90a; this GPU is sm_80"):
            self.choose("fwd", "fp16", 80, requested="09")
        with self.assertRaisesRegex(UnsupportedProblem, "log-sum-exp"):
            self.choose("fwd", "fp16", 90, requested="07")

    def test_refusals_carry_the_librarys_reason(self):
        too_wide = Problem(1, 2, 2, 16, 16, self.library.stage("11_backward").max_dim + 8)
        with self.assertRaisesRegex(UnsupportedProblem, "head dim") as caught:
            self.choose("bwd", "fp16", 90, problem=too_wide)
        self.assertIn("11_backward", str(caught.exception))
        with self.assertRaisesRegex(UnsupportedProblem, "no cuda stage with a backward pass in fp32"):
            self.choose("bwd", "fp32", 90)


class ChoiceInTheBuiltLibrary(unittest.TestCase):
    """The built library's own descriptors say what the rules above assume of them."""

    def test_its_stages_declare_what_the_choice_reads(self):
        library = _support.library_or_skip(self)
        by_id = {s.id: s for s in library.stages()}
        for expected in COURSE:
            actual = by_id.get(expected.id)
            if actual is None:  # a build of some stages only (FA_ONLY_STAGES)
                continue
            with self.subTest(stage=expected.id):
                self.assertEqual((actual.backend, actual.precision, actual.architecture),
                                 (expected.backend, expected.precision, expected.architecture))
                self.assertEqual(actual.supports("lse"), expected.supports("lse"))
                self.assertEqual(actual.supports("backward"), expected.supports("backward"))
                self.assertEqual(actual.max_dim, expected.max_dim)
        self.assertTrue(set(by_id) & {s.id for s in COURSE}, "the library has none of the course's stages")


class WithoutTorch(unittest.TestCase):
    """The op needs PyTorch; nothing else in the package may, and the scripts say what is missing."""

    def run_python(self, code, *args):
        return subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + code, *args],
                              capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(_support.REPO, "python")))

    def test_the_package_imports_and_only_the_op_needs_torch(self):
        """Without PyTorch the package imports, offers everything in __all__, and the op says what is
        missing when called."""
        done = self.run_python("import fa_course, fa_course.selection, fa_course.bench.torch_runner\n"
                               "assert 'fa_course.ops' not in sys.modules\n"
                               "missing = [n for n in fa_course.__all__ if not hasattr(fa_course, n)]\n"
                               "assert not missing, missing\n"
                               "try:\n    fa_course.attention(None, None, None)\n"
                               "except ModuleNotFoundError as e:\n    print('needs torch:', e)\n"
                               "try:\n    import fa_course.ops\nexcept ImportError as e:\n    print('ops needs torch')\n")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("needs torch: fa_course's op needs PyTorch", done.stdout)
        self.assertIn("ops needs torch", done.stdout)

    def test_the_benchmark_tools_are_not_imported_by_the_op(self):
        """fa_course.bench is for scripts and notebooks: neither the package nor the op imports it
        (checked on the op's source, which needs PyTorch to import)."""
        done = self.run_python("import fa_course\nprint(sorted(m for m in sys.modules if m.startswith('fa_course')))")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("fa_course.bench", done.stdout)
        package = os.path.join(_support.REPO, "python", "fa_course")
        for name in ("ops.py", "capi.py", "selection.py", "problem.py", "__init__.py"):
            with open(os.path.join(package, name), encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            imported = [f"{node.module or ''}.{alias.name}" for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) for alias in node.names]
            imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            self.assertTrue(imported, name)
            self.assertFalse([m for m in imported if "bench" in m], name)

    def test_the_training_example_refuses_clearly(self):
        script = os.path.join(_support.REPO, "python", "examples", "train_attention.py")
        done = self.run_python(f"import runpy; sys.argv = [{script!r}]; runpy.run_path({script!r}, "
                               f"run_name='__main__')")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("PyTorch is needed", done.stderr)

    def test_the_overhead_benchmark_refuses_clearly(self):
        script = os.path.join(_support.REPO, "scripts", "op_overhead.py")
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
