"""Reading and writing results CSVs: legacy conversion, merge by key, loud failures."""

import glob
import os
import tempfile
import unittest

import _support
from fa_course.bench import results, schema

LEGACY = """stage,gpu,B,H,N,D,dtype,causal,ms_median,ms_min,tflops,gbps,peak_bytes,max_abs_err,rel_l2_err,status,source_hash,note
02_naive_gpu,NVIDIA H200,32,16,512,128,fp32,0,78.3967,78.3064,0.87656,6.84813,1073741824,8.59139e-08,4.11805e-07,ok,8ae897dc0b39097d,
torch_flash,NVIDIA H200,32,16,512,128,bf16,1,0.240832,0.22096,285.342,1114.62,269485056,3.451e-04,2.340e-03,ok,,
02_naive_gpu,NVIDIA H200,1,1,262144,128,fp32,0,,,,,274877906944,,,oom,8ae897dc0b39097d,"1000 bytes free, see ""log"" here"
"""

LEGACY_TRAFFIC = """stage,gpu,B,H,N,D,dtype,dram_read_bytes,dram_write_bytes,l2_bytes,predicted_bytes
02_naive_gpu,NVIDIA H200,4,16,4096,128,fp32,9007722496,8682083072,712371081920,17716740096
"""


class Files(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)

    def path(self, name, text=None):
        path = os.path.join(self.folder.name, name)
        if text is not None:
            with open(path, "w") as handle:
                handle.write(text)
        return path


class Legacy(Files):
    def test_results_are_converted(self):
        rows = results.read_results(self.path("old.csv", LEGACY))
        self.assertEqual(len(rows), 3)
        first = rows[0]
        self.assertEqual(list(first), schema.RESULTS_COLUMNS)
        self.assertEqual((first["B"], first["Hq"], first["Hkv"], first["Nq"], first["Nk"], first["D"]),
                         (32, 16, 16, 512, 512, 128))
        self.assertEqual(first["pass"], "fwd")
        self.assertEqual(first["causal"], 0)
        self.assertEqual(rows[1]["causal"], 1)
        self.assertAlmostEqual(first["ms_median"], 78.3967)
        self.assertEqual(first["peak_bytes"], 1073741824)
        self.assertEqual(first["source_hash"], "8ae897dc0b39097d")
        self.assertIsNone(first["note"])
        self.assertIsNone(rows[2]["ms_median"])
        self.assertEqual(rows[2]["status"], "oom")
        self.assertEqual(rows[2]["note"], '1000 bytes free, see "log" here')

    def test_untyped_rows_keep_the_text(self):
        rows = results.read_results(self.path("old.csv", LEGACY), typed=False)
        self.assertEqual(rows[0]["Hkv"], "16")
        self.assertEqual(rows[0]["ms_median"], "78.3967")
        self.assertEqual(rows[0]["note"], "")

    def test_traffic_is_converted(self):
        rows = results.read_traffic(self.path("traffic.csv", LEGACY_TRAFFIC))
        self.assertEqual(list(rows[0]), schema.TRAFFIC_COLUMNS)
        self.assertEqual((rows[0]["Hq"], rows[0]["Hkv"], rows[0]["Nq"], rows[0]["Nk"], rows[0]["causal"],
                          rows[0]["pass"]), (16, 16, 4096, 4096, 0, "fwd"))
        self.assertEqual(rows[0]["predicted_bytes"], 17716740096)

    def test_kinds(self):
        self.assertEqual(results.csv_kind(self.path("a.csv", LEGACY)), "results")
        self.assertEqual(results.csv_kind(self.path("b.csv", LEGACY_TRAFFIC)), "traffic")
        self.assertEqual(results.csv_kind(self.path("c.csv", "gpu,metric,value,unit\n")), "ceilings")
        self.assertIsNone(results.csv_kind(self.path("d.csv", "x,y\n1,2\n")))

    def test_merge_rewrites_a_legacy_file_in_the_current_schema(self):
        path = self.path("old.csv", LEGACY)
        row = results.make_row(stage="08_mma_registers", gpu="NVIDIA H200", B=1, Hq=32, Hkv=8, Nq=4, Nk=65536, D=128,
                               dtype="fp16", causal=False, status="ok", ms_median=0.0123456789, **{"pass": "fwd"})
        self.assertEqual(results.merge_results(path, [row]), (0, 1))
        self.assertEqual(results.read_header(path), schema.RESULTS_COLUMNS)
        rows = results.read_results(path)
        self.assertEqual(len(rows), 4)
        self.assertEqual(rows[0]["Hq"], 16)
        self.assertEqual(rows[2]["note"], '1000 bytes free, see "log" here')
        self.assertEqual(rows[3]["Nk"], 65536)
        self.assertEqual(rows[3]["causal"], 0)
        self.assertAlmostEqual(rows[3]["ms_median"], 0.0123457)


class Keys(Files):
    def row(self, **fields):
        base = dict(stage="05_float4", gpu="G", B=1, Hq=2, Hkv=2, Nq=64, Nk=64, D=32, dtype="fp32", causal=0,
                    status="ok", ms_median=1.0)
        base["pass"] = "fwd"
        base.update(fields)
        return results.make_row(**base)

    def test_round_trip(self):
        path = self.path("r.csv")
        rows = [self.row(), self.row(causal=True, ms_median=0.5), self.row(Hkv=1, note="a, b")]
        results.write_results(path, rows)
        back = results.read_results(path)
        self.assertEqual([r["causal"] for r in back], [0, 1, 0])
        self.assertEqual([r["Hkv"] for r in back], [2, 2, 1])
        self.assertEqual(back[2]["note"], "a, b")
        self.assertEqual(back[1]["ms_median"], 0.5)

    def test_merge_replaces_the_row_with_the_same_key(self):
        path = self.path("r.csv")
        results.write_results(path, [self.row(), self.row(D=64)])
        replaced, added = results.merge_results(path, [self.row(ms_median=2.0), self.row(Nk=128)])
        self.assertEqual((replaced, added), (1, 1))
        back = results.read_results(path)
        self.assertEqual([(r["D"], r["Nk"], r["ms_median"]) for r in back], [(32, 64, 2.0), (64, 64, 1.0), (32, 128, 1.0)])

    def test_key_values_compare_as_numbers(self):
        path = self.path("r.csv")
        results.write_results(path, [self.row()])
        text_row = {k: ("" if v is None else str(v)) for k, v in self.row(ms_median=3.0).items()}
        self.assertEqual(results.merge_results(path, [text_row]), (1, 0))

    def test_a_duplicate_key_in_a_file_is_an_error(self):
        path = self.path("dup.csv", LEGACY + LEGACY.splitlines()[1] + "\n")
        with self.assertRaises(results.SchemaError):
            results.read_results(path)
        self.assertEqual(len(results.read_results(path, duplicates="last")), 3)

    def test_a_duplicate_key_across_files_is_an_error(self):
        one = self.path("one.csv")
        two = self.path("two.csv")
        results.write_results(one, [self.row()])
        results.write_results(two, [self.row(ms_median=5.0)])
        with self.assertRaises(results.SchemaError):
            results.read_results([one, two])
        self.assertEqual(results.read_results([one, two], duplicates="last")[0]["ms_median"], 5.0)

    def test_writing_a_duplicate_key_is_an_error(self):
        with self.assertRaises(results.SchemaError):
            results.write_results(self.path("w.csv"), [self.row(), self.row()])

    def test_unknown_columns_and_headers_are_refused(self):
        with self.assertRaises(results.SchemaError):
            results.make_row(stage="x", H=3)
        with self.assertRaises(results.SchemaError):
            results.write_results(self.path("w.csv"), [dict(self.row(), extra=1)])
        with self.assertRaises(results.SchemaError):
            results.read_results(self.path("x.csv", "gpu,metric,value,unit\nG,m,1,u\n"))
        with self.assertRaises(results.SchemaError):
            results.write_results(self.path("w.csv"), [self.row(**{"pass": "sideways"})])

    def test_ragged_lines_are_refused(self):
        with self.assertRaises(results.SchemaError):
            results.read_results(self.path("r.csv", LEGACY + "02_naive_gpu,G,1\n"))

    def test_write_is_atomic_and_leaves_no_temporary_files(self):
        path = self.path("r.csv")
        results.write_results(path, [self.row()])
        self.assertEqual(os.listdir(self.folder.name), ["r.csv"])


class RepositoryData(unittest.TestCase):
    def test_every_data_file_of_a_known_kind_reads(self):
        """The data sets in plots/data/ read without error (no duplicate key, no ragged line)."""
        paths = sorted(glob.glob(os.path.join(_support.REPO, "plots", "data", "*", "*.csv")))
        read = 0
        for path in paths:
            kind = results.csv_kind(path)
            if kind is not None:
                with self.subTest(path=os.path.relpath(path, _support.REPO)):
                    results.read_csv(path, kind)
                    read += 1
        if paths:
            self.assertGreater(read, 0, "plots/data has CSV files, none of a known kind")


if __name__ == "__main__":
    unittest.main()
