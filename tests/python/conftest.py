"""Fixtures of the Python binding's tests. Every rank of a concordrun job runs the same pytest
session: tests run in the same order everywhere, so their collective calls match across ranks."""
import pytest

import concord


@pytest.fixture(scope="session")
def comm():
    c = concord.init()
    yield c
    concord.finalize()


def pytest_report_header(config):
    return "concord library: %s, version %s" % (concord.lib().concord_path, concord.version())
