#!/usr/bin/python3
"""Docs that cannot drift: every repository path a comment or a doc cites must exist.

Usage: check-citations.py [--root DIR] [--verbose]
       check-citations.py --self-test

--self-test builds a small tree in a temporary directory with good citations and broken ones
(each kind: a missing file, too few lines, a missing anchor, a missing section), runs this
script on it with --root, and checks that it fails naming exactly the broken ones and none of
the good ones (nor a path in a string literal), then that it passes once they are mended. So
the checker cannot silently pass everything (ctest docs.citations_selftest).

What is read:
  - comments (and Python docstrings) of the C/C++/CUDA, CMake, Python and shell files under
    SOURCE_DIRS, plus the top-level CMakeLists.txt and setup.py; string literals and code
    (an #include is checked by the compiler) are not read;
  - all of every Markdown file in MARKDOWN_FILES / MARKDOWN_DIRS, fenced blocks included.
  Directories named build* and .git are skipped everywhere, and so is bench/results/: those
  are dated records of a run, kept as they were written.

What is a citation:
  - a token that looks like a path and ends in one of CITED_EXTENSIONS, with or without
    directories (`ring_schedule.h`, `src/collectives/ring_schedule.h`), optionally followed
    by `:LINE` or `:LINE-LINE`, or for a Markdown file by `#anchor`;
  - in Markdown, the target of a link `[text](target)` that is not a URL.
  Not a citation: URLs, absolute paths (/usr/include/nccl.h), paths made of placeholders or
  globs (`*.json`, `${out}.md`, `<dir>/x.json`), and the external names in EXTERNAL.

When it resolves: relative to the repository root, to the citing file's directory or any
directory above it, or to one of SEARCH_ROOTS (the include roots); or, for a bare file name, to
a file of that name anywhere in the tree (`git ls-files`, tracked and untracked-but-not-ignored;
a plain directory walk when --root is not a git work tree). A `:LINE[-LINE]` suffix also needs
the file to have that many lines. A Markdown `#anchor`, and a section named after a Markdown
citation (`FORMAT.md, "Sparse payload"`, `section "Name"`, `§Name`), must name a heading of that
file: the anchor as GitHub slugs it, the section as the start of a heading's text (so
"Compression" matches "Compression (`src/compression.*`)") or of a list item's bold label.
Skipped, besides EXTERNAL: GENERATED names (what a build or a run writes), paths with a
PLACEHOLDERS part (`OUT.md`), and paths under build*/ (build output).

Prints `file:line: cites 'X' which does not exist` (or `... but it has only N lines`, `... but it
has no such heading`, `... section 'Y' which it does not have`) for each broken citation, and a
count on stderr; exits 1 if there is any broken citation, 0 otherwise.
"""

import argparse
import ast
import io
import os
import re
import subprocess
import sys
import tokenize

SOURCE_DIRS = ["src", "base", "transport", "cuda", "compressors", "include", "trainer", "tools",
               "bench", "python_bindings", "tests", "scripts", "cmake"]
TOP_LEVEL_SOURCES = ["CMakeLists.txt", "setup.py"]
MARKDOWN_FILES = ["README.md", "compressors/FORMAT.md"]
MARKDOWN_DIRS = ["docs"]
SKIP_DIRS = ["bench/results"]  # dated run records: they cite the tree as it was that day

CITED_EXTENSIONS = ["h", "cc", "cu", "cuh", "cpp", "py", "sh", "md", "txt", "cmake", "json",
                    "toml"]

C_LIKE = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh", ".h.in")
HASH_COMMENTED = (".cmake", ".cmake.in")  # plus CMakeLists.txt
SHELL = (".sh",)
PYTHON = (".py",)

# Names that are cited but are not ours: headers of the system and of the libraries we build
# against, and files of the projects the comments compare us with. Exact names, so that a
# broken citation of one of our own files cannot hide behind a pattern.
EXTERNAL = {
    # CUDA toolkit, cuBLAS, NCCL, UCX, MPI, OpenBLAS headers
    "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h", "cuda_bf16.h", "cublas_v2.h",
    "cublas_api.h", "nccl.h", "ucp.h", "ucp/api/ucp.h", "mpi.h", "cblas.h",
    # Gloo (facebookincubator/gloo), the house style's model for collective files
    "allreduce_ring.h", "gloo/allreduce_ring.h",
    # nccl-tests' sources, cited as "src/common.cu there" by the benchmark's nccl-tests mode
    "src/common.cu", "src/util.cu",
    # Torch's CMake package, which the torch backend's build deliberately does not use
    "TorchConfig.cmake",
    # System headers that pip install's build-requirement check looks for
    # (scripts/check-build-deps.py), and the pip internals setup.py's progress lines work with
    "Python.h", "pybind11/pybind11.h", "openssl/evp.h", "fmt/core.h", "zlib.h", "nlohmann/json.hpp",
    "CLI/CLI.hpp", "sitecustomize.py", "pip/_internal/utils/subprocess.py", "cli/spinners.py",
}

# Files that a build or a run writes, cited as what comes out, never in the tree: the
# configured version header, CMake's cache, the bindings' status note, and the outputs
# that the bench and soak scripts document.
GENERATED = {
    "version.h", "gradcomm/version.h", "include/gradcomm/version.h", "CMakeCache.txt",
    "_torch_backend_status.txt", "out.json", "log.txt", "stacks.txt",
}

# A path part spelled as a placeholder stands for a name chosen at run time
# (`OUT.md`, `DIR/table.md`, `training-cpu-DATE.md`, `X.md`, the compiler's `x.h`).
PLACEHOLDERS = {"OUT", "DIR", "PREFIX", "DATE", "NAME", "X", "x", "build_dir"}

# Directories a citation may also be relative to: the include roots the code's #includes use
# (`collectives/ring_driver.h` is under src/, `gradcomm/types.h` include/gradcomm/,
# `half.h` base/), and the Python package root (`gradcomm/torch.py`). A citation may also be
# relative to any directory above the citing file (a codec in compressors/sign/ may name a
# header in compressors/quantize/ as quantize/NAME).
SEARCH_ROOTS = ["src", "include", "base", "python_bindings"]

EXT_ALT = "|".join(sorted(CITED_EXTENSIONS, key=len, reverse=True))
# A path token: optional directories, a name, a cited extension; not glued to more path
# characters on either side (so /abs/paths, ${var}.md and *.json never match), then an
# optional :LINE[-LINE] or #anchor.
PATH_RE = re.compile(
    r"(?<![\w./\-~$*{}%<@\\…])"
    r"((?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:" + EXT_ALT + r"))"
    r"(?![\w/\-]|\.\w|\(|\{)"
    r"(?::(\d+)(?:-(\d+))?(?![\w.]))?"
    r"(#[\w\-]+)?")
MD_LINK_RE = re.compile(r"(?<!\!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL_WORD_RE = re.compile(r"://|^www\.|^[\w\-]+(?:\.[\w\-]+)*\.(?:com|org|io|net|dev|edu|ai)/")
# A section named right after a Markdown citation: `X.md, "Name"`, `X.md "Name"`,
# `X.md, section "Name"`, `X.md §Name`, `X.md, §"Name"`.
SECTION_RE = re.compile(
    r"^\)?[,:]?\s*(?:section\s+|§\s*)?(?:\"([^\"\n]+)\"|“([^”\n]+)”)"
    r"|^\)?[,:]?\s*§\s*([^\s,;:)\"]+(?:[ \t][A-Z][^\s,;:)\"]*)*)")


# ---- the tree --------------------------------------------------------------------------------

def list_files(root):
    """Every file of the tree, relative to root: git's list (tracked, and untracked files that
    are not ignored) in a work tree, else a walk that skips build* and .git."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                              "--exclude-standard", "-z"], capture_output=True, check=True)
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"],
                             capture_output=True, check=True, text=True).stdout.strip()
        if os.path.realpath(top) == os.path.realpath(root):
            files = [f for f in out.stdout.decode().split("\0") if f]
            return sorted(f for f in files if os.path.isfile(os.path.join(root, f)))
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git" and not d.startswith("build")]
        for name in filenames:
            files.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(files)


def skipped(path):
    parts = path.split("/")
    if any(p == ".git" or p.startswith("build") for p in parts[:-1]):
        return True
    return any(path == d or path.startswith(d + "/") for d in SKIP_DIRS)


def files_to_scan(files):
    """(path, kind) for every file whose comments or text are read."""
    out = []
    for f in files:
        if skipped(f):
            continue
        top = f.split("/")[0]
        base = os.path.basename(f)
        if f in MARKDOWN_FILES or (top in MARKDOWN_DIRS and f.endswith(".md")):
            out.append((f, "md"))
            continue
        if top not in SOURCE_DIRS and f not in TOP_LEVEL_SOURCES:
            continue
        if base == "CMakeLists.txt" or f.endswith(HASH_COMMENTED):
            out.append((f, "cmake"))
        elif f.endswith(C_LIKE):
            out.append((f, "c"))
        elif f.endswith(PYTHON):
            out.append((f, "py"))
        elif f.endswith(SHELL):
            out.append((f, "sh"))
    return out


# ---- comments --------------------------------------------------------------------------------

def c_comments(text):
    """[(line, text)] of the // and /* */ comments of C, C++ and CUDA source; string, character
    and raw-string literals are stepped over (digit separators like 1'000 are not quotes)."""
    out = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_") or text[i - 1] in "8uUL"):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            line += text.count("\n", i, end)
            i = end
        elif c == '"' or (c == "'" and not _digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def _digit_separator(text, i):
    """True for the ' of 1'000'000 (C++14), false for a character literal (also u8'a')."""
    if i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"):
        return False
    m = re.search(r"[\w]+$", text[max(0, i - 8):i])
    return not (m and m.group(0) in ("L", "u", "U", "u8"))


def hash_comments(text, shell):
    """[(line, text)] of # comments in shell and CMake: a # outside quotes (for shell, at the
    start of a word, so $# and ${#x} are not comments); CMake's #[[ ]] blocks too."""
    out = []
    lines = text.split("\n")
    k = 0
    while k < len(lines):
        s = lines[k]
        quote = None
        i = 0
        while i < len(s):
            c = s[i]
            if quote:
                if c == "\\" and quote == '"':
                    i += 1
                elif c == quote:
                    quote = None
            elif c in "'\"" and not (shell and c == "'" and i > 0 and s[i - 1].isalnum()
                                     and _inside_word_apostrophe(s, i)):
                quote = c
            elif c == "\\":
                i += 1
            elif c == "#" and (not shell or i == 0 or s[i - 1] in " \t;(|&"):
                m = re.match(r"#\[(=*)\[", s[i:]) if not shell else None
                if m:  # a CMake bracket comment, possibly over lines
                    close = "]" + m.group(1) + "]"
                    rest = s[i + len(m.group(0)):]
                    start = k
                    while close not in rest and k + 1 < len(lines):
                        out.append((k + 1, rest))
                        k += 1
                        rest = lines[k]
                    out.append((k + 1, rest.split(close)[0]))
                    s = ""
                    break
                out.append((k + 1, s[i + 1:]))
                break
            i += 1
        k += 1
    return out


def _inside_word_apostrophe(s, i):
    """An apostrophe between letters (don't) in an unquoted shell word is rare in code but
    common in echoed prose; treat it as a quote only if another ' closes it on the line."""
    return s.find("'", i + 1) < 0


def python_comments(text):
    """[(line, text)] of # comments and docstrings of a Python file."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return hash_comments(text, shell=True)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                first = body[0].lineno
                for k, part in enumerate(body[0].value.value.split("\n")):
                    out.append((first + k, part))
    return sorted(out)


def comment_lines(path, kind, text):
    if kind == "md":
        return list(enumerate(text.split("\n"), start=1))
    if kind == "c":
        return c_comments(text)
    if kind == "py":
        return python_comments(text)
    return hash_comments(text, shell=(kind == "sh"))


# ---- resolving -------------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(names):
    return [slug(h) for h in names if not h.startswith("\0")]


def headings(root, rel, cache):
    if rel not in cache:
        names = []
        in_fence = False
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for s in f:
                if s.lstrip().startswith("```"):
                    in_fence = not in_fence
                m = None if in_fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", s)
                if m:
                    names.append(m.group(1))
                # a bold label that opens a list item names a section too
                m = None if in_fence else re.match(r"\s*[-*]\s+\*\*(.+?)\*\*", s)
                if m:
                    names.append("\0" + m.group(1))  # not an anchor (GitHub makes none)
        cache[rel] = names
    return cache[rel]


def section_matches(name, names):
    want = re.sub(r"[`*_]", "", name).strip().lower()
    for h in names:
        h = h.lstrip("\0")
        have = re.sub(r"[`*_]", "", h).strip().lower()
        if have == want or (have.startswith(want) and not have[len(want)].isalnum()):
            return True
    return False


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = list_files(root)
        self.by_name = {}
        for f in self.files:
            self.by_name.setdefault(os.path.basename(f), []).append(f)
        self.dirs = {os.path.dirname(f) for f in self.files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.lines = {}
        self.heads = {}

    def exists(self, rel):
        rel = os.path.normpath(rel)
        return rel in self.by_path() or rel in self.dirs

    def by_path(self):
        if not hasattr(self, "_paths"):
            self._paths = set(self.files)
        return self._paths

    def resolve(self, cited, citing):
        """The repository paths `cited` may mean, seen from the file `citing`."""
        here = os.path.dirname(citing)
        bases = [""] + [os.path.join(here, *([".."] * k)) for k in range(here.count("/") + 1)
                        if here] + SEARCH_ROOTS
        out = []
        for cand in (os.path.join(b, cited) for b in bases):
            cand = os.path.normpath(cand)
            if not cand.startswith("..") and self.exists(cand):
                out.append(cand)
        if not out and "/" not in cited.rstrip("/"):
            out = list(self.by_name.get(cited, []))
        return out

    def line_count(self, rel):
        if rel not in self.lines:
            with open(os.path.join(self.root, rel), "rb") as f:
                self.lines[rel] = f.read().count(b"\n")
        return self.lines[rel]


VERBOSE = []


def check_one(tree, citing, lineno, cited, first, last, anchor, section, problems):
    """Append a problem for `cited` unless it resolves (and its lines, anchor, section do)."""
    cited = cited.rstrip(".,")
    if VERBOSE:
        print(f"{citing}:{lineno}: {cited}" + (f":{first}" if first else "") +
              (f"-{last}" if last else "") + (f"#{anchor}" if anchor else "") +
              (f" section '{section}'" if section else ""), file=sys.stderr)
    if cited in EXTERNAL or cited in GENERATED or os.path.basename(cited) in GENERATED:
        return 1
    if any(part in PLACEHOLDERS for part in re.split(r"[-_./]", cited)):
        return 1
    if cited.split("/")[0].startswith("build") and "/" in cited:
        return 1  # build output (build/include/gradcomm/version.h), not a file of the tree
    targets = tree.resolve(cited, citing)
    if not targets:
        problems.append(f"{citing}:{lineno}: cites '{cited}' which does not exist")
        return 1
    files = [t for t in targets if os.path.isfile(os.path.join(tree.root, t))]
    if last or first:
        need = int(last or first)
        if files and not any(tree.line_count(t) >= need for t in files):
            have = max(tree.line_count(t) for t in files)
            problems.append(f"{citing}:{lineno}: cites '{cited}:{first}"
                            f"{'-' + last if last else ''}' but it has only {have} lines")
    md = [t for t in files if t.endswith(".md")]
    if anchor and md:
        if not any(anchor in anchors(headings(tree.root, t, tree.heads)) for t in md):
            problems.append(f"{citing}:{lineno}: cites '{cited}#{anchor}' but it has no such heading")
    if section and md:
        if not any(section_matches(section, headings(tree.root, t, tree.heads)) for t in md):
            problems.append(f"{citing}:{lineno}: cites '{cited}' section '{section}' "
                            f"which it does not have")
    return 1


def find_section(rest):
    m = SECTION_RE.match(rest)
    if not m:
        return None
    return (m.group(1) or m.group(2) or m.group(3)).strip()


def check_file(tree, path, kind, problems):
    with open(os.path.join(tree.root, path), encoding="utf-8", errors="replace") as f:
        text = f.read()
    pieces = comment_lines(path, kind, text)
    count = 0
    for idx, (lineno, s) in enumerate(pieces):
        # the next comment line, for a section name that wraps: `(X.md,` / `"Name")`
        nxt = pieces[idx + 1][1] if idx + 1 < len(pieces) and pieces[idx + 1][0] == lineno + 1 else ""
        nxt = re.sub(r"^\s*(?://+|#+|\*+)?\s*", " ", nxt) if kind != "md" else " " + nxt.lstrip()
        spans = []
        if kind == "md":
            for m in MD_LINK_RE.finditer(s):
                target = m.group(1)
                spans.append(m.span(1))
                if re.match(r"^(?:[a-z][a-z0-9+.\-]*:|//)", target, re.I):
                    continue  # a URL, mailto: and the like
                path_part, _, anchor = target.partition("#")
                if not path_part:  # an anchor in this file
                    if anchor not in anchors(headings(tree.root, path, tree.heads)):
                        problems.append(f"{path}:{lineno}: cites '#{anchor}' but it has no such heading")
                    count += 1
                    continue
                lm = re.match(r"^(.*?):(\d+)(?:-(\d+))?$", path_part)
                first = last = None
                if lm:
                    path_part, first, last = lm.group(1), lm.group(2), lm.group(3)
                section = find_section(s[m.end():] + nxt) if path_part.endswith(".md") else None
                count += check_one(tree, path, lineno, path_part.rstrip("/") or ".", first, last,
                                   anchor, section, problems)
        for m in PATH_RE.finditer(s):
            if any(a <= m.start(1) < b for a, b in spans):
                continue  # a link target, checked above
            word_start = max(s.rfind(" ", 0, m.start(1)), s.rfind("(", 0, m.start(1)),
                             s.rfind("`", 0, m.start(1))) + 1
            word = s[word_start:m.end()]
            if URL_WORD_RE.search(word):
                continue
            cited, first, last, anchor = m.group(1), m.group(2), m.group(3), m.group(4)
            section = find_section(s[m.end():] + nxt) if cited.endswith(".md") else None
            count += check_one(tree, path, lineno, cited, first, last,
                               anchor[1:] if anchor else None, section, problems)
    return count


# ---- self-test -------------------------------------------------------------------------------

SELFTEST_TREE = {
    "src/a.cc": (
        '// Good: b.h, src/b.h:3, docs/guide.md, "Usage" (a heading), docs/guide.md#usage.\n'
        '// Broken: src/gone.h, and src/b.h:9 (b.h has 3 lines).\n'
        'const char* s = "src/in_a_string.h";  // a literal is code, not a citation\n'
        '// Broken: docs/guide.md, "No such part".\n'),
    "src/b.h": "// one\n// two\n// three\n",
    "src/run.sh": "#!/bin/sh\n# calls b.h's sibling a.cc; writes OUT.json (a placeholder)\n",
    "docs/guide.md": (
        "# Guide\n\n## Usage\n\nSee [the code](../src/a.cc) and [usage](#usage),\n"
        "[nothing](missing.md) and [no anchor](guide.md#nowhere); allreduce_ring.h is Gloo's.\n"),
}
SELFTEST_BROKEN = [
    "src/a.cc:2: cites 'src/gone.h' which does not exist",
    "src/a.cc:2: cites 'src/b.h:9' but it has only 3 lines",
    "src/a.cc:4: cites 'docs/guide.md' section 'No such part' which it does not have",
    "docs/guide.md:6: cites 'missing.md' which does not exist",
    "docs/guide.md:6: cites 'guide.md#nowhere' but it has no such heading",
]


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory(prefix="check-citations-") as root:
        for rel, text in SELFTEST_TREE.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        run = lambda: subprocess.run([sys.executable, os.path.abspath(__file__), "--root", root],
                                     capture_output=True, text=True)
        r = run()
        got = r.stdout.splitlines()
        ok = r.returncode == 1 and sorted(got) == sorted(SELFTEST_BROKEN)
        print(f"broken tree: exit {r.returncode} (want 1), reported:\n  " + "\n  ".join(got))
        if not ok:
            print("FAIL: want exactly:\n  " + "\n  ".join(SELFTEST_BROKEN))
            return 1
        # mend every broken citation: the same tree must now pass
        for extra in ("src/gone.h", "docs/missing.md"):
            open(os.path.join(root, extra), "w").close()
        with open(os.path.join(root, "src/b.h"), "a") as f:
            f.write("// four\n" * 6)
        with open(os.path.join(root, "docs/guide.md"), "a") as f:
            f.write("\n## Nowhere\n\n## No such part\n")
        r = run()
        print(f"mended tree: exit {r.returncode} (want 0){': ' + r.stdout if r.stdout else ''}")
        if r.returncode != 0:
            print("FAIL")
            return 1
    print("self-test passed")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository root (default: this script's parent's parent)")
    ap.add_argument("--verbose", action="store_true", help="also print what was checked")
    ap.add_argument("--self-test", action="store_true",
                    help="check the checker on a temporary tree with known broken citations")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    if args.verbose:
        VERBOSE.append(True)
    tree = Tree(root)
    scan = files_to_scan(tree.files)
    problems = []
    count = 0
    for path, kind in scan:
        count += check_file(tree, path, kind, problems)
    for p in problems:
        print(p)
    print(f"check-citations: {count} citations in {len(scan)} files, {len(problems)} broken",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
