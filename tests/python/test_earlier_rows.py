"""scripts/lib/earlier_rows.sh, gpu_suite.sh's keeping of rows across calls into one OUTDIR: a data
phase's rows go over the earlier ones, and a phase cut short by a call's time limit loses neither."""

import os
import subprocess
import tempfile
import unittest

from _support import REPO, result_row
from fa_course.bench import data
from fa_course.bench import results

LIBRARY = os.path.join(REPO, "scripts", "lib", "earlier_rows.sh")


def row(stage, ms, q_seq):
    return result_row(stage, ms, Nq=q_seq)


class EarlierRows(unittest.TestCase):
    def setUp(self):
        temporary = tempfile.TemporaryDirectory()
        self.addCleanup(temporary.cleanup)
        self.out = temporary.name
        os.makedirs(os.path.join(self.out, "data"))
        os.makedirs(os.path.join(self.out, "logs"))

    def call(self, *steps):
        """One gpu_suite.sh call's handling of the rows: the library's functions, in order, in bash."""
        script = f'out={self.out}; note() {{ echo "$*"; }}; source {LIBRARY}; ' + "; ".join(steps)
        environment = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        finished = subprocess.run(["bash", "-c", script], env=environment, capture_output=True, text=True)
        self.assertEqual(finished.returncode, 0, finished.stdout + finished.stderr)
        return finished.stdout

    def write_torch(self, rows):
        results.write_results(os.path.join(self.out, "data", "torch.csv"), rows)

    def torch_rows(self):
        return {(r["stage"], r["Nq"]): r["ms_median"] for r in data.load(os.path.join(self.out, "data"))["torch"]}

    def test_a_phase_puts_its_rows_over_the_earlier_ones(self):
        self.write_torch([row("10_overlap", 1.0, 4096), row("torch_cudnn", 1.1, 4096)])
        self.call("set_aside_earlier_rows torch")
        self.write_torch([row("13_wgmma_backward", 2.0, 4096), row("torch_cudnn", 1.2, 4096)])
        self.call("merge_earlier_rows torch")
        self.assertEqual(self.torch_rows(), {("10_overlap", "4096"): "1", ("13_wgmma_backward", "4096"): "2",
                                             ("torch_cudnn", "4096"): "1.2"})
        self.assertFalse(os.path.exists(os.path.join(self.out, "earlier")))

    def test_a_phase_cut_short_loses_neither_its_rows_nor_the_earlier_ones(self):
        # call 1: stage 10's rows, then a torch phase cut short after one row (no merge at its end)
        self.write_torch([row("10_overlap", 1.0, 4096), row("10_overlap", 3.0, 8192)])
        self.call("set_aside_earlier_rows torch")
        self.write_torch([row("13_wgmma_backward", 2.5, 4096)])
        # call 2: the cut phase's rows are merged first, then the phase runs again and ends
        said = self.call("finish_cut_phases", "set_aside_earlier_rows torch")
        self.assertIn("merged first: torch.csv", said)
        self.write_torch([row("13_wgmma_backward", 2.0, 4096), row("13_wgmma_backward", 6.0, 8192)])
        self.call("merge_earlier_rows torch")
        self.assertEqual(self.torch_rows(), {("10_overlap", "4096"): "1", ("10_overlap", "8192"): "3",
                                             ("13_wgmma_backward", "4096"): "2", ("13_wgmma_backward", "8192"): "6"})

    def test_nothing_cut_short_nothing_said(self):
        self.assertEqual(self.call("finish_cut_phases"), "")


if __name__ == "__main__":
    unittest.main()
