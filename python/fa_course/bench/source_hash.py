"""The source_hash of the results CSVs (DESIGN.md, "Results CSV"): which code produced a row, blind to
comments and whitespace. scripts/source_hash.py is its command (CMake, the GPU suite and the
maintainers call it); fa_course.bench.data and scripts/restamp import it.

A stage's hash covers what decides its rows, and nothing else:
  - its code: the .cu/.cpp files of stages/<stage> and of the stages it links
    (target_link_libraries(... fa_stage_<ID>)), and everything they include from the tree,
    transitively (every #include "..."/<...> that resolves to a file of the stage folders or of
    common/include, whatever #if surrounds it: a superset of what the compiler reads); for each
    common/include/fa/X header in that closure, common/src/X.cpp and its own closure; and what
    the generated main of its executable (STAGE_MAIN) includes;
  - the CMake files and presets that set its flags (FLAG_FILES, the stages' CMakeLists.txt);
  - the nvcc version (given, else `nvcc --version` of $CUDACXX, PATH or /usr/local/cuda);
  - the method hashes of the code that times and checks (METHODS): "cpp" (the C++ runner, timing,
    metrics, inputs, reference, report: results.csv, memory.csv) and "torch" (the torch runner, its
    GPU timing and the call of our stage through the C ABI, Python and C sides: torch.csv,
    torch_graph.csv, fp8.csv). A changed method changes every stage's hash; a
    restamp (scripts/restamp) carries a kind's rows over only when that kind's method is unchanged.
So renaming a local in common/src/cli.cpp changes no stage's hash, while a changed flag, nvcc or
timing method does. A change that leaves the machine code identical is carried over by
scripts/restamp (plots/data/<gpu>/restamps.csv), proved on the compiled objects.

Each file is normalized: C/C++/CUDA lose comments (// to the end of the line, /* ... */; a small
tokenizer knows string, character and raw string literals), CMake files (CMakeLists.txt, *.cmake,
*.cmake.in) their # and #[[ ]] comments outside quoted and bracket arguments, then every
whitespace character outside literals is dropped (a string's text is code: "a b" and "ab" stay
different); Python files (methods) are compared as tokens without comments and docstrings. The
hash is the first 16 hex digits of a sha256 over "path NUL normalized-content NUL" per file in
byte order of path, then the nvcc version and the method hashes (a method hash covers its files'
contents in METHODS order, not their paths: moving a file keeps it).

Python 3 standard library only, and self-contained (no import of the package): the command loads
this file alone, so CMake's call at every build neither needs nor imports PyTorch. Every function
takes the root of the source tree it hashes.
"""

import hashlib
import io
import os
import re
import shutil
import subprocess
import tokenize

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


def _whole_fstrings(text, tokens):
    """The tokens with each f-string as one STRING token of its source text, as Python 3.11 gives it
    (3.12 splits an f-string into FSTRING_START, its parts and FSTRING_END), so that the hash of a
    file does not depend on the Python version that computes it."""
    start_kind = getattr(tokenize, "FSTRING_START", None)
    if start_kind is None:
        return tokens
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    merged, index = [], 0
    while index < len(tokens):
        token = tokens[index]
        if token.type != start_kind:
            merged.append(token)
            index += 1
            continue
        depth, end = 0, index
        while True:
            if tokens[end].type == start_kind:
                depth += 1
            elif tokens[end].type == tokenize.FSTRING_END:
                depth -= 1
                if depth == 0:
                    break
            end += 1
        first, last = token.start, tokens[end].end
        source = text[offsets[first[0] - 1] + first[1]:offsets[last[0] - 1] + last[1]]
        merged.append(tokenize.TokenInfo(tokenize.STRING, source, first, last, token.line))
        index = end + 1
    return merged


def normalize_python(text):
    """Python as its tokens, without comments, blank lines and docstrings (a string that is a whole
    statement); indentation is kept as INDENT/DEDENT."""
    out = []
    previous = tokenize.NEWLINE
    tokens = _whole_fstrings(text, list(tokenize.generate_tokens(io.StringIO(text).readline)))
    for index, token in enumerate(tokens):
        kind = token.type
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        following = tokens[index + 1].type if index + 1 < len(tokens) else tokenize.ENDMARKER
        if (kind == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
                and following in (tokenize.NEWLINE, tokenize.ENDMARKER)):
            continue  # a docstring
        if kind == tokenize.NEWLINE and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue  # the end of a dropped docstring's line
        out.append(tokenize.tok_name[kind] if kind in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE)
                   else token.string)
        previous = kind
    return " ".join(out)


def normalize(path, text):
    if path.endswith(".py"):
        return normalize_python(text)
    return normalize_cmake(text) if is_cmake(path) else normalize_c(text)


def read_text(path):
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
        return handle.read()


def source_files(root, folders):
    """The files under `folders` (relative to root) with a C/C++/CUDA/CMake suffix, as sorted
    relative paths with / (what --tree hashes)."""
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


def hash_files(root, paths, extra=()):
    """sha256 over "path NUL normalized NUL" per file (byte order of path), then the `extra` strings."""
    digest = hashlib.sha256()
    for path in sorted(set(paths), key=lambda p: p.encode()):
        digest.update(path.encode() + b"\0")
        digest.update(normalize(path, read_text(os.path.join(root, path))).encode("utf-8", errors="surrogateescape") + b"\0")
    for value in extra:
        digest.update(value.encode() + b"\0")
    return digest.hexdigest()[:LENGTH]


def hash_folders(root, folders):
    return hash_files(root, source_files(root, folders))


# ---- what a stage's rows depend on ----

LINK_CALL = re.compile(r"target_link_libraries\s*\(([^)]*)\)")
STAGE_LIBRARY = re.compile(r"^fa_stage_([0-9][0-9]_\w+)$")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)
# The CMake files and presets that set a stage's flags (besides the stages' own CMakeLists.txt).
STAGE_MAIN = "cmake/stage_main.cpp.in"  # every stage executable's main (cmake/Stage.cmake)
FLAG_FILES = ("CMakeLists.txt", "CMakePresets.json", "cmake/CudaArchitectures.cmake", "cmake/Warnings.cmake",
              "cmake/Stage.cmake", STAGE_MAIN, "common/CMakeLists.txt", "stages/CMakeLists.txt")
# Headers the build generates, by the file they are made from (fa_source_hash.h is the hash itself).
GENERATED = {"fa/stages.hpp": "stages/stages.hpp.in", "fa_source_hash.h": None}
# The code that times and checks, per method, found by file name under its folders (a moved file stays
# found), or by its path there where the name is not unique; the kinds (data files) whose rows each
# method produces. The torch method's timed call of one of our stages runs through capi.py's
# Library.forward and problem.py's Problem.of into the C ABI (api/fa_capi.cpp: the checks of every
# call, then the stage).
METHODS = {
    "cpp": (("common",), ("runner.cpp", "timing.cpp", "metrics.cpp", "inputs.cpp", "reference.cpp", "report.cpp")),
    "torch": (("python", "api"),
              ("torch_runner.py", "torch_gpu.py", "fa_course/capi.py", "problem.py", "fa_capi.cpp", "fa_capi.h")),
}
# fp8.csv (scripts/fp8_peers.py) times and checks with the torch runner's functions (torch_gpu's event
# timing, torch_runner's float64 comparison and its stage and SDPA calls): the torch method.
METHOD_OF_KIND = {"results": "cpp", "memory": "cpp", "torch": "torch", "torch_graph": "torch", "fp8": "torch"}


def stage_dependencies(stage, root):
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
        text = normalize_cmake(read_text(path), keep_whitespace=True)
        for call in LINK_CALL.finditer(text):
            for token in call.group(1).split():
                match = STAGE_LIBRARY.match(token)
                if match and match.group(1) not in found and match.group(1) != stage:
                    if not os.path.isdir(os.path.join(root, "stages", match.group(1))):
                        raise FileNotFoundError(f"source_hash: {current} links {token}, but stages/{match.group(1)} is missing")
                    found.add(match.group(1))
                    pending.append(match.group(1))
    return sorted(found)


def _relative(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def include_closure(root, sources, include_dirs):
    """The files of the tree that `sources` (relative paths) include, transitively, with them: each
    #include resolved as the compiler does (a "..." include first beside its file, then the include
    directories), whatever preprocessor condition surrounds it. Includes that resolve to no file
    here are the toolkit's and the system's (the nvcc version stands for them)."""
    seen, pending = set(), list(sources)
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        text = read_text(os.path.join(root, path))
        for quote, name in INCLUDE.findall(_without_comments(text)):
            if name in GENERATED:
                if GENERATED[name]:
                    pending.append(GENERATED[name])
                continue
            candidates = ([os.path.dirname(path)] if quote == '"' else []) + list(include_dirs)
            for directory in candidates:
                full = os.path.normpath(os.path.join(root, directory, name))
                if os.path.isfile(full):
                    pending.append(_relative(root, full))
                    break
    return seen


def _without_comments(text):
    """C source with its comments blanked (an #include in a comment includes nothing); lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif text[i] == '"':
            end = _skip_quoted(text, i, '"')
            out.append(text[i:end])
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def stage_files(stage, root):
    """The files a stage's hash covers (relative paths, sorted): see the module's docstring."""
    if not stage or "/" in stage or stage.startswith("."):
        raise ValueError(f"source_hash: {stage!r} is not a stage folder name (e.g. 04_online_softmax)")
    if not os.path.isdir(os.path.join(root, "stages", stage)):
        raise FileNotFoundError(f"source_hash: {os.path.join(root, 'stages', stage)} is not a folder")
    folders = [f"stages/{s}" for s in [stage] + stage_dependencies(stage, root)]
    sources = []
    for folder in folders:
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith((".cu", ".cpp")):
                sources.append(f"{folder}/{name}")
    include_dirs = folders + ["common/include"]
    closure = include_closure(root, sources, include_dirs)
    # The common/src file that implements each header of common/include the stage's code includes.
    implementations = []
    for path in sorted(closure):
        if path.startswith("common/include/fa/"):
            base = os.path.splitext(os.path.basename(path))[0]
            candidate = f"common/src/{base}.cpp"
            if os.path.isfile(os.path.join(root, candidate)):
                implementations.append(candidate)
    closure |= include_closure(root, implementations, ["common/include"])
    # The stage's executable is also compiled from the generated main, with what it includes.
    if os.path.isfile(os.path.join(root, STAGE_MAIN)):
        closure |= include_closure(root, [STAGE_MAIN], ["common/include"])
    flags = [f"{folder}/CMakeLists.txt" for folder in folders] + list(FLAG_FILES)
    closure |= {f for f in flags if os.path.isfile(os.path.join(root, f))}
    return sorted(closure, key=lambda p: p.encode())


def method_files(method, root):
    """The files of a method (METHODS), in METHODS order: each found by name under its folders (the
    first folder that has it), or by its path there (a name with a slash)."""
    folders, names = METHODS[method]
    found = {}
    for folder in folders:
        for directory, subdirs, files in os.walk(os.path.join(root, folder)):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__")))
            for name in sorted(files):
                path = os.path.relpath(os.path.join(directory, name), os.path.join(root, folder)).replace(os.sep, "/")
                for wanted in names:
                    if wanted not in found and (path == wanted if "/" in wanted else name == wanted):
                        found[wanted] = _relative(root, os.path.join(directory, name))
    missing = [n for n in names if n not in found]
    if missing:
        where = ", ".join(f"{folder}/" for folder in folders)
        raise FileNotFoundError(f"source_hash: method {method}: no {', '.join(missing)} under {where} "
                                f"(update METHODS in python/fa_course/bench/source_hash.py if it moved out)")
    return [found[n] for n in names]


def method_hash(method, root):
    """The hash of a method's files' normalized contents (not their paths) and, for the C++ method,
    the headers of common/include they include."""
    files = method_files(method, root)
    if method == "cpp":
        headers = include_closure(root, files, ["common/include"]) - set(files)
        files = files + sorted(headers, key=lambda p: p.encode())
    digest = hashlib.sha256(f"method {method}\0".encode())
    for path in files:
        digest.update(normalize(path, read_text(os.path.join(root, path))).encode("utf-8", errors="surrogateescape") + b"\0")
    return digest.hexdigest()[:LENGTH]


NVCC_RELEASE = re.compile(r"\bV(\d+\.\d+\.\d+)\b")


def nvcc_version(explicit=None):
    """The version of the nvcc that builds the stages, as CMake writes it (13.0.88): `explicit`,
    else $FA_NVCC_VERSION, else `nvcc --version` of $CUDACXX, PATH or /usr/local/cuda/bin."""
    if explicit:
        return explicit
    if os.environ.get("FA_NVCC_VERSION"):
        return os.environ["FA_NVCC_VERSION"]
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate):
            try:
                text = subprocess.run([candidate, "--version"], capture_output=True, text=True, check=True).stdout
            except (OSError, subprocess.CalledProcessError):
                continue
            match = NVCC_RELEASE.search(text)
            if match:
                return match.group(1)
    raise FileNotFoundError("source_hash: no nvcc found ($CUDACXX, PATH, /usr/local/cuda/bin): a stage's hash "
                            "includes the nvcc version; give it with --nvcc-version or FA_NVCC_VERSION")


def stage_hash(stage, root, nvcc=None):
    """The source_hash a stage's rows carry: its files (stage_files), the nvcc version and the
    method hashes (module docstring)."""
    extra = ["nvcc " + nvcc_version(nvcc)] + [f"method {m} {method_hash(m, root)}" for m in sorted(METHODS)]
    return hash_files(root, stage_files(stage, root), ["source_hash v2"] + extra)


def tree_hash(root):
    """The source_hash of stages/ and common/ (what env.txt records as the tree's hash)."""
    return hash_folders(root, ["stages", "common"])


def stages(root):
    """The stage folders of the tree (NN_name), in course order."""
    folder = os.path.join(root, "stages")
    return sorted(s for s in os.listdir(folder) if re.match(r"^[0-9][0-9]_", s) and
                  os.path.isdir(os.path.join(folder, s)))


def compiler_dependencies(build):
    """{object (relative to the build folder): [the files it was compiled from, absolute]} as the
    compiler reported them: Ninja's log of the depfiles (ninja -t deps), else the *.d files a
    Makefile build keeps."""
    found = {}
    if os.path.exists(os.path.join(build, "build.ninja")):
        text = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True, check=True).stdout
        current = None
        for line in text.splitlines():
            if line and not line[0].isspace() and ": #deps" in line:
                current = line.split(": #deps")[0]
                found[current] = []
            elif line.strip() and current:
                found[current].append(os.path.normpath(os.path.join(build, line.strip())))
    else:
        for directory, _, names in os.walk(build):
            for name in (n for n in names if n.endswith(".d")):
                with open(os.path.join(directory, name)) as handle:
                    body = handle.read().replace("\\\n", " ")
                target, _, files = body.partition(": ")
                found[os.path.relpath(os.path.join(directory, name[:-2]), build)] = [
                    os.path.normpath(os.path.join(build, f)) for f in files.split()]
    return found


def check_dependencies(build, root):
    """The files the compiler read for each stage's objects (stages/<stage>/ of the build) that its
    hash does not cover: [] when stage_files() holds every file of the tree the compiler read."""
    missing = []
    dependencies = compiler_dependencies(build)
    if not dependencies:
        raise FileNotFoundError(f"source_hash: no compiler dependency information in {build} (build it first)")
    # The runner's code reaches every stage's executable through its generated main; the cpp method
    # hash, part of every stage's hash, covers those files and the headers they include.
    method = method_files("cpp", root)
    method_covered = set(method) | include_closure(root, method, ["common/include"])
    for stage in stages(root):
        covered = set(stage_files(stage, root)) | method_covered
        for target, files in sorted(dependencies.items()):
            if not target.replace(os.sep, "/").startswith(f"stages/{stage}/"):
                continue
            for path in files:
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                if relative.startswith(("stages/", "common/")) and relative not in covered:
                    missing.append(f"{stage}: {target} was compiled from {relative}")
    return missing


def write_header(output, stage, root, nvcc=None):
    """Writes the C header with FA_SOURCE_HASH, only when its text changed (nothing rebuilds
    needlessly). Returns the hash."""
    value = stage_hash(stage, root, nvcc)
    content = ("// Generated by scripts/source_hash.py: the source_hash of stages/%s (its code, flags, nvcc, methods).\n"
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
