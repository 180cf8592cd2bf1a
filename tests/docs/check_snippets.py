#!/usr/bin/env python3
"""Compiles every C and C++ example of Concord's documentation, so that none can rot.

What is checked:
  - README.md, docs/*.md and bindings/python/README.md: every fenced block whose info string is
    `c` or `cpp`.
  - include/concord/*.h and *.hpp: every fenced block inside a comment. The comment leader of each
    line (`//`, `///`, ` *`, `/*`) is removed first, so an example in a header is written as in
    Markdown:
        //   ```cpp
        //   concord::Communicator comm;
        //   ```
  - Python blocks (```python) are compiled with Python's compile(): syntax only, nothing runs.
    Shell and other blocks are not checked.

How a block becomes a translation unit:
  - A block that defines `int main(` is a whole program: compiled as it is.
  - Any other block is a fragment: its `#include` lines go to the top, after the standard preamble
    (C: concord.h, stdio.h, stdlib.h, string.h, stdint.h; C++: concord.hpp, cstdio, cstdint,
    cstring, string, vector), and the rest becomes the body of a function that is never called.
    The function's parameters are the application's objects a fragment may use without declaring
    them (a fragment may declare its own of the same name: the body is a nested block):
        C:   concord_comm_t comm; float* data; void* device_ptr; int local_gpu;
             void* backward_stream; void* optimizer_stream;
        C++: concord::Communicator& comm; float* data; void* device_ptr; int local_gpu;
             void* backward_stream; void* optimizer_stream;
    Nothing else is assumed: a fragment that uses another name must declare it.
  - C is compiled as C99, C++ as C++17, both with -Wall -Wextra -Wno-unused-parameter -Werror,
    against include/, and linked against libconcord, so a wrong function name, a wrong argument
    or a missing declaration fails. Programs are linked, never run.

Before the real blocks, a deliberately broken fragment (a function libconcord does not have) must
fail to build: a harness that accepts everything would otherwise pass silently. The check also
fails when README.md has no C or C++ block at all.

Usage: check_snippets.py --root REPO --cc CC --cxx CXX --library LIBCONCORD --work DIR
                         [--flag FLAG ...] [FILE ...]
(FILEs default to the Markdown files above and include/concord/*; --flag adds a compiler and linker
flag, e.g. the sanitizer the library was built with.) Standard library only.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9+_-]*)\s*$")
MAIN = re.compile(r"\bint\s+main\s*\(")
COMMENT_LEADER = re.compile(r"^\s*(///|//|/\*\*|/\*|\*/|\*)? ?")
LANGUAGES = {"c": "c", "cpp": "cpp", "c++": "cpp", "cxx": "cpp", "python": "python", "py": "python"}

C_PREAMBLE = """#include <concord/concord.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
"""
CPP_PREAMBLE = """#include <concord/concord.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
"""
C_PARAMS = ("concord_comm_t comm, float* data, void* device_ptr, int local_gpu, "
            "void* backward_stream, void* optimizer_stream")
CPP_PARAMS = ("concord::Communicator& comm, float* data, void* device_ptr, int local_gpu, "
              "void* backward_stream, void* optimizer_stream")


class Block:
    def __init__(self, path, line, language, text):
        self.path = path
        self.line = line  # 1-based line of the opening fence
        self.language = language
        self.text = text

    def where(self):
        return "%s:%d (%s)" % (self.path, self.line, self.language)


def fenced_blocks(path, lines, strip_comments):
    """Every fenced block of a checked language in `lines`."""
    blocks = []
    opened = None  # (line number, language, indent) of the fence being read
    body = []
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if strip_comments:
            line = COMMENT_LEADER.sub("", line, count=1)
        m = FENCE.match(line)
        if opened is None:
            if m:
                opened = (number, m.group(2).lower(), len(m.group(1)))
                body = []
            continue
        if m and not m.group(2):
            number0, language, _ = opened
            if language in LANGUAGES:
                blocks.append(Block(path, number0, LANGUAGES[language], "\n".join(body) + "\n"))
            opened = None
            continue
        # Remove the fence's own indentation (a block inside a list item).
        indent = opened[2]
        body.append(line[indent:] if line[:indent].strip() == "" else line)
    if opened is not None:
        raise SystemExit("%s:%d: unterminated ``` block" % (path, opened[0]))
    return blocks


def collect(root, files):
    if not files:
        files = [os.path.join(root, "README.md")]
        files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
        files.append(os.path.join(root, "bindings", "python", "README.md"))
        files += sorted(glob.glob(os.path.join(root, "include", "concord", "*.h")))
        files += sorted(glob.glob(os.path.join(root, "include", "concord", "*.hpp")))
    blocks = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        header = path.endswith((".h", ".hpp"))
        blocks += fenced_blocks(os.path.relpath(path, root), lines, strip_comments=header)
    return blocks


def translation_unit(block):
    """The source to compile for a C or C++ block."""
    if MAIN.search(block.text):
        return "#line %d \"%s\"\n%s" % (block.line + 1, block.path, block.text)
    includes, body = [], []
    for line in block.text.splitlines():
        # An #include moves to the top; a blank line keeps the body's line numbers.
        if line.lstrip().startswith("#include"):
            includes.append(line)
            body.append("")
        else:
            body.append(line)
    c = block.language == "c"
    params = C_PARAMS if c else CPP_PARAMS
    # #line makes the compiler's messages point into the documentation file.
    return "".join([
        C_PREAMBLE if c else CPP_PREAMBLE,
        "\n".join(includes) + "\n",
        "void concord_doc_snippet(%s);\n" % params,
        "void concord_doc_snippet(%s) {\n{\n" % params,
        "#line %d \"%s\"\n" % (block.line + 1, block.path),
        "\n".join(body) + "\n",
        "}\n}\nint main(void) { return 0; }\n",
    ])


def build(block, args, index):
    """Compiles and links one block; returns (ok, compiler output)."""
    c = block.language == "c"
    source = os.path.join(args.work, "snippet%03d.%s" % (index, "c" if c else "cc"))
    with open(source, "w", encoding="utf-8") as f:
        f.write(translation_unit(block))
    compiler = args.cc if c else args.cxx
    command = [compiler, "-std=c99" if c else "-std=c++17", "-Wall", "-Wextra",
               "-Wno-unused-parameter", "-Werror", "-I", os.path.join(args.root, "include"),
               source, args.library, "-o", source + ".out"] + args.flag
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    return result.returncode == 0, " ".join(command) + "\n" + result.stdout


def check_python(block):
    try:
        compile(block.text, block.where(), "exec")
        return True, ""
    except SyntaxError as e:
        return False, "%s: %s" % (block.where(), e)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--cc", required=True)
    parser.add_argument("--cxx", required=True)
    parser.add_argument("--library", required=True, help="libconcord.so to link against")
    parser.add_argument("--work", required=True, help="directory for the generated sources")
    parser.add_argument("--flag", action="append", default=[])
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)

    # The negative control: a fragment calling a function libconcord does not have must fail.
    broken = Block("<negative control>", 1, "c",
                   "concord_status_t s = concord_no_such_function(comm);\n(void)s;\n")
    ok, _ = build(broken, args, 0)
    if ok:
        print("FAIL: a fragment calling a function libconcord does not have built: "
              "the harness checks nothing")
        return 1

    blocks = collect(args.root, args.files)
    if not args.files and not any(b.path == "README.md" and b.language in ("c", "cpp")
                                  for b in blocks):
        print("FAIL: README.md has no C or C++ block; the extraction is broken")
        return 1
    failures = 0
    counts = {"c": 0, "cpp": 0, "python": 0}
    for index, block in enumerate(blocks, 1):
        counts[block.language] += 1
        ok, output = check_python(block) if block.language == "python" else build(
            block, args, index)
        print("%s %s" % ("ok  " if ok else "FAIL", block.where()))
        if not ok:
            failures += 1
            print(output)
    print("%d C, %d C++ and %d Python blocks checked; %d failed" %
          (counts["c"], counts["cpp"], counts["python"], failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
