"""How the suite's tests are spread over pytest-xdist's workers (``pytest -n N``).

- Tests that share a module- or class-scoped fixture (a Spark session, a browser, a
  service) form one group: they run on one worker, one after another, so the fixture
  is built once and the tests see it in the order they are written.
- Tests marked ``serial`` (a Spark standalone cluster, which takes every core it is
  given) form the group ``serial``: never two of them at once. A test marked
  ``xdist_group(name)`` is in the group ``name``.
- Longest first: groups and tests are ordered by the time they took in a recorded
  run (``tests/timings.json``; ``pytest -n 4 --record-timings`` writes it), so that
  no long test starts last while the other workers are idle. A test the file does
  not know counts as short; a stale file only makes the order less good.

The groups reach xdist's scheduler (in the controlling process, which collects
nothing itself) as a file each worker writes while collecting: xdist's own
``--dist loadgroup`` passes them inside the tests' node ids, which pytest 9.2's
structured node ids no longer allow (pytest-xdist issue 1386).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

TIMINGS = Path(__file__).resolve().parents[1] / "timings.json"
RECORDED_FROM_S = 1.0
"""Tests shorter than this are left out of the file: they count as :data:`UNKNOWN_S`."""
UNKNOWN_S = 0.5
SERIAL = "serial"
GROUPS_DIR = "redrive_groups_dir"
"""The workers' input naming the folder where they write the groups they collected."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-timings",
        action="store_true",
        help=f"write how long each test took to {TIMINGS.name} (the order of the next runs)",
    )


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config):
        config.stash[_groups_dir] = Path(tempfile.mkdtemp(prefix="redrive-test-groups-"))
    if config.getoption("record_timings") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimingRecorder(), "redrive-timing-recorder")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_groups_dir, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


_groups_dir = pytest.StashKey[Path]()


def pytest_configure_node(node: Any) -> None:
    """(xdist, in the controller) Tell each worker where to write its groups."""
    node.workerinput[GROUPS_DIR] = str(node.config.stash[_groups_dir])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling:
    return GroupScheduling(config, log, config.stash[_groups_dir])


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, each test's scope being its group (or itself), the
    work handed out in the order the workers collected it: longest first."""

    def __init__(self, config: pytest.Config, log: Any, groups_dir: Path) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the collected order
        self.groups_dir = groups_dir
        self._groups: dict[str, str] | None = None

    def _reschedule(self, node: Any) -> None:
        """A worker gets its next unit when it is down to its last test (a worker runs
        a test once it knows the next one, or that there is none): work waits in the
        queue, where any worker may take it, not behind another worker's long test."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) <= 1:
            self._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            # Called once every worker has collected; their files are all the same.
            first = next(iter(sorted(self.groups_dir.glob("*.json"))), None)
            self._groups = json.loads(first.read_text()) if first else {}
        return self._groups.get(nodeid, nodeid)


def _shared_scope(item: pytest.Item) -> str | None:
    """The module whose module- or class-scoped fixture this test uses, if any."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope in ("module", "class", "package"):
                return item.nodeid.split("::")[0]
    return None


def group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker(SERIAL) is not None:
        return SERIAL
    explicit = item.get_closest_marker("xdist_group")
    if explicit is not None:
        return str(explicit.args[0] if explicit.args else explicit.kwargs.get("name", "default"))
    return _shared_scope(item)


def _timings() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(TIMINGS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    units: list[list[pytest.Item]] = []
    for item in items:
        group = group_of(item)
        if group is None:
            units.append([item])
            continue
        if not groups[group]:
            units.append(groups[group])
        groups[group].append(item)
    timings = _timings()

    def seconds(unit: list[pytest.Item]) -> float:
        return sum(timings.get(item.nodeid, UNKNOWN_S) for item in unit)

    # sorted() is stable: units of equal weight keep the order they were written in.
    items[:] = [item for unit in sorted(units, key=seconds, reverse=True) for item in unit]
    workerinput = getattr(config, "workerinput", {})
    if GROUPS_DIR in workerinput:
        grouped = {item.nodeid: name for name, members in groups.items() for item in members}
        target = Path(workerinput[GROUPS_DIR]) / f"{workerinput['workerid']}.json"
        target.with_suffix(".tmp").write_text(json.dumps(grouped))
        target.with_suffix(".tmp").replace(target)


class TimingRecorder:
    """Adds up each test's setup, call and teardown; writes the file at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {k: round(v, 1) for k, v in sorted(self.seconds.items()) if v >= RECORDED_FROM_S}
        TIMINGS.write_text(json.dumps(kept, indent=0) + "\n")
