#!/usr/bin/python3
"""Runs unittest test files and ends with a Criterion-style line
"Synthesis: Tested: N | Passing: P | Failing: F | Crashing: E", which
tools/test.sh counts (each test case once).  Skipped cases are not counted;
when every case was skipped (say torch is not installed) the exit status is 77,
which meson reports as SKIP.

usage: run.py [--parity PATH] FILE.py ...
"""
import os
import sys
import unittest


def main(argv):
    args = list(argv)
    if args[:1] == ["--parity"]:
        os.environ["PARITY_EXE"] = os.path.abspath(args[1])
        args = args[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))  # the package sources
    sys.path.insert(0, here)
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for path in args:
        name = os.path.splitext(os.path.basename(path))[0] if path.endswith(".py") else path
        suite.addTests(loader.loadTestsFromName(name))
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    skipped = len(res.skipped)
    for test, why in res.skipped:
        print(f"skipped: {test.id()}: {why}")
    tested = res.testsRun - skipped
    failing = len(res.failures) + len(res.unexpectedSuccesses)
    crashing = len(res.errors)
    print(f"[====] Synthesis: Tested: {tested} | Passing: {tested - failing - crashing} | "
          f"Failing: {failing} | Crashing: {crashing}")
    if tested == 0 and skipped:
        return 77
    return 0 if res.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
