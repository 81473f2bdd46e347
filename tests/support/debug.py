"""A pytest plugin (``-p tests.support.debug`` in pyproject.toml), loaded before Django's
settings: the suite runs with development settings (``DEBUG=1``) unless the environment says
otherwise, as ``make test`` does. Production settings default to ``DEBUG`` off."""

import os

os.environ.setdefault("DEBUG", "1")
