#!/usr/bin/env python3
"""The source_hash of a stage: which code produced a results row (python/fa_course/bench/source_hash.py
says what it covers and how files are normalized).

  scripts/source_hash.py 04_online_softmax        # the hash a row of 04_online_softmax carries
  scripts/source_hash.py --all                    # 'STAGE HASH' for every stage folder
  scripts/source_hash.py --files 12_split_kv      # the files that hash covers
  scripts/source_hash.py --method torch           # the method hash of the torch kinds
  scripts/source_hash.py --tree                   # hash of stages/ + common/ (env.txt records it)
  scripts/source_hash.py --header OUT --stage 04_online_softmax [--nvcc-version 13.0.88]
                                                  # writes OUT = #define FA_SOURCE_HASH "..." (CMake)
  scripts/source_hash.py --normalized FILE        # the text that is hashed for FILE (debugging)
  scripts/source_hash.py --check-build BUILD      # every file the compiler read for a stage is in its hash
  --root DIR                                      # another tree than this script's repository

Python 3 standard library only: CMake runs it at every build, the GPU suite on an offline machine.
It loads the hash's module from this checkout's package by its path, without importing the package
(whose op imports PyTorch where it is installed).
"""

import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_library():
    path = os.path.join(ROOT, "python", "fa_course", "bench", "source_hash.py")
    spec = importlib.util.spec_from_file_location("fa_course_source_hash", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


source_hash = load_library()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage_arg", nargs="?", metavar="STAGE", help="stage folder name, e.g. 04_online_softmax")
    parser.add_argument("--tree", action="store_true", help="hash stages/ and common/")
    parser.add_argument("--header", metavar="OUT", help="write the C header FA_SOURCE_HASH to OUT (needs --stage)")
    parser.add_argument("--stage", help="the stage of --header")
    parser.add_argument("--all", action="store_true", help="print 'STAGE HASH' for every stage folder")
    parser.add_argument("--files", action="store_true", help="print the files STAGE's hash covers")
    parser.add_argument("--method", choices=sorted(source_hash.METHODS), help="print a method's hash (--files: its files)")
    parser.add_argument("--nvcc-version", help="the nvcc version (default: ask nvcc)")
    parser.add_argument("--normalized", metavar="FILE", help="print FILE as it is hashed")
    parser.add_argument("--check-build", metavar="BUILD", help="fail unless every file of the tree the compiler "
                        "read for a stage's objects in BUILD is in the stage's hash")
    parser.add_argument("--root", default=ROOT, help="the repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    stage = args.stage or args.stage_arg
    try:
        if args.normalized:
            print(source_hash.normalize(args.normalized, source_hash.read_text(args.normalized)))
        elif args.check_build:
            missing = source_hash.check_dependencies(os.path.abspath(args.check_build), root)
            for line in missing:
                print(f"not in the stage's hash: {line}")
            if missing:
                return 1
            print(f"every file the compiler read for the stages' objects in {args.check_build} is in their hashes")
        elif args.header:
            if not stage:
                parser.error("--header needs --stage STAGE")
            source_hash.write_header(args.header, stage, root, args.nvcc_version)
        elif args.tree:
            print(source_hash.tree_hash(root))
        elif args.method:
            files = source_hash.method_files(args.method, root)
            print("\n".join(files) if args.files else source_hash.method_hash(args.method, root))
        elif args.all:
            for name in source_hash.stages(root):
                print(name, source_hash.stage_hash(name, root, args.nvcc_version))
        elif stage and args.files:
            print("\n".join(source_hash.stage_files(stage, root)))
        elif stage:
            print(source_hash.stage_hash(stage, root, args.nvcc_version))
        else:
            parser.error("give a STAGE, --all, --files STAGE, --method M, --tree, --header OUT --stage STAGE "
                         "or --normalized FILE")
    except (OSError, ValueError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
