#!/usr/bin/env python3
"""design.md's source_hash: which code produced a results row, blind to comments and whitespace.

  scripts/source_hash.py 04_online_softmax        # hash of stages/04_online_softmax + common/
  scripts/source_hash.py 12_split_kv              # stages/12_split_kv + the stages it links (08) + common/
  scripts/source_hash.py --tree                   # hash of stages/ + common/ (env.txt records it)
  scripts/source_hash.py --header OUT --stage 04_online_softmax
                                                  # writes OUT = #define FA_SOURCE_HASH "..." (CMake)
  scripts/source_hash.py --normalized FILE        # the text that is hashed for FILE (debugging)
  --root DIR                                      # another tree than this script's repository

Files: *.cu *.cuh *.cpp *.hpp *.h CMakeLists.txt *.cmake *.in under those folders, in byte order of
their path relative to the root. Each is normalized: C/C++ comments (// to the end of the line,
/* ... */) are dropped by a small tokenizer that knows string, character and raw string literals,
CMake files (CMakeLists.txt, *.cmake, *.cmake.in) lose their # and #[[ ]] comments outside quoted
and bracket arguments, then every whitespace character outside literals is removed (a string's
text is code: "a b" and "ab" stay different). The hash is the first 16 hex digits of the sha256
over "path NUL normalized-content NUL" for every file. So a corrected comment or a reindented
block keeps the hash, and data measured before it stay current; any changed token changes it.

Python 3 standard library only: CMake, the GPU suite, python/fa_course/data.py and the notebooks
all call this one file.
"""

import argparse
import hashlib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUFFIXES = (".cu", ".cuh", ".cpp", ".hpp", ".h", ".cmake", ".in")
NAMES = ("CMakeLists.txt",)
LENGTH = 16


def is_cmake(path):
    name = os.path.basename(path)
    return name == "CMakeLists.txt" or name.endswith((".cmake", ".cmake.in"))


def _skip_quoted(text, i, quote):
    """Index just past the literal that opens with `quote` at text[i] (backslash escapes; an
    unterminated literal ends at the end of its line, as the compiler would complain)."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            return j + 1
        if c == "\n" and quote == "'":
            return j
        j += 1
    return n


_RAW_OPEN = re.compile(r'R"([^()\\\s]{0,16})\(')
_IDENT = re.compile(r"[A-Za-z0-9_]")


def normalize_c(text):
    """C, C++ and CUDA source without comments and without whitespace outside literals."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            # To the end of the line; a backslash before the newline continues the comment.
            j = i
            while True:
                end = text.find("\n", j)
                if end < 0:
                    i = n
                    break
                if text[j:end].rstrip("\r").endswith("\\"):
                    j = end + 1
                    continue
                i = end
                break
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if c == '"':
            # A raw string R"d( ... )d" (with an optional u8/u/U/L prefix before the R).
            start = i
            while start > 0 and _IDENT.match(text[start - 1]):
                start -= 1
            if text[start:i] in ("R", "u8R", "uR", "UR", "LR"):
                match = _RAW_OPEN.match(text, i - 1)
                if match:
                    closing = ")" + match.group(1) + '"'
                    end = text.find(closing, match.end())
                    end = n if end < 0 else end + len(closing)
                    out.append(text[i:end])
                    i = end
                    continue
            end = _skip_quoted(text, i, '"')
            out.append(text[i:end])
            i = end
            continue
        if c == "'":
            end = _skip_quoted(text, i, "'")
            out.append(text[i:end])
            i = end
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            if i == 0 or not _IDENT.match(text[i - 1]):
                # A pp-number, whose ' are C++14 digit separators (1'000'000), not char literals.
                j = i + 1
                while j < n:
                    d = text[j]
                    if _IDENT.match(d) or d in ".'":
                        j += 1
                    elif d in "+-" and text[j - 1] in "eEpP":
                        j += 1
                    else:
                        break
                out.append(text[i:j])
                i = j
                continue
        if c.isspace():
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


_BRACKET_OPEN = re.compile(r"\[(=*)\[")


def normalize_cmake(text, keep_whitespace=False):
    """CMake code without # comments (line and bracket) and, unless keep_whitespace, without
    whitespace outside quoted and bracket arguments."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            match = _BRACKET_OPEN.match(text, i + 1)
            if match:  # #[[ ... ]] or #[==[ ... ]==]
                closing = "]" + match.group(1) + "]"
                end = text.find(closing, match.end())
                i = n if end < 0 else end + len(closing)
            else:
                end = text.find("\n", i)
                i = n if end < 0 else end
            continue
        if c == '"':
            end = _skip_quoted(text, i, '"')
            out.append(text[i:end])
            i = end
            continue
        if c == "[":
            match = _BRACKET_OPEN.match(text, i)
            if match:  # a bracket argument [[ ... ]], kept as it is
                closing = "]" + match.group(1) + "]"
                end = text.find(closing, match.end())
                end = n if end < 0 else end + len(closing)
                out.append(text[i:end])
                i = end
                continue
        if c == "\\" and i + 1 < n:  # an escaped character (\# \" \ ) is kept with its escape
            out.append(text[i:i + 2])
            i += 2
            continue
        if c.isspace() and not keep_whitespace:
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def normalize(path, text):
    return normalize_cmake(text) if is_cmake(path) else normalize_c(text)


def source_files(root, folders):
    """The hashed files under `folders` (relative to root), as sorted relative paths with /."""
    paths = []
    for folder in folders:
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            raise FileNotFoundError(f"source_hash: {top} is not a folder")
        for directory, subdirs, names in os.walk(top):
            subdirs.sort()
            for name in names:
                full = os.path.join(directory, name)
                if (name in NAMES or name.endswith(SUFFIXES)) and os.path.isfile(full):
                    paths.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(set(paths), key=lambda p: p.encode())


def hash_folders(root, folders):
    digest = hashlib.sha256()
    for path in source_files(root, folders):
        with open(os.path.join(root, path), encoding="utf-8", errors="surrogateescape", newline="") as handle:
            text = handle.read()
        digest.update(path.encode() + b"\0")
        digest.update(normalize(path, text).encode("utf-8", errors="surrogateescape") + b"\0")
    return digest.hexdigest()[:LENGTH]


LINK_CALL = re.compile(r"target_link_libraries\s*\(([^)]*)\)")
STAGE_LIBRARY = re.compile(r"^fa_stage_([0-9][0-9]_\w+)$")


def stage_dependencies(stage, root=ROOT):
    """The stages whose libraries stages/<stage> links (target_link_libraries(... fa_stage_<ID>) in
    its CMakeLists.txt), and theirs, sorted: their kernels run in this stage's rows (stage 12 hands
    prefill shapes to stage 08's, stage 11's forward is stage 08's), so their code is part of the
    stage's hash."""
    found = set()
    pending = [stage]
    while pending:
        current = pending.pop()
        path = os.path.join(root, "stages", current, "CMakeLists.txt")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            text = normalize_cmake(handle.read(), keep_whitespace=True)
        for call in LINK_CALL.finditer(text):
            for token in call.group(1).split():
                match = STAGE_LIBRARY.match(token)
                if match and match.group(1) not in found and match.group(1) != stage:
                    if not os.path.isdir(os.path.join(root, "stages", match.group(1))):
                        raise FileNotFoundError(f"source_hash: {current} links {token}, but stages/{match.group(1)} is missing")
                    found.add(match.group(1))
                    pending.append(match.group(1))
    return sorted(found)


def stage_hash(stage, root=ROOT):
    """The source_hash of stages/<stage>, the stages it links (stage_dependencies) and common/: the
    hash a stage's results rows carry."""
    if not stage or "/" in stage or stage.startswith("."):
        raise ValueError(f"source_hash: {stage!r} is not a stage folder name (e.g. 04_online_softmax)")
    folders = [f"stages/{stage}"] + [f"stages/{dependency}" for dependency in stage_dependencies(stage, root)]
    return hash_folders(root, folders + ["common"])


def tree_hash(root=ROOT):
    """The source_hash of stages/ and common/ (what env.txt records as the tree's hash)."""
    return hash_folders(root, ["stages", "common"])


def stages(root=ROOT):
    """The stage folders of the tree (NN_name), in course order."""
    folder = os.path.join(root, "stages")
    return sorted(s for s in os.listdir(folder) if re.match(r"^[0-9][0-9]_", s) and
                  os.path.isdir(os.path.join(folder, s)))


def write_header(output, stage, root=ROOT):
    """Writes the C header with FA_SOURCE_HASH, only when its text changed (nothing rebuilds
    needlessly). Returns the hash."""
    value = stage_hash(stage, root)
    content = ("// Generated by scripts/source_hash.py: the source_hash of stages/%s, the stages it links and common/.\n"
               "#pragma once\n#define FA_SOURCE_HASH \"%s\"\n" % (stage, value))
    try:
        with open(output) as handle:
            if handle.read() == content:
                return value
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    temporary = output + ".tmp"
    with open(temporary, "w") as handle:
        handle.write(content)
    os.replace(temporary, output)
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage_arg", nargs="?", metavar="STAGE", help="stage folder name, e.g. 04_online_softmax")
    parser.add_argument("--tree", action="store_true", help="hash stages/ and common/")
    parser.add_argument("--header", metavar="OUT", help="write the C header FA_SOURCE_HASH to OUT (needs --stage)")
    parser.add_argument("--stage", help="the stage of --header")
    parser.add_argument("--all", action="store_true", help="print 'STAGE HASH' for every stage folder")
    parser.add_argument("--normalized", metavar="FILE", help="print FILE as it is hashed")
    parser.add_argument("--root", default=ROOT, help="the repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    try:
        if args.normalized:
            with open(args.normalized, encoding="utf-8", errors="surrogateescape", newline="") as handle:
                print(normalize(args.normalized, handle.read()))
        elif args.header:
            stage = args.stage or args.stage_arg
            if not stage:
                parser.error("--header needs --stage STAGE")
            write_header(args.header, stage, root)
        elif args.tree:
            print(tree_hash(root))
        elif args.all:
            for stage in stages(root):
                print(stage, stage_hash(stage, root))
        elif args.stage_arg or args.stage:
            print(stage_hash(args.stage_arg or args.stage, root))
        else:
            parser.error("give a STAGE, --tree, --all, --header OUT --stage STAGE or --normalized FILE")
    except (OSError, ValueError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
