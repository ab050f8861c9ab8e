"""The data folder (python/fa_course/bench/data.py): one file per kind, torch_graph.csv among the kinds."""

import os
import tempfile
import unittest

import _support  # (puts the package on sys.path)
from _support import result_row as row
from fa_course.bench import data
from fa_course.bench import results


class Folder(unittest.TestCase):
    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory()
        self.addCleanup(self.temporary.cleanup)

    def folder(self, name, files):
        """A data folder holding `files` ({file name: rows})."""
        path = os.path.join(self.temporary.name, name)
        os.makedirs(path)
        for file, rows in files.items():
            results.write_results(os.path.join(path, file), rows)
        return path


class GraphTimedRows(Folder):
    """Rows timed as CUDA graph replays (compare_torch.py --timing graph) have a file of their own."""

    def test_check_accepts_torch_graph_beside_torch(self):
        folder = self.folder("run", {"torch.csv": [row("torch_flash", 0.0216)],
                                     "torch_graph.csv": [row("torch_flash", 0.0215, "CUDA graph replay")]})
        self.assertEqual(data.check(folder), {"torch": 1, "torch_graph": 1})

    def test_the_same_key_in_torch_and_torch_graph_is_no_duplicate(self):
        folder = self.folder("run", {"torch.csv": [row("torch_cudnn", 0.0149)],
                                     "torch_graph.csv": [row("torch_cudnn", 0.0143, "CUDA graph replay")]})
        loaded = data.load(folder)
        self.assertEqual([r["ms_median"] for r in loaded["torch"]], ["0.0149"])
        self.assertEqual([r["ms_median"] for r in loaded["torch_graph"]], ["0.0143"])

    def test_merge_carries_graph_rows_and_replaces_by_key(self):
        old = self.folder("old", {"torch.csv": [row("torch_flash", 0.0216)],
                                  "torch_graph.csv": [row("torch_flash", 0.03, "CUDA graph replay"),
                                                      row("torch_flash", 0.05, "CUDA graph replay", Nq=4)]})
        new = self.folder("new", {"torch_graph.csv": [row("torch_flash", 0.0215, "CUDA graph replay"),
                                                      row("12_split_kv", 0.0169, "CUDA graph replay")]})
        summary = data.merge(new, old)
        self.assertEqual(summary, {"torch_graph": (1, 1, 3)})
        graph = {(r["stage"], r["Nq"]): r["ms_median"] for r in data.load(old)["torch_graph"]}
        self.assertEqual(graph, {("torch_flash", "1"): "0.0215", ("torch_flash", "4"): "0.05",
                                 ("12_split_kv", "1"): "0.0169"})
        self.assertEqual([r["ms_median"] for r in data.load(old)["torch"]], ["0.0216"])

    def test_merge_into_an_empty_folder_writes_torch_graph(self):
        new = self.folder("new", {"torch_graph.csv": [row("12_split_kv", 0.0169, "CUDA graph replay")]})
        target = os.path.join(self.temporary.name, "NVIDIA_H200")
        data.merge(new, target)
        self.assertEqual(sorted(os.listdir(target)), ["torch_graph.csv"])

    def test_a_call_numbered_graph_file_is_a_second_file_of_kind_torch_graph(self):
        folder = self.folder("run", {"torch_graph.csv": [row("torch_flash", 0.0215)],
                                     "torch_graph_call2.csv": [row("torch_flash", 0.0214)]})
        with self.assertRaises(data.DataError) as raised:
            data.check(folder)
        self.assertIn("torch_graph_call2.csv: a second file of kind torch_graph", str(raised.exception))

    def test_a_call_numbered_torch_file_is_still_a_second_file_of_kind_torch(self):
        folder = self.folder("run", {"torch.csv": [row("torch_flash", 0.0216)],
                                     "torch_call8.csv": [row("torch_flash", 0.0217)]})
        with self.assertRaisesRegex(data.DataError, "torch_call8.csv: a second file of kind torch "):
            data.check(folder)

    def test_stale_reports_graph_rows_of_our_stages(self):
        folder = self.folder("run", {"torch_graph.csv": [dict(row("12_split_kv", 0.0169), source_hash="0" * 16),
                                                         row("torch_flash", 0.0215)]})
        report = data.stale(folder, root=_support.REPO)
        self.assertEqual([(r["kind"], r["stage"], r["rows"], r["current"]) for r in report],
                         [("torch_graph", "12_split_kv", 1, 0)])


class Fp8Rows(Folder):
    """scripts/fp8_peers.py's rows: fp8.csv, a kind of its own, with cuDNN's FP8 attention a peer."""

    def test_fp8_is_a_kind_with_the_results_header(self):
        folder = self.folder("run", {"fp8.csv": [row("14_fp8/attention", 1.1), row("cudnn_fp8", 1.2)],
                                     "torch.csv": [row("torch_cudnn", 2.0)]})
        self.assertEqual(data.check(folder), {"fp8": 2, "torch": 1})

    def test_the_same_key_in_torch_and_fp8_is_no_duplicate_and_merges_apart(self):
        old = self.folder("old", {"torch.csv": [row("torch_cudnn", 2.0)]})
        new = self.folder("new", {"fp8.csv": [row("torch_cudnn", 2.1), row("10_overlap", 2.2)]})
        self.assertEqual(data.merge(new, old), {"fp8": (0, 2, 2)})
        loaded = data.load(old)
        self.assertEqual([r["ms_median"] for r in loaded["torch"]], ["2"])
        self.assertEqual(sorted(r["stage"] for r in loaded["fp8"]), ["10_overlap", "torch_cudnn"])

    def test_stale_leaves_the_fp8_peer_out(self):
        folder = self.folder("run", {"fp8.csv": [dict(row("14_fp8", 1.0), source_hash="0" * 16),
                                                 row("cudnn_fp8", 1.2)]})
        report = data.stale(folder, root=_support.REPO)
        self.assertEqual([(r["kind"], r["stage"], r["rows"], r["current"]) for r in report], [("fp8", "14_fp8", 1, 0)])


class PeersOfAnotherRun(Folder):
    """merge --keep-peers: a run that measured one stage beside the peers leaves the peers that
    another stage's tables were compared with in its own run."""

    def old_and_new(self):
        old = self.folder("old", {"torch.csv": [row("10_overlap", 1.00), row("torch_cudnn", 1.04)]})
        new = self.folder("new", {"torch.csv": [row("09_wgmma_tma", 1.10), row("torch_cudnn", 1.01),
                                                row("torch_cudnn", 2.00, Nq=4)]})
        return old, new

    def test_a_plain_merge_replaces_the_peer(self):
        old, new = self.old_and_new()
        self.assertEqual(data.merge(new, old), {"torch": (1, 2, 4)})
        peers = {r["Nq"]: r["ms_median"] for r in data.load(old)["torch"] if r["stage"] == "torch_cudnn"}
        self.assertEqual(peers, {"1": "1.01", "4": "2"})

    def test_keep_peers_keeps_the_peer_and_adds_the_rest(self):
        old, new = self.old_and_new()
        self.assertEqual(data.merge(new, old, keep_peers=True), {"torch": (0, 2, 4)})
        rows = {(r["stage"], r["Nq"]): r["ms_median"] for r in data.load(old)["torch"]}
        self.assertEqual(rows, {("10_overlap", "1"): "1", ("torch_cudnn", "1"): "1.04",
                                ("09_wgmma_tma", "1"): "1.1", ("torch_cudnn", "4"): "2"})

    def test_keep_peers_from_the_command_line(self):
        old, new = self.old_and_new()
        self.assertEqual(data.main(["merge", "--keep-peers", new, old]), 0)
        peers = {r["Nq"]: r["ms_median"] for r in data.load(old)["torch"] if r["stage"] == "torch_cudnn"}
        self.assertEqual(peers, {"1": "1.04", "4": "2"})


if __name__ == "__main__":
    unittest.main()
