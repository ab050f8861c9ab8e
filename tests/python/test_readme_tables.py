"""fa_course.bench.readme_tables: the measured table of a stage README, written from a data folder
(scripts/make_tables.py). Synthetic rows, each ratio computed here from the times written."""

import tempfile
import unittest
from pathlib import Path

import _support
from fa_course import Problem
from fa_course.bench import readme_tables, results

README = """# Stage

| not | measured |
|---|---|
| before | the heading |

## Measured

Some words.

| old | table |
|---|---|
| 1 | 2 |

After the table.

| a second | table |
|---|---|

## What limits it
"""


class Rewrite(unittest.TestCase):
    def test_only_the_first_table_under_measured_is_replaced(self):
        text = readme_tables.rewrite(README, ["| new |", "|---|"])
        self.assertIn("| not | measured |\n|---|---|\n| before | the heading |", text)
        self.assertIn("Some words.\n\n| new |\n|---|\n\nAfter the table.", text)
        self.assertIn("| a second | table |", text)
        self.assertNotIn("| old | table |", text)

    def test_a_readme_without_the_heading_or_its_table_is_refused(self):
        with self.assertRaisesRegex(ValueError, "no '## Measured' heading"):
            readme_tables.rewrite("# Stage\n\n| a |\n", ["| new |"])
        with self.assertRaisesRegex(ValueError, "no table under '## Measured'"):
            readme_tables.rewrite("## Measured\n\nwords\n\n## Next\n\n| a |\n", ["| new |"])


def torch_row(stage, problem, dtype, ms, tflops, status="ok"):
    return _support.result_row(stage, ms, dtype=dtype, tflops=tflops, status=status, **problem.row_fields())


class Stage10Sweep(unittest.TestCase):
    """Each ratio is the peer's time over stage 10's; TFLOP/s to one decimal."""

    def test_the_sweep_from_rows(self):
        sweep = [Problem.square(16384 // n, 16, n, 128) for n in (512, 1024, 2048, 4096, 8192, 16384)]
        rows = []
        for i, problem in enumerate(sweep):
            ours_ms = 1.0 + i
            for dtype in ("fp16", "bf16"):
                rows.append(torch_row("10_overlap", problem, dtype, ours_ms, 600.04 + i if dtype == "fp16" else 700.06))
            rows.append(torch_row("10_overlap", problem.with_causal(True), "fp16", ours_ms / 2, 1.0))
            rows.append(torch_row("torch_cudnn", problem, "fp16", ours_ms * 1.25, 1.0))
            rows.append(torch_row("torch_cudnn", problem.with_causal(True), "fp16", ours_ms / 2 * 0.5, 1.0))
            rows.append(torch_row("torch_flash", problem, "fp16", ours_ms * 2, 1.0))
        with tempfile.TemporaryDirectory() as folder:
            results.write_csv(Path(folder) / "torch.csv", rows)
            lines = readme_tables.stage10(Path(folder))
        self.assertEqual(lines[0], "| N | 512 | 1024 | 2048 | 4096 | 8192 | 16384 |")
        self.assertEqual(lines[2], "| 10, FP16 | 600.0 | 601.0 | 602.0 | 603.0 | 604.0 | 605.0 |")
        self.assertEqual(lines[3], "| 10, BF16 | " + " | ".join(["700.1"] * 6) + " |")
        self.assertEqual(lines[4], "| over cuDNN, FP16 | " + " | ".join(["1.25"] * 6) + " |")
        self.assertEqual(lines[5], "| over cuDNN, causal FP16 | " + " | ".join(["0.50"] * 6) + " |")
        self.assertEqual(lines[6], "| over PyTorch flash, FP16 | " + " | ".join(["2.00"] * 6) + " |")
        self.assertEqual(len(lines), 7)

    def test_a_missing_or_failed_row_is_named(self):
        problem = Problem.square(32, 16, 512, 128)
        with tempfile.TemporaryDirectory() as folder:
            results.write_csv(Path(folder) / "torch.csv", [torch_row("10_overlap", problem, "fp16", 1.0, 1.0,
                                                                     status="oom")])
            with self.assertRaisesRegex(ValueError, r"torch.csv has no ok row of 10_overlap at \(32, 16, 512, 128\), "
                                                    r"fp16, fwd"):
                readme_tables.stage10(Path(folder))


class CommittedReadmes(unittest.TestCase):
    def test_every_generated_readme_has_its_table_in_the_data(self):
        generated = readme_tables.stage_readmes(Path(_support.REPO))
        self.assertEqual(set(generated), {f"stages/{stage}/README.md" for stage in readme_tables.TABLES})


if __name__ == "__main__":
    unittest.main()
