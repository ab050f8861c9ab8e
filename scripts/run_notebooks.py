#!/usr/bin/env python3
"""Executes every notebook in notebooks/ headless (nbclient, kernel python3), in memory: the
committed notebooks keep no outputs. Exits non-zero when a notebook raises. The data folder (--data,
else every folder under plots/data/) is checked first (python/fa_course/bench/data.py: one file per kind,
no duplicate key), so an incoherent one fails here with one message instead of inside a notebook.
The notebooks import this checkout's package (python/ first on their PYTHONPATH).

  python3 scripts/run_notebooks.py                      # data: the one folder under plots/data/
  python3 scripts/run_notebooks.py --data DIR --plots /tmp/plots notebooks/memory.ipynb
"""

import argparse
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--data", help="data folder (sets FA_DATA_DIR; default: the one under plots/data/)")
    parser.add_argument("--plots", help="where figures go (sets FA_PLOTS_DIR; default: plots/)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="print each notebook's text output")
    args = parser.parse_args()
    try:
        import nbclient
        import nbformat
    except ImportError as error:
        print(f"run_notebooks: {error}; install the pinned tools: pip install -r requirements.txt", file=sys.stderr)
        return 2
    # The notebooks read the data through this checkout's package (fa_course.bench), here and in
    # their kernels, whatever else the environment has on its path.
    package = os.path.join(ROOT, "python")
    sys.path.insert(0, package)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    from fa_course.bench import data as fa_dataset

    folders = [args.data] if args.data else sorted(
        p for p in glob.glob(os.path.join(ROOT, "plots", "data", "*")) if os.path.isdir(p))
    for folder in folders:
        try:
            fa_dataset.check(folder)
        except fa_dataset.DataError as error:
            print(f"run_notebooks: {error}", file=sys.stderr)
            return 1
    if args.data:
        os.environ["FA_DATA_DIR"] = os.path.abspath(args.data)
    if args.plots:
        os.environ["FA_PLOTS_DIR"] = os.path.abspath(args.plots)
    paths = args.notebooks or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    if not paths:
        print("run_notebooks: no notebooks found", file=sys.stderr)
        return 2
    failed = []
    for path in paths:
        started = time.monotonic()
        notebook = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(notebook, kernel_name="python3", timeout=args.timeout,
                                         resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
        try:
            client.execute()
            status = "ok"
        except nbclient.exceptions.CellExecutionError as error:
            status = "FAILED"
            failed.append(path)
            print(str(error)[-3000:], file=sys.stderr)
        if args.verbose:
            for cell in notebook.cells:
                for output in cell.get("outputs", []):
                    if output.get("output_type") == "stream":
                        print(output["text"], end="")
        print(f"{status:<6} {os.path.relpath(path)} ({time.monotonic() - started:.1f} s)", flush=True)
    print(f"{len(paths) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
