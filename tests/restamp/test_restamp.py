"""scripts/restamp and the rule it serves (no GPU): the machine-code comparison on tiny kernels
compiled here (a refactor that changes no machine code is accepted, a changed register budget or
launch bound is refused), the chain of restamps that `fa_course.bench.data stale` follows, and the
method hashes (a changed timing method changes the hash; a restamp carries only the kinds whose
method is unchanged)."""

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from fa_course.bench import data  # noqa: E402
from fa_course.bench import results  # noqa: E402


def _load(name, path):
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


restamp = _load("fa_restamp", os.path.join(REPO, "scripts", "restamp"))
source_hash = restamp.source_hash

KERNEL = """#include <cuda_runtime.h>
namespace {
// Scales a vector.
__global__ void __launch_bounds__(BOUND) scale(float* out, const float* in, float factor, int n) {
  int INDEX = blockIdx.x * blockDim.x + threadIdx.x;
  if (INDEX >= n) return;
  float loaded[48];  // all live at once: 40 registers, more than a budget of 32
#pragma unroll
  for (int k = 0; k < 48; ++k) loaded[k] = __ldg(in + (INDEX + k * 4099) % n);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 48; ++k) sum += loaded[k] * loaded[47 - k] * factor;
  out[INDEX] = sum;
}
}  // namespace
const char* where() { return __FILE__; }
void launch(float* out, const float* in, float factor, int n) { scale<<<(n + 255) / 256, 256>>>(out, in, factor, n); }
"""


class MachineCode(unittest.TestCase):
    """One kernel compiled in variants, each in a folder of its own (paths of one length)."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp()
        cls.nvcc = restamp.nvcc_path()
        cls.cuobjdump = restamp.find_cuobjdump()
        variants = {
            "base": (KERNEL.replace("BOUND", "256").replace("INDEX", "index"), []),
            # comments, a renamed local, another layout: the same machine code
            "refactor": ("/* a refactor */\n" + KERNEL.replace("BOUND", "256").replace("INDEX", "element")
                         .replace("// Scales a vector.", "// Scales every element of a vector.\n\n"), []),
            "bounds": (KERNEL.replace("BOUND", "128").replace("INDEX", "index"), []),
            # at least 8 blocks of 256 threads per SM: a budget of 32 registers (nvcc ignores
            # -maxrregcount for a kernel with launch bounds)
            "registers": (KERNEL.replace("BOUND", "256, 8").replace("INDEX", "index"), []),
        }
        cls.digests = {}
        for number, (name, (text, flags)) in enumerate(sorted(variants.items())):
            folder = os.path.join(cls.work, f"tree{number}")
            os.makedirs(folder)
            source, output = os.path.join(folder, "scale.cu"), os.path.join(folder, "scale.o")
            with open(source, "w") as handle:
                handle.write(text)
            subprocess.run([cls.nvcc, "-c", "-O3", "-arch=sm_90", "-Xcompiler", "-fPIC", *flags, source, "-o", output],
                           check=True, capture_output=True)
            with open(output, "rb") as handle:
                body = handle.read()
            replacements = [(folder.encode(), b"@" * len(folder.encode()))]
            cls.digests[name] = restamp.object_digests(body, "90", replacements, cls.cuobjdump,
                                                       os.path.join(cls.work, "scratch"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def parts(self, name, part):
        return {k: v for k, v in self.digests[name].items() if k[0] == part}

    def test_the_fixture_has_device_and_host_code(self):
        self.assertTrue(self.parts("base", "sass"), "no cubin for sm_90 found in the object")
        self.assertTrue(any(".text" in key for _, key in self.parts("base", "sass")))
        self.assertTrue(self.parts("base", "host"))

    def test_a_refactor_that_changes_no_machine_code_is_accepted(self):
        # other folder, other anonymous-namespace tag, other comments and local names
        self.assertEqual(restamp.differences(self.digests["base"], self.digests["refactor"]), [])

    def test_a_changed_launch_bound_is_refused(self):
        differ = restamp.differences(self.digests["base"], self.digests["bounds"])
        self.assertTrue(any(kind == "sass" for kind, _ in differ), differ)

    def test_a_changed_register_budget_is_refused(self):
        differ = restamp.differences(self.digests["base"], self.digests["registers"])
        self.assertTrue(any(kind == "sass" for kind, _ in differ), differ)

    def test_the_anonymous_namespace_tag_is_all_that_is_blanked(self):
        tag = b"_ZN34_GLOBAL__N__1a2b3c4d_8_scale_cu_9f8e7d6c5scaleEPfPKffi"
        blanked = restamp.normalize_bytes(tag, [])
        self.assertEqual(blanked, b"_ZN34_GLOBAL__N__00000000_8_scale_cu_000000005scaleEPfPKffi")
        self.assertEqual(restamp.normalize_bytes(b"scale_1a2b3c4d", []), b"scale_1a2b3c4d")

    def test_the_number_of_a_nested_anonymous_namespace_is_blanked_whatever_its_digits(self):
        """nvcc appends to a nested anonymous namespace a number that differs from one compile of the
        same file to the next (stage 12's split_kv_wgmma.cu: _8201, then _20615); a kernel's host stub
        and its guard variable carry the kernel's name, so their lengths change with it."""
        def guard(number, kernel=b"5scale"):
            namespace = b"_GLOBAL__N__1a2b3c4d_8_scale_cu_9f8e7d6c_" + number
            mangled = b"_ZN2fa8split_kv%d%s%sEPf" % (len(namespace), namespace, kernel)
            stub = b"__device_stub_" + mangled
            return b"_ZGVZL%d%sE5__tmp" % (len(stub), stub)

        normalized = restamp.normalize_bytes(guard(b"8201"), [])
        self.assertEqual(restamp.normalize_bytes(guard(b"20615"), []), normalized)
        self.assertNotEqual(restamp.normalize_bytes(guard(b"8201", b"5scalf"), []), normalized)


def row(stage, source_hash_value, kind_note=""):
    fields = dict(stage=stage, gpu="NVIDIA H200", B=1, Hq=32, Hkv=8, Nq=1, Nk=4096, D=128, dtype="fp16", causal=0,
                  status="ok", ms_median=0.02, note=kind_note, source_hash=source_hash_value)
    fields["pass"] = "fwd"
    return results.make_row(**fields)


class Chain(unittest.TestCase):
    """`stale` follows restamps from a row's hash to this tree's, kind by kind."""

    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory()
        self.addCleanup(self.temporary.cleanup)
        self.folder = os.path.join(self.temporary.name, "NVIDIA_H200")
        os.makedirs(self.folder)

    def restamp_row(self, from_hash, to_hash, kinds):
        return dict(stage="04_online_softmax", kinds=kinds, from_hash=from_hash, to_hash=to_hash,
                    sass_digest="0" * 16, host_digest="0" * 16, nvcc="13.0.88", arch="sm_90",
                    from_commit="a..b", to_commit="c", date="2026-11-28T00:00:00Z")

    def test_rows_are_current_restamped_or_stale(self):
        a, b, c, now = "a" * 16, "b" * 16, "c" * 16, "d" * 16
        restamps = [self.restamp_row(a, b, "results;memory"), self.restamp_row(b, now, "results;torch"),
                    self.restamp_row(c, now, "torch")]
        state = lambda kind, value: data.row_state(kind, row("04_online_softmax", value),
                                                   {"04_online_softmax": now}, restamps)
        self.assertEqual(state("results", now), "current")
        self.assertEqual(state("results", a), "restamped")  # a -> b -> now
        self.assertEqual(state("memory", a), "stale")  # b -> now does not hold for memory
        self.assertEqual(state("torch", c), "restamped")
        self.assertEqual(state("results", c), "stale")  # c -> now holds for torch only
        self.assertEqual(state("results", "e" * 16), "stale")

    def test_stale_reports_the_three_counts_and_fails_only_on_stale_rows(self):
        now = source_hash.stage_hash("04_online_softmax", REPO)
        old = "1" * 16
        results.write_results(os.path.join(self.folder, "results.csv"),
                              [row("04_online_softmax", now), dict(row("04_online_softmax", old), Nk=8192)])
        self.assertEqual(data.main(["stale", "--fail", self.folder]), 1)
        with open(os.path.join(self.folder, data.RESTAMPS_FILE), "w") as handle:
            handle.write(",".join(data.RESTAMP_COLUMNS) + "\n")
            handle.write(",".join(self.restamp_row(old, now, "results")[c] for c in data.RESTAMP_COLUMNS) + "\n")
        report = data.stale(self.folder)
        self.assertEqual([(r["kind"], r["current"], r["restamped"], r["stale"], r["state"]) for r in report],
                         [("results", 1, 1, 0, "restamped")])
        self.assertEqual(data.main(["stale", "--fail", self.folder]), 0)
        data.check(self.folder)  # restamps.csv belongs in a data folder

    def test_a_malformed_restamps_file_is_refused(self):
        with open(os.path.join(self.folder, data.RESTAMPS_FILE), "w") as handle:
            handle.write("stage,from,to\n04_online_softmax,x,y\n")
        with self.assertRaisesRegex(data.DataError, "restamps.csv: header"):
            data.check(self.folder)

    def test_the_commit_env_txt_names_is_taken_whole_or_not_at_all(self):
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        measured = "1" * 16
        for named, expected in ((head[:7], [head]), (head, [head]), ("0" * 12, [])):
            with open(os.path.join(self.folder, data.ENV_FILE), "w") as handle:
                handle.write(f"commit: {named}\nsource_hash 04_online_softmax: {measured}\n")
            self.assertEqual(restamp.env_commit(self.folder, "04_online_softmax", measured), expected, named)
        self.assertEqual(restamp.env_commit(self.folder, "04_online_softmax", "2" * 16), [])


class Methods(unittest.TestCase):
    """The method hashes: the code that times and checks, per kind."""

    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory()
        self.addCleanup(self.temporary.cleanup)
        self.tree = os.path.join(self.temporary.name, "tree")
        for path in ["stages/04_online_softmax", "common"]:
            shutil.copytree(os.path.join(REPO, path), os.path.join(self.tree, path))
        for path in source_hash.method_files("torch", REPO):
            os.makedirs(os.path.dirname(os.path.join(self.tree, path)), exist_ok=True)
            shutil.copy(os.path.join(REPO, path), os.path.join(self.tree, path))
        self.timing = os.path.join(self.tree, source_hash.method_files("torch", self.tree)[1])

    def edit(self, old, new):
        with open(self.timing) as handle:
            text = handle.read()
        self.assertIn(old, text)
        with open(self.timing, "w") as handle:
            handle.write(text.replace(old, new, 1))

    def test_a_changed_timing_method_changes_the_hash_a_comment_does_not(self):
        method, stage = source_hash.method_hash("torch", self.tree), source_hash.stage_hash("04_online_softmax", self.tree)
        self.edit("def event_times_ms(", "# a comment\ndef event_times_ms(")
        self.assertEqual(source_hash.method_hash("torch", self.tree), method)
        self.edit("time.perf_counter()", "time.monotonic()")
        self.assertNotEqual(source_hash.method_hash("torch", self.tree), method)
        self.assertNotEqual(source_hash.stage_hash("04_online_softmax", self.tree), stage)
        self.assertEqual(source_hash.method_hash("cpp", self.tree), source_hash.method_hash("cpp", REPO))

    def test_the_torch_method_covers_the_call_of_our_stage(self):
        # A timed call of one of our stages runs through capi.py's Library.forward (the C ABI call) and
        # problem.py's Problem.of: a change there changes the torch method's hash; the benchmark's shim
        # of the same name (bench/capi.py) is not the file taken.
        files = source_hash.method_files("torch", self.tree)
        self.assertIn("python/fa_course/capi.py", files)
        self.assertIn("python/fa_course/problem.py", files)
        method = source_hash.method_hash("torch", self.tree)
        capi = os.path.join(self.tree, "python/fa_course/capi.py")
        with open(capi) as handle:
            text = handle.read()
        self.assertIn("stream_handle = _stream_handle(stream)", text)
        with open(capi, "w") as handle:
            handle.write(text.replace("stream_handle = _stream_handle(stream)",
                                      "stream_handle = _stream_handle(stream); self.synchronize()", 1))
        self.assertNotEqual(source_hash.method_hash("torch", self.tree), method)

    def test_the_torch_method_covers_the_c_abi_call_of_our_stage(self):
        # Library.forward calls fa_forward_v2 (api/fa_capi.cpp), whose checks run in every timed call
        # before the stage does: a change to it changes the torch method's hash, a comment does not.
        self.assertIn("api/fa_capi.cpp", source_hash.method_files("torch", self.tree))
        self.assertIn("api/fa_capi.h", source_hash.method_files("torch", self.tree))
        method = source_hash.method_hash("torch", self.tree)
        abi = os.path.join(self.tree, "api/fa_capi.cpp")
        with open(abi) as handle:
            text = handle.read()
        call = 'return guarded_forward("fa_forward_v2", stage_id, args);'
        self.assertIn(call, text)
        with open(abi, "w") as handle:
            handle.write(text.replace(call, "// a comment\n  " + call, 1))
        self.assertEqual(source_hash.method_hash("torch", self.tree), method)
        with open(abi, "w") as handle:
            handle.write(text.replace(call, "cudaDeviceSynchronize();\n  " + call, 1))
        self.assertNotEqual(source_hash.method_hash("torch", self.tree), method)

    def test_a_restamp_carries_only_the_kinds_whose_method_is_unchanged(self):
        self.assertEqual({source_hash.METHOD_OF_KIND[k] for k in ("results", "memory")}, {"cpp"})
        self.assertEqual({source_hash.METHOD_OF_KIND[k] for k in ("torch", "torch_graph")}, {"torch"})
        self.assertEqual(set(source_hash.METHOD_OF_KIND), {k for k, kind in data.KINDS.items()
                                                           if kind.schema_kind == "results"})

    def test_the_method_hashes_of_other_commits_follow_this_trees_methods(self):
        # own_hashes caches a commit's method (and code) hashes by the version of the source_hash
        # module that computed them: values an older METHODS gave are never read back for a newer one
        # (they once shared the commit's cache file, where they were read back whatever METHODS said).
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        work = self.temporary.name
        stale = {"method:torch": "0" * 16, "code:04_online_softmax": "1" * 16}

        def write(name, hashes):  # a cache file of restamp's work folder, as it writes them
            os.makedirs(os.path.join(work, "hashes"), exist_ok=True)
            with open(os.path.join(work, "hashes", name), "w") as handle:
                handle.writelines(f"{k} {v}\n" for k, v in hashes.items())

        write(commit, {"04_online_softmax": "2" * 16, **stale})
        hashes = restamp.own_hashes(commit, work)
        self.assertEqual(hashes["04_online_softmax"], "2" * 16)  # the commit's own hashes: from the cache
        exported = os.path.join(work, "exported")
        restamp.export_commit(commit, exported)
        self.assertEqual(hashes["method:torch"], source_hash.method_hash("torch", exported))
        self.assertNotEqual(hashes["code:04_online_softmax"], "1" * 16)
        write(f"{commit}.{restamp._scope_version()}", stale)
        self.assertEqual(restamp.own_hashes(commit, work)["method:torch"], "0" * 16)  # this version's cache

    def test_an_fstring_is_one_token_whatever_the_python(self):
        # Python 3.12 splits f-strings into parts; the hash must not depend on which Python computes it
        # (the GPU machine's 3.12 once gave the torch method another hash than CI's 3.11).
        text = 'label = f"{name!r:>6} {value:.3f} {f\'{inner}\'}"  # comment\n'
        self.assertEqual(source_hash.normalize_python(text),
                         'label = f"{name!r:>6} {value:.3f} {f\'{inner}\'}" NEWLINE')

    def test_the_nvcc_version_is_part_of_the_hash(self):
        self.assertNotEqual(source_hash.stage_hash("04_online_softmax", self.tree, "13.0.88"),
                            source_hash.stage_hash("04_online_softmax", self.tree, "13.1.0"))


if __name__ == "__main__":
    unittest.main()
