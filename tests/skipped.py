"""Rerun what the last whole run skipped: CI's second pass (`make peer-test`).

A whole run (`pytest` with no paths and no test left out: `make test`) records the node ids it skipped, a module
skipped at import included, in pytest's cache (.pytest_cache). `pytest --rerun-skipped` then runs those and nothing
else.
CI runs the suite once as a newcomer does (no peer library: their tests skip and say why), installs the peers, and
runs only what was skipped, with MATGPTQ_REQUIRE_PEERS=1 so that a peer that does not import fails instead of
skipping again. Tests skipped for want of a GPU or of `make real-model` skip again, at no cost.
"""

import pytest

KEY = "matgptq/skipped"


def pytest_addoption(parser):
    parser.addoption(
        "--rerun-skipped",
        action="store_true",
        help="run only the tests the last whole run (`make test`) skipped; CI's peer pass (`make peer-test`)",
    )


def pytest_configure(config):
    if getattr(config, "cache", None) is None:  # -p no:cacheprovider
        return
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.rerun_skipped:
        config.pluginmanager.register(_Recorder(config), "matgptq-skip-recorder")


class _Recorder:
    """Collects the node ids of skipped tests and of modules skipped at collection; writes them at the end unless the
    run left tests out (-k, -m, --lf, --deselect: each reports what it deselected)."""

    def __init__(self, config):
        self.config = config
        self.skipped: set[str] = set()
        self.partial = False

    def pytest_deselected(self, items):
        self.partial = True

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped.add(report.nodeid)

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.add(report.nodeid)

    def pytest_sessionfinish(self, session):
        if not self.partial:
            self.config.cache.set(KEY, sorted(self.skipped))


def pytest_collection_modifyitems(config, items):
    if not config.option.rerun_skipped:
        return
    cache = getattr(config, "cache", None)
    recorded = cache.get(KEY, None) if cache is not None else None
    if recorded is None:
        raise pytest.UsageError("--rerun-skipped: no whole run is recorded; run the whole suite first (`make test`)")
    recorded = set(recorded)

    def wanted(nodeid: str) -> bool:  # the test itself, or a module (or class) skipped as a whole
        parts = nodeid.split("::")
        return any("::".join(parts[:i]) in recorded for i in range(1, len(parts) + 1))

    keep, deselected = [], []
    for item in items:
        (keep if wanted(item.nodeid) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = keep
