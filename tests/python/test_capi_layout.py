"""The ctypes declarations of fa_course.capi against api/fa_capi.h: struct fields (names, order,
types), enum values, and every exported function's prototype. Read from the header's text, so this
needs no build; where a C compiler exists, sizeof and offsetof of every field are compared too."""

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import _support
from fa_course import capi


def header_text():
    with open(_support.HEADER) as handle:
        text = handle.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_structs(text):
    """{name: [(field type, field name)]} of every `typedef struct name { ... } name;`."""
    structs = {}
    for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", text, flags=re.S):
        fields = []
        for declaration in body.split(";"):
            declaration = " ".join(declaration.split())
            if not declaration:
                continue
            match = re.fullmatch(r"(.+?)\s*(\**)\s*(\w+)", declaration)
            fields.append(((match.group(1) + match.group(2)).replace(" *", "*"), match.group(3)))
        structs[name] = fields
    return structs


def header_enums(text):
    """{enum name: {constant: value}}; values are integers or a << b."""
    enums = {}
    for name, body in re.findall(r"enum\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        values = {}
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            constant, expression = (part.strip() for part in item.split("="))
            match = re.fullmatch(r"(\d+)(?:\s*<<\s*(\d+))?", expression)
            values[constant] = int(match.group(1)) << int(match.group(2) or 0)
        enums[name] = values
    return enums


def header_functions(text):
    """{name: (return type, [argument types])} of every FA_CAPI_EXPORT declaration."""
    functions = {}
    for returns, name, arguments in re.findall(r"FA_CAPI_EXPORT\s+([\w\s\*]+?)\s*\b(fa_\w+)\s*\(([^)]*)\)\s*;", text):
        types = []
        arguments = " ".join(arguments.split())
        if arguments and arguments != "void":
            for argument in arguments.split(","):
                match = re.fullmatch(r"\s*(.+?)\s*(\**)\s*(\w+)\s*", argument)
                types.append((match.group(1) + match.group(2)).replace(" *", "*"))
        functions[name] = (" ".join(returns.split()).replace(" *", "*"), types)
    return functions


SCALARS = {"uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "int": ctypes.c_int,
           "double": ctypes.c_double}


def ctypes_of(c_type):
    """The ctypes type a C type maps to (None for void)."""
    c_type = c_type.replace("const ", "").strip()
    if c_type == "void":
        return None
    if c_type in SCALARS:
        return SCALARS[c_type]
    if c_type == "char*":
        return ctypes.c_char_p
    if c_type in ("void*", "float*"):  # the mirrors hold data pointers as addresses, set from ints
        return ctypes.c_void_p
    if c_type.endswith("*") and c_type[:-1] in capi.STRUCTS:
        return ctypes.POINTER(capi.STRUCTS[c_type[:-1]])
    raise AssertionError(f"the test does not know the C type '{c_type}': extend ctypes_of")


class Structs(unittest.TestCase):
    def setUp(self):
        self.structs = header_structs(header_text())

    def test_every_struct_of_the_header_is_mirrored(self):
        self.assertEqual(set(self.structs), set(capi.STRUCTS))

    def test_fields_in_order_with_their_types(self):
        for name, fields in self.structs.items():
            with self.subTest(struct=name):
                mirrored = capi.STRUCTS[name]._fields_
                self.assertEqual([f[1] for f in fields], [f[0] for f in mirrored], "field names or order")
                for (c_type, field), (_, python_type) in zip(fields, mirrored):
                    self.assertIs(ctypes_of(c_type), python_type, f"{name}.{field}: {c_type}")

    def test_every_struct_starts_with_its_size(self):
        for name, fields in self.structs.items():
            self.assertEqual(fields[0], ("uint32_t", "size"), name)


class DocumentedLayout(unittest.TestCase):
    """The sizes the header defines (FA_*_SIZE_V2 .. V4: each struct's newest is its size today) and the
    offsets its comment lists, against ctypes."""

    def test_size_macros(self):
        with open(_support.HEADER) as handle:
            text = handle.read()
        newest = {}
        for macro, version, value in re.findall(r"#define\s+FA_(\w+)_SIZE_V(\d+)\s+(\d+)u?", text):
            if int(version) > newest.get(macro, (0, 0))[0]:
                newest[macro] = (int(version), value)
        sizes = {macro: value for macro, (_, value) in newest.items()}
        self.assertEqual(set(sizes),
                         {"PROBLEM", "FORWARD_ARGS", "BACKWARD_ARGS", "FP8_QUANTIZE_ARGS", "FP8_FORWARD_ARGS"})
        for macro, value in sizes.items():
            self.assertEqual(ctypes.sizeof(capi.STRUCTS["fa_" + macro.lower()]), int(value), macro)

    def test_offsets_of_the_comment(self):
        with open(_support.HEADER) as handle:
            text = handle.read()
        found = 0
        for name, size, fields in re.findall(r"\*\s+(fa_\w+)\s+(\d+) bytes: (.*?)(?=\n\s*\*\s*fa_\w+\s+\d+ bytes|\n\s*\*\s*\n)",
                                             text, flags=re.S):
            structure = capi.STRUCTS[name]
            self.assertEqual(ctypes.sizeof(structure), int(size), name)
            for field, offset in re.findall(r"(\w+) @(\d+)", fields):
                self.assertEqual(getattr(structure, field).offset, int(offset), f"{name}.{field}")
                found += 1
        self.assertGreater(found, 0, "the header's layout comment was not found")


class Enums(unittest.TestCase):
    def test_values(self):
        enums = header_enums(header_text())
        for enum in ("fa_status", "fa_feature", "fa_pass", "fa_dtype", "fa_fp8_v_layout", "fa_fp8_call"):
            self.assertIn(enum, enums)
            for constant, value in enums[enum].items():
                with self.subTest(constant=constant):
                    self.assertEqual(getattr(capi, constant), value)

    def test_status_names_cover_every_status(self):
        statuses = header_enums(header_text())["fa_status"]
        self.assertEqual({v: k for k, v in statuses.items()}, capi.STATUS_NAMES)

    def test_feature_names_cover_every_feature(self):
        features = header_enums(header_text())["fa_feature"]
        self.assertEqual(sorted(features.values()), sorted(capi.FEATURES.values()))
        for name, bit in capi.FEATURES.items():
            self.assertEqual(features["FA_FEATURE_" + name.upper()], bit)


class Functions(unittest.TestCase):
    def test_every_exported_function_has_its_prototype(self):
        functions = header_functions(header_text())
        self.assertIn("fa_forward_v2", functions)
        self.assertEqual(set(functions), set(capi.PROTOTYPES), "functions of the header vs capi.PROTOTYPES")
        for name, (returns, arguments) in functions.items():
            with self.subTest(function=name):
                restype, argtypes = capi.PROTOTYPES[name]
                self.assertIs(ctypes_of(returns), restype, f"return type {returns}")
                self.assertEqual(len(arguments), len(argtypes), "argument count")
                for index, (c_type, python_type) in enumerate(zip(arguments, argtypes)):
                    self.assertIs(ctypes_of(c_type), python_type, f"argument {index}: {c_type}")


class CompiledLayout(unittest.TestCase):
    """sizeof and offsetof as the C compiler sees them, against ctypes."""

    def test_sizes_and_offsets(self):
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            self.skipTest("no C compiler (cc, gcc or clang) to compile the layout probe; the text checks still ran")
        structs = header_structs(header_text())
        lines = ["#include <stddef.h>", "#include <stdio.h>", f'#include "{_support.HEADER}"', "int main(void) {"]
        for name, fields in structs.items():
            lines.append(f'  printf("{name} %zu\\n", sizeof({name}));')
            for _, field in fields:
                lines.append(f'  printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
        lines += ["  return 0;", "}"]
        with tempfile.TemporaryDirectory() as folder:
            source = os.path.join(folder, "probe.c")
            binary = os.path.join(folder, "probe")
            with open(source, "w") as handle:
                handle.write("\n".join(lines) + "\n")
            subprocess.run([compiler, "-std=c99", "-o", binary, source], check=True, capture_output=True)
            output = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
        measured = dict(line.split() for line in output.splitlines())
        for name, structure in capi.STRUCTS.items():
            self.assertEqual(int(measured[name]), ctypes.sizeof(structure), f"sizeof({name})")
            for field, _ in structure._fields_:
                self.assertEqual(int(measured[f"{name}.{field}"]), getattr(structure, field).offset,
                                 f"offsetof({name}, {field})")


if __name__ == "__main__":
    unittest.main()
