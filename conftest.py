"""Repository-root conftest: deliberately empty.

The pytest-eagle3 plugin (entry point ``pytest11: eagle3``) provides every
option, marker and fixture, and is active wherever the package is installed;
the project's own test helpers live in ``tests/conftest.py``.  This file marks
the repository root for pytest and is where a fork's checkout can replace one
link of the fixture chain, e.g. a prepared checkpoint::

    @pytest.fixture(scope="session")
    def eagle3_checkpoint():
        return Path("/models/my-target")
"""
