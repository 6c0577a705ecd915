#!/usr/bin/env python3
"""The executables cargo built, from its `--message-format=json` on stdin.

Usage: cargo ... --no-run --message-format=json | cargo_artifacts.py benches|tests

  benches  one line per bench target:   NAME<TAB>PACKAGE_DIR<TAB>EXECUTABLE
  tests    one line per test or example: PACKAGE_DIR<TAB>EXECUTABLE<TAB>test|example

PACKAGE_DIR is where cargo would run the binary from. Lines that are not
JSON (cargo's own progress) are skipped.
"""

import json
import os
import sys


def artifacts():
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            yield msg, os.path.dirname(msg["manifest_path"]), msg["executable"]


def main(argv):
    if len(argv) != 2 or argv[1] not in ("benches", "tests"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for msg, package_dir, exe in artifacts():
        kinds = msg["target"]["kind"]
        if argv[1] == "benches":
            if "bench" in kinds:
                print(f"{msg['target']['name']}\t{package_dir}\t{exe}")
        elif "example" in kinds:
            print(f"{package_dir}\t{exe}\texample")
        elif msg["profile"]["test"]:
            print(f"{package_dir}\t{exe}\ttest")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
