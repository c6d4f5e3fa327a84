"""What the tests of both trees share: helper modules and the fixtures of more than one folder.

tests/unit and tests/integration hold test modules and conftest.py files only
(and what one folder alone reads or imports, beside it); a helper or fixture
that tests of both trees, or of several rooms, use lives here, once. The
fixture modules (*_fixtures.py) are registered by tests/conftest.py
(`pytest_plugins`), so a test finds them wherever it lies; the rest is
imported by name (`from support.loopback import Loopback`): tests/conftest.py
puts tests/ on sys.path. The data those tests read is in tests/data/.
"""
