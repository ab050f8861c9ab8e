"""The repository's rooms: the package loads nothing from scripts/ (scripts import the package, never
the other way round), every citation of the design document names a file and a section that exist,
and the README's "Layout" section lists every top-level folder."""

import ast
import os
import re
import subprocess
import unittest

import _support

PACKAGE = os.path.join(_support.REPO, "python", "fa_course")
DESIGN = os.path.join(_support.REPO, "DESIGN.md")
# A section cited by name: DESIGN.md, "Results CSV", DESIGN.md ("Tests") or DESIGN.md's "Build"
CITED_SECTION = re.compile(r'DESIGN\.md`?(?:,|\'s)?\s*\(?"([^"\n]+)"')
LOWER_CASE_NAME = re.compile(r"\bdesign\.md\b")


def tracked_files():
    """The files git tracks in this checkout (None outside a git checkout)."""
    try:
        listing = subprocess.run(["git", "-C", _support.REPO, "ls-files", "-z"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return [name for name in listing.stdout.decode().split("\0") if name]


def read(path):
    with open(os.path.join(_support.REPO, path), encoding="utf-8", errors="replace") as handle:
        return handle.read()


class Layout(unittest.TestCase):
    def setUp(self):
        self.files = tracked_files()
        if self.files is None:
            self.skipTest("not a git checkout")

    def test_the_package_loads_nothing_from_scripts(self):
        for directory, _, names in os.walk(PACKAGE):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
                named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                         and isinstance(node.value, str) and node.value.strip("/") == "scripts"]
                self.assertEqual(named, [], f"{os.path.relpath(path, _support.REPO)} names the scripts/ folder")

    def test_citations_of_the_design_document_resolve(self):
        with open(DESIGN, encoding="utf-8") as handle:
            headings = {line.lstrip("#").strip().lower() for line in handle if line.startswith("#")}
        for path in self.files:
            if path.startswith("plots/data/") or not os.path.isfile(os.path.join(_support.REPO, path)):
                continue
            text = read(path)
            self.assertIsNone(LOWER_CASE_NAME.search(text), f"{path} names the design document in lower case")
            for section in CITED_SECTION.findall(text):
                self.assertIn(section.lower(), headings, f"{path} cites DESIGN.md's \"{section}\", which it lacks")

    def test_the_readme_layout_lists_every_top_level_folder(self):
        folders = sorted({path.split("/")[0] for path in self.files if "/" in path})
        readme = read("README.md")
        layout = readme[readme.index("## Layout"):]
        layout = layout[:layout.index("\n## ", 1)]
        listed = set(re.findall(r"^([A-Za-z0-9_.]+)/", layout, re.MULTILINE))
        self.assertEqual([f for f in folders if f not in listed], [], "folders missing from the README's Layout")


if __name__ == "__main__":
    unittest.main()
