"""pytest-xdist: whether a run is pytest-eagle3's, for ``-n auto``.

How many workers an eagle3 run gets is the GPU leases' business
(:func:`pytest_eagle3.plugin.gpu_workers.auto_num_workers`); this module only decides
whether a run is about pytest-eagle3 at all, so that unrelated projects keep
xdist's own ``-n auto``.
"""

from __future__ import annotations

import os

import pytest

#: xdist's own override of ``-n auto``; when set, it wins over the eagle3 count.
ENV_XDIST_AUTO = "PYTEST_XDIST_AUTO_NUM_WORKERS"


def is_eagle3_run(config: pytest.Config) -> bool:
    """Whether this pytest run is about pytest-eagle3 at all: an eagle3 option on
    the command line, an eagle3 target from the environment or ini file, or the
    packaged suite among the arguments.  Unrelated projects in an environment where
    the plugin is installed keep xdist's own ``-n auto``."""
    opt = config.option
    names = ("eagle3_tp", "eagle3_device", "eagle3_target", "eagle3_cache", "eagle3_draft", "eagle3_plan")
    if any(getattr(opt, name, None) not in (None, False) for name in names):
        return True
    if os.environ.get("PYTEST_EAGLE3_TARGET"):
        return True
    try:
        if config.getini("eagle3_target"):
            return True
    except ValueError:
        pass
    return any("pytest_eagle3" in str(arg) for arg in getattr(config, "args", ()))
