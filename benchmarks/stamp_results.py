"""Record in every committed result file the commit that committed it (for results written before the benchmarks
recorded their own commit and machine; see ``_machine.stamp``). Idempotent: a file that already records a commit
is left alone.

    python benchmarks/stamp_results.py            # stamps benchmarks/results/**.md and **.json
    python benchmarks/stamp_results.py --dry-run  # lists what it would do

The commit is ``git log --follow -1 --diff-filter=AM --format=%h -- FILE``: the last commit that added or changed
the file, ignoring renames (the move of studies to ``results/studies/``). A Markdown file gets a line under its
title; a JSON file that is an object gets ``"commit"`` (and ``"machine"`` when its Markdown sibling has a
``Machine:`` line or the JSON itself names the CPU); other files (JSON arrays, ``.jsonl``, images) are listed and
left as they are.
"""

import argparse
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARK = "Commit: recorded at commit"


def committed_at(path):
    out = subprocess.run(["git", "-C", str(REPO), "log", "--follow", "-1", "--diff-filter=AM", "--format=%h", "--",
                          str(path.relative_to(REPO))], check=True, capture_output=True, text=True).stdout.strip()
    return out or None


def note(commit):
    return (f"recorded at commit {commit} (the commit that added or last changed this file; the run used the code "
            f"of that commit or of its parent, not necessarily clean; the run itself did not record it)")


def md_machine(md_path):
    """The ``Machine:`` line of a Markdown result, if it has one."""
    if not md_path.exists():
        return None
    for line in md_path.read_text().splitlines():
        m = re.match(r"\s*(?:[-*]\s*)?\**Machine\**:?\**\s*(.+)", line)
        if m:
            return m.group(1).strip().rstrip(" ")
    return None


def json_machine(data):
    """A description from the CPU fields a JSON result already has (meta, env, info or machine)."""
    for key in ("meta", "env", "info", "machine", None):
        d = data if key is None else data.get(key)
        if isinstance(d, list) and d and isinstance(d[0], dict):
            d = d[0]
        if not isinstance(d, dict):
            continue
        cpu = d.get("cpu") or d.get("cpu_model")
        if cpu:
            n = d.get("n_cpus") or d.get("logical_cores") or d.get("cpus")
            return f"{cpu}" + (f", {n} logical CPUs" if n else "")
    return None


def stamp_md(path, commit):
    text = path.read_text()
    if MARK in text or re.search(r"^Commit: `", text, re.M):
        return False
    lines = text.split("\n")
    line = f"Commit: {note(commit)}."
    if lines and lines[0].startswith("#"):
        lines[1:1] = ["", line]
    else:
        lines[0:0] = [line, ""]
    path.write_text("\n".join(lines))
    return True


def stamp_json(path, commit):
    text = path.read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        return None
    if "commit" in data:
        return False
    data["commit"] = note(commit)
    machine = json_machine(data) or md_machine(path.with_suffix(".md"))
    if machine and "machine" not in data:
        data["machine"] = machine
    indent = 1 if text.startswith("{\n ") and not text.startswith("{\n  ") else (2 if text.startswith("{\n  ") else None)
    path.write_text(json.dumps(data, indent=indent) + ("\n" if text.endswith("\n") else ""))
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    stamped, skipped, left = [], [], []
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(REPO)
        if path.suffix not in (".md", ".json"):
            left.append(f"{rel} (not Markdown or JSON)")
            continue
        commit = committed_at(path)
        if commit is None:
            left.append(f"{rel} (not committed yet)")
            continue
        if args.dry_run:
            stamped.append(f"{rel} <- {commit}")
            continue
        done = stamp_md(path, commit) if path.suffix == ".md" else stamp_json(path, commit)
        if done is None:
            left.append(f"{rel} (JSON but not an object)")
        else:
            (stamped if done else skipped).append(f"{rel} <- {commit}")
    print(f"stamped {len(stamped)}, already stamped {len(skipped)}, left as they are {len(left)}:")
    for line in left:
        print("  " + line)
    if args.dry_run:
        print("\n".join("  " + s for s in stamped))


if __name__ == "__main__":
    main()
