#!/usr/bin/python3
"""The docs keep telling the truth about the program (issue 32, point 7).

Over README.md, docs/*.md and every folder's README.md:
  1. every `ringctl SUB ... --flag` (a code span, or a line of a code block) names a subcommand
     ringctl has and flags that subcommand takes (its --help);
  2. every relative link [text](path) resolves to a file or folder of the tree;
  3. every spec a command there runs (`ringctl run|submit|validate|plan FILE.yaml`) that is in the
     tree validates as the docs use it (with --what-if when the command has it).

  docs_test.py SOURCE_DIR RINGCTL
Prints each problem as file:line: what, and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

root, ringctl = sys.argv[1], sys.argv[2]
problems = []


def docs():
    out = [os.path.join(root, "README.md")]
    for d in sorted(os.listdir(os.path.join(root, "docs"))):
        if d.endswith(".md"):
            out.append(os.path.join(root, "docs", d))
    for top in sorted(os.listdir(root)):
        p = os.path.join(root, top)
        if top.startswith(".") or top in ("build", "docs") or not os.path.isdir(p):
            continue
        for dirpath, dirnames, files in os.walk(p):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "corpus"]
            if "README.md" in files:
                out.append(os.path.join(dirpath, "README.md"))
    return out


help_cache = {}


def flags_of(sub):
    """The flags `ringctl SUB --help` lists, or None when SUB is not a subcommand."""
    if sub not in help_cache:
        r = subprocess.run([ringctl, sub, "--help"], capture_output=True, text=True)
        if r.returncode != 0:
            help_cache[sub] = None
        else:
            flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", r.stdout))
            flags |= set(re.findall(r"(?<![\w-])(-[a-zA-Z])(?=[, ])", r.stdout))
            help_cache[sub] = flags
    return help_cache[sub]


# Commands: in a code span, or on a line of a fenced block; a line may hold several (a; b, a | b).
span = re.compile(r"`([^`\n]+)`")
# (A subcommand ends at a blank or the end: "ringctl status: unknown flag" is a message, and
# "ringctl st<TAB>" a completion.)
command = re.compile(r"(?:^|[\s;|&(])ringctl((?:\s+--?[a-z][\w-]*(?:[ =][^\s-][^\s]*)?)*)\s+([a-z][a-z-]*)(?=\s|$)(.*)")


def check_command(path, lineno, text):
    for m in command.finditer(text):
        sub, rest = m.group(2), m.group(3)
        # What follows up to the next command separator belongs to this command.
        rest = re.split(r"[;|&]|\bringctl\b", rest)[0]
        flags = flags_of(sub)
        if flags is None:
            problems.append(f"{path}:{lineno}: `ringctl {sub}`: ringctl has no subcommand '{sub}'")
            continue
        for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
            if f not in flags:
                problems.append(f"{path}:{lineno}: `ringctl {sub} {f}`: {sub} has no flag {f}")
        spec = re.search(r"(?<![\w/.-])((?:configs|tests|scripts)/[\w./-]+\.yaml)", rest)
        if spec and sub in ("run", "submit", "validate", "plan"):
            check_spec(path, lineno, spec.group(1), "--what-if" in rest)


checked_specs = {}


def check_spec(path, lineno, spec, what_if):
    full = os.path.join(root, spec)
    if not os.path.isfile(full):
        problems.append(f"{path}:{lineno}: {spec}: no such file in the tree")
        return
    key = (spec, what_if)
    if key not in checked_specs:
        args = [ringctl, "validate", full] + (["--what-if"] if what_if else [])
        r = subprocess.run(args, capture_output=True, text=True)
        checked_specs[key] = r.returncode == 0, (r.stdout + r.stderr).strip()[-400:]
    ok, out = checked_specs[key]
    if not ok:
        problems.append(f"{path}:{lineno}: {spec} does not validate as the docs use it: {out}")


link = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def check_links(path, lineno, text):
    for m in link.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, an anchor in the same file
        file_part = target.split("#", 1)[0]
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(resolved):
            problems.append(f"{path}:{lineno}: link ({target}) resolves to nothing")


for path in docs():
    rel = os.path.relpath(path, root)
    in_block = False
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            if in_block:
                check_command(rel, lineno, line.split(" #", 1)[0])
                continue
            for s in span.finditer(line):
                check_command(rel, lineno, s.group(1))
            check_links(path, lineno, line)

for p in problems:
    print(p)
print(f"docs_test: {len(problems)} problem(s), {len(help_cache)} subcommands and "
      f"{len(checked_specs)} specs checked")
sys.exit(1 if problems else 0)
