"""Runs one test file of the reference's suite the way its CI does
(``python <file> [args]``) and records every case's outcome as JSON.

Usage: ``python reference_case_runner.py <out.json> <test file> [args...]``.

The file runs as ``__main__``; whatever unittest runner it builds (its own
``TextTestRunner`` or ``unittest.main``) records its results here. Cases of a
class or module whose setup failed are recorded as errors with that setup's
message, since they never ran. A file that is a plain script (no unittest)
is one case named after the file, passed when it exits with 0. A file whose
main is ``pytest.main(...)`` has its cases recorded through a pytest plugin.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
import unittest
import unittest.runner

results: dict = {}
order: list = []
script_name = ""


def _record(case_id: str, outcome: str, message: str = "") -> None:
    if case_id not in results:
        order.append(case_id)
    rank = {"not run": 0, "skipped": 1, "passed": 2, "failed": 3, "error": 4}
    old = results.get(case_id)
    if old is None or rank.get(outcome, 4) >= rank.get(old["outcome"], 0):
        results[case_id] = {"outcome": outcome, "message": message[-2000:]}


def _short_id(test) -> str:
    # "module.Class.test_x" -> "Class.test_x"; the file names the module.
    parts = test.id().split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else test.id()


def _walk(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _walk(t)
        else:
            yield t


class RecordingResult(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test)
        _record(_short_id(test), "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._bad(test, "failed", err)

    def addError(self, test, err):
        super().addError(test, err)
        self._bad(test, "error", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        _record(_short_id(test), "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        _record(_short_id(test), "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        _record(_short_id(test), "failed", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "failed" if issubclass(err[0], test.failureException) else "error"
            _record(_short_id(test), outcome, f"{subtest._subDescription()}: {self._exc_info_to_string(err, test)}")

    def _bad(self, test, outcome, err):
        text = self._exc_info_to_string(err, test) if isinstance(err, tuple) else str(err)
        if isinstance(test, unittest.case._SubTest):
            test = test.test_case
        if not isinstance(test, unittest.TestCase):
            # setUpClass / setUpModule / tearDown*: blame every case it covers.
            desc = str(test)
            for case_id, r in list(results.items()):
                cls = case_id.split(".")[0]
                if r["outcome"] == "not run" and (
                    desc.startswith("setUpModule") or desc.endswith((f".{cls})", f"({cls})"))
                ):
                    _record(case_id, outcome, f"{desc}: {text}")
            if desc.startswith(("tearDownModule", "tearDownClass")):
                _record(desc, outcome, text)
            return
        _record(_short_id(test), outcome, text)


class RecordingRunner(unittest.TextTestRunner):
    def __init__(self, *args, **kwargs):
        kwargs["resultclass"] = RecordingResult
        kwargs.setdefault("verbosity", 2)
        super().__init__(*args, **kwargs)

    def run(self, test):
        for t in _walk(test):
            if isinstance(t, unittest.TestCase):
                _record(_short_id(t), "not run")
        return super().run(test)


class PytestRecorder:
    """A pytest plugin recording each case of a file whose main is
    ``pytest.main(...)``."""

    def pytest_runtest_logreport(self, report):
        case_id = report.nodeid.split("::", 1)[-1].replace("::", ".")
        if report.skipped:
            _record(case_id, "skipped", str(report.longrepr))
        elif report.failed:
            _record(case_id, "failed" if report.when == "call" else "error", str(report.longrepr))
        elif report.when == "call":
            _record(case_id, "passed")


def _record_pytest_cases() -> None:
    try:
        import pytest
    except ImportError:
        return
    run = pytest.main

    def main(args=None, plugins=None):
        return run(args, [*(plugins or []), PytestRecorder()])

    pytest.main = main


def main() -> int:
    global script_name
    out, path, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    script_name = os.path.basename(path)
    # Scripts build `unittest.TextTestRunner(...)`; `unittest.main` looks up
    # `unittest.runner.TextTestRunner` when it runs.
    unittest.TextTestRunner = RecordingRunner
    unittest.runner.TextTestRunner = RecordingRunner
    _record_pytest_cases()
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        code = 1
        _record("<import/run>", "error", traceback.format_exc())
    if not results or list(results) == ["<import/run>"]:
        # A plain script: one case, judged by its exit code.
        _record(script_name, "passed" if code == 0 else "failed", f"exit code {code}")
    elif code != 0 and all(r["outcome"] in ("passed", "skipped") for r in results.values()):
        _record("<exit code>", "failed", f"exit code {code}")
    with open(out, "w") as f:
        json.dump({"file": script_name, "exit_code": code, "cases": [{"id": k, **results[k]} for k in order]}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
